"""How well the confidence calibrator (confidence.py) predicts good translations.

    python -m benchmarks.bench_confidence --model_folder DIR --experiment_name NAME [--checkpoint PATH]
        [--datasource data/tatoeba] [--beam 5] [--threshold 50] [--max_sentences N] [--json]

Free beam search (bench_glossary.search: `--beam`, the config's penalties) over the validation
split fits a calibrator against "sentence chrF >= --threshold", each sentence scored against every
reference its source has in the split; the test split, decoded the same way, measures it:
Spearman's correlation of the probabilities with sentence chrF, the mean chrF of the lowest-scored
10% against the rest's, the expected calibration error, and, as a baseline, Spearman's correlation
of the mean token log-probability alone.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_confidence.py: run it from the repository root as: python -m benchmarks.bench_confidence")

from benchmarks.bench_glossary import search, search_parser  # noqa: E402  (the batched search both measure)
from nmt.training.checkpoint import CheckpointError  # noqa: E402
from nmt.inference.confidence import (CalibrationError, confidence_report, features, fit_calibrator,  # noqa: E402
                        sentence_chrfs)
from config import EVALUATE, ConfigError, parse_args, weights_dir  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.corpora.sources import DataError, Pair, open_source, read_all_pairs  # noqa: E402
from nmt.corpora.tokenizer import decode_ids  # noqa: E402
from nmt.inference.translator import TorchTranslator, TranslatorError  # noqa: E402


def decoded(translator: TorchTranslator, pairs: Sequence[Pair], beam: int,
            config: dict[str, Any]) -> tuple[list[list[float]], list[float]]:
    """The calibrator's features and the sentence chrF of each pair's best hypothesis, against all
    the references of its source."""
    references: dict[str, list[str]] = {}
    for source, reference in pairs:
        references.setdefault(source, []).append(reference)
    found, _ = search(translator, [s for s, _ in pairs], beam, config)
    texts = [decode_ids(translator.tok_tgt, h[0]) for h in found]
    return ([features(h.log_prob, h.length, h.lowest) for h in found],
            sentence_chrfs(texts, [references[s] for s, _ in pairs]))


def measure(args: Any, config: dict[str, Any]) -> dict[str, Any]:
    device = pick_device(config["device"])
    translator = TorchTranslator.load(args.checkpoint, weights_dir(config), device, choice=config["checkpoint_choice"])
    languages = (translator.model_config["lang_src"], translator.model_config["lang_tgt"])
    source = open_source(config["datasource"], *languages)
    splits = [read_all_pairs(source, split, *languages)[:args.max_sentences or None]
              for split in ("validation", "test")]
    fit_rows, fit_chrfs = decoded(translator, splits[0], args.beam, config)
    test_rows, test_chrfs = decoded(translator, splits[1], args.beam, config)
    calibrator = fit_calibrator(fit_rows, fit_chrfs, args.threshold)
    report = confidence_report(calibrator.probabilities(test_rows), test_chrfs, args.threshold)
    baseline = confidence_report([row[0] for row in test_rows], test_chrfs, args.threshold)
    return {"command": " ".join(["python", "-m", "benchmarks.bench_confidence", *sys.argv[1:]]),
            "model": translator.source, "datasource": config["datasource"], "beam": args.beam,
            "threshold": args.threshold, "validation_sentences": len(fit_rows), "test_sentences": len(test_rows),
            "calibrator": calibrator.to_dict(), **report, "spearman_mean_log_prob_alone": baseline["spearman"]}


def argument_parser() -> argparse.ArgumentParser:
    parser = search_parser(__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=50.0, help="a translation is good at this sentence chrF")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    try:
        result = measure(args, resolved.config)
    except (CalibrationError, CheckpointError, ConfigError, DataError, TranslatorError) as error:
        print(f"bench_confidence.py: error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['command']}\nmodel {result['model']}, beam {result['beam']}: fitted on "
          f"{result['validation_sentences']} validation sentences, measured on {result['test_sentences']} test "
          f"sentences; good = sentence chrF >= {result['threshold']} ({100 * result['good_share']:.1f}% of test)\n"
          f"Spearman with sentence chrF: {result['spearman']:.3f} (mean log-probability alone: "
          f"{result['spearman_mean_log_prob_alone']:.3f})\nmean chrF, lowest-scored 10%: "
          f"{result['lowest_10pct_chrf']:.1f}, the rest: {result['rest_chrf']:.1f}\nexpected calibration error: "
          f"{result['calibration_error']:.3f} (mean probability {result['mean_probability']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
