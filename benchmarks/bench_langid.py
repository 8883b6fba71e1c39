"""Language-ID libraries on tatoeba's sentences: how often each names the right language, by length, and how fast.

    python -m benchmarks.bench_langid [--source data/tatoeba] [--lingua PATH]

Both sides of the en-it training pairs (30,718 sentences, 5 to 478 characters) are identified by
py3langid (the project's, requirements.txt) and, when importable, lingua-language-detector (not a
dependency: install it apart, e.g. `pip install --target /tmp/lingua lingua-language-detector`, and
pass `--lingua /tmp/lingua`). Each library runs over all its languages and over the pair's two
alone; printed per run: seconds to load, seconds to identify every sentence on one thread, and
the share identified right for sentences under 20 characters, 20 to 39, and 40 or more.
Tatoeba's sides are taken as correct: its pairs are checked by people.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BUCKETS = ((0, 20, "<20"), (20, 40, "20-39"), (40, 10 ** 9, ">=40"))


def py3langid_runs(languages: tuple[str, str]) -> dict[str, Callable[[], Callable[[str], str]]]:
    def load(subset: list[str] | None) -> Callable[[str], str]:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
        identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        if subset:
            identifier.set_languages(subset)
        return lambda text: identifier.classify(text)[0]

    return {"py3langid, all languages": lambda: load(None), "py3langid, en and it": lambda: load(list(languages))}


def lingua_runs(languages: tuple[str, str]) -> dict[str, Callable[[], Callable[[str], str]]]:
    def load(pair_only: bool) -> Callable[[str], str]:
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder
        chosen = [Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())) for code in languages]
        builder = LanguageDetectorBuilder.from_languages(*chosen) if pair_only \
            else LanguageDetectorBuilder.from_all_languages()
        detector = builder.with_preloaded_language_models().build()
        return lambda text: getattr(getattr(detector.detect_language_of(text), "iso_code_639_1", None), "name",
                                    "").lower()

    return {"lingua, all languages": lambda: load(False), "lingua, en and it": lambda: load(True)}


def measure(load: Callable[[], Callable[[str], str]], sentences: list[tuple[str, str]]) -> dict[str, str]:
    start = time.perf_counter()
    identify = load()
    loaded = time.perf_counter()
    found = [identify(text) == language for text, language in sentences]
    done = time.perf_counter()
    row = {"load s": f"{loaded - start:.1f}", "identify s": f"{done - loaded:.1f}"}
    for low, high, name in BUCKETS:
        right = [ok for ok, (text, _) in zip(found, sentences) if low <= len(text) < high]
        row[name] = f"{sum(right) / len(right):.2%} of {len(right)}"
    return row


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=ROOT / "data" / "tatoeba")
    parser.add_argument("--lingua", type=Path, default=None, help="folder lingua-language-detector is installed in")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    path = args.source / "en-it" / "train.jsonl"
    if not path.is_file():
        parser.error(f"--source {args.source} has no en-it/train.jsonl")
    if args.lingua:
        sys.path.insert(0, str(args.lingua))
    rows = [json.loads(line)["translation"] for line in path.read_text(encoding="utf-8").splitlines()]
    sentences = [(row[language], language) for row in rows for language in ("en", "it")]
    runs = py3langid_runs(("en", "it"))
    try:
        import lingua  # noqa: F401  (only whether it is there)
        runs |= lingua_runs(("en", "it"))
    except ImportError:
        print("lingua-language-detector is not importable: skipped (see --lingua)", file=sys.stderr)
    print(f"| library | load s | identify s ({len(sentences)} sentences) | <20 chars | 20-39 | >=40 |")
    print("|---|---|---|---|---|---|")
    for name, load in runs.items():
        row = measure(load, sentences)
        print(f"| {name} | {row['load s']} | {row['identify s']} | {row['<20']} | {row['20-39']} | {row['>=40']} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
