"""Corpus scores of detokenized translations against raw references.

BLEU and chrF come from sacrebleu (so they match the `sacrebleu` command on the same text);
CER and WER from torchmetrics. Nothing here tokenizes: sacrebleu applies its own standard
tokenization, which is what makes scores comparable across systems.

- `corpus_scores`: the standard scores, every line against its own reference (`nrefs:1`), as other
  toolkits report them.
- `grouped_scores`: BLEU and chrF with repeated source sentences scored once, against all their
  references (sacreBLEU's several reference streams, `nrefs:var`). tatoeba's validation split holds
  one English sentence 24 times with 24 Italian references: line by line it weighs 24 times as
  much as any other sentence, and its one translation can match at most one of them per line.
- `improves`: whether a validation metric's value beats the best so far, which way each improves
  (the best checkpoint and early stopping both ask it).
"""
from __future__ import annotations

from typing import Any, Sequence

import sacrebleu


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float | str]:
    """BLEU, chrF (0-100), CER and WER (fractions), and the sacreBLEU signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        raise ValueError("no sentences to score")
    # Imported here: torchmetrics costs ~0.4 s to import, which every train.py and translate.py start
    # would pay for a function only validation and evaluate.py call.
    from torchmetrics.functional.text import char_error_rate, word_error_rate
    hypotheses, references = list(hypotheses), list(references)
    bleu_metric = sacrebleu.metrics.BLEU()
    chrf_metric = sacrebleu.metrics.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [references])
    chrf = chrf_metric.corpus_score(hypotheses, [references])
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "cer": float(char_error_rate(hypotheses, references)),
        "wer": float(word_error_rate(hypotheses, references)),
        "bleu_text": str(bleu),
        "bleu_signature": str(bleu_metric.get_signature()),
        "chrf_signature": str(chrf_metric.get_signature()),
    }


def group_by_source(sources: Sequence[str], hypotheses: Sequence[str],
                    references: Sequence[str]) -> tuple[list[str], list[list[str | None]]]:
    """Each distinct source once, in order of first appearance: the hypothesis of its first line, and
    sacreBLEU's reference streams (stream k holds every source's k-th reference, None where a source
    has fewer)."""
    if not len(sources) == len(hypotheses) == len(references):
        raise ValueError(f"{len(sources)} sources, {len(hypotheses)} hypotheses, {len(references)} references")
    grouped: dict[str, tuple[str, list[str]]] = {}
    for source, hypothesis, reference in zip(sources, hypotheses, references):
        grouped.setdefault(source, (hypothesis, []))[1].append(reference)
    groups = list(grouped.values())
    depth = max((len(refs) for _, refs in groups), default=0)
    streams = [[refs[k] if k < len(refs) else None for _, refs in groups] for k in range(depth)]
    return [hypothesis for hypothesis, _ in groups], streams


def grouped_scores(sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """BLEU and chrF with each distinct source scored once against all its references; how many
    distinct sources and references there were, and the signatures."""
    if not sources:
        raise ValueError("no sentences to score")
    unique, streams = group_by_source(sources, hypotheses, references)
    bleu_metric, chrf_metric = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu = bleu_metric.corpus_score(unique, streams)
    chrf = chrf_metric.corpus_score(unique, streams)
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "sources": len(unique),
        "references": len(references),
        "bleu_text": str(bleu),
        "bleu_signature": str(bleu_metric.get_signature()),
        "chrf_signature": str(chrf_metric.get_signature()),
    }


# Which way each validation metric improves; `--best_metric` is one of them.
HIGHER_IS_BETTER = {"bleu": True, "chrf": True, "loss": False}


def improves(metric: str, value: float, best: float | None) -> bool:
    """Whether `value` of `metric` beats `best` (None: nothing yet)."""
    return best is None or (value > best if HIGHER_IS_BETTER[metric] else value < best)
