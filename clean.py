"""Run the cleaning alone on a corpus and report: `python clean.py --datasource ../shared/data/tatoeba`.

Reads the split (`--split`, default train: the one training cleans) of every corpus of
--datasource through dataset.py, as training reads it, passes its pairs through cleaning.Cleaner
with the `--clean_*` thresholds (defaults: cleaning.CleaningSettings), and prints, per corpus, the
pairs kept and removed by reason, and a sample of each reason's pairs (`--clean_samples` per
reason) with what the rule saw. `--report FILE.json` also writes the whole report (settings,
counts, samples) as JSON. Nothing is written to the data store; training is not needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from atomic_files import atomic_write_bytes
from cleaning import REASONS, Cleaner, CleaningReport, CleaningSettings, settings_from_config
from config import ConfigError, _parse_bool, build_parser, config_or_exit, corpora, corpus_name
from dataset import DataError, open_source, read_pairs


def add_cleaning_arguments(parser: argparse.ArgumentParser) -> None:
    """One --clean_NAME option per CleaningSettings field, typed from its default."""
    group = parser.add_argument_group("cleaning")
    for setting in fields(CleaningSettings):
        kind = _parse_bool if isinstance(setting.default, bool) else type(setting.default)
        group.add_argument(f"--clean_{setting.name}", type=kind, default=setting.default,
                           metavar=type(setting.default).__name__.upper(), help=f"default: {setting.default!r}")
    group.add_argument("--clean_samples", type=int, default=5, help="removed pairs shown per reason (default: 5)")


def print_report(name: str, split: str, report: CleaningReport) -> None:
    share = report.kept / report.seen if report.seen else 0.0
    print(f"{name} {report.pair} {split}: kept {report.kept} of {report.seen} pairs ({share:.2%}), "
          f"NFC-normalised {report.normalized}")
    for reason in REASONS:
        if reason in report.removed:
            print(f"  removed {reason:<15} {report.removed[reason]:>8}  ({report.removed[reason] / report.seen:.2%})")
    for note in report.unjudged:
        print(f"  not judged: {note}")
    for reason, samples in report.as_dict()["samples"].items():
        print(f"  {reason} (sample of {len(samples)}; row numbers from 1):")
        for sample in samples:
            print(f"    row {sample['row'] + 1}: {sample['source']!r} ||| {sample['target']!r}  [{sample['detail']}]")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--split", default="train", help="split to clean (default: train, the one training cleans)")
    parser.add_argument("--report", type=Path, default=None, help="also write the whole report to this JSON file")
    add_cleaning_arguments(parser)
    args = parser.parse_args(argv)
    config = config_or_exit(args, parser)
    try:
        settings = settings_from_config(vars(args))
    except ValueError as error:
        parser.error(str(error))
    try:
        reports = []
        for corpus in corpora(config):
            source = open_source(corpus.source, f"{config['lang_src']}-{corpus.lang_tgt}")
            if args.split not in source.splits:
                raise DataError(f"{corpus.source!r} has no {args.split!r} split (found: {', '.join(source.splits)})")
            cleaner = Cleaner(settings, config["lang_src"], corpus.lang_tgt, args.clean_samples, config["seed"])
            for _ in cleaner.clean_batches(read_pairs(source, args.split, config["lang_src"], corpus.lang_tgt)):
                pass
            print_report(corpus_name(corpus.source), args.split, cleaner.report)
            reports.append({"corpus": corpus.source, "split": args.split, **cleaner.report.as_dict()})
        if args.report:
            atomic_write_bytes(args.report, json.dumps(reports, ensure_ascii=False, indent=1).encode("utf-8"))
    except ConfigError as error:
        parser.error(str(error))
    except DataError as error:
        print(f"clean.py: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"clean.py: error: cannot write {args.report}: {error.strerror or error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
