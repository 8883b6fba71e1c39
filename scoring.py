"""Corpus scores of detokenized translations against raw references.

BLEU and chrF come from sacrebleu (so they match the `sacrebleu` command on the same text);
CER and WER from torchmetrics. Nothing here tokenizes: sacrebleu applies its own standard
tokenization, which is what makes scores comparable across systems.
"""
from __future__ import annotations

from typing import Sequence

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
