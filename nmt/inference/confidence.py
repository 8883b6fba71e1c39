"""Confidence: the probability that a translation is good, from the model's own view of it.

A hypothesis's features (decoding.Hypothesis), none touched by the length or brevity penalty: its
mean token log-probability (log_prob / length), its least likely token's log-probability, and
the logarithm of its length in tokens (both counting [EOS] when it ended). A logistic regression
on the standardised features (`Calibrator`) maps them to a probability in [0, 1]. It is fitted
(`fit_calibrator`) on the validation split's best hypotheses against "sentence chrF >= threshold"
(sacrebleu's sentence chrF against the reference, or the best of several), by L-BFGS in float64
with a small L2 penalty, so the same data always gives the same model. The weights of the two
log-probability features are fitted as softplus(u) > 0: at a given length the probability rises
with the model's score, never falls, whatever the data. A calibrator is plain JSON-able data
(`to_dict`, `from_dict`), stored in a checkpoint or beside an exported model.

Where a calibrator lives: `fit_on_pairs` translates a split's distinct sources (with whatever
translator the caller gives) and fits one on them; train.py does so at the end of training and
`evaluate.py --fit_confidence` on a finished model, and `save_calibrator` writes it, with the
checkpoint it was fitted on, as CONFIDENCE_FILE beside the run's checkpoints, where every
checkpoint of the run finds it (`read_calibrator`); export.py copies it into project.json.

`confidence_report` measures one on a test set: Spearman's correlation of the probabilities with
sentence chrF, the mean chrF of the lowest-scored 10% against the rest's, and the expected
calibration error (10 equal-width bins, weighted by their share of sentences).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import sacrebleu
import torch

from nmt.atomic_files import atomic_write_bytes
from nmt.diagnostics import first_line
from nmt.text_files import TextFileError, read_text

FEATURES = ("mean_log_prob", "lowest_log_prob", "log_length")
MONOTONE = 2  # the first two features get weights > 0
L2_PENALTY = 1e-3
MIN_SENTENCES = 20
CONFIDENCE_FILE = "confidence.json"  # beside a run's checkpoints


class CalibrationError(ValueError):
    """Data a calibrator cannot be fitted on, or stored data that is not a calibrator; one line."""


def features(log_prob: float, length: int, lowest: float) -> list[float]:
    """The calibrator's features of a hypothesis with these decoding.Hypothesis values."""
    length = max(length, 1)
    return [log_prob / length, lowest, math.log(length)]


