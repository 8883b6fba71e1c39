"""glossary.py: a TSV glossary is read or refused in one line per bad row; source terms are found as
whole words in any case, the longest first; target terms become the ids the model writes for them in
running text, with the project's BPE and WordLevel tokenizers; a term the vocabulary cannot spell is
refused by name. A term forbids what it replaces (its copy, its usual renderings), never its own
words; a model trained with term_annotation reads the matches annotated, on either engine, and
CTranslate2 refuses a glossary for any other model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from config import PRESETS, TERM_TAGS, get_config
from model import build_transformer
from nmt.corpora.terms import annotated_ids
from nmt.inference.glossary import (Glossary, GlossaryError, check_pairs, config_glossary, read_glossary,
                                    term_alternatives, term_ids)
from nmt.corpora.tokenizer import EOS_ID, UNK_ID, encode_ids, train_tokenizer
from nmt.inference.translator import CTranslate2Translator, DecodingOptions, TorchTranslator, TranslatorError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def italian() -> list[str]:
    with open(ROOT / "data" / "tatoeba" / "en-it" / "train.jsonl", encoding="utf-8") as rows:
        return [json.loads(row)["translation"]["it"] for _, row in zip(range(3000), rows)]


@pytest.fixture(scope="module", params=["bpe", "wordlevel"])
def tok_tgt(request, italian: list[str]):
    return train_tokenizer(italian, request.param, 2000, 2)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "glossary.tsv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_reads_a_tsv_glossary(tmp_path: Path) -> None:
    path = write(tmp_path, "cat\tgatto\n\nblack cat \t gatto nero\ncat\tgatto\nNew York\tNuova York\n")
    # outer whitespace trimmed, blank lines skipped, the same pair twice kept once
    assert read_glossary(path, 10) == [("cat", "gatto"), ("black cat", "gatto nero"), ("New York", "Nuova York")]


@pytest.mark.parametrize("text, message", [
    ("cat\tgatto\ndog\n", r"glossary.tsv:2: expected 2 tab-separated columns .* found 1"),
    ("cat\tgatto\tmicio\n", r"glossary.tsv:1: expected 2 .* found 3"),
    ("cat\t \n", r"glossary.tsv:1: empty target term"),
    ("\tgatto\n", r"glossary.tsv:1: empty source term"),
    ("cat\tgatto\nCAT\tmicio\n", r"glossary.tsv:2: source term 'CAT' already has the target 'gatto' \(.*:1\)"),
    ("a\tb\nc\td\ne\tf\n", r"3 terms, more than the 2 allowed"),
    (b"cat\tgatt\xff\n", r"not UTF-8 text \(byte 8\)"),
    ("x" * 201 + "\ty\n", r"glossary.tsv:1: source term longer than 200 characters"),
])
def test_a_bad_glossary_is_one_line_naming_the_row(tmp_path: Path, text: str | bytes, message: str) -> None:
    with pytest.raises(GlossaryError, match=message) as error:
        read_glossary(write(tmp_path, text), 2)
    assert "\n" not in str(error.value)


def test_an_unreadable_glossary_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GlossaryError, match=r"^glossary .*missing.tsv: cannot read it: No such file"):
        read_glossary(tmp_path / "missing.tsv", 10)


def test_pairs_from_a_request_are_checked_alike() -> None:
    assert check_pairs([["cat", "gatto"]], 5) == [("cat", "gatto")]
    for pairs, message in (([["cat"]], "glossary entry 1: expected a pair"), ([["cat", 3]], "entry 1: expected"),
                           (["cat\tgatto"], "entry 1: expected"), ([["a", "b"], ["", "c"]], "entry 2: empty source")):
        with pytest.raises(GlossaryError, match=message):
            check_pairs(pairs, 5)


def test_source_terms_are_whole_words_in_any_case_longest_first(tok_tgt) -> None:
    pairs = [("cat", "gatto"), ("black cat", "gatto nero"), ("new", "nuovo"), ("new york", "nuova"), ("C++", "nero")]
    glossary = Glossary.build(pairs, tok_tgt)
    found = glossary.terms_in("The BLACK  cat saw a Cat in New\tYork, not a bobcat or cats; C++ too.")
    assert found == [("BLACK  cat", "gatto nero"), ("Cat", "gatto"), ("New\tYork", "nuova"), ("C++", "nero")]
    assert glossary.terms_in("A cat, a cat and a cat.") == [("cat", "gatto")]  # each target once
    assert glossary.terms_in("A bobcat, then a black cat.") == [("black cat", "gatto nero")]
    assert glossary.terms_in("Cat!") == [("Cat", "gatto")]
    assert glossary.terms_in("category") == [] and Glossary.build([], tok_tgt).constraints("a cat") == []


def test_target_terms_are_the_ids_the_model_writes_in_running_text(tok_tgt) -> None:
    """After a space, an elision, an opening bracket or quote: one of the term's spellings is there."""
    glossary = Glossary.build([("black cat", "gatto nero"), ("house", "casa")], tok_tgt)
    assert glossary.constraints("The house and the black cat.") == [term_alternatives(tok_tgt, "casa"),
                                                                     term_alternatives(tok_tgt, "gatto nero")]
    for term in ("gatto nero", "casa", "Tom"):
        alternatives = term_alternatives(tok_tgt, term)
        assert alternatives[0] == term_ids(tok_tgt, term) and tok_tgt.decode(alternatives[0]) == term
        for text in (f"{term} è qui.", f"Ecco {term}, di nuovo.", f"dell'{term}", f"la ({term})", f'"{term}"'):
            encoded = encode_ids(tok_tgt, text)
            if UNK_ID in encoded:  # WordLevel knows no "casa" without its "▁"
                continue
            assert any(encoded[i:i + len(ids)] == ids for ids in alternatives for i in range(len(encoded))), text
    # A glued spelling starts with its bracket or quote: the end of a longer word does not count.
    assert all(len(ids) > 1 for ids in term_alternatives(tok_tgt, "casa")[1:])


