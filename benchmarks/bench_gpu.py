"""GPU training benchmark: the step train.py takes, on the work users run, against torch.nn.Transformer.

    python -m benchmarks.bench_gpu [--device cuda] [--json FILE] [--steps 200] [--budget_s 300] [--tiny]

One process, one device. Prints one table on stdout (progress on stderr) and, with --json, writes
the same figures as one JSON object. In order:
1. Peaks: the GPU's datasheet bf16 peak (bench.SPEC_BF16_TFLOPS, by its name) and a bf16 `torch.mm`
   of 8192-square matrices measured here (fp32 on a CPU).
2. The host floor: the host time of one training step of paper base and of paper big, at the shape
   of a 32k-token news batch, on the meta device: the kernels launched with no work behind them,
   the floor a GPU's step cannot go under without CUDA graphs.
3. The loss on a 32k-token batch of a 32k vocabulary: loss.loss_sum's chunked form against the
   fused F.cross_entropy, forward and backward, time and peak memory.
4. Training legs, each a model and a batch, on news lengths (news_workload.py: newstest2009's
   histogram, a 32k joint vocabulary, sentences up to 128 tokens) unless said: paper base and big
   (config.PRESETS, tied embeddings) at 32k and 64k tokens; the anchors' settings, big at 10,240
   tokens (NVIDIA DeepLearningExamples, 1 x A100: 82,059 tokens/s) and big at 13,824 with
   sentences of at most 64 tokens (MLPerf v0.7, NVIDIA, 8 x A100: about 101k a GPU); and tatoeba
   (data/tatoeba, bench.py's word-level tokenizers) at 4,096, the launch-overhead check. Rows:
   `captured`, train.py's GPU step (cuda_graphs.CapturedStep over length buckets); `eager`, the
   step as it ran before (exact widths, no graphs); torch.nn.Transformer (bench.TorchTransformer,
   same sizes, tied, SDPA, the fused F.cross_entropy, the same AdamW) on the captured row's very
   batches, eager and torch.compile'd (its best counts). Each row: warm-up steps on one batch of
   every shape of its timed batches (where a captured row records its graphs), then `--steps` timed
   steps, each with its batch collated by DataLoader workers, as train.py does, its one read of the
   device and AdamW. Reported: real target tokens/s (labels that are not padding), ms a step, MFU
   (the matrix FLOPs of the sentences at their own lengths, model.train_flops, per second) against
   the datasheet's peak and the measured one, the padding share of the batches' positions, peak
   memory (torch.cuda.max_memory_allocated), and the distinct batch shapes.
Rows run in the order of ROWS, the targets' first, and none starts once `--budget_s` seconds have
passed since the start: those are reported as not run. The targets are judged only on a GPU at
full sizes (n/a elsewhere); with --json the file is rewritten after every row. `--tiny` shrinks
everything to a seconds-long smoke test on any device (tests/test_bench_gpu.py). On a CPU the captured rows run through
cuda_graphs.StandInGraphs (the capture and replay code, no graphs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("bench_gpu.py: run it from the repository root as: python -m benchmarks.bench_gpu")

from benchmarks.bench import PeakMemory, TorchTransformer, matmul_peak, spec_peak_tflops, synchronize  # noqa: E402
from benchmarks.news_workload import NEWS_VOCAB, news_dataset  # noqa: E402
from config import PRESETS, ConfigError, get_config  # noqa: E402
from dataset import BatchPlan, BilingualDataset, MicroBatches, bucket_lengths, padding_waste  # noqa: E402
from model import build_model, train_flops  # noqa: E402
from nmt.atomic_files import atomic_write_bytes  # noqa: E402
from nmt.corpora.sources import open_source, read_pairs  # noqa: E402
from nmt.corpora.tokenizer import train_tokenizer  # noqa: E402
from nmt.device import pick_device  # noqa: E402
from nmt.precision import amp_dtype, autocast_context  # noqa: E402
from nmt.training.cuda_graphs import CapturedStep, CudaGraphs, EagerStep, StandInGraphs  # noqa: E402
from nmt.training.loss import loss_sum  # noqa: E402
from nmt.training.optimizer import build_optimizer  # noqa: E402

STARTED = time.monotonic()
TATOEBA = Path(__file__).resolve().parents[1] / "data" / "tatoeba"
TATOEBA_TODAY = 89_268  # docs/speed.md: the H200's tatoeba tokens/s before this benchmark (base, 4,096 tokens)


@dataclass(frozen=True)
class Leg:
    """A model (a config preset) on batches of `batch_tokens` of `data` (news or tatoeba), sentences up
    to `seq_len` tokens (both sides at most `max_tokens` where given)."""

    preset: str
    batch_tokens: int
    data: str = "news"
    seq_len: int = 128
    max_tokens: int = 0


LEGS = {"base 32k": Leg("base", 32_768), "big 32k": Leg("big", 32_768), "base 64k": Leg("base", 65_536),
        "big 64k": Leg("big", 65_536), "big 10,240 (DLE)": Leg("big", 10_240),
        "big 13,824, <= 64 (MLPerf)": Leg("big", 13_824, max_tokens=64),
        "tatoeba base 4,096": Leg("base", 4_096, "tatoeba")}
ROWS = [("base 32k", "captured"), ("base 32k", "nn.Transformer"), ("big 32k", "captured"),
        ("big 32k", "nn.Transformer"), ("tatoeba base 4,096", "captured"), ("tatoeba base 4,096", "eager"),
        ("base 32k", "eager"),
        ("big 10,240 (DLE)", "captured"), ("big 13,824, <= 64 (MLPerf)", "captured"), ("base 64k", "captured"),
        ("big 64k", "captured"), ("base 32k", "nn.Transformer, compiled"), ("big 32k", "nn.Transformer, compiled"),
        ("big 32k", "eager")]
TINY = {"base": {**PRESETS["tiny"], "dropout": 0.1}, "big": {**PRESETS["tiny"], "d_model": 64, "num_heads": 4,
                                                              "d_ff": 128, "dropout": 0.1}}
TINY_VOCAB = 320
TINY_SHARE = 32  # a tiny run's batches: the legs' budgets over this


def log(message: str) -> None:
    print(f"[bench_gpu {time.monotonic() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- legs' data and models

def leg_config(leg: Leg, tiny: bool) -> dict[str, Any]:
    """The config a leg trains with: its preset, a joint tied vocabulary, its seq_len and batch (tiny:
    TINY's sizes, the batch TINY_SHARE times smaller); bf16 on CUDA."""
    preset = TINY[leg.preset] if tiny else PRESETS[leg.preset]
    return {**get_config(), **preset, "seq_len": leg.seq_len, "joint_vocab": True, "tie_embeddings": True,
            "amp": "auto", "batch_tokens": leg.batch_tokens // TINY_SHARE if tiny else leg.batch_tokens}


def tatoeba_dataset(seq_len: int, limit: int) -> tuple[BilingualDataset, int]:
    """tatoeba's train split (at most `limit` pairs) under one word-level vocabulary of both sides, as
    bench.py tokenizes it; the vocabulary's size."""
    source = open_source(str(TATOEBA), "en", "it")
    pairs = [pair for batch in read_pairs(source, "train", "en", "it") for pair in batch][:limit]
    tokenizer = train_tokenizer((text for pair in pairs for text in pair), "wordlevel", 16_000, 2)
    return BilingualDataset.from_pairs(pairs, tokenizer, tokenizer, seq_len, "tatoeba"), tokenizer.get_vocab_size()


def leg_data(leg: Leg, tiny: bool, steps: int, seed: int) -> tuple[BilingualDataset, int]:
    """The leg's pairs, enough for its warm-up and timed steps, and the vocabulary's size."""
    if leg.data == "tatoeba":
        return tatoeba_dataset(leg.seq_len, 500 if tiny else 1_000_000)
    vocab = TINY_VOCAB if tiny else NEWS_VOCAB
    batch_tokens = leg_config(leg, tiny)["batch_tokens"]
    pairs = max(500, (steps + 60) * batch_tokens // 30)  # news batches hold about one pair per 30 tokens
    return news_dataset(pairs, seed, leg.seq_len, leg.max_tokens, vocab), vocab


def timed_batches(plan: BatchPlan, steps: int) -> list[np.ndarray]:
    """`steps` batches of the plan's epochs, in order, the epochs repeated as needed."""
    batches: list[np.ndarray] = []
    epoch = 0
    while len(batches) < steps:
        batches += plan.epoch_batches(epoch)
        epoch += 1
    return batches[:steps]


def warm_up_batches(plan: BatchPlan, batches: list[np.ndarray]) -> list[np.ndarray]:
    """One batch of every shape among `batches` (where a captured step records its graphs), then three more."""
    seen: dict[Any, np.ndarray] = {}
    for batch in batches:
        shape = plan.shape_of(batch) or (len(batch), int(plan.dataset.src_lens[batch].max()),
                                         int(plan.dataset.tgt_lens[batch].max()))
        seen.setdefault(shape, batch)
    return [*seen.values(), *batches[:3]]


def build_row(variant: str, config: dict[str, Any], vocab: int, device: torch.device,
              backend: str = "inductor") -> tuple[torch.nn.Module, EagerStep, Callable[..., torch.Tensor]]:
    """A row's model on the device, its step (eager, or captured) and its micro-batch's compute
    (forward, loss, backward), as train.py's Trainer.loss_backward runs it; `backend`: torch.compile's."""
    torch.manual_seed(0)
    torch_transformer = variant.startswith("nn.Transformer")
    model = (TorchTransformer(vocab, vocab, config) if torch_transformer else build_model(config, vocab, vocab))
    model = model.to(device).train()
    optimizer = build_optimizer(model, config)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    if variant == "captured":
        graphs = CudaGraphs() if device.type == "cuda" else StandInGraphs()
        step = CapturedStep(model, optimizer, scaler, config["clip_grad"], device, graphs)
    else:
        step = EagerStep(model, optimizer, scaler, config["clip_grad"], device)
    forward = torch.compile(model, dynamic=True, backend=backend) if variant.endswith("compiled") else model
    dtype = amp_dtype(config, device)

    def compute(batch: dict[str, torch.Tensor], scale: Any) -> torch.Tensor:
        with autocast_context(device, dtype, cache=variant != "captured"):
            logits = forward(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
        summed = loss_sum(logits, batch["label"], config["label_smoothing"], fused=torch_transformer)
        del logits
        (summed * scale).backward()
        return summed.detach()

    return model, step, compute


# ---------------------------------------------------------------------------- one row

def run_steps(step: EagerStep, compute: Callable[..., torch.Tensor], loader: DataLoader) -> int:
    """train.py's steps over the loader's batches, one micro-batch each; how many were not finite."""
    skipped = 0
    for batch in loader:
        tokens = int(batch.pop("step_tokens"))
        batch.pop("num_tokens")
        nonfinite = bool(step.check(step.micro_batch(batch, 1.0 / tokens, compute)))  # the step's one read
        step.apply(nonfinite)
        skipped += nonfinite
    return skipped


def loader_of(plan: BatchPlan, batches: list[np.ndarray], device: torch.device) -> DataLoader:
    """The batches collated in DataLoader workers with their token counts, as run_data.epoch_loader does."""
    plan_entries = [(batch, int(plan.dataset.tgt_lens[batch].sum())) for batch in batches]
    workers = 2 if device.type == "cuda" else 0
    return DataLoader(MicroBatches(plan.dataset, plan_entries, plan.shape_of), batch_size=None, shuffle=False,
                      num_workers=workers, pin_memory=device.type == "cuda")


def measure_row(leg: Leg, variant: str, dataset: BilingualDataset, vocab: int, args: argparse.Namespace,
                device: torch.device) -> dict[str, Any]:
    """One row (module docstring): warm-up, then `args.steps` timed steps; its figures."""
    config = leg_config(leg, args.tiny)
    buckets = None if variant == "eager" else bucket_lengths(leg.seq_len)
    plan = BatchPlan(dataset, config["batch_tokens"], args.seed, buckets=buckets)
    batches = timed_batches(plan, args.steps)
    model, step, compute = build_row(variant, config, vocab, device, "eager" if args.tiny else "inductor")
    with PeakMemory(device) as memory:
        run_steps(step, compute, loader_of(plan, warm_up_batches(plan, batches), device))
        synchronize(device)
        started = time.perf_counter()
        skipped = run_steps(step, compute, loader_of(plan, batches, device))
        synchronize(device)
        seconds = time.perf_counter() - started
    tokens = sum(int(dataset.tgt_lens[batch].sum()) for batch in batches)
    flops = sum(int(train_flops(1, dataset.src_lens[batch], dataset.tgt_lens[batch], config, vocab).sum())
                for batch in batches)
    shapes = {plan.shape_of(batch) or len(batch) for batch in batches} if buckets is not None else None
    return {"leg": leg.__dict__, "variant": variant, "steps": len(batches), "skipped_steps": skipped,
            "tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / len(batches),
            "real_flops_per_s": flops / seconds,
            "padding": padding_waste(batches, dataset.src_lens, dataset.tgt_lens, plan.shape_of),
            "peak_memory_bytes": memory.peak, "memory_kind": memory.kind,
            "batch_shapes": len(shapes) if shapes is not None else "exact widths",
            "parameters": sum(p.numel() for p in model.parameters()), "dtype": str(amp_dtype(config, device))}


# ---------------------------------------------------------------------------- host floor, loss, peaks

class OpCount(TorchDispatchMode):
    """How many ATen operations run inside it: on CUDA each is a kernel launch, or a few."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def host_floor(config: dict[str, Any], vocab: int, rows: int, length: int, repeats: int = 2) -> dict[str, float]:
    """One eager training step on the meta device (module docstring): its host time in ms (median of
    `repeats` after one more), and the operations of its forward, loss, backward and clipping, which
    a GPU launches (AdamW's, one loop of them here, are one fused kernel there). The meta device's
    kernels are Python (torch._refs), slower than CUDA's launches: the time is an upper bound."""
    meta = torch.device("meta")
    model = build_model(config, vocab, vocab).to(meta).train()
    optimizer = build_optimizer(model, config)
    step = EagerStep(model, optimizer, torch.amp.GradScaler("cpu", enabled=False), config["clip_grad"], meta)
    batch = {"encoder_input": torch.zeros(rows, length, dtype=torch.long, device=meta),
             "decoder_input": torch.zeros(rows, length, dtype=torch.long, device=meta),
             "label": torch.zeros(rows, length, dtype=torch.long, device=meta),
             "src_mask": torch.ones(rows, 1, 1, length, dtype=torch.bool, device=meta)}

    def compute(moved: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
        logits = model(moved["encoder_input"], moved["decoder_input"], moved["src_mask"])
        summed = loss_sum(logits, moved["label"], config["label_smoothing"])
        (summed * scale).backward()
        return summed.detach()

    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        with OpCount() as ops:
            step.check(step.micro_batch(batch, 1.0, compute))
        step.apply(False)  # a meta tensor holds no value to read: the step is applied
        times.append(time.perf_counter() - started)
    return {"ms": 1000 * statistics.median(times[1:]), "operations": ops.count}


def loss_forms(device: torch.device, tokens: int, vocab: int, repeats: int = 5) -> list[dict[str, Any]]:
    """The chunked loss and the fused F.cross_entropy on bf16 logits (tokens x vocab): forward and
    backward, median ms and peak memory."""
    generator = torch.Generator().manual_seed(0)
    label = torch.randint(4, vocab, (tokens,), generator=generator).to(device)
    rows = []
    for name, fused in (("chunked (loss.loss_sum)", False), ("fused (F.cross_entropy)", True)):
        logits = torch.randn(tokens, vocab, generator=generator).to(device, torch.bfloat16).requires_grad_()
        times = []
        with PeakMemory(device) as memory:
            for _ in range(repeats + 1):
                synchronize(device)
                started = time.perf_counter()
                loss_sum(logits, label, 0.1, fused=fused).backward()
                synchronize(device)
                times.append(time.perf_counter() - started)
                logits.grad = None
        rows.append({"form": name, "ms": 1000 * statistics.median(times[1:]), "peak_memory_bytes": memory.peak,
                     "memory_kind": memory.kind})
        del logits
    return rows


def peaks(device: torch.device, tiny: bool) -> dict[str, Any]:
    """The datasheet's bf16 peak (CUDA) and the measured matmul peak, in TFLOP/s."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    measured = matmul_peak(device, 256 if tiny else 8192, dtype)["torch.mm"] / 1000
    return {"device": name, "spec_tflops": spec_peak_tflops(name) if device.type == "cuda" else None,
            "measured_tflops": measured, "measured_dtype": str(dtype).replace("torch.", "")}


# ---------------------------------------------------------------------------- the run and its report

def training_rows(args: argparse.Namespace, device: torch.device, result: dict[str, Any]) -> None:
    """Every row of ROWS that starts within the budget, in order, each with its MFUs, into
    result["rows"]; the JSON rewritten after each (a leg stopped by gpu_check.sh's limit keeps its rows)."""
    data: dict[str, tuple[BilingualDataset, int]] = {}
    peak, rows = result["peaks"], result["rows"]
    for leg_name, variant in [(leg, variant) for leg, variant in ROWS if leg in args.rows and variant in args.variants]:
        if time.monotonic() - STARTED > args.budget_s:
            rows.append({"leg_name": leg_name, "variant": variant, "not_run": f"past --budget_s {args.budget_s:g}"})
            continue
        leg = LEGS[leg_name]
        if leg_name not in data:
            data[leg_name] = leg_data(leg, args.tiny, args.steps, args.seed)
        log(f"{leg_name}, {variant}")
        row = {"leg_name": leg_name, **measure_row(leg, variant, *data[leg_name], args, device)}
        for key, tflops in (("mfu_spec", peak["spec_tflops"]), ("mfu_measured", peak["measured_tflops"])):
            row[key] = row["real_flops_per_s"] / 1e12 / tflops if tflops else None
        log(f"{leg_name}, {variant}: {row['tokens_per_s']:,.0f} tokens/s, {row['ms_per_step']:.1f} ms a step")
        rows.append(row)
        write_json(args.json, {**result, "targets": targets(rows, judged(args, device))})
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the next row starts from the memory this one held


def judged(args: argparse.Namespace, device: torch.device) -> bool:
    """Whether the run is under the targets' conditions: full sizes on a GPU."""
    return device.type == "cuda" and not args.tiny


def write_json(path: Path | None, result: dict[str, Any]) -> None:
    if path is not None:
        atomic_write_bytes(path, (json.dumps(result, indent=1) + "\n").encode("utf-8"))


def targets(rows: list[dict[str, Any]], judge: bool) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it is met (None: not measured,
    or not under the targets' conditions, `judge` false: a CPU's or a tiny run's values are no GPU's)."""
    found = {(row["leg_name"], row["variant"]): row for row in rows if "not_run" not in row}

    def speed(leg: str, variant: str) -> float | None:
        return found[(leg, variant)]["tokens_per_s"] if (leg, variant) in found else None

    checks = []
    for leg, least in (("base 32k", 0.30), ("big 32k", 0.40)):
        mfu = found.get((leg, "captured"), {}).get("mfu_spec")
        checks.append((f"{leg}: MFU of the datasheet's peak", mfu, least))
        baselines = (speed(leg, "nn.Transformer"), speed(leg, "nn.Transformer, compiled"))
        baseline, ours = max(filter(None, baselines), default=None), speed(leg, "captured")
        checks.append((f"{leg}: x torch.nn.Transformer (its best)", ours / baseline if ours and baseline else None,
                       1.5))
    tatoeba = speed("tatoeba base 4,096", "captured")
    checks.append((f"tatoeba 4,096: x the {TATOEBA_TODAY:,} tokens/s of docs/speed.md",
                   tatoeba / TATOEBA_TODAY if tatoeba else None, 3.0))
    return [{"target": name, "value": value, "needed": least,
             "met": None if value is None or not judge else value >= least} for name, value, least in checks]


def run(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Every figure of the module docstring, in its order, and the targets."""
    peak = peaks(device, args.tiny)
    log(f"{peak['device']}: measured {peak['measured_tflops']:.3g} TFLOP/s ({peak['measured_dtype']} torch.mm)")
    floor_config = {key: leg_config(LEGS[key], args.tiny) for key in ("base 32k", "big 32k")}
    vocab = TINY_VOCAB if args.tiny else NEWS_VOCAB
    length = 32 if not args.tiny else 16
    floors = {key: host_floor(config, vocab, config["batch_tokens"] // length, length, 1 if args.tiny else 2)
              for key, config in floor_config.items()}
    log("host floor (meta device): " + ", ".join(f"{key} {floor['ms']:.0f} ms" for key, floor in floors.items()))
    losses = {"tokens": 512 if args.tiny else 32_768, "vocab": vocab}
    losses["forms"] = loss_forms(device, losses["tokens"], vocab)
    result = {"command": " ".join(["python", "-m", "benchmarks.bench_gpu", *args.argv]),
              "date": datetime.date.today().isoformat(), "torch": torch.__version__, "tiny": args.tiny,
              "peaks": peak, "host_floor": floors, "loss": losses, "rows": []}
    training_rows(args, device, result)
    return {**result, "targets": targets(result["rows"], judged(args, device)), "seconds": time.monotonic() - STARTED}


def target_line(target: dict[str, Any]) -> str:
    mark = {True: "met ", False: "MISS", None: "n/a "}[target["met"]]  # n/a: not measured, or not on a GPU
    value = "not measured" if target["value"] is None else f"{target['value']:.3f}"
    return f"  [{mark}] {target['target']}: {value} (needed {target['needed']})"


def table(result: dict[str, Any]) -> str:
    peak = result["peaks"]
    lines = [f"bench_gpu.py on {peak['device']}, torch {result['torch']}, {result['date']}"
             + (" -- TINY sizes, not the targets' conditions" if result["tiny"] else ""),
             f"peaks: datasheet {peak['spec_tflops'] or '-'} TFLOP/s bf16, measured {peak['measured_tflops']:.3g} "
             f"({peak['measured_dtype']} torch.mm); host floor of a step (meta device): "
             + ", ".join(f"{key} {floor['ms']:.0f} ms, {floor['operations']} operations"
                         for key, floor in result["host_floor"].items()),
             f"loss of {result['loss']['tokens']} tokens x {result['loss']['vocab']} entries, forward + backward: "
             + "; ".join(f"{row['form']} {row['ms']:.1f} ms, {row['peak_memory_bytes'] / 2**30:.2f} GiB"
                         for row in result["loss"]["forms"]),
             "", f"{'leg':<28}{'row':<26}{'tokens/s':>11}{'ms/step':>9}{'MFU spec':>9}{'MFU meas':>9}{'padding':>8}"
                 f"{'mem GiB':>8}{'shapes':>7}"]
    for row in result["rows"]:
        if "not_run" in row:
            lines.append(f"{row['leg_name']:<28}{row['variant']:<26}  not run: {row['not_run']}")
            continue
        mfu = [f"{100 * row[key]:>8.1f}%" if row[key] is not None else f"{'-':>9}"
               for key in ("mfu_spec", "mfu_measured")]
        lines.append(f"{row['leg_name']:<28}{row['variant']:<26}{row['tokens_per_s']:>11,.0f}{row['ms_per_step']:>9.1f}"
                     f"{''.join(mfu)}{100 * row['padding']:>7.1f}%{row['peak_memory_bytes'] / 2**30:>8.2f}"
                     f"{str(row['batch_shapes']).replace('exact widths', 'exact'):>7}")
    lines += ["", "targets:"] + [target_line(target) for target in result["targets"]]
    lines.append(f"({result['seconds']:.0f} s; command: {result['command']})")
    return "\n".join(lines)


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file as JSON")
    parser.add_argument("--steps", type=int, default=200, help="timed steps a row (default 200)")
    parser.add_argument("--budget_s", type=float, default=300.0, help="start no row after this many seconds")
    parser.add_argument("--rows", nargs="+", default=list(LEGS), choices=list(LEGS), metavar="LEG",
                        help=f"only these legs (default: all): {', '.join(LEGS)}")
    variants = list(dict.fromkeys(variant for _, variant in ROWS))
    parser.add_argument("--variants", nargs="+", default=variants, choices=variants, metavar="ROW",
                        help=f"only these rows of each leg (default: all): {', '.join(variants)}")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a smoke test of the benchmark itself")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    if args.steps < 1:
        print("bench_gpu.py: error: --steps must be at least 1", file=sys.stderr)
        return 2
    try:
        device = pick_device(args.device)
    except ConfigError as error:
        print(f"bench_gpu.py: error: {error}", file=sys.stderr)
        return 2
    result = run(args, device)
    write_json(args.json, result)
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
