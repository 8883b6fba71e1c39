"""benchmarks/bench_terms.py: terms of each kind are drawn with the seed, absent from the corpus
where new; references are rewritten where the source word's linked word stood; a sentence is judged
in place when it is the free output with the word replaced or holds the term where the reference
does; and the whole benchmark runs on a tiny model trained with term_annotation, every term
present (the constraint's guarantee)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import bench_terms
from benchmarks.bench_terms import Term
from conftest import train_in_process
from nmt.corpora.terms import WordList, dice_table, renderings, words
from synthetic_data import tiny_corpus

PAIRS = [("Tom sees the cat.", "Tom vede il gatto."), ("Tom eats bread.", "Tom mangia pane."),
         ("The cat eats.", "Il gatto mangia."), ("The dog sees Tom.", "Il cane vede Tom."),
         ("The dog eats bread.", "Il cane mangia pane."), ("The cat sees the dog.", "Il gatto vede il cane.")] * 4


@pytest.fixture(scope="module")
def word_list() -> WordList:
    return WordList(renderings(dice_table(PAIRS)))


def test_terms_are_drawn_with_the_seed_and_new_names_are_new(word_list: WordList) -> None:
    taken = {w for pair in PAIRS for side in pair for w in words(side)}
    sources = [s for s, _ in PAIRS]
    terms = bench_terms.draw_terms(word_list, sources, taken, np.random.default_rng(5))
    assert terms == bench_terms.draw_terms(word_list, sources, taken, np.random.default_rng(5))
    assert Term("name", "Tom", "Tommaso") in terms
    products = [term for term in terms if term.kind == "product"]
    assert products and all(term.target.casefold() not in taken for term in products)
    for term in terms:
        if term.kind == "rare_sense":
            assert term.target not in word_list.renderings[term.source]


def test_references_are_rewritten_in_place_and_judged(word_list: WordList) -> None:
    terms = [Term("name", "Tom", "Tommaso"), Term("rare_sense", "cat", "ponte")]
    [row] = bench_terms.benchmark_rows([("Tom sees the cat.", "Tom vede il gatto.")], terms, word_list, tom=False)
    assert row.rewritten == "Tommaso vede il ponte." and row.terms == tuple(terms)
    assert bench_terms.benchmark_rows([("The cat sleeps.", "Dorme.")], terms, word_list, tom=False) == []
    free = "Tom vede il gatto."
    assert bench_terms.replaced_free(free, row, word_list) == "Tommaso vede il ponte."
    judged = bench_terms.judge(row, "Tommaso vede il ponte.", free, word_list)
    assert judged["present"] == judged["in_place"] == judged["in_place_replaced"] == 2 and judged["source_left"] == 0
    moved = bench_terms.judge(row, "Tom vede il gatto. Tommaso ponte.", free, word_list)
    assert moved["present"] == 2 and moved["in_place"] == 0 and moved["source_left"] == 1 and moved["longer"] == 1
    [tom_row] = bench_terms.benchmark_rows([("Tom and Tom.", "Tom e Tom."), ("Mary.", "Maria.")], [], word_list,
                                           tom=True)
    assert tom_row.rewritten == "Tommaso e Tommaso."


def test_the_benchmark_runs_on_a_tiny_model_trained_with_annotations(tmp_path, capsys) -> None:
    data = tiny_corpus(tmp_path / "data", train=400, validation=40, test=40)
    run = train_in_process(["--datasource", str(data), "--preset", "tiny", "--joint_vocab", "true",
                            "--tokenizer_type", "bpe", "--vocab_size", "200", "--term_annotation", "0.5",
                            "--max_steps", "40", "--lr", "1e-2", "--confidence_sentences", "0",
                            "--model_folder", str(tmp_path / "w"), "--runs_folder", str(tmp_path / "r"),
                            "--store_folder", str(tmp_path / "s")])
    assert run.code == 0, run.stderr
    assert bench_terms.main(["--model_folder", str(tmp_path / "w"), "--datasource", str(data), "--split", "validation",
                             "--store_folder", str(tmp_path / "s"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["annotated"] and result["word_list"] and result["sentences"] > 0
    assert result["present"] == result["term_count"] >= result["sentences"]  # the guarantee
    assert {term["kind"] for term in result["terms"]} <= {"product", "rare_sense"}
    assert 0 <= result["in_place"] <= result["term_count"] and 0 <= result["bleu_glossary"]["bleu"] <= 100
