"""translate.py with each engine as a user runs it: whole processes, start-up and model load included.

    python -m benchmarks.bench_cli --datasource data/tatoeba [--experiment_name NAME | --checkpoint PATH]
                                   [--split test] [--repeat 5] [--rounds 3] [--quantization auto] [--json]

The checkpoint (found as translate.py finds it) is exported as export.py exports it, with the run's
confidence calibrator, into a temporary folder (`--quantization`: default auto, this machine's
choice, timed as export.py times it where its rule cannot tell; the export is not timed here).
The split's sources (found as evaluate.py finds them), `--repeat` times over (tatoeba test's 1,282
lines 5 times: 6,410), are one input file, which each command translates from standard input into
a file, each run in a fresh interpreter, at --beam_size (default 5), segmentation as in
evaluate.py (off unless --split_sentences true):
- `pytorch`: `translate.py --checkpoint PATH`;
- `ctranslate2`: `translate.py --engine ctranslate2 --model_dir DIR`;
- `ctranslate2 --scores`, where the model has a confidence calibrator: the same with each line's
  confidence, what confidence costs when it is asked for (without --scores it is not computed).
The commands take turns, `--rounds` times (3), each keeping its fastest wall-clock time (what
`time` reports of the whole command) with that run's CPU time (user + sys); every run of a command
must write the same bytes, and --scores the same translations as without. Reported: the CPU (its
model name, /proc/cpuinfo's family and model numbers, the family ct2_model reads from its flags,
whether it has avx512f and avx2), threads, the times, and the target: the ctranslate2 command at
least 3x faster than the pytorch one, in wall-clock time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_cli.py: run it from the repository root as: python -m benchmarks.bench_cli")

import torch  # noqa: E402  (after the check above)

from config import EVALUATE, build_parser, parse_args, weights_dir  # noqa: E402
from export import export_model, run_calibrator  # noqa: E402
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.store import eval_pairs  # noqa: E402
from nmt.inference.ct2_model import QUANTIZATIONS, cpu_info, read_project_files  # noqa: E402
from nmt.inference.translator import split_sentences_on  # noqa: E402
from nmt.training.checkpoint import CheckpointError, load_for_inference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository, where the commands run
TARGET = 3.0  # the ctranslate2 command's speed-up over the pytorch one, whole processes
# The commands' environment, the user's: export.py's timing sets CT2_USE_MKL in this process.
ENVIRONMENT = dict(os.environ)


class BenchError(RuntimeError):
    """A command that failed, or runs of one command that disagree; the message says which."""


def cpu_description() -> dict[str, Any]:
    """This machine's CPU as the report names it."""
    info = cpu_info()
    return {"model_name": info.model or info.vendor or "unknown", "numbers": info.numbers, "family": info.family,
            "avx512f": "avx512f" in info.flags, "avx2": "avx2" in info.flags}


def commands(checkpoint: Path, model_dir: Path, decoding: list[str]) -> dict[str, list[str]]:
    """Each timed command's arguments to translate.py; `--scores` only where the export has a calibrator."""
    ct2 = ["--engine", "ctranslate2", "--model_dir", str(model_dir), *decoding]
    found = {"pytorch": ["--checkpoint", str(checkpoint), *decoding], "ctranslate2": ct2}
    project, *_ = read_project_files(model_dir)
    if project.get("confidence"):
        found["ctranslate2 --scores"] = [*ct2, "--scores"]
    return found


def run_once(arguments: list[str], source: Path, output: Path) -> tuple[float, float]:
    """One fresh `translate.py ARGUMENTS < source > output`: its wall-clock and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with source.open("rb") as stdin, output.open("wb") as stdout:
        result = subprocess.run([sys.executable, "translate.py", *arguments], cwd=ROOT, stdin=stdin, stdout=stdout,
                                stderr=subprocess.PIPE, text=True, env=ENVIRONMENT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise BenchError(f"translate.py {' '.join(arguments)} failed: "
                         f"{(result.stderr.strip().splitlines() or ['no message'])[-1]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(runs: dict[str, list[str]], source: Path, work: Path, rounds: int) -> dict[str, dict[str, Any]]:
    """Each command run `rounds` times, taking turns: its fastest wall-clock run and that run's CPU
    time. Raises BenchError where a command writes other bytes in another run."""
    rows: dict[str, dict[str, Any]] = {}
    for turn in range(rounds):
        for name, arguments in runs.items():
            output = work / f"{name.replace(' ', '_')}.{turn}.out"
            wall, cpu = run_once(arguments, source, output)
            first = work / f"{name.replace(' ', '_')}.0.out"
            if output.read_bytes() != first.read_bytes():
                raise BenchError(f"{name}: run {turn + 1} wrote other translations than run 1")
            if name not in rows or wall < rows[name]["wall_s"]:
                rows[name] = {"command": " ".join(["python translate.py", *arguments, "< INPUT"]), "wall_s": wall,
                              "cpu_s": cpu, "output": str(first)}
            print(f"[bench_cli] {name}: {wall:.1f} s", file=sys.stderr, flush=True)
    return rows


def translations(output: Path, scores: bool) -> list[str]:
    """The translations a command wrote: its non-blank lines, or with --scores each row's last column."""
    lines = output.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[-1] for line in lines] if scores else [line for line in lines if line.strip()]


