"""inline_tags.py: a piece's prose and tags as the reader finds them, tags placed by an alignment
(reversed word order, nesting, siblings, punctuation, a WHOLE mark, HTML escapes), token attention
summed into words; and end to end, through both engines, the toy model (which reverses the order of
the words it translates) puts <b> and Markdown's ** around the word the tag covered, where the
monotone fallback would not."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import export
from config import get_config
from nmt.inference.documents import html_text, translate_document
from nmt.inference.inline_tags import (CLOSE, OPEN, READ, WHOLE, Alignment, InlinePiece, Mark, Tag, place,
                                       read_piece, word_alignment)
from nmt.inference.translator import CTranslate2Translator, DecodingOptions


def linked(links: dict[int, int], targets: int, sources: int) -> Alignment:
    """Target word t on source word links[t] (a word without a link: on none)."""
    return Alignment([[1.0 if links.get(t) == s else 0.0 for s in range(sources)] for t in range(targets)])


def test_read_piece_gives_the_prose_and_each_tag_with_the_words_it_covered() -> None:
    raw = 'Run <code>ls -l</code> <b>now</b>, &copy;&nbsp;<a href="/x">Tom</a>'
    marks = [Mark(4, 22, WHOLE, text="ls -l"), Mark(23, 26, OPEN, 0), Mark(29, 33, CLOSE, 0),
             Mark(35, 41, READ, text="©"), Mark(41, 47, READ, text="\xa0"), Mark(47, 60, OPEN, 1),
             Mark(63, 67, CLOSE, 1)]
    assert read_piece(raw, marks) == InlinePiece(
        "Run ls -l now, © Tom", [Tag("<code>ls -l</code>", "", 4, 9, whole=True), Tag("<b>", "</b>", 10, 13),
                                 Tag('<a href="/x">', "</a>", 17, 20)], {"©": "&copy;"})


def test_a_tag_goes_around_the_target_word_its_source_word_is_aligned_with() -> None:
    piece = InlinePiece("one two three.", [Tag("<b>", "</b>", 8, 13)])
    # words: one two three . -> tre due uno .
    assert place(piece, "tre due uno.", linked({0: 2, 1: 1, 2: 0, 3: 3}, 4, 4)) == ("<b>tre</b> due uno.",
                                                                                  [(0, 3), (6, 10)])
    assert place(piece, "tre due uno.")[0] == "tre due <b>uno</b>."  # without attention: the words in order


def test_nested_tags_stay_nested_and_side_by_side_ones_share_no_word() -> None:
    nested = InlinePiece("the old man", [Tag("<b>", "</b>", 4, 11), Tag("<i>", "</i>", 8, 11, parent=0)])
    # words: l ' uomo vecchio il; a mark between two words of a tag is taken with them
    assert place(nested, "l'uomo vecchio il", linked({0: 2, 2: 2, 3: 1, 4: 0}, 5, 3))[0] == \
        "<b><i>l'uomo</i> vecchio</b> il"
    siblings = InlinePiece("red green", [Tag("<b>", "</b>", 0, 3), Tag("<i>", "</i>", 4, 9)])
    # both target words attend most to "green", and "red" most to the first: <i> takes the second only
    aligned = Alignment([[0.4, 0.6], [0.0, 1.0]])
    assert place(siblings, "rosso verde", aligned)[0] == "<b>rosso</b> <i>verde</i>"


def test_a_tag_grows_onto_the_neighbours_that_attend_to_its_words_and_not_onto_far_ones() -> None:
    """"went" -> "è andato": "andato" attends most to it, "è" beside it too; "casa." attends most to it
    as well, but stands apart, and stays out."""
    piece = InlinePiece("He went home.", [Tag("<b>", "</b>", 3, 7)])
    aligned = Alignment([[1, 0, 0, 0], [0.2, 0.7, 0.1, 0], [0, 0.9, 0.1, 0], [0.1, 0.3, 0.6, 0], [0, 0.55, 0.45, 0],
                         [0, 0, 0.2, 0.8]])
    assert place(piece, "Lui è andato a casa.", aligned)[0] == "Lui <b>è andato</b> a casa."


def test_punctuation_stays_outside_unless_the_tag_covered_it() -> None:
    word = InlinePiece("Click here.", [Tag("<b>", "</b>", 6, 10)])
    assert place(word, "Clicca «qui».", Alignment([[1, 0], [0, 1]]))[0] == "Clicca «<b>qui</b>»."
    sentence = InlinePiece("Stop.", [Tag("<b>", "</b>", 0, 5)])
    assert place(sentence, "Fermo.", Alignment([[1]]))[0] == "<b>Fermo.</b>"


def test_a_whole_mark_replaces_its_words_and_the_words_are_escaped() -> None:
    piece = InlinePiece("Run ls & go", [Tag("<code>ls</code>", "", 4, 6, whole=True)], {"&": "&amp;"})
    aligned = Alignment([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    assert place(piece, "Esegui ls & <vai>", aligned, html_text) == ("Esegui <code>ls</code> &amp; &lt;vai&gt;",
                                                                    [(7, 22)])


def test_token_attention_is_summed_into_words() -> None:
    """Sub-word tokens of one word share its row (their mean) and column (their sum); each row sums to 1."""
    source, target = "unhappy cat", "gatto infelice"
    source_offsets = [(0, 2), (2, 7), (7, 11)]  # "un", "happy", " cat"
    target_offsets = [(0, 5), (5, 11), (11, 14)]  # "gatto", " infel", "ice"
    attention = [[0.1, 0.1, 0.8], [0.5, 0.4, 0.1], [0.3, 0.5, 0.2]]
    found = word_alignment(source, source_offsets, target, target_offsets, attention)
    torch.testing.assert_close(torch.tensor(found.weights), torch.tensor([[0.2, 0.8], [0.85, 0.15]]))


@pytest.fixture(scope="module")
def toy_engines(toy_translator, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The toy model behind both engines (an export of it for CTranslate2)."""
    folder = tmp_path_factory.mktemp("inline") / "ct2"
    config = dict(get_config(), d_model=32, num_layers=1, num_heads=2, d_ff=64, seq_len=toy_translator.seq_len)
    export.export_model(toy_translator.model, config, toy_translator.tok_src, toy_translator.tok_tgt, folder, "float32")
    return {"pytorch": toy_translator.translator(), "ctranslate2": CTranslate2Translator(Path(folder))}


@pytest.mark.parametrize("engine", ["pytorch", "ctranslate2"])
@pytest.mark.parametrize("fmt, text, expected", [
    ("html", '<p>one two <b class="k">three</b>.</p>', '<p><b class="k">tre</b> due uno.</p>'),
    ("html", "<p><i>four</i> five six seven.</p>", "<p>sette sei cinque <i>quattro</i>.</p>"),
    ("markdown", "one **two** three four.\n", "quattro tre **due** uno.\n"),
])
def test_both_engines_place_tags_by_the_models_attention(toy_engines: dict, engine: str, fmt: str, text: str,
                                                         expected: str) -> None:
    """The toy reverses the words, so the tag moves: the monotone fallback would leave it where it was."""
    translator = toy_engines[engine]
    assert translator.translate_document(text, fmt, DecodingOptions(beam_size=2), True) == (expected, 0)
    monotone = translate_document(text, fmt, lambda pieces: translator.translate_best(pieces, DecodingOptions()), "en")
    assert monotone != expected
