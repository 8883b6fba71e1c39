"""Noisy-corpus benchmark: all of tatoeba's training pairs with seeded noise added, and what the
default cleaning removes of it.

    python -m benchmarks.noisy_corpus --output NOISY_FOLDER [--seed 1] [--fraction 0.3] [--source data/tatoeba]
                                      [--json] [--score_forward CKPT --score_backward CKPT [--score_keep 0.9]]

Writes NOISY_FOLDER in the Hub layout (a README whose `configs:` header names the files for en-it
and for it-en, en-it/train.jsonl, and the source's validation and test files copied as they are),
so that `python train.py --datasource NOISY_FOLDER` trains on it, either way, and scores on the
clean held-out splits. Every clean training pair is kept, in its order, and `--fraction` as many
pairs again (chosen with `--seed`) are added among them at seeded places: noise of five kinds, in
equal shares, that web-crawled corpora carry, each made from a clean pair drawn at random:
- misaligned: the source with the target of another pair (of another source sentence);
- target_both: the target language on both sides, the source replaced by another pair's target;
- copy: the source copied into the target, untranslated;
- swapped: the two sides exchanged;
- boilerplate: navigation and footer lines of web pages (BOILERPLATE), translated or not, repeated.
A filter that removed exactly the noise would give back the clean corpus: what the noise costs a
model, and what cleaning wins back of it, are measured against the clean recipe's own run.
NOISY_FOLDER/noise.json lists the added rows of each kind (0-based, in the written file). Then the
corpus is read back as training reads it and cleaned with cleaning.CleaningSettings' defaults;
printed per kind: its rows, how many the cleaning removed, and by which rule, and how many it kept
with their sides swapped back; and over all, the precision (the share of removed rows that were
noise) and recall (the share of noise rows removed or swapped back). With `--score_forward CKPT
--score_backward CKPT` (models trained each way on the folder) the pairs the rules keep are then
scored by dual conditional cross-entropy and the best `--score_keep` kept; its removals count as
the rule "score". Run again on a folder it wrote (same --seed and --fraction), it reads noise.json
and evaluates the folder as it is. Trainings on the folder are run separately: docs/cleaning.md.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the repository
if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("noisy_corpus.py: run it from the repository root as: python -m benchmarks.noisy_corpus")

from nmt.atomic_files import atomic_write_bytes  # noqa: E402  (after the check above)
from nmt.training.checkpoint import CheckpointError  # noqa: E402
from nmt.corpora.cleaning import Cleaner, CleaningSettings, Removal, keep_best  # noqa: E402
from nmt.inference.pair_scoring import dual_conditional_cross_entropy  # noqa: E402
from nmt.corpora.sources import open_source, read_pairs  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.inference.translator import TorchTranslator, TranslatorError  # noqa: E402

PAIR = ("en", "it")
KINDS = ("misaligned", "target_both", "copy", "swapped", "boilerplate")
# (English, Italian); {n} becomes a number from 1 to 40, so those lines are near-duplicates of
# each other only when their numbers agree.
BOILERPLATE = [
    ("Click here to subscribe to our newsletter.", "Clicca qui per iscriverti alla nostra newsletter."),
    ("All rights reserved.", "Tutti i diritti riservati."),
    ("Home | About us | Contact", "Home | Chi siamo | Contatti"),
    ("Read more", "Leggi tutto"),
    ("Share on Facebook", "Condividi su Facebook"),
    ("Privacy policy", "Privacy policy"),
    ("Back to top", "Back to top"),
    ("This website uses cookies to improve your experience.", "This website uses cookies to improve your experience."),
    ("Log in", "Accedi"),
    ("Page {n}", "Pagina {n}"),
    ("Posted on March {n}, 2019", "Pubblicato il {n} marzo 2019"),
    ("Copyright © 2019. All rights reserved.", "Copyright © 2019. All rights reserved."),
]


def noise_pair(kind: str, index: int, pairs: list[tuple[str, str]], rng: random.Random) -> tuple[str, str]:
    """Noise of `kind` made from pair `index`."""
    source, target = pairs[index]
    other = index
    while pairs[other][0] == source:  # another source sentence: tatoeba repeats sources with other targets
        other = rng.randrange(len(pairs))
    if kind == "misaligned":
        return source, pairs[other][1]
    if kind == "target_both":
        return pairs[other][1], target
    if kind == "copy":
        return source, source
    if kind == "swapped":
        return target, source
    english, italian = rng.choice(BOILERPLATE)
    number = rng.randint(1, 40)
    return english.format(n=number), italian.format(n=number)


def with_noise(rows: list[dict[str, Any]], seed: int, fraction: float) -> tuple[list[dict[str, Any]],
                                                                              dict[str, list[int]]]:
    """Every row of `rows`, in its order, and `fraction` as many noise rows among them at seeded
    places, the kinds in turn; the rows written and the noise rows' places by kind."""
    pairs = [(row["translation"][PAIR[0]], row["translation"][PAIR[1]]) for row in rows]
    if len({source for source, _ in pairs}) < 2:
        raise ValueError("the corpus has fewer than two distinct source sentences to misalign")
    rng = random.Random(seed)
    added = round(fraction * len(rows))
    noise = [(KINDS[number % len(KINDS)], rng.randrange(len(rows))) for number in range(added)]
    places = set(rng.sample(range(len(rows) + added), added))
    clean, made = iter(rows), iter(noise)
    written: list[dict[str, Any]] = []
    kinds: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for place in range(len(rows) + added):
        if place in places:
            kind, index = next(made)
            kinds[kind].append(place)
            written.append({"translation": dict(zip(PAIR, noise_pair(kind, index, pairs, rng)))})
        else:
            written.append(next(clean))
    return written, kinds


