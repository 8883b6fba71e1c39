"""scoring.py: BLEU and chrF are exactly sacrebleu's; CER and WER are edit-distance rates; repeated
sources grouped equal sacreBLEU's own multi-reference score."""
from __future__ import annotations

from typing import Sequence

import pytest
import sacrebleu

from nmt.inference.scoring import corpus_scores, group_by_source, grouped_scores, improves

REFERENCES = [
    "Il gatto è sul tavolo.",
    "Non so di cosa stai parlando!",
    "Dov'è la stazione?",
    "Amo questa parte dell'Australia.",
    "Tom non è qui; è fuori, in giardino.",
]
HYPOTHESES = [
    "Il gatto è sul tavolo.",
    "Non so cosa stai dicendo!",
    "Dove è la stazione?",
    "Amo questa parte d'Australia.",
    "Tom è fuori in giardino.",
]


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance, the textbook dynamic programme (independent of torchmetrics)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def test_bleu_and_chrf_equal_sacrebleu() -> None:
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert scores["bleu"] == bleu.score
    assert scores["chrf"] == chrf.score
    assert 10 < scores["bleu"] < 90  # a partly right corpus: neither trivial value
    assert scores["bleu_text"].startswith(f"BLEU = {bleu.score:.2f}")
    assert "nrefs:1" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert "nrefs:1" in scores["chrf_signature"]


def test_cer_and_wer_are_corpus_edit_rates() -> None:
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    char_edits = sum(edit_distance(h, r) for h, r in zip(HYPOTHESES, REFERENCES))
    word_edits = sum(edit_distance(h.split(), r.split()) for h, r in zip(HYPOTHESES, REFERENCES))
    assert scores["cer"] == pytest.approx(char_edits / sum(map(len, REFERENCES)))
    assert scores["wer"] == pytest.approx(word_edits / sum(len(r.split()) for r in REFERENCES))


def test_known_pairs() -> None:
    one = corpus_scores(["il gatto nero"], ["il gatto bianco"])
    assert one["wer"] == pytest.approx(1 / 3)
    assert one["cer"] == pytest.approx(edit_distance("nero", "bianco") / len("il gatto bianco"))
    perfect = corpus_scores(REFERENCES, REFERENCES)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    assert perfect["cer"] == 0.0 and perfect["wer"] == 0.0
    nothing = corpus_scores(["", "xyz"], ["Il gatto.", "Il cane."])
    assert nothing["bleu"] == 0.0 and nothing["wer"] == 1.0


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        corpus_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no sentences"):
        corpus_scores([], [])


def test_repeated_sources_scored_once_equal_sacrebleus_multi_reference_score() -> None:
    # "Dov'è la stazione?" asked three times with three references, "Il gatto" twice, one single line.
    sources = ["Where is the station?", "The cat.", "Where is the station?", "I know.", "The cat.",
               "Where is the station?"]
    hypotheses = ["Dov'è la stazione?", "Il gatto.", "Dov'è la stazione?", "Lo so.", "Il gatto.",
                  "Dov'è la stazione?"]
    references = ["Dove si trova la stazione?", "Il gatto.", "Dov'è la stazione?", "Io lo so.", "La gatta.",
                  "Dov'è la fermata?"]
    unique, streams = group_by_source(sources, hypotheses, references)
    assert unique == ["Dov'è la stazione?", "Il gatto.", "Lo so."]
    by_hand = [["Dove si trova la stazione?", "Il gatto.", "Io lo so."],
               ["Dov'è la stazione?", "La gatta.", None],
               ["Dov'è la fermata?", None, None]]
    assert streams == by_hand
    scores = grouped_scores(sources, hypotheses, references)
    bleu = sacrebleu.metrics.BLEU()
    expected = bleu.corpus_score(unique, by_hand)
    assert scores["bleu"] == expected.score and scores["bleu_text"] == str(expected)
    assert scores["chrf"] == sacrebleu.metrics.CHRF().corpus_score(unique, by_hand).score
    assert "nrefs:var" in scores["bleu_signature"]
    assert (scores["sources"], scores["references"]) == (3, 6)
    # The station, right against one of its references, counts once: grouped BLEU is above line-by-line BLEU.
    assert scores["bleu"] > corpus_scores(hypotheses, references)["bleu"]


def test_improves_knows_which_way_each_metric_goes() -> None:
    assert improves("bleu", 30.1, 30.0) and not improves("bleu", 30.0, 30.0) and not improves("chrf", 49.0, 50.0)
    assert improves("loss", 1.9, 2.0) and not improves("loss", 2.1, 2.0)
    assert all(improves(metric, 0.0, None) for metric in ("bleu", "chrf", "loss"))  # nothing to beat yet