def test_a_term_the_vocabulary_cannot_spell_is_refused_by_name(tok_tgt) -> None:
    unknown = "Zxqwvy" if tok_tgt.get_vocab().get("▁Zxqwvy") is None else pytest.fail("premise")
    if tok_tgt.encode(unknown, add_special_tokens=False).ids.count(0):  # WordLevel: an unknown word is [UNK]
        with pytest.raises(GlossaryError, match=r"the target term 'Zxqwvy' cannot be spelled .* 'Zxqwvy' is unknown"):
            Glossary.build([("odd", unknown)], tok_tgt)
    else:  # BPE spells any word from its letters
        assert Glossary.build([("odd", unknown)], tok_tgt).constraints("odd") != [[0]]
    try:  # a typed special token is text, never the token that ends a sentence
        assert EOS_ID not in term_ids(tok_tgt, "casa [EOS]")
    except GlossaryError as error:  # WordLevel: its pieces are words it does not know
        assert "cannot be spelled by the model's vocabulary" in str(error)
    with pytest.raises(GlossaryError, match=r"is \d+ tokens long, more than the 3 allowed"):
        term_ids(tok_tgt, "il gatto nero è qui", max_term_tokens=3)


def test_a_glossary_saved_with_a_byte_order_mark_keeps_its_first_term(tmp_path: Path) -> None:
    """Excel and Windows editors write U+FEFF first: it is no part of the first source term."""
    path = write(tmp_path, "\ufeffcat\tgatto\ndog\tcane\n")
    assert read_glossary(path, 10) == [("cat", "gatto"), ("dog", "cane")]
    with pytest.raises(GlossaryError, match=r"glossary .*glossary.tsv is not UTF-8 text \(byte 0\): it is UTF-16"):
        read_glossary(write(tmp_path, "cat\tgatto\n".encode("utf-16")), 10)


def test_config_glossary_reads_the_configs_file(tmp_path: Path) -> None:
    path = write(tmp_path, "cat\tgatto\ndog\tcane\n")
    assert config_glossary({"glossary": str(path), "glossary_max_terms": 5}) == [("cat", "gatto"), ("dog", "cane")]
    assert config_glossary({"glossary": "", "glossary_max_terms": 5}) is None
    with pytest.raises(GlossaryError, match="more than the 1 allowed"):
        config_glossary({"glossary": str(path), "glossary_max_terms": 1})


# ---------------------------------------------------------------------------- what a term replaces

RENDERINGS = {"tom": {"tom": 0.99}, "cat": {"gatto": 0.8, "gatta": 0.45}, "black": {"nero": 0.7}}


def test_a_term_forbids_its_copy_and_usual_renderings_but_never_its_own_words(tok_tgt) -> None:
    glossary = Glossary.build([("Tom", "Maria"), ("cat", "cane"), ("black cat", "gatto nero"), ("Mary", "Mary casa")],
                              tok_tgt, renderings=RENDERINGS)
    assert glossary.forbidden_words("Tom saw a cat.") == ["Tom", "tom", "cat", "Cat", "gatto", "Gatto"]
    assert glossary.forbidden_words("A black cat.") == ["black", "Black", "cat", "Cat"]  # gatto, nero: its own
    assert glossary.forbidden_words("Mary sings.") == [] and glossary.forbidden_words("Nobody.") == []
    outside = Glossary.build([("black cat", "casa")], tok_tgt, renderings=RENDERINGS)
    assert outside.forbidden_words("The black cat saw a cat.") == ["black", "Black", "nero", "Nero"]  # cat: also outside
    assert Glossary.build([("cat", "cane")], tok_tgt).forbidden_words("The cat.") == ["cat", "Cat"]  # no word list
    constraints = glossary.constraints("Tom saw a cat.")
    assert list(constraints) == [glossary.target_ids["Maria"], glossary.target_ids["cane"]]
    spelled = [ids for word in ("Tom", "tom", "cat", "Cat", "gatto", "Gatto") for ids in glossary.spelled(word)]
    assert constraints.forbidden == spelled and encode_ids(tok_tgt, "gatto") in constraints.forbidden


