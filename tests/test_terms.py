"""terms.py: the word list links each target word to its best source word by Dice; training pairs
are annotated with linked words in place (some replaced by another word, in the annotation and the
target alike), seeded; annotated ids are the running text's ids with the tags where the terms
stand; the option needs a joint vocabulary."""
from __future__ import annotations

import numpy as np
import pytest

from config import TERM_TAGS, ConfigError, PRESETS, get_config, validate_config
from nmt.corpora.terms import (WordList, annotated_ids, dice_table, read_renderings, renderings,
                               save_renderings)
from nmt.corpora.tokenizer import encode_texts, train_tokenizer

PAIRS = [("The cat sleeps.", "Il gatto dorme."), ("A cat eats.", "Un gatto mangia."),
         ("The cat eats.", "Il gatto mangia."), ("The dog sleeps.", "Il cane dorme."),
         ("A dog eats.", "Un cane mangia."), ("The dog eats.", "Il cane mangia.")] * 2


def test_each_target_word_renders_its_best_source_word() -> None:
    table = dice_table(PAIRS)
    assert table["cat"]["gatto"] == pytest.approx(1.0) and table["dog"]["cane"] == pytest.approx(1.0)
    assert table["the"]["il"] == pytest.approx(1.0)  # "the" and "il" always together here
    assert "cane" not in table["cat"]  # never together
    rendered = renderings(table)
    assert rendered["cat"] == {"gatto": pytest.approx(1.0)} and rendered["dog"] == {"cane": pytest.approx(1.0)}
    assert "gatto" not in rendered["the"]  # "the" is in more pairs without gatto: cat is gatto's best
    assert dice_table([]) == {}


def test_a_training_pair_is_annotated_in_place_seeded() -> None:
    words = WordList(renderings(dice_table(PAIRS)))
    [(cat, gatto)] = [link for link in words.links("The cat sleeps.", "Il gatto dorme.")
                      if link[0].group() == "cat"]
    assert gatto.group() == "gatto"
    found = [words.annotation("The cat sleeps.", "Il gatto dorme.", np.random.default_rng(seed)) for seed in range(40)]
    assert found == [words.annotation("The cat sleeps.", "Il gatto dorme.", np.random.default_rng(seed))
                     for seed in range(40)]
    for spans, target in found:
        assert spans and all("The cat sleeps."[start:end] in ("The", "cat", "sleeps") for start, end, _ in spans)
        for start, end, term in spans:  # the target term stands where the linked word stood, in the target
            assert term in target.split(" ") or f"{term}." in target.split(" ")
    substituted = [target for _, target in found if target != "Il gatto dorme."]
    assert 5 <= len(substituted) <= 35, "about half the terms are replaced by another word"
    assert words.annotation("No link here.", "Niente.", np.random.default_rng(0)) == ([], "Niente.")


def test_annotated_ids_are_running_text_with_tags_where_the_terms_stand() -> None:
    tok = train_tokenizer([s for pair in PAIRS for s in pair] + ["Tom's Tommaso (Tom)"], "bpe", 300, 1,
                          tags=TERM_TAGS)
    tags = tuple(tok.token_to_id(tag) for tag in TERM_TAGS)
    # (a term glued after a bracket is tokenized as a word of its own: "▁cat", not running text's "cat")
    for text, spans, running in (("The cat sleeps.", [(4, 7, "gatto")], True), ("Tom's cat.", [(0, 3, "Tommaso")], True),
                                 ("A cat (cat) eats.", [(2, 5, "gatto"), (7, 10, "gatto")], False)):
        [ids] = annotated_ids(tok, [text], [spans], tags)
        # with the annotations taken out, the ids are the running text's
        plain, inside = [], 0
        for token in ids:
            inside = {tags[0]: 1, tags[1]: 2, tags[2]: 0}.get(token, inside)
            if token not in tags and inside != 2:
                plain.append(token)
        assert (plain == encode_texts(tok, [text])[0].ids) == running
        assert ids.count(tags[0]) == ids.count(tags[1]) == ids.count(tags[2]) == len(spans)
        term = ids[ids.index(tags[1]) + 1:ids.index(tags[2])]
        assert tok.decode(term) == spans[0][2]
    assert annotated_ids(tok, ["The cat."], [[]], tags) == [encode_texts(tok, ["The cat."])[0].ids]


def test_renderings_are_stored_beside_a_run(tmp_path) -> None:
    save_renderings(tmp_path, {"cat": {"gatto": 0.8}})
    assert read_renderings(tmp_path) == {"cat": {"gatto": 0.8}}
    (tmp_path / "term_renderings.json").write_text("[1, 2]", encoding="utf-8")
    assert read_renderings(tmp_path) is None and read_renderings(tmp_path / "missing") is None


def test_term_annotation_needs_a_joint_vocabulary() -> None:
    config = {**get_config(), "term_annotation": 0.25}
    with pytest.raises(ConfigError, match=r"^--term_annotation needs --joint_vocab true: .*"):
        validate_config(config)
    validate_config({**config, "joint_vocab": True})
    validate_config({**get_config(), **PRESETS["cpu"], "term_annotation": 0.25})
