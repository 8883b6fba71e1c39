"""Data benchmark: preparing corpora of millions of pairs, and restarting on them.

    python -m benchmarks.bench_data [--sizes 100000,1000000,4000000] [--source ../shared/data/tatoeba] [--json]
                                    [--before CHECKOUT]

For each size it writes an opus_books-shaped folder (parquet, one `en-it` config, only a train
split, `id` and `translation` columns) whose pairs each join two or three random training pairs of
`--source` (so they are distinct and about opus_books' length), then times train.py as a user runs
it, each in a fresh process:
1. cold: `python train.py --datasource FOLDER --preset tiny --max_steps 2 --val_max_sentences 16
   --num_epochs 1` with empty store, weights and runs folders;
2. warm: the same with `--max_steps 4`: a resume, which finds the stores built by the cold run.
Reported per run: seconds to the first step (until train.py logs its "steps per epoch" line, which
comes after all data preparation and model building), seconds in all, peak RSS while preparing (the
process's VmHWM at that line), peak RSS while training (the largest VmRSS sampled every 50 ms after
it), and the stores' size on disk. `--before CHECKOUT` runs another checkout's train.py on the same
folders instead (it takes no --store_folder): this project's figures before the data store.
The folders, stores and runs live in a temporary folder removed at the end (`--keep` keeps it).
With `--work DIR`, the corpora written there stay for the next run to reuse, each run gets a
folder of its own made there (tempfile.mkdtemp, `run_SIZE_store-*`), and only that folder is
removed: nothing else in DIR is touched.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_data.py: run it from the repository root as: python -m benchmarks.bench_data")

ROOT = Path(__file__).resolve().parents[1]  # the repository, where train.py runs from
PREPARED_LINE = "steps per epoch"


def write_corpus(folder: Path, pairs: int, source: Path, seed: int = 0) -> Path:
    """An opus_books-shaped parquet folder of `pairs` pairs made by joining source training pairs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nmt.corpora.sources import open_source, read_pairs
    base = [pair for batch in read_pairs(open_source(str(source), "en", "it"), "train", "en", "it") for pair in batch]
    rng = random.Random(seed)
    (folder / "en-it").mkdir(parents=True)
    schema = pa.schema([("id", pa.string()), ("translation", pa.struct([("en", pa.string()), ("it", pa.string())]))])
    with pq.ParquetWriter(folder / "en-it" / "train-00000-of-00001.parquet", schema) as writer:
        for start in range(0, pairs, 100_000):
            rows = []
            for index in range(start, min(start + 100_000, pairs)):
                parts = [base[rng.randrange(len(base))] for _ in range(rng.choice((2, 3)))]
                rows.append({"id": str(index), "translation": {"en": " ".join(p[0] for p in parts),
                                                               "it": " ".join(p[1] for p in parts)}})
            writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: en-it\n  data_files:\n  - split: train\n"
                                      "    path: en-it/train-*.parquet\n---\nbench_data.py corpus\n", encoding="utf-8")
    return folder


def memory_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed_run(command: list[str], cwd: Path) -> dict[str, Any]:
    """Run a train.py command, watching its memory and its stderr for the end of preparation."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    result: dict[str, Any] = {"prepared_s": None, "prepare_peak_gb": None, "train_peak_gb": 0.0}
    lines: list[str] = []

    def read_stderr() -> None:
        for line in process.stderr:
            lines.append(line)
            if PREPARED_LINE in line and result["prepared_s"] is None:
                result["prepared_s"] = time.monotonic() - started
                result["prepare_peak_gb"] = memory_kb(process.pid, "VmHWM") / 2 ** 20

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    while process.poll() is None:
        if result["prepared_s"] is not None:
            result["train_peak_gb"] = max(result["train_peak_gb"], memory_kb(process.pid, "VmRSS") / 2 ** 20)
        time.sleep(0.05)
    reader.join()
    result["total_s"] = time.monotonic() - started
    if process.returncode != 0 or result["prepared_s"] is None:
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}): {''.join(lines[-5:])}")
    return result


def folder_size_gb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2 ** 30 if folder.exists() else 0.0


def measure(size: int, work: Path, source: Path, checkout: Path, store: bool) -> dict[str, Any]:
    corpus = work / f"corpus_{size}"
    if not corpus.exists():
        made = time.monotonic()
        write_corpus(corpus, size, source)
        print(f"[bench_data] wrote {size:,} pairs in {time.monotonic() - made:.0f} s", file=sys.stderr, flush=True)
    run = Path(tempfile.mkdtemp(prefix=f"run_{size}_{'store' if store else 'before'}-", dir=work))
    folders = ["--model_folder", str(run / "weights"), "--runs_folder", str(run / "runs")]
    if store:
        folders += ["--store_folder", str(run / "stores")]
    command = [sys.executable, "train.py", "--datasource", str(corpus), "--preset", "tiny",
               "--val_max_sentences", "16", "--num_epochs", "1", *folders]
    row: dict[str, Any] = {"pairs": size}
    for name, steps in (("cold", "2"), ("warm", "4")):
        row[name] = timed_run(command + ["--max_steps", steps], checkout)
        print(f"[bench_data] {size:,} pairs, {name}: {json.dumps(row[name])}", file=sys.stderr, flush=True)
    row["store_gb"] = folder_size_gb(run / "stores")
    row["corpus_gb"] = folder_size_gb(corpus)
    shutil.rmtree(run, ignore_errors=True)  # made above by mkdtemp
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| pairs | cold: to first step | cold: total | cold: peak RSS preparing / training | warm restart: to "
             "first step | warm: peak RSS preparing / training | store on disk | corpus (parquet) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        cold, warm = row["cold"], row["warm"]
        lines.append(f"| {row['pairs']:,} | {cold['prepared_s']:.1f} s | {cold['total_s']:.1f} s | "
                     f"{cold['prepare_peak_gb']:.2f} / {cold['train_peak_gb']:.2f} GB | {warm['prepared_s']:.1f} s | "
                     f"{warm['prepare_peak_gb']:.2f} / {warm['train_peak_gb']:.2f} GB | {row['store_gb']:.2f} GB | "
                     f"{row['corpus_gb']:.2f} GB |")
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000,4000000", help="comma-separated corpus sizes in pairs")
    parser.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "data" / "tatoeba",
                        help="dataset folder whose train pairs are joined into the corpora")
    parser.add_argument("--before", type=Path, default=None, metavar="CHECKOUT",
                        help="run this checkout's train.py instead (without a data store)")
    parser.add_argument("--work", type=Path, default=None, help="folder for corpora and runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be comma-separated numbers, got {args.sizes!r}")
    if not (args.source / "README.md").is_file():
        print(f"bench_data.py: error: {args.source} is not a dataset folder", file=sys.stderr)
        return 1
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_data-"))
    try:
        rows = [measure(size, work, args.source.resolve(), (args.before or ROOT).resolve(), args.before is None)
                for size in sizes]
    except RuntimeError as error:
        print(f"bench_data.py: error: {error}", file=sys.stderr)
        return 1
    finally:
        if not args.keep and args.work is None:
            shutil.rmtree(work, ignore_errors=True)  # made above by mkdtemp
    result = {"command": " ".join(["python", "-m", "benchmarks.bench_data", *sys.argv[1:]]), "rows": rows}
    print(json.dumps(result, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