def test_every_match_is_annotated_for_a_model_trained_with_term_annotation(italian: list[str]) -> None:
    """A joint tokenizer with config.TERM_TAGS and a model config with term_annotation: the source
    is annotated at each match, as training annotates (terms.annotated_ids); without a glossary, or
    for a model trained without term_annotation, it is plain."""
    tok = train_tokenizer(italian + ["Tom saw the cat and Tom ran."], "bpe", 2000, 2, tags=TERM_TAGS)
    model = build_transformer(tok.get_vocab_size(), tok.get_vocab_size(), 64, 64, d_model=16, N=1, h=2, d_ff=32)
    config = {**get_config(), **PRESETS["cpu"], "seq_len": 64}
    annotating = TorchTranslator(model, tok, tok, {**config, "term_annotation": 0.25})
    plain_model = TorchTranslator(model, tok, tok, config)
    glossary = annotating.build_glossary([("Tom", "Tommaso")])
    sentence = "Tom saw the cat and Tom ran."
    tags = tuple(tok.token_to_id(tag) for tag in TERM_TAGS)
    [annotated] = annotating.encode([sentence], "", glossary)
    assert annotated.ids == annotated_ids(tok, [sentence], [[(0, 3, "Tommaso"), (20, 23, "Tommaso")]], tags)[0]
    assert annotated.ids.count(tags[0]) == 2 and annotated.tokens[0] == "<term>"
    assert annotating.encode([sentence], "")[0].ids == plain_model.encode([sentence], "", glossary)[0].ids \
        == encode_ids(tok, sentence)
    plan, sources = annotating.segment_lines([sentence], "", False, glossary)
    assert sources[0].ids == annotated.ids


def test_ctranslate2_takes_a_glossary_only_for_a_model_trained_with_annotations(tok_tgt) -> None:
    """The annotation is only input text, so CTranslate2 takes a glossary for a model trained with
    term_annotation, and constrains nothing; for another it refuses in one line."""
    ct2 = CTranslate2Translator.__new__(CTranslate2Translator)  # the rules need no model
    ct2.tok_tgt, ct2.renderings, ct2.term_tags = tok_tgt, None, (4, 5, 6)
    glossary = ct2.build_glossary([("cat", "gatto")])
    assert glossary.terms_in("The cat.") == [("cat", "gatto")]
    assert ct2.constraints(["The cat."], DecodingOptions().with_glossary(glossary, 10)[0]) is None
    ct2.term_tags = None
    with pytest.raises(TranslatorError, match=r"^the ctranslate2 engine has no constrained search, and this model "
                                              r"was not trained with --term_annotation.*\(--engine pytorch\)$"):
        ct2.build_glossary([("cat", "gatto")])


def test_an_exported_model_trained_with_annotations_takes_a_glossary_on_ctranslate2(tmp_path: Path) -> None:
    """A tiny run with term_annotation, exported: CTranslate2 reads the glossary's matches annotated
    (its source tokens hold the tags) and translates; the PyTorch engine writes the term."""
    import export
    from conftest import train_in_process
    from synthetic_data import tiny_corpus
    data = tiny_corpus(tmp_path / "data", train=300, validation=20, test=20)
    run = train_in_process(["--datasource", str(data), "--preset", "tiny", "--joint_vocab", "true", "--tokenizer_type",
                            "bpe", "--vocab_size", "200", "--term_annotation", "0.5", "--max_steps", "20",
                            "--confidence_sentences", "0", "--model_folder", str(tmp_path / "w"),
                            "--runs_folder", str(tmp_path / "r"), "--store_folder", str(tmp_path / "s")])
    assert run.code == 0, run.stderr
    [checkpoint] = sorted((tmp_path / "w").glob("*/ckpt_*.pt"))[-1:]
    assert export.main(["--checkpoint", str(checkpoint), "--quantization", "float32", "--output",
                        str(tmp_path / "ct2")]) == 0
    sentence, pairs = "The cat sees the dog.", [("cat", "pesce")]
    for translator in (CTranslate2Translator(tmp_path / "ct2"), TorchTranslator.load(checkpoint, checkpoint.parent,
                                                                                     torch.device("cpu"))):
        glossary = translator.build_glossary(pairs)
        assert translator.encode([sentence], "", glossary)[0].tokens[1] == "<term>"
        options, _ = DecodingOptions(beam_size=2).with_glossary(glossary, 4)
        [[found]] = translator.translate([sentence], options)
        assert isinstance(found.text, str)
        if translator.engine == "pytorch":
            assert "pesce" in found.text