def targets(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The target line, and what --scores costs over the ctranslate2 command (information)."""
    speedup = rows["pytorch"]["wall_s"] / rows["ctranslate2"]["wall_s"]
    found = {"ctranslate2 / pytorch, whole processes, wall-clock": {"value": speedup, "target": f">= {TARGET:g}",
                                                                     "met": speedup >= TARGET}}
    if "ctranslate2 --scores" in rows:
        cost = rows["ctranslate2 --scores"]["wall_s"] / rows["ctranslate2"]["wall_s"] - 1
        found["--scores' cost over the ctranslate2 command"] = {"value": cost, "target": "information", "met": True}
    return found


def table(result: dict[str, Any]) -> str:
    cpu = result["cpu"]
    lines = [f"{result['input']}, {result['model']} exported as {result['quantization']}, "
             f"{' '.join(result['decoding'])}, {result['threads']} threads",
             f"CPU: {cpu['model_name']} ({cpu['numbers'] or 'no family/model numbers'}), {cpu['family']}: "
             f"avx512f {'yes' if cpu['avx512f'] else 'no'}, avx2 {'yes' if cpu['avx2'] else 'no'}",
             "", "| command | wall-clock s (best) | CPU s (that run) |", "|---|---|---|"]
    lines += [f"| {name} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} |" for name, row in result["rows"].items()]
    lines += ["", *[f"{row['command']}" for row in result["rows"].values()], ""]
    if "ctranslate2 --scores" in result["rows"]:
        lines.append(f"--scores gave the same translations: {'yes' if result['scores_keep_translations'] else 'NO'}")
    for name, value in result["targets"].items():
        verdict = "" if value["target"] == "information" else f" (target {value['target']}) " + \
            ("met" if value["met"] else "MISS")
        lines.append(f"{name}: {value['value']:.2f}{verdict}")
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = build_parser(EVALUATE, __doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, metavar="PATH",
                        help="checkpoint file (default: the run's, by --checkpoint_choice)")
    parser.add_argument("--split", default="test", help="the split whose sources are translated (default test)")
    parser.add_argument("--repeat", type=int, default=5, help="the split's sources this many times over (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each command, taking turns; each keeps its "
                                                              "fastest (default 3)")
    parser.add_argument("--quantization", choices=("auto", *QUANTIZATIONS), default="auto",
                        help="export.py's --quantization (default auto)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, resolved = parse_args(EVALUATE, argv, parser=argument_parser())
    config = resolved.config
    if args.repeat < 1 or args.rounds < 1:
        print("bench_cli.py: error: --repeat and --rounds must be at least 1", file=sys.stderr)
        return 2
    try:
        model, tok_src, tok_tgt, model_config, path = load_for_inference(
            args.checkpoint, weights_dir(config), torch.device("cpu"), choice=config["checkpoint_choice"])
        sources = [source for source, _ in eval_pairs(config, args.split, model_config)]
    except (CheckpointError, DataError) as error:
        print(f"bench_cli.py: error: {error}", file=sys.stderr)
        return 1
    decoding = ["--beam_size", str(config["beam_size"]), "--device", "cpu", "--split_sentences",
                "true" if split_sentences_on(config, auto=False) else "false"]
    result: dict[str, Any] = {"model": str(path), "input": f"{config['datasource']} {args.split} x{args.repeat} "
                              f"({len(sources) * args.repeat} lines)", "decoding": decoding, "cpu": cpu_description(),
                              "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="bench_cli-") as folder:
        work = Path(folder)
        (work / "input.txt").write_text("".join(f"{source}\n" for source in sources * args.repeat), encoding="utf-8")
        # export.py's export, as `export.py --checkpoint PATH --quantization Q` writes it
        export_model(model, model_config, tok_src, tok_tgt, work / "ct2", args.quantization, str(path),
                     confidence=run_calibrator(path.parent))
        del model
        result["quantization"] = read_project_files(work / "ct2")[0]["quantization"]
        try:
            result["rows"] = measure(commands(path, work / "ct2", decoding), work / "input.txt", work, args.rounds)
        except BenchError as error:
            print(f"bench_cli.py: error: {error}", file=sys.stderr)
            return 1
        outputs = {name: Path(row.pop("output")) for name, row in result["rows"].items()}
        result["scores_keep_translations"] = "ctranslate2 --scores" not in outputs or \
            translations(outputs["ctranslate2 --scores"], True) == translations(outputs["ctranslate2"], False)
    result["targets"] = targets(result["rows"])
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0 if result["scores_keep_translations"] else 1


if __name__ == "__main__":
    sys.exit(main())
