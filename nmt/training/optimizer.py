"""The optimizer and the learning-rate schedule of a training run (train.py; benchmarks/bench.py
steps the same optimizer).

- `build_optimizer`: AdamW with the config's lr, betas and eps; weight decay on weight matrices only;
  the fused kernel on CUDA (one launch for all parameters instead of a few per tensor group) and on
  the CPU (one pass over each tensor: 3.4 against 9.3 ms inside a training step of the cpu preset's
  2 + 2 layers, which takes about 150), torch's default elsewhere (meta, MPS). They keep the same
  state, so a checkpoint moves between them.
- `warmup_steps`: `--warmup_steps`, or when it is 0 `--warmup_fraction` of the run's steps: a GPU run
  on opus_books takes a few thousand steps, which the paper's fixed 4000 would spend warming up.
- `lr_factor`: the multiplier of the peak lr after a number of optimizer steps: linear warmup, then
  the paper's inverse square root (`--lr_schedule inverse_sqrt`), a cosine decay to `--min_lr`
  at the run's last step (`cosine`), or warmup-stable-decay (`wsd`: the peak held, then a linear
  decay to `--min_lr` over the last `--decay_fraction` of the steps after warmup; Hägele et al.
  2024); a decay re-planned partway (`decay_from`: a planned run re-timed inside wsd's decay,
  time_budget.py) goes on linearly from where it stood to `--min_lr` at the new last step.
  train.py wraps it in a `LambdaLR`, which a checkpoint saves.
"""
from __future__ import annotations

import math
from typing import Any

import torch

FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def build_optimizer(model: torch.nn.Module, config: dict[str, Any]) -> torch.optim.Optimizer:
    """AdamW; weight decay on weight matrices only, never on biases, LayerNorms or embeddings; fused
    where the model's parameters are on a CUDA device or the CPU (build it after moving the model)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=config["lr"], betas=(config["adam_beta1"], config["adam_beta2"]),
                             eps=config["adam_eps"],
                             fused=next(model.parameters()).device.type in FUSED_ADAMW_DEVICES or None)


def warmup_steps(config: dict[str, Any], total_steps: int) -> int:
    """Steps of linear warmup: `warmup_steps`, else `warmup_fraction` of `total_steps` (0: none)."""
    return config["warmup_steps"] or round(config["warmup_fraction"] * total_steps)


def decay_start(config: dict[str, Any], total_steps: int, warmup: int) -> int:
    """The step after which the learning rate starts to fall: wsd's last `decay_fraction` of the
    steps after warmup (at least one step), or the warmup's end for the other schedules."""
    if config["lr_schedule"] != "wsd":
        return warmup
    return total_steps - max(1, round(config["decay_fraction"] * (total_steps - warmup)))


def length_free_until(config: dict[str, Any], total_steps: int, warmup: int) -> int | None:
    """The step from which the run's length can no longer change without a jump in the learning
    rate, its warmup aside: wsd's decay start, the run's end for the inverse square root (which
    never depends on it); None for cosine, which spreads its decay over the whole run."""
    if config["lr_schedule"] == "inverse_sqrt":
        return total_steps
    return decay_start(config, total_steps, warmup) if config["lr_schedule"] == "wsd" else None


def length_free(config: dict[str, Any], step: int, total_steps: int, warmup: int) -> bool:
    """Whether the run's length can change after `step` without a jump in the learning rate."""
    until = length_free_until(config, total_steps, warmup)
    return until is not None and step < until


def lr_factor(step: int, config: dict[str, Any], total_steps: int, warmup: int | None = None,
              decay_from: tuple[int, float] | None = None) -> float:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup (over `warmup` steps, by
    default the config's `warmup_steps`), then the paper's inverse square root (from the first step
    when there is no warmup), a cosine decay to min_lr at `total_steps`, or the peak held until a
    linear decay to min_lr over the last `decay_fraction` of the steps after warmup (wsd). With
    `decay_from` (a step and its multiplier), the steps from that one on decay linearly from that
    multiplier to min_lr at `total_steps`: a decay whose end moved while under way, without a jump."""
    if decay_from is not None and step >= decay_from[0]:
        start, factor = decay_from
        floor = config["min_lr"] / config["lr"]
        return floor + (factor - floor) * max(0, total_steps - step - 1) / max(1, total_steps - start - 1)
    step += 1
    warmup = warmup_steps(config, total_steps) if warmup is None else warmup
    if warmup and step < warmup:
        return step / warmup
    if config["lr_schedule"] == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / step)
    floor = config["min_lr"] / config["lr"]
    if config["lr_schedule"] == "wsd":
        decay = total_steps - decay_start(config, total_steps, warmup)
        return floor + (1 - floor) * min(1.0, max(0, total_steps - step) / decay)
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
