"""The optimizer of a training run (train.py; benchmarks/bench.py steps the same optimizer); its
learning rate is schedule.py's.

- `build_optimizer`: AdamW with the config's lr, betas and eps; weight decay on weight matrices only;
  the fused kernel on CUDA (one launch for all parameters instead of a few per tensor group) and on
  the CPU (one pass over each tensor instead of several per tensor group), torch's default elsewhere
  (meta, MPS). They keep the same state, so a checkpoint moves between them.
- `apply_settings`: a resumed optimizer's state brings back the betas, eps and weight decay it was
  saved with; the config's replace them, so that what runs is what the config (stored in the next
  checkpoint) says.
"""
from __future__ import annotations

from typing import Any

import torch

from nmt.diagnostics import log

FUSED_ADAMW_DEVICES = ("cuda", "cpu")
SETTINGS = ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps")  # what a resume applies and says it changed


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


def apply_settings(optimizer: torch.optim.Optimizer, config: dict[str, Any], saved: dict[str, Any]) -> None:
    """The config's betas, eps and weight decay on a resumed optimizer's groups (the learning rate
    is the schedule's: schedule.LearningRate), and one line naming what changed since `saved`, the
    checkpoint's config."""
    for group, decay in zip(optimizer.param_groups, (config["weight_decay"], 0.0)):
        group.update(betas=(config["adam_beta1"], config["adam_beta2"]), eps=config["adam_eps"], weight_decay=decay)
    changed = [f"--{key} {saved[key]} -> {config[key]}" for key in SETTINGS if saved[key] != config[key]]
    if changed:
        log(f"resuming with changed optimizer settings, applied from here on: {', '.join(changed)}")
