"""What a batch shape costs the first time it is seen, against the same step repeated: this project's
attention backends (device.pick_device) beside torch's default ones.

    python -m benchmarks.bench_new_shapes [--datasource FOLDER] [--device auto|cpu|cuda] [--steps 24] [--json]

Token-budget batches give almost every training step a (sentences, source width, target width) of
its own, and incremental decoding a key length of its own at every token. A kernel that builds a
plan per shape (cuDNN's attention does, and keeps it in a cache keyed by shape) pays that build on
each of them, which a benchmark that warms up on the very batches it times never sees.

Each setting runs in a fresh process, so caches of kernels and plans start empty: the paper-base
training step of benchmarks/bench.py (`project_step`, bf16 on a GPU that has it) on two warm-up
batches, then on `--steps` batches of the epoch whose shapes are all different, each timed on first
sight, then the same batches again, timed; then greedy decoding (KV cache, 16 sentences, 40
tokens) twice, timed each time; then the host's busiest operators (torch.profiler, self CPU time)
over four more batches of shapes not seen before. Settings: "project" (the backends as
pick_device leaves them) and "torch default" (cuDNN's attention turned back on, as torch ships it).
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
from typing import Any

import numpy as np
import torch

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_new_shapes.py: run it from the repository root as: python -m benchmarks.bench_new_shapes")

from benchmarks.bench import bench_settings, load_data, on_device, project_step, timed  # noqa: E402
from config import ConfigError  # noqa: E402
from dataset import BatchPlan  # noqa: E402
from nmt.inference.decoding import greedy_decode  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from model import build_model  # noqa: E402
from nmt.training.optimizer import build_optimizer  # noqa: E402
from nmt.precision import amp_dtype  # noqa: E402
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.tokenizer import EOS_ID, PAD_ID, TokenizerError  # noqa: E402

SETTINGS = ("project", "torch default")
PROFILED_BATCHES = 4
DECODE_SENTENCES, DECODE_TOKENS = 16, 40


def distinct_shapes(dataset: Any, batches: list[np.ndarray], count: int) -> list[np.ndarray]:
    """The first `count` batches of the epoch whose (sentences, source width, target width) differ."""
    seen, picked = set(), []
    for batch in batches:
        shape = (len(batch), int(dataset.src_lens[batch].max()), int(dataset.tgt_lens[batch].max()))
        if shape not in seen:
            seen.add(shape)
            picked.append(batch)
        if len(picked) == count:
            break
    return picked


def measure(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """One setting, in this process: first-sight and repeated steps, decoding, a profile."""
    device = pick_device(args.device)
    if setting == "torch default":
        torch.backends.cuda.enable_cudnn_sdp(True)
    settings = bench_settings(args.quick)
    config = settings["config"]
    dataset, tok_src, tok_tgt, _ = load_data(args.datasource, settings, args.seed)
    vocab = (tok_src.get_vocab_size(), tok_tgt.get_vocab_size())
    batches = distinct_shapes(dataset, BatchPlan(dataset, config["batch_tokens"], args.seed).epoch_batches(0),
                              2 + args.steps + PROFILED_BATCHES)
    on = [on_device(dataset.collate(batch), device) for batch in batches]
    warmups, timed_batches, profiled = on[:2], on[2:2 + args.steps], on[2 + args.steps:]
    torch.manual_seed(args.seed)
    model = build_model(config, *vocab).to(device).train()
    optimizer = build_optimizer(model, config)
    step = functools.partial(project_step, model, optimizer, config=config, dtype=amp_dtype(config, device),
                             device=device)
    for batch in warmups:
        step(batch)
    first = [timed(device, lambda: step(batch))[0] for batch in timed_batches]
    again = [timed(device, lambda: step(batch))[0] for batch in timed_batches]

    model.eval()
    with torch.no_grad():
        model.projection_layer.proj.bias[EOS_ID] = -1e9  # every sentence decodes all its tokens
        src = dataset.collate(np.arange(DECODE_SENTENCES))["encoder_input"].to(device)
        decode = lambda: greedy_decode(model, src, (src != PAD_ID)[:, None, None, :], DECODE_TOKENS)  # noqa: E731
        decoding = [timed(device, decode)[0] for _ in range(2)]
    model.train()

    activities = [torch.profiler.ProfilerActivity.CPU] + \
        ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as profile:
        for batch in profiled:
            step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = sorted(profile.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    busiest = [{"op": event.key, "calls": event.count, "self_cpu_ms": event.self_cpu_time_total / 1000 / len(profiled)}
               for event in events[:12]]
    return {"setting": setting, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled() if device.type == "cuda" else None,
            "steps": len(first),
            "shapes": [list(batch["label"].shape) + [batch["encoder_input"].size(1)] for batch in timed_batches],
            "first_ms": [1000 * s for s in first], "again_ms": [1000 * s for s in again],
            "decode_first_ms": 1000 * decoding[0], "decode_again_ms": 1000 * decoding[1],
            "profiled_batches": len(profiled), "busiest_per_step": busiest}


def table(results: list[dict[str, Any]], quick: bool) -> str:
    lines = [f"{results[0]['device']}, torch {results[0]['torch']}: {results[0]['steps']} training steps of "
             f"distinct shapes ({'tiny' if quick else 'paper base'}), then greedy decoding "
             f"({DECODE_SENTENCES} x {DECODE_TOKENS} tokens)", "",
             "| setting | cuDNN attention | step, first sight (median / mean ms) | step, again (median ms) "
             "| decoding, first / again (ms) |", "|---|---|---|---|---|"]
    for r in results:
        cudnn = "-" if r["cudnn_attention"] is None else "on" if r["cudnn_attention"] else "off"
        lines.append(f"| {r['setting']} | {cudnn} | "
                     f"{statistics.median(r['first_ms']):.1f} / {statistics.mean(r['first_ms']):.1f} | "
                     f"{statistics.median(r['again_ms']):.1f} | "
                     f"{r['decode_first_ms']:.0f} / {r['decode_again_ms']:.0f} |")
    for r in results:
        lines += ["", f"{r['setting']}: busiest host operators over {r['profiled_batches']} steps of new shapes "
                      f"(self CPU ms a step)"]
        lines += [f"  {e['self_cpu_ms']:9.2f}  {e['calls']:6d}  {e['op'][:90]}" for e in r["busiest_per_step"]]
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_new_shapes.py", description=__doc__.splitlines()[0])
    parser.add_argument("--datasource", default=None, help="local dataset folder in Hub layout (default: "
                                                           "synthetic opus_books-like lengths)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=24, help="timed batches of distinct shapes (default 24)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the benchmark itself")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--setting", choices=SETTINGS, help=argparse.SUPPRESS)  # one setting, in this process
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    try:
        if args.setting:
            print(json.dumps(measure(args.setting, args)), flush=True)
            return 0
        pick_device(args.device)  # a device the machine lacks is refused here, once
    except (ConfigError, DataError, TokenizerError) as error:
        print(f"bench_new_shapes.py: error: {error}", file=sys.stderr)
        return 2
    results = []
    for setting in SETTINGS:
        command = [sys.executable, "-m", "benchmarks.bench_new_shapes", "--setting", setting,
                   *(argv if argv is not None else sys.argv[1:])]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if done.returncode == 2:  # bad input, which the process has named in one line
            return 2
        if done.returncode != 0:
            print(f"bench_new_shapes.py: error: the {setting!r} process exited {done.returncode}", file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(json.dumps(results, indent=1) if args.json else table(results, args.quick), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
