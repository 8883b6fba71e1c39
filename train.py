"""Train the Transformer: `python train.py [--preset cpu] [--key value ...]`.

Reads top to bottom: config -> distributed setup -> data and tokenizers -> model, optimizer,
schedule -> resume -> the loop (token-budget batches, AMP, gradient accumulation, clipping,
non-finite step skipping) -> validation and checkpoints at epoch ends, at max_steps, at
max_minutes, every save_every_steps, and on SIGINT/SIGTERM.

Under `torchrun --nproc_per_node N train.py ...` each rank trains on a disjoint share of every
global step (DistributedDataParallel); rank 0 alone writes tokenizers, checkpoints, TensorBoard and
the progress bar, and runs validation while the others wait.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import math
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from attention_plot import attention_figure
from checkpoint import (CheckpointError, RunLock, atomic_write_bytes, checkpoint_candidates, load_checkpoint,
                        load_latest, save_checkpoint)
from config import IDENTITY_KEYS, ConfigError, parse_config, runs_dir, validate_config, weights_dir
from dataset import (BatchPlan, BilingualDataset, DataError, MicroBatches, get_or_build_tokenizers, load_splits,
                     log, padding_waste)
from decoding import translate_sentences
from model import Transformer, build_model
from scoring import corpus_scores
from tokenizer import PAD_ID, TokenizerError, tokenizer_from_json


# ---------------------------------------------------------------------------- setup helpers

def pick_device(config: dict[str, Any], local_rank: int) -> torch.device:
    choice = config["device"]
    if choice == "auto":
        if torch.cuda.is_available():
            choice = "cuda"
        elif torch.backends.mps.is_available():
            choice = "mps"
        else:
            choice = "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available")
        return torch.device("cuda", local_rank)
    if choice == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("--device mps: MPS is not available")
    return torch.device(choice)


def keep_freed_memory() -> None:
    """Make glibc's malloc keep freed memory for reuse instead of handing it back to the OS.

    By default every block over 32 MB (at base size: feed-forward activations, logits) is mapped
    afresh and page-faulted in on first touch, every training step on CPU: at the paper-base size
    with 4k-token batches that was a quarter of the step's time (bench.py). The cost is that the
    process keeps its peak heap until it exits. Does nothing where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    mallopt(m_mmap_max, 0)
    mallopt(m_trim_threshold, 2 ** 31 - 1)


def amp_dtype(config: dict[str, Any], device: torch.device) -> torch.dtype | None:
    """bf16 where the hardware has it, else fp16 (with a GradScaler); off on CPU unless asked."""
    choice = config["amp"]
    if choice == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[choice]


