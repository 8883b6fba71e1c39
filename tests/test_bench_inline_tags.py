"""benchmarks/bench_inline_tags.py on the toy model (number words, their order reversed): the word
list's translation of each word, the word it wraps, and both ways of translating the tagged
sentences: placed by attention, the text is the plain translation and the tag is around the word's
translation; split at the tags, the pieces translated apart lose the reversal."""
from __future__ import annotations

import re

import pytest

from benchmarks import bench_inline_tags
from conftest import TOY_SOURCE, TOY_TARGET
from nmt.inference.translator import DecodingOptions


def test_the_word_to_wrap_is_the_one_of_highest_dice_whose_translation_the_output_holds() -> None:
    best = {"cat": ("gatto", 0.9), "black": ("nero", 0.8), "the": ("il", 0.95)}
    match, target = bench_inline_tags.chosen_word("The black cat sleeps.", "Il gatto nero dorme.", best)
    assert (match.group(), target) == ("cat", "gatto")  # "the" -> "il" is too short, "cat" has the higher Dice
    assert bench_inline_tags.chosen_word("The black cat.", "Il cane.", best) is None


def test_bench_inline_tags_on_the_toy_places_by_attention_and_splitting_loses_the_order(toy_translator) -> None:
    translator = toy_translator.translator()
    test = toy_translator.pairs(30, seed=33)
    result = bench_inline_tags.measure(translator, toy_translator.train_pairs, test, DecodingOptions(beam_size=2))
    assert bench_inline_tags.translations_of(
        bench_inline_tags.word_list(toy_translator.train_pairs)) == {s: (t, 1.0) for s, t in zip(TOY_SOURCE, TOY_TARGET)}
    assert result["tagged_sentences"] == 30
    attention, split = result["attention"], result["split"]
    assert attention["bleu_against_plain"] == pytest.approx(100.0)  # the model got the same prose: the same translation
    assert attention["hold_the_translation"] >= 28 and attention["exact_rate"] >= 0.9
    assert split["bleu_against_plain"] < 60 and split["bleu"] < attention["bleu"]
    assert all(re.fullmatch(r"[a-z ]*<b>[a-z]+</b>[a-z .]*", example["source"]) for example in result["examples"])
    assert "placed by attention" in bench_inline_tags.table({**result, "command": "x", "model": "toy",
                                                             "data": "toy", "beam": 2})
