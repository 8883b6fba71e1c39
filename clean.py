"""Run the cleaning alone on a corpus and report: `python clean.py --datasource data/tatoeba`.

Cleans what training cleans, with the `--clean_*` thresholds (defaults: cleaning.CleaningSettings):
the training pairs of every corpus of --datasource that its text store keeps once the held-out
splits are carved or given apart and repeats dropped (store.text_stores, as train.py calls it,
under store_folder, so that train.py with the same options opens the same stores instead of
cleaning again); and prints, per corpus, the pairs kept and removed by reason, and a sample of
each reason's pairs (`--clean_samples` per reason) with what the rule saw. `--split validation`
or `test` cleans that split of the corpus as it is read instead (training never cleans it).
`--report FILE.json` also writes the whole report (settings, counts, samples) as JSON. Training is
not needed.

With `--clean_score_forward CKPT --clean_score_backward CKPT` (a model each way, trained on this
corpus: the first step of the two-step recipe in docs/cleaning.md) the pairs the rules keep are
also scored by dual conditional cross-entropy (nmt/inference/pair_scoring.py), and the report says how many the best
`--clean_score_keep` share holds, the highest score it keeps, and the worst-scored pairs: what
train.py with the same options keeps.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


from nmt.atomic_files import atomic_write_bytes
from nmt.corpora.cleaning import (REASONS, Cleaner, CleaningReport, CleaningSettings, PairScorer, Removal,
                                  scoring_summary, settings_from_config)
from config import CLEAN, ConfigError, Corpus, OneLineParser, build_parser, corpora, corpus_name, parse_args
from nmt.corpora.sources import DataError, Pair, open_source, read_pairs
from nmt.corpora.store import text_stores
from nmt.inference.pair_scoring import pair_scorer


def print_report(name: str, split: str, report: CleaningReport) -> None:
    share = report.kept / report.seen if report.seen else 0.0
    print(f"{name} {report.pair} {split}: kept {report.kept} of {report.seen} pairs ({share:.2%}), "
          f"sides swapped {report.swapped}, NFC-normalised {report.normalized}")
    for reason in REASONS:
        if reason in report.removed:
            print(f"  removed {reason:<15} {report.removed[reason]:>8}  ({report.removed[reason] / report.seen:.2%})")
    for note in report.unjudged:
        print(f"  not judged: {note}")
    for reason, samples in report.as_dict()["samples"].items():
        print(f"  {reason} (sample of {len(samples)}; row numbers from 1):")
        for sample in samples:
            print(f"    row {sample['row'] + 1}: {sample['source']!r} ||| {sample['target']!r}  [{sample['detail']}]")


def print_scoring(scoring: dict[str, Any]) -> None:
    print(f"  scored {scoring['scored']} kept pairs by dual conditional cross-entropy: keeping the best "
          f"{scoring['kept']} ({scoring['keep']:.0%}), scores up to {scoring['cut']:.3f}")
    print(f"  worst {len(scoring['worst'])} (row numbers from 1):")
    for sample in scoring["worst"]:
        print(f"    row {sample['row'] + 1}: {sample['source']!r} ||| {sample['target']!r}  [score {sample['score']:.3f}]")


def score_kept(pairs: list[Pair], rows: list[int], scorer: PairScorer, keep: float, samples: int, lang_src: str,
               lang_tgt: str) -> dict[str, Any]:
    """The kept pairs' scores: how many the best `keep` share holds, the highest score kept, and the
    `samples` worst pairs (rows as the cleaner counts them)."""
    scores = scorer(pairs, lang_src, lang_tgt)
    _, summary, worst = scoring_summary(scores, keep, samples)
    return {**summary, "worst": [{"row": rows[i], "source": pairs[i][0], "target": pairs[i][1],
                                  "score": float(scores[i])} for i in worst]}


def clean_training_pairs(config: dict[str, Any], scorer: PairScorer | None) -> list[dict[str, Any]]:
    """Build (or open) every corpus's text store with the rules on (and scoring by `scorer`), print
    what their cleaning removed from the training pairs (and what scoring kept), and return the
    reports."""
    reports = []
    for corpus, text in zip(corpora(config), text_stores({**config, "clean": True}, scorer=scorer)):
        cleaning = text.cleaning()
        print_report(corpus_name(corpus.source), "train", CleaningReport(**cleaning["rules"]))
        report = {"corpus": corpus.source, "split": "train", **cleaning["rules"]}
        if cleaning["scoring"]:
            report["scoring"] = cleaning["scoring"]
            print_scoring(report["scoring"])
        reports.append(report)
    return reports


def clean_split(corpus: Corpus, config: dict[str, Any], args: argparse.Namespace, settings: CleaningSettings,
                scorer: PairScorer | None) -> dict[str, Any]:
    """Clean one corpus's held-out split as it is read, print its report (and its scoring by
    `scorer`), and return it."""
    lang_src, lang_tgt = config["lang_src"], corpus.lang_tgt
    source = open_source(corpus.source, lang_src, lang_tgt, config["max_line_bytes"])
    if args.split not in source.splits:
        raise DataError(f"{corpus.source!r} has no {args.split!r} split (found: {', '.join(source.splits)})")
    cleaner = Cleaner(settings, lang_src, lang_tgt, config["clean_samples"], config["seed"])
    kept: list[Pair] = []
    rows: list[int] = []
    for batch in read_pairs(source, args.split, lang_src, lang_tgt):
        for pair in batch:
            judged = cleaner.judge(pair)
            if scorer and not isinstance(judged, Removal):
                kept.append(judged)
                rows.append(cleaner.report.seen - 1)
    print_report(corpus_name(corpus.source), args.split, cleaner.report)
    report = {"corpus": corpus.source, "split": args.split, **cleaner.report.as_dict()}
    if scorer:
        report["scoring"] = score_kept(kept, rows, scorer, config["clean_score_keep"], config["clean_samples"],
                                       lang_src, lang_tgt)
        print_scoring(report["scoring"])
    return report


def argument_parser() -> OneLineParser:
    parser = build_parser(CLEAN, __doc__.splitlines()[0])
    parser.add_argument("--split", default="train",
                        help="split to clean (default: train, the pairs training cleans; another as it is read)")
    parser.add_argument("--report", type=Path, default=None, help="also write the whole report to this JSON file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(CLEAN, argv, parser=parser)
    config = resolved.config
    settings = settings_from_config(config)  # its ranges are the config's, checked by parse_args
    scorer = pair_scorer(config)  # loads its models, on the config's device, when first asked
    try:
        if args.split == "train":
            reports = clean_training_pairs(config, scorer)
        else:
            reports = [clean_split(corpus, config, args, settings, scorer) for corpus in corpora(config)]
    except ConfigError as error:
        parser.error(str(error))
    except (DataError, ValueError) as error:
        print(f"clean.py: error: {error}", file=sys.stderr)
        return 1
    if args.report:
        try:
            atomic_write_bytes(args.report, json.dumps(reports, ensure_ascii=False, indent=1).encode("utf-8"))
        except OSError as error:
            print(f"clean.py: error: cannot write {args.report}: {error.strerror or error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