def build_optimizer(model: torch.nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    """AdamW; weight decay on weight matrices only, never on biases, LayerNorms or embeddings."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=config["lr"], betas=(config["adam_beta1"], config["adam_beta2"]),
                             eps=config["adam_eps"])


def lr_factor(step: int, config: dict[str, Any], total_steps: int) -> float:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup, then the paper's
    inverse square root, or a cosine decay to min_lr at `total_steps`."""
    step += 1
    warmup = config["warmup_steps"]
    if warmup and step < warmup:
        return step / warmup
    if config["lr_schedule"] == "inverse_sqrt":
        return math.sqrt(warmup / step) if warmup else 1.0
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    floor = config["min_lr"] / config["lr"]
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


LOSS_CHUNK_ELEMENTS = 2 ** 22  # 16 MB of fp32 log-probabilities at a time


class _SmoothedCrossEntropySum(torch.autograd.Function):
    """F.cross_entropy(logits.float(), label, ignore_index=PAD_ID, label_smoothing, reduction="sum"),
    with the gradient computed in the forward pass a few hundred rows at a time.

    The loss over a 10k vocabulary is the step's largest tensor: computed the usual way, the
    log-probabilities are kept for backward, which then allocates two more tensors of their size.
    Here only the gradient (in the logits' dtype) outlives the forward pass, and backward scales it
    in place: about 0.5 GB less peak RSS at the paper-base size with 4k-token batches (bench.py)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, label: torch.Tensor, smoothing: float) -> torch.Tensor:
        rows = max(1, LOSS_CHUNK_ELEMENTS // logits.size(-1))
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        for start in range(0, logits.size(0), rows):
            log_probs = torch.log_softmax(logits[start:start + rows].float(), dim=-1)
            target = label[start:start + rows]
            real = (target != PAD_ID).unsqueeze(1)
            picked = log_probs.gather(1, target.unsqueeze(1))
            # -(1 - s) log p(label) - (s / V) sum_j log p(j), as F.cross_entropy smooths
            loss = -(1 - smoothing) * picked - smoothing / log_probs.size(-1) * log_probs.sum(-1, keepdim=True)
            total += loss.masked_fill(~real, 0.0).sum()
            if grad is not None:
                # d/dlogits = softmax - the smoothed target distribution
                chunk = log_probs.exp_().sub_(smoothing / log_probs.size(-1))
                chunk.scatter_add_(1, target.unsqueeze(1), torch.full_like(picked, smoothing - 1))
                grad[start:start + rows] = chunk.masked_fill_(~real, 0.0)
        ctx.grad = grad
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad, ctx.grad = ctx.grad, None
        if grad is None:
            raise RuntimeError("backward through loss_sum a second time is not supported")
        return grad.mul_(grad_output.to(grad.dtype)), None, None


def loss_sum(logits: torch.Tensor, label: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over the non-padding target tokens (fp32 softmax)."""
    return _SmoothedCrossEntropySum.apply(logits.reshape(-1, logits.size(-1)), label.reshape(-1), label_smoothing)


def rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_resumable(checkpoint_config: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose model, vocabulary or data split differs from the config."""
    validate_config(checkpoint_config)
    for key in IDENTITY_KEYS:
        if checkpoint_config[key] != config[key]:
            raise ConfigError(f"checkpoint {path} was trained with --{key} {checkpoint_config[key]!r} but this run "
                              f"has {config[key]!r}; use the same options to resume, or a new --experiment_name")


class GracefulStop:
    """First SIGINT/SIGTERM asks the loop to stop after the current step; a second SIGINT exits at once."""

    def __init__(self) -> None:
        self.requested = False

    def __enter__(self) -> "GracefulStop":
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log(f"received {signal.Signals(signum).name}: stopping after this step and saving a checkpoint "
            f"(press Ctrl-C again to quit at once)")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------- validation

@torch.no_grad()
def run_validation(model: Transformer, val_ds: BilingualDataset, val_pairs: list[tuple[str, str]], tok_src, tok_tgt,
                   config: dict[str, Any], device: torch.device, writer, global_step: int) -> dict[str, float]:
    """Validation loss (teacher forced, plain cross-entropy), then decoding of the whole split
    (or `val_max_sentences`) scored with sacreBLEU, chrF, CER and WER; logged and printed."""
    model.eval()
    total, tokens = torch.zeros((), device=device), 0
    plan = BatchPlan(val_ds, config["batch_tokens"], config["seed"])
    for indices in plan.epoch_batches(0):
        batch = {k: v.to(device) for k, v in val_ds.collate(indices).items()}
        logits = model(batch["encoder_input"], batch["decoder_input"], batch["src_mask"], batch["tgt_mask"])
        total += loss_sum(logits, batch["label"], 0.0)
        tokens += int((batch["label"] != PAD_ID).sum())
    metrics = {"loss": float(total) / max(1, tokens)}
    pairs = val_pairs[:config["val_max_sentences"]] if config["val_max_sentences"] else val_pairs
    sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
    hypotheses = translate_sentences(model, tok_src, tok_tgt, sources, config["seq_len"], config["eval_batch_size"],
                                     config["val_beam_size"], config["length_penalty"])
    scores = corpus_scores(hypotheses, references)
    metrics.update({k: scores[k] for k in ("bleu", "chrf", "cer", "wer")})
    model.train()
    for name, value in metrics.items():
        writer.add_scalar(f"val/{name}", value, global_step)
    examples = []
    for source, reference, hypothesis in list(zip(sources, references, hypotheses))[:config["num_examples"]]:
        examples.append(f"SOURCE: {source}\nTARGET: {reference}\nOUTPUT: {hypothesis}")
    if examples:
        writer.add_text("val/examples", "\n\n".join(e.replace("\n", "  \n") for e in examples), global_step)
        writer.add_figure("val/attention", attention_figure(model, tok_src, tok_tgt, sources[0]), global_step)
    print(f"step {global_step}: val loss {metrics['loss']:.3f} | BLEU {metrics['bleu']:.2f} | "
          f"chrF {metrics['chrf']:.2f} | CER {metrics['cer']:.3f} | WER {metrics['wer']:.3f} "
          f"on {len(pairs)} sentences ({scores['bleu_signature']})", flush=True)
    for example in examples:
        print(example, flush=True)
    return metrics


# ---------------------------------------------------------------------------- training

def train(config: dict[str, Any]) -> int:
    started = time.monotonic()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    distributed = world_size > 1
    device = pick_device(config, local_rank)
    if device.type == "cpu":
        keep_freed_memory()
    if distributed:
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # Long timeout: ranks wait at a barrier while rank 0 validates.
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=60))
    is_main = rank == 0

    folder = weights_dir(config)
    lock = RunLock(folder)
    if is_main:
        lock.acquire()
    try:
        return _train(config, started, device, world_size, rank, distributed, is_main, folder)
    finally:
        lock.release()
        if distributed:
            dist.destroy_process_group()


def _train(config: dict[str, Any], started: float, device: torch.device, world_size: int, rank: int,
           distributed: bool, is_main: bool, folder: Path) -> int:
    random.seed(config["seed"])
    np.random.seed(config["seed"])
    torch.manual_seed(config["seed"])

    # Which checkpoint, if any, this run continues.
    resume: dict[str, Any] | None = None
    if config["preload"] == "latest":
        found = load_latest(folder)
        if found:
            resume_path, resume = found
    elif config["preload"] == "none":
        if checkpoint_candidates(folder):
            raise ConfigError(f"{folder} already holds checkpoints; resume them with --preload latest, or start "
                              f"a new run with another --experiment_name")
    else:
        resume_path = Path(config["preload"])
        resume = load_checkpoint(resume_path)
    if resume is not None:
        check_resumable(resume["config"], config, resume_path)
        log(f"resuming from {resume_path} (epoch {resume['epoch']}, step {resume['global_step']})")

    splits = load_splits(config)
    if resume is not None:
        tok_src = tokenizer_from_json(resume["tokenizers"]["src"])
        tok_tgt = tokenizer_from_json(resume["tokenizers"]["tgt"])
    else:
        if is_main:
            tok_src, tok_tgt = get_or_build_tokenizers(config, splits["train"], folder, rebuild=True)
        if distributed:
            dist.barrier()  # the other ranks read what rank 0 wrote
        if not is_main:
            tok_src, tok_tgt = get_or_build_tokenizers(config, None, folder)
    if is_main:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / "config.json", json.dumps(config, indent=1).encode("utf-8"))

    train_ds = BilingualDataset(splits["train"], tok_src, tok_tgt, config["seq_len"], "train")
    val_ds = BilingualDataset(splits["validation"], tok_src, tok_tgt, config["seq_len"], "validation")
    if len(train_ds) == 0:
        raise DataError(f"no training pairs fit in --seq_len {config['seq_len']}")
    plan = BatchPlan(train_ds, config["batch_tokens"], config["seed"], world_size, rank, config["accum_steps"])

    model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size()).to(device)
    optimizer = build_optimizer(model, config)
    steps_per_epoch = plan.steps_per_epoch(0)
    if steps_per_epoch == 0:
        raise DataError(f"too little training data for one step of {world_size * config['accum_steps']} batches")
    total_steps = config["max_steps"] or config["num_epochs"] * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, config, total_steps))
    dtype = amp_dtype(config, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    epoch, step_in_epoch, global_step = 0, 0, 0
    best_bleu, stale_validations = -1.0, 0
    if resume is not None:
        try:
            model.load_state_dict(resume["model"])
        except RuntimeError as error:
            raise ConfigError(f"checkpoint {resume_path} does not fit this model: {str(error).splitlines()[0]}") \
                from None
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        scaler.load_state_dict(resume["scaler"])
        epoch, step_in_epoch, global_step = resume["epoch"], resume["step_in_epoch"], resume["global_step"]
        best_bleu, stale_validations = resume["best_bleu"], resume["stale_validations"]
        set_rng_state(resume["rng"])
        del resume  # free the CPU copy of the weights
    if distributed:
        # Dropout differs per rank, and a resumed run gets the same streams as an unbroken one.
        torch.manual_seed(config["seed"] + 1_000_003 * global_step + rank)

    raw_model = model
    if config["compile"]:
        model = torch.compile(model)
    if distributed:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    writer = None
    if is_main:
        from torch.utils.tensorboard import SummaryWriter
        # purge_step drops events a killed run logged after its last checkpoint, so no step is logged twice.
        writer = SummaryWriter(str(runs_dir(config)), purge_step=global_step + 1 if global_step else None)
        waste = padding_waste(plan.epoch_batches(epoch), train_ds.src_lens, train_ds.tgt_lens)
        log(f"{len(train_ds)} training pairs, {steps_per_epoch} steps per epoch, {waste:.1%} padding, "
            f"{sum(p.numel() for p in raw_model.parameters()):,} parameters, device {device}"
            + (f", {world_size} ranks" if distributed else "")
            + (f", autocast {str(dtype).replace('torch.', '')}" if dtype else ""))

    def save(metrics: dict[str, float] | None = None) -> None:
        if not is_main:
            return
        state = {
            "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": global_step,
            "config": config, "tokenizers": {"src": tok_src.to_str(), "tgt": tok_tgt.to_str()},
            "rng": rng_state(), "best_bleu": best_bleu, "stale_validations": stale_validations,
            "metrics": metrics or {},
        }
        path = save_checkpoint(folder, state, global_step, config["keep_checkpoints"],
                               metrics["bleu"] if metrics else None)
        log(f"saved {path}")

    def validate() -> dict[str, float] | None:
        metrics = None
        if is_main and splits["validation"]:
            metrics = run_validation(raw_model, val_ds, splits["validation"], tok_src, tok_tgt, config, device,
                                     writer, global_step)
        if distributed:
            dist.barrier()
        return metrics

    if config["max_steps"] and global_step >= config["max_steps"]:
        log(f"already trained {global_step} steps (--max_steps {config['max_steps']}); raise --max_steps to go on")
        return 0
    if epoch >= config["num_epochs"]:
        log(f"already trained {epoch} epochs; raise --num_epochs to go on")
        return 0

    model.train()
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    stop_reason, nonfinite_run, last_validation_seconds = None, 0, 0.0
    with GracefulStop() as graceful:
        while epoch < config["num_epochs"] and stop_reason is None:
            micro_batches = plan.micro_batches(epoch, step_in_epoch)
            epoch_steps = plan.steps_per_epoch(epoch)
            workers = config["num_workers"] if config["num_workers"] >= 0 else (2 if device.type == "cuda" else 0)
            # Its own generator: a loader draws worker seeds from the global RNG otherwise, which
            # would shift the dropout stream of a run resumed mid-epoch.
            loader = DataLoader(MicroBatches(train_ds, micro_batches), batch_size=None, shuffle=False,
                                num_workers=workers, pin_memory=device.type == "cuda",
                                generator=torch.Generator().manual_seed(config["seed"] + epoch))
            epoch_started = time.monotonic()
            progress = tqdm(total=epoch_steps, initial=step_in_epoch, desc=f"epoch {epoch}",
                            disable=not is_main, file=sys.stderr, dynamic_ncols=True)
            step_loss = torch.zeros((), device=device)
            log_loss, log_tokens, log_started = torch.zeros((), device=device), 0, time.monotonic()
            for index, batch in enumerate(loader):
                # Token counts stay on the host: reading them back from the device would sync.
                step_tokens, num_tokens = int(batch.pop("step_tokens")), int(batch.pop("num_tokens"))
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                last_micro = index % config["accum_steps"] == config["accum_steps"] - 1
                # DDP all-reduces gradients only on the last micro-batch of a step.
                sync = model.no_sync() if distributed and not last_micro else contextlib.nullcontext()
                with sync:
                    with autocast:
                        logits = model(batch["encoder_input"], batch["decoder_input"], batch["src_mask"],
                                       batch["tgt_mask"])
                    summed = loss_sum(logits, batch["label"], config["label_smoothing"])
                    del logits  # backward needs only the gradient the loss stored: free the logits
                    # Normalised by the whole global step's target tokens; DDP averages over ranks.
                    scaler.scale(summed * (world_size / step_tokens)).backward()
                step_loss += summed.detach()
                log_tokens += num_tokens
                if not last_micro:
                    continue

                scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), config["clip_grad"] or float("inf"))
                # One sync per step: whether the step is usable decides whether to apply it.
                # (With fp16 the scaler itself skips steps whose gradients overflowed.)
                finite = torch.isfinite(step_loss)
                if not scaler.is_enabled():
                    finite &= torch.isfinite(grad_norm)
                if bool(finite):
                    scaler.step(optimizer)
                    scheduler.step()
                    nonfinite_run = 0
                    log_loss += step_loss
                else:
                    nonfinite_run += 1
                    log(f"step {global_step + 1}: non-finite loss or gradient, step skipped "
                        f"({nonfinite_run} in a row)")
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step_loss = torch.zeros((), device=device)
                global_step += 1
                step_in_epoch += 1
                progress.update(1)

                if is_main and global_step % config["log_every"] == 0:
                    elapsed = time.monotonic() - log_started
                    tokens_per_second = log_tokens * world_size / max(elapsed, 1e-9)
                    mean_loss = float(log_loss) / max(1, log_tokens)
                    lr = scheduler.get_last_lr()[0]
                    writer.add_scalar("train/loss", mean_loss, global_step)
                    writer.add_scalar("train/lr", lr, global_step)
                    writer.add_scalar("train/tokens_per_second", tokens_per_second, global_step)
                    progress.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}")
                    log_loss, log_tokens, log_started = torch.zeros((), device=device), 0, time.monotonic()

                if nonfinite_run >= config["max_nonfinite_steps"]:
                    stop_reason = "nonfinite"
                elif config["max_steps"] and global_step >= config["max_steps"]:
                    stop_reason = "max_steps"
                elif config["max_minutes"] and \
                        time.monotonic() - started + last_validation_seconds >= 60 * config["max_minutes"]:
                    stop_reason = "max_minutes"
                elif graceful.requested:
                    stop_reason = "signal"
                if distributed:
                    # Every rank must stop at the same step: share the decision.
                    flag = torch.tensor([0 if stop_reason is None else 1], device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    if flag.item() and stop_reason is None:
                        stop_reason = "signal"
                if stop_reason:
                    break
                if config["save_every_steps"] and global_step % config["save_every_steps"] == 0 \
                        and step_in_epoch < epoch_steps:
                    save()
            progress.close()
            if step_in_epoch >= epoch_steps:
                if is_main:
                    log(f"epoch {epoch} trained in {time.monotonic() - epoch_started:.1f} s")
                epoch, step_in_epoch = epoch + 1, 0

            metrics = None
            if stop_reason not in ("signal", "nonfinite"):
                validation_started = time.monotonic()
                metrics = validate()
                last_validation_seconds = time.monotonic() - validation_started
                if metrics is not None:
                    if metrics["bleu"] > best_bleu:
                        best_bleu, stale_validations = metrics["bleu"], 0
                    else:
                        stale_validations += 1
                    if config["early_stopping_patience"] and stale_validations >= config["early_stopping_patience"]:
                        stop_reason = "early_stopping"
                if distributed:
                    flag = torch.tensor([1 if stop_reason else 0], device=device)
                    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                    stop_reason = stop_reason or ("early_stopping" if flag.item() else None)
            save(metrics)
            if distributed:
                dist.barrier()

    if writer is not None:
        writer.close()
    if is_main:
        command = " ".join(["python", "train.py", *sys.argv[1:]])
        messages = {
            None: f"finished {config['num_epochs']} epochs ({global_step} steps)",
            "max_steps": f"reached --max_steps {config['max_steps']}",
            "max_minutes": f"reached --max_minutes {config['max_minutes']} ({global_step} steps)",
            "early_stopping": f"stopped early: no better validation BLEU in {stale_validations} validations",
            "signal": f"stopped at step {global_step}; resume with: {command}",
            "nonfinite": f"stopped after {nonfinite_run} non-finite steps in a row at step {global_step}; "
                         f"the checkpoint holds the last good weights (try a lower --lr or --amp off)",
        }
        log(messages[stop_reason])
    return 1 if stop_reason == "nonfinite" else 0


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv, description=__doc__.splitlines()[0])
    try:
        return train(config)
    except (ConfigError, DataError, CheckpointError, TokenizerError) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except KeyboardInterrupt:
        print("train.py: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
