"""Sentence segmentation: how often the segmenter finds the boundaries between sentences, and its cost.

    python -m benchmarks.bench_segmentation [--data FOLDER:SPLIT ...] [--language en] [--seed 0]
                                            [--libraries sentencex,pysbd] [--errors N] [--json]

Each data set (a folder in Hub layout, `en-it` pairs; default: the FLORES-200 devtest and
newstest2009 test sets in ../shared/data, and tatoeba's validation split shipped in data/) is read
in file order and the sentences of its `--language` side (en or it) are joined, consecutive ones,
with a single space into paragraphs of 2 to 4 sentences (the sizes drawn with `--seed`). Each
library segments each paragraph with that language's rules: `sentencex` as this project calls it
(sentences.sentence_spans, which also keeps URLs and e-mail addresses whole), and `pysbd`
(clean=False) when it is installed
(it is not a requirement of the project; `pip install pysbd` for the comparison).

A boundary is the character offset where a sentence after the paragraph's first one starts; a
join is a true one (where two lines of the set meet). Over all paragraphs: TP = joins found,
FN = joins missed, FP = splits inside a line. Reported:
- strict: precision TP / (TP + FP), recall TP / (TP + FN), accuracy TP / (TP + FP + FN) (the
  share of right decisions among all places where the data or the segmenter puts a boundary,
  stricter than F1), and the share of paragraphs split exactly at their joins;
- join accuracy: the same accuracy without the two kinds of decision these sets cannot judge: a
  join after a line that does not end with sentence-final punctuation (a headline: no punctuation
  rule can find it, and a real document puts it on a line of its own), and a split inside a line
  that the segmenter also makes in that line alone (these sets' lines are translation units, and
  some hold two sentences: such a split is a true boundary or the segmenter's own error, which
  only reading tells). A split inside a line made only in the paragraph still counts as wrong;
- the counts behind them (joins, missed, unmarked, inside, inside_alone), so each can be checked;
- the segmentation time per sentence: all paragraphs segmented once after a warm-up, divided by
  the number of sentences; and the time per sentence of all that sentences.py does around a
  translator (segmenting, cutting around URLs, planning, reassembling), best of 5.
`--errors N` prints N wrong paragraphs per set and library to stderr, to read. These are
evaluation sets, and reading their errors informs a rule: sentences.py's quote rule was written
after reading newstest2009's English errors, so that side's figure is in-sample there; its Italian
side, never read, is the held-out measure of the same rules on news (docs/text.md).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]  # the repository
if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_segmentation.py: run it from the repository root as: python -m benchmarks.bench_segmentation")

from nmt.corpora.sources import DataError, open_source, read_all_pairs  # noqa: E402  (after the check above)
from nmt.inference.sentences import plan_lines, sentence_spans  # noqa: E402

DEFAULT_DATA = [f"{ROOT.parent}/shared/data/flores200_devtest:test", f"{ROOT.parent}/shared/data/newstest2009:test",
                f"{ROOT}/data/tatoeba:validation"]
Segmenter = Callable[[str], list[int]]  # a paragraph -> the offsets where its sentences start


def paragraphs(sentences: list[str], seed: int) -> list[list[str]]:
    """Consecutive sentences grouped by 2 to 4 (the last group may be shorter; one alone is dropped)."""
    rng, groups, position = random.Random(seed), [], 0
    while position < len(sentences) - 1:
        size = rng.randint(2, 4)
        groups.append(sentences[position:position + size])
        position += size
    return groups


def gold_starts(group: list[str]) -> list[int]:
    """Where each sentence after the first starts in the paragraph " ".join(group)."""
    starts, position = [], 0
    for sentence in group[:-1]:
        position += len(sentence) + 1
        starts.append(position)
    return starts


def sentencex_segmenter(language: str) -> Segmenter:
    return lambda text: [span.start for span in sentence_spans(text, language)[1:]]


def pysbd_segmenter(language: str) -> Segmenter | None:
    try:
        import pysbd
    except ImportError:
        return None
    segmenter = pysbd.Segmenter(language=language, clean=False)

    def starts(text: str) -> list[int]:
        found, position = [], 0
        for sentence in segmenter.segment(text):
            sentence = sentence.strip()
            position = text.find(sentence, position) if sentence else -1
            if position < 0:
                break
            found.append(position)
            position += len(sentence)
        return found[1:]

    return starts


SEGMENTERS = {"sentencex": sentencex_segmenter, "pysbd": pysbd_segmenter}


MARKED_END = re.compile(r"[.!?…][\"'”’)\]]*$")  # a line that ends the way sentences end


def counts(group: list[str], found: set[int], segment: Segmenter) -> dict[str, int]:
    """One paragraph's boundary counts: the true ones found and missed, those after a line with no
    sentence-final punctuation, and the splits inside a line (also made on the line alone or not)."""
    gold = gold_starts(group)
    missed = [i for i, start in enumerate(gold) if start not in found]
    inside = alone = 0
    for start, sentence in zip([0] + gold, group):
        within = {p - start for p in found if start < p < start + len(sentence)}
        inside, alone = inside + len(within), alone + len(within & set(segment(sentence)))
    return {"joins": len(gold), "missed": len(missed), "unmarked": sum(not MARKED_END.search(s) for s in group[:-1]),
            "missed_unmarked": sum(not MARKED_END.search(group[i]) for i in missed),
            "inside": inside, "inside_alone": alone, "exact": not missed and not inside}


def score(groups: list[list[str]], segment: Segmenter, errors: int) -> dict[str, float]:
    """Boundary counts and rates, the exact-paragraph share and the time per sentence of one segmenter."""
    texts = [" ".join(group) for group in groups]
    for text in texts[:50]:  # warm-up: rule tables, caches
        segment(text)
    started = time.perf_counter()
    found = [segment(text) for text in texts]
    seconds = time.perf_counter() - started
    total: dict[str, int] = {}
    for group, text, starts in zip(groups, texts, found):
        for key, value in counts(group, set(starts), segment).items():
            total[key] = total.get(key, 0) + value
        if set(starts) != set(gold_starts(group)) and errors > 0:
            errors -= 1
            cut = sorted(starts)
            print(f"  found {[text[a:b] for a, b in zip([0] + cut, cut + [len(text)])]}\n  gold  {group}",
                  file=sys.stderr)
    tp, fn, fp = total["joins"] - total["missed"], total["missed"], total["inside"]
    marked_missed, in_context = fn - total["missed_unmarked"], fp - total["inside_alone"]
    sentences = sum(len(group) for group in groups)
    return {**total, "paragraphs": len(groups), "sentences": sentences,
            "precision": tp / max(1, tp + fp), "recall": tp / max(1, tp + fn), "accuracy": tp / max(1, tp + fp + fn),
            "join_accuracy": (tp - total["unmarked"] + total["missed_unmarked"])
            / max(1, tp - total["unmarked"] + total["missed_unmarked"] + marked_missed + in_context),
            "exact_paragraphs": total["exact"] / max(1, len(groups)), "us_per_sentence": 1e6 * seconds / max(1, sentences)}


def plan_cost(groups: list[list[str]], language: str, repeats: int = 5) -> float:
    """Microseconds per sentence of all that sentences.py does around a translator (segmenting,
    cutting around URLs, planning, reassembling an unchanged translation), best of `repeats`."""
    texts, best = [" ".join(group) for group in groups], float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        plan = plan_lines(texts, language)
        plan.assemble(plan.sources)
        best = min(best, time.perf_counter() - started)
    return 1e6 * best / max(1, sum(len(group) for group in groups))


def side_sentences(data: str, language: str) -> list[str]:
    """The `language` side (en or it) of a FOLDER:SPLIT, in file order."""
    folder, _, split = data.rpartition(":")
    pairs = read_all_pairs(open_source(folder, "en", "it"), split, "en", "it")
    return [source if language == "en" else target for source, target in pairs]


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", metavar="FOLDER:SPLIT",
                        help="a Hub-layout en-it folder and its split (repeatable; default: FLORES-200 devtest, "
                             "newstest2009, tatoeba validation)")
    parser.add_argument("--language", choices=("en", "it"), default="en",
                        help="the side whose sentences are joined and segmented (default: en)")
    parser.add_argument("--seed", type=int, default=0, help="draws the paragraph sizes (default: 0)")
    parser.add_argument("--libraries", default="sentencex,pysbd", help="comma-separated: sentencex, pysbd")
    parser.add_argument("--errors", type=int, default=0, metavar="N", help="print N wrong paragraphs per set")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    unknown = set(args.libraries.split(",")) - set(SEGMENTERS)
    if unknown:
        parser.error(f"unknown libraries {sorted(unknown)}: choose from {', '.join(SEGMENTERS)}")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for data in args.data or DEFAULT_DATA:
        if ":" not in data or not Path(data.rpartition(":")[0]).is_dir():
            print(f"bench_segmentation.py: skipping {data}: no such FOLDER:SPLIT", file=sys.stderr)
            continue
        try:
            groups = paragraphs(side_sentences(data, args.language), args.seed)
        except DataError as error:
            print(f"bench_segmentation.py: error: {data}: {error}", file=sys.stderr)
            return 1
        name = Path(data.rpartition(":")[0]).name + ":" + data.rpartition(":")[2]
        results[name] = {"plan": {"us_per_sentence": plan_cost(groups, args.language)}}
        for library in args.libraries.split(","):
            segment = SEGMENTERS[library](args.language)
            if segment is None:
                print(f"bench_segmentation.py: skipping {library}: not installed", file=sys.stderr)
                continue
            print(f"bench_segmentation.py: {name} with {library}", file=sys.stderr)
            results[name][library] = score(groups, segment, args.errors)
    if not results:
        print("bench_segmentation.py: error: no data set to segment", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(results))
        return 0
    for name, by_library in results.items():
        print(f"{name:<24} sentences.py, segmenting to reassembling: {by_library.pop('plan')['us_per_sentence']:.1f} "
              "us/sentence (best of 5)")
        for library, row in by_library.items():
            print(f"{name:<24} {library:<9} paragraphs {row['paragraphs']:>4}  joins {row['joins']:>4}  "
                  f"missed {row['missed']:>3} ({row['missed_unmarked']} unmarked)  inside {row['inside']:>3} "
                  f"({row['inside_alone']} alone)  precision {row['precision']:.4f}  recall {row['recall']:.4f}  "
                  f"accuracy {row['accuracy']:.4f}  join accuracy {row['join_accuracy']:.4f}  "
                  f"exact {row['exact_paragraphs']:.4f}  {row['us_per_sentence']:.1f} us/sentence")
    return 0


if __name__ == "__main__":
    sys.exit(main())