def write_noisy_corpus(source: Path, output: Path, seed: int, fraction: float) -> dict[str, list[int]]:
    """Write the noisy copy of `source` to `output` (module docstring); the added rows by kind."""
    rows = [json.loads(line) for line in (source / "en-it" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    rows, kinds = with_noise(rows, seed, fraction)
    (output / "en-it").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(output / "en-it" / "train.jsonl",
                       "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8"))
    for split in ("validation", "test"):
        atomic_write_bytes(output / "en-it" / f"{split}.jsonl", (source / "en-it" / f"{split}.jsonl").read_bytes())
    # Both directions name the same files: the backward model of the scoring recipe trains on it-en.
    header = "configs:\n" + "".join(f"- config_name: {pair}\n  data_files:\n" + "".join(
        f"  - split: {split}\n    path: en-it/{split}.jsonl\n" for split in ("train", "validation", "test"))
        for pair in ("en-it", "it-en"))
    atomic_write_bytes(output / "README.md", (
        f"---\n{header}---\n# {source.name} with noise\n\nThe training pairs of {source} and {fraction:.0%} as many "
        f"pairs of seeded noise among them (seed {seed}; benchmarks/noisy_corpus.py); validation and test as they "
        f"were. noise.json lists the added rows of each kind.\n").encode("utf-8"))
    atomic_write_bytes(output / "noise.json",
                       json.dumps({"seed": seed, "fraction": fraction, "rows": kinds}, indent=1).encode("utf-8"))
    return kinds


def cleaning_by_kind(folder: Path, kinds: dict[str, list[int]], models: tuple[TorchTranslator, TorchTranslator] | None,
                     keep: float) -> dict[str, Any]:
    """Clean the folder's train split with the default settings, then with `models` (forward,
    backward) keep the best `keep` of what the rules kept; rows and removals (by rule) per kind."""
    kind_of = {index: kind for kind, indices in kinds.items() for index in indices}
    cleaner = Cleaner(CleaningSettings(), *PAIR)
    table: dict[str, dict[str, Any]] = {kind: {"rows": 0, "removed": 0, "swapped": 0, "by_rule": {}}
                                        for kind in ("clean", *KINDS)}
    kept: list[tuple[str, str]] = []
    kept_kinds: list[str] = []
    row = 0
    for batch in read_pairs(open_source(str(folder), *PAIR), "train", *PAIR):
        for pair in batch:
            kind = kind_of.get(row, "clean")
            table[kind]["rows"] += 1
            swapped = cleaner.report.swapped
            judged = cleaner.judge(pair)
            table[kind]["swapped"] += cleaner.report.swapped - swapped
            if isinstance(judged, Removal):
                table[kind]["by_rule"][judged.reason] = table[kind]["by_rule"].get(judged.reason, 0) + 1
            else:
                kept.append(judged)
                kept_kinds.append(kind)
            row += 1
    written = len((folder / "en-it" / "train.jsonl").read_bytes().splitlines())
    if row != written:  # a skipped row would shift every later row's kind
        raise ValueError(f"{folder}: read {row} usable training rows of the {written} written")
    if models:
        best = set(keep_best(dual_conditional_cross_entropy(kept, *models, *PAIR), keep).tolist())
        for index, kind in enumerate(kept_kinds):
            if index not in best:
                table[kind]["by_rule"]["score"] = table[kind]["by_rule"].get("score", 0) + 1
    for entry in table.values():
        entry["removed"] = sum(entry["by_rule"].values())
    noise = sum(table[kind]["rows"] for kind in KINDS)
    noise_removed = sum(table[kind]["removed"] for kind in KINDS)
    removed = noise_removed + table["clean"]["removed"]
    repaired = table["swapped"]["swapped"]
    return {"kinds": table, "precision": noise_removed / removed if removed else 1.0,
            "recall": (noise_removed + repaired) / noise if noise else 1.0, "summary": cleaner.report.summary()}


def noisy_folder(args: argparse.Namespace) -> dict[str, list[int]]:
    """The rows of each kind of noise in --output: written now, or read from the noise.json of a
    folder this script wrote before (with the same --seed and --fraction)."""
    record = args.output / "noise.json"
    if record.is_file():
        written = json.loads(record.read_text(encoding="utf-8"))
        if (written["seed"], written["fraction"]) != (args.seed, args.fraction):
            raise ValueError(f"{args.output} holds the noise of seed {written['seed']} and fraction "
                             f"{written['fraction']}, not {args.seed} and {args.fraction}")
        return written["rows"]
    if args.output.exists() and any(args.output.iterdir()):
        raise ValueError(f"--output {args.output} exists, is not empty and has no noise.json: name a new folder")
    return write_noisy_corpus(args.source, args.output, args.seed, args.fraction)


def print_table(result: dict[str, Any]) -> None:
    print("| kind | pairs | removed | share | swapped back | by rule |")
    print("|---|---|---|---|---|---|")
    for kind, entry in result["kinds"].items():
        rules = ", ".join(f"{rule} {count}" for rule, count in sorted(entry["by_rule"].items()))
        print(f"| {kind} | {entry['rows']} | {entry['removed']} | {entry['removed'] / max(entry['rows'], 1):.1%} "
              f"| {entry['swapped']} | {rules} |")
    print(f"precision {result['precision']:.4f}, recall {result['recall']:.4f}")


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="folder to write the noisy corpus to")
    parser.add_argument("--source", type=Path, default=ROOT / "data" / "tatoeba",
                        help="a folder with en-it/train.jsonl, validation.jsonl and test.jsonl")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fraction", type=float, default=0.3, help="noise pairs added, as a share of the training pairs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    parser.add_argument("--score_forward", type=Path, default=None, help="checkpoint of an en->it model trained on "
                        "the noisy corpus: with --score_backward, also score the pairs the rules keep")
    parser.add_argument("--score_backward", type=Path, default=None, help="checkpoint of an it->en model, likewise")
    parser.add_argument("--score_keep", type=float, default=0.9, help="fraction of those pairs scoring keeps")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if not all((args.source / "en-it" / f"{split}.jsonl").is_file() for split in ("train", "validation", "test")):
        parser.error(f"--source {args.source} has no en-it/train.jsonl, validation.jsonl and test.jsonl")
    if not 0 <= args.fraction <= 10:
        parser.error(f"--fraction must be a number from 0 to 10, got {args.fraction}")
    if (args.score_forward is None) != (args.score_backward is None) or not 0 < args.score_keep <= 1:
        parser.error("scoring needs both --score_forward and --score_backward, and --score_keep in (0, 1]")
    try:
        kinds = noisy_folder(args)
        models = None if args.score_forward is None else tuple(
            TorchTranslator.load(path, path.parent, pick_device("auto")) for path in (args.score_forward,
                                                                                      args.score_backward))
        result = cleaning_by_kind(args.output, kinds, models, args.score_keep)
    except (ValueError, CheckpointError, TranslatorError) as error:
        print(f"noisy_corpus.py: error: {error}", file=sys.stderr)
        return 1
    print(result["summary"], file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