def sentence_chrfs(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
    """sacrebleu's sentence chrF (0-100) of each hypothesis against its references."""
    if len(hypotheses) != len(references):
        raise CalibrationError(f"{len(hypotheses)} hypotheses for {len(references)} reference lists")
    return [sacrebleu.sentence_chrf(hypothesis, list(refs)).score for hypothesis, refs in zip(hypotheses, references)]


@dataclass(frozen=True)
class Calibrator:
    """p(good) = sigmoid(bias + sum_i weight_i (x_i - mean_i) / scale_i) over FEATURES; good means
    sentence chrF >= `threshold`, as measured on `sentences` validation sentences."""

    mean: list[float]
    scale: list[float]
    weights: list[float]
    bias: float
    threshold: float
    sentences: int
    metric: str = "chrF"

    def probabilities(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """p(good) for each row of `features`."""
        if not rows:
            return []
        x = (torch.tensor(rows, dtype=torch.float64) - torch.tensor(self.mean, dtype=torch.float64)) \
            / torch.tensor(self.scale, dtype=torch.float64)
        return torch.sigmoid(x @ torch.tensor(self.weights, dtype=torch.float64) + self.bias).tolist()

    def probability(self, log_prob: float, length: int, lowest: float) -> float:
        """p(good) of one hypothesis (decoding.Hypothesis's log_prob, length, lowest)."""
        return self.probabilities([features(log_prob, length, lowest)])[0]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "logistic", "features": list(FEATURES), **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> "Calibrator":
        """A calibrator from `to_dict`'s data; CalibrationError in one line for anything else."""
        try:
            if data["kind"] != "logistic" or list(data["features"]) != list(FEATURES):
                raise ValueError(f"kind {data['kind']!r} over {data['features']}")
            calibrator = cls([float(v) for v in data["mean"]], [float(v) for v in data["scale"]],
                             [float(v) for v in data["weights"]], float(data["bias"]), float(data["threshold"]),
                             int(data["sentences"]), str(data.get("metric", "chrF")))
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            detail = f"it has no {error.args[0]!r}" if isinstance(error, KeyError) else first_line(error)
            raise CalibrationError(f"not a stored confidence calibrator: {detail}") from None
        numbers = [*calibrator.mean, *calibrator.scale, *calibrator.weights, calibrator.bias, calibrator.threshold]
        if not all(len(part) == len(FEATURES) for part in (calibrator.mean, calibrator.scale, calibrator.weights)) \
                or not all(map(math.isfinite, numbers)) or min(calibrator.scale) <= 0 \
                or min(calibrator.weights[:MONOTONE]) < 0:
            raise CalibrationError("not a stored confidence calibrator: malformed numbers")
        return calibrator


def fit_calibrator(rows: Sequence[Sequence[float]], chrfs: Sequence[float], threshold: float) -> Calibrator:
    """A calibrator fitted on `rows` of features against chrfs[i] >= threshold. Raises
    CalibrationError when there are fewer than MIN_SENTENCES sentences or only one outcome."""
    if len(rows) != len(chrfs):
        raise CalibrationError(f"{len(rows)} feature rows for {len(chrfs)} chrF scores")
    if len(rows) < MIN_SENTENCES:
        raise CalibrationError(f"calibration needs at least {MIN_SENTENCES} sentences, got {len(rows)}")
    good = torch.tensor([score >= threshold for score in chrfs], dtype=torch.float64)
    if good.min() == good.max():
        raise CalibrationError(f"cannot calibrate: every one of the {len(rows)} sentences is "
                               f"{'at or above' if bool(good[0]) else 'below'} chrF {threshold}")
    x = torch.tensor(rows, dtype=torch.float64)
    mean, scale = x.mean(dim=0), x.std(dim=0).clamp(min=1e-6)
    x = (x - mean) / scale
    raw = torch.zeros(len(FEATURES) + 1, dtype=torch.float64, requires_grad=True)  # u_1..u_n, bias
    optimizer = torch.optim.LBFGS([raw], lr=1.0, max_iter=100, tolerance_grad=1e-9, tolerance_change=1e-12,
                                  line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        weights = _weights(raw[:-1])
        value = torch.nn.functional.binary_cross_entropy_with_logits(x @ weights + raw[-1], good) \
            + L2_PENALTY * weights.square().sum()
        value.backward()
        return value

    optimizer.step(loss)
    weights = _weights(raw[:-1]).detach()
    return Calibrator(mean.tolist(), scale.tolist(), weights.tolist(), float(raw[-1].detach()), float(threshold),
                      len(rows))


class Scored(Protocol):
    """A translation with what the calibrator reads (translator.Hypothesis)."""

    text: str
    log_prob: float
    length: int
    lowest: float


def fit_on_pairs(pairs: Sequence[tuple[str, str]], translate: Callable[[list[str]], Sequence[Scored]],
                 threshold: float, most: int) -> Calibrator:
    """A calibrator fitted on the first `most` distinct sources of `pairs`, each translated once by
    `translate` and scored by sentence chrF against all its references there. Sources with nothing
    to translate (no letter) are left out. Raises CalibrationError (fit_calibrator's)."""
    references: dict[str, list[str]] = {}
    for source, reference in pairs:
        if source in references or len(references) < most:
            references.setdefault(source, []).append(reference)
    if len(references) < MIN_SENTENCES:  # said before anything is translated
        raise CalibrationError(f"calibration needs at least {MIN_SENTENCES} sentences, got {len(references)}")
    sources = list(references)
    kept = [(found, references[source]) for source, found in zip(sources, translate(sources)) if found.length > 0]
    rows = [features(found.log_prob, found.length, found.lowest) for found, _ in kept]
    return fit_calibrator(rows, sentence_chrfs([found.text for found, _ in kept], [refs for _, refs in kept]),
                          threshold)


def save_calibrator(folder: Path, calibrator: Calibrator, checkpoint: str) -> Path:
    """Write `calibrator` as folder/CONFIDENCE_FILE (atomically), naming the checkpoint it was fitted on."""
    path = Path(folder) / CONFIDENCE_FILE
    atomic_write_bytes(path, json.dumps({**calibrator.to_dict(), "checkpoint": checkpoint}, indent=1).encode("utf-8"))
    return path


def read_calibrator(folder: Path) -> Calibrator | None:
    """The calibrator stored in `folder` (None when there is none); CalibrationError in one line for a
    file that cannot be read (a hand-edited one may carry a byte-order mark) or is not one."""
    path = Path(folder) / CONFIDENCE_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(read_text(path, f"the confidence calibrator {path}"))
    except TextFileError as error:
        raise CalibrationError(str(error)) from None
    except json.JSONDecodeError as error:
        raise CalibrationError(f"the confidence calibrator {path} is not valid JSON: {error}") from None
    try:
        return Calibrator.from_dict(data)
    except CalibrationError as error:
        raise CalibrationError(f"{path}: {error}") from None


def _weights(raw: torch.Tensor) -> torch.Tensor:
    """The logistic weights: softplus of the raw values for the MONOTONE features, the rest as they are."""
    return torch.cat([torch.nn.functional.softplus(raw[:MONOTONE]), raw[MONOTONE:]])


def confidence_report(probabilities: Sequence[float], chrfs: Sequence[float], threshold: float,
                      bins: int = 10) -> dict[str, float]:
    """How well `probabilities` (one per sentence) rank and predict sentence chrF: Spearman's rho
    with it, the mean chrF of the lowest-scored 10% and of the rest, and the expected calibration
    error against chrF >= threshold."""
    p = torch.tensor(probabilities, dtype=torch.float64)
    chrf = torch.tensor(chrfs, dtype=torch.float64)
    if p.numel() != chrf.numel() or p.numel() < 10:
        raise CalibrationError(f"a report needs one probability per chrF score, at least 10: got {p.numel()} "
                               f"and {chrf.numel()}")
    lowest = p.argsort(stable=True)[:p.numel() // 10]
    rest = torch.ones_like(p, dtype=torch.bool)
    rest[lowest] = False
    good = (chrf >= threshold).double()
    which = (p * bins).long().clamp(max=bins - 1)
    error = sum(abs(float(p[which == b].mean() - good[which == b].mean())) * int((which == b).sum()) / p.numel()
                for b in range(bins) if bool((which == b).any()))
    return {"spearman": _pearson(_ranks(p), _ranks(chrf)), "lowest_10pct_chrf": float(chrf[lowest].mean()),
            "rest_chrf": float(chrf[rest].mean()), "calibration_error": error, "good_share": float(good.mean()),
            "mean_probability": float(p.mean())}


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks from 1, tied values sharing their mean rank."""
    order = values.argsort(stable=True)
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, values.numel() + 1, dtype=torch.float64)
    unique, inverse = values.unique(return_inverse=True)
    sums = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, ranks)
    counts = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, torch.ones_like(ranks))
    return (sums / counts)[inverse]


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator else 0.0
