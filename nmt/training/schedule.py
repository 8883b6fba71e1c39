"""The learning-rate schedule of a training run, stated once.

- `Schedule`: the multiplier of the peak learning rate after a number of optimizer steps, with the
  run's length and warmup. Linear warmup, then the paper's inverse square root (`inverse_sqrt`), a
  cosine decay to `min_lr` at the run's last step (`cosine`), or warmup-stable-decay (`wsd`: the
  peak held, then a linear decay to `min_lr` over the last `decay_fraction` of the steps after
  warmup; Hägele et al. 2024). A decay re-planned while under way (`decay_from`: a run planned to its
  clock and re-timed inside wsd's decay, clock_plan.py) goes on linearly from where it stood to
  `min_lr` at the new last step, without a jump. A run of a fixed length builds its schedule from
  the config (`Schedule.from_config`), a planned run from its plan (`Schedule.from_plan`); nothing
  outside this module asks which kind of schedule a run has.
- `LearningRate`: sets the optimizer's rate from the schedule after every applied step, as
  torch's LambdaLR would, and is saved in a checkpoint (its step count) to be restored on resume.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch


def warmup_steps(config: dict[str, Any], total_steps: int) -> int:
    """Steps of linear warmup: `warmup_steps`, else `warmup_fraction` of `total_steps` (0: none). A
    GPU run on opus_books takes a few thousand steps, which the paper's fixed 4000 would spend
    warming up."""
    return config["warmup_steps"] or round(config["warmup_fraction"] * total_steps)


@dataclass(frozen=True)
class Schedule:
    """The peak rate's multiplier over a run of `total_steps` steps with `warmup_steps` of warmup."""

    kind: str  # inverse_sqrt, cosine or wsd (config.lr_schedule)
    total_steps: int
    warmup_steps: int
    peak_lr: float
    min_lr: float
    decay_fraction: float  # wsd's share of the steps after warmup that decay
    decay_from: tuple[int, float] | None = None  # a step and its multiplier: the decay goes on from there

    @classmethod
    def from_config(cls, config: dict[str, Any], total_steps: int, warmup: int | None = None,
                    decay_from: tuple[int, float] | None = None) -> Schedule:
        """The config's schedule over `total_steps` (its warmup by default: `warmup_steps`)."""
        return cls(config["lr_schedule"], total_steps, warmup_steps(config, total_steps) if warmup is None else warmup,
                   config["lr"], config["min_lr"], config["decay_fraction"], decay_from)

    @classmethod
    def from_plan(cls, config: dict[str, Any], plan: Any) -> Schedule:
        """The schedule of a run planned to its clock (clock_plan.Plan): its length, warmup and anchor."""
        return cls.from_config(config, plan.total_steps, plan.warmup_steps, plan.decay_anchor)

    def factor(self, step: int) -> float:
        """The multiplier of the peak rate after `step` optimizer steps."""
        if self.decay_from is not None and step >= self.decay_from[0]:
            start, factor = self.decay_from
            floor = self.min_lr / self.peak_lr
            return floor + (factor - floor) * max(0, self.total_steps - step - 1) / max(1, self.total_steps - start - 1)
        step += 1
        warmup = self.warmup_steps
        if warmup and step < warmup:
            return step / warmup
        if self.kind == "inverse_sqrt":
            return math.sqrt(max(warmup, 1) / step)
        floor = self.min_lr / self.peak_lr
        if self.kind == "wsd":
            decay = self.total_steps - self.decay_start()
            return floor + (1 - floor) * min(1.0, max(0, self.total_steps - step) / decay)
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    def decay_start(self) -> int:
        """The step after which the rate starts to fall: wsd's last `decay_fraction` of the steps
        after warmup (at least one step), or the warmup's end for the other schedules."""
        if self.kind != "wsd":
            return self.warmup_steps
        return self.total_steps - max(1, round(self.decay_fraction * (self.total_steps - self.warmup_steps)))

    def length_free_until(self) -> int | None:
        """The step from which the run's length can no longer change without a jump in the rate, its
        warmup aside: wsd's decay start, the run's end for the inverse square root (which never
        depends on it); None for cosine, which spreads its decay over the whole run."""
        if self.kind == "inverse_sqrt":
            return self.total_steps
        return self.decay_start() if self.kind == "wsd" else None

    def length_free(self, step: int) -> bool:
        """Whether the run's length can change after `step` without a jump in the rate."""
        until = self.length_free_until()
        return until is not None and step < until

    @property
    def decay_can_move(self) -> bool:
        """Whether the decay, once under way, can go on from where it stands to another end (wsd's
        linear decay; cosine's and the inverse square root's shapes depend on the whole run)."""
        return self.kind == "wsd"

    def anchor_for(self, total_steps: int, warmup: int, at: int, decaying: bool) -> tuple[int, float] | None:
        """Where a schedule of `total_steps` and `warmup` that replaces this one at step `at` decays
        anew from: this one's multiplier at `at`, where the decay can move and is under way
        (`decaying`) or the new schedule's decay would have begun by then; otherwise None. Without
        it, a run shortened just before its decay would drop from the peak into the middle of it."""
        if not self.decay_can_move:
            return None
        if decaying or replace(self, total_steps=total_steps, warmup_steps=warmup, decay_from=None).decay_start() <= at:
            return at, self.factor(at)
        return None


class LearningRate:
    """The optimizer's learning rate: the schedule's peak times its multiplier at the step count,
    set at the start and after every applied step (a skipped, non-finite step does not count)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule) -> None:
        self.optimizer, self.schedule, self.steps = optimizer, schedule, 0
        self.apply()

    def apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.schedule.peak_lr * self.schedule.factor(self.steps)

    def step(self) -> None:
        self.steps += 1
        self.apply()

    def follow(self, schedule: Schedule) -> None:
        """From the next step on, `schedule` (a plan or its re-time); the step under way keeps its rate."""
        self.schedule = schedule

    def state_dict(self) -> dict[str, int]:
        return {"last_epoch": self.steps}  # LambdaLR's name for it: checkpoints written with one resume

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The step count of a checkpoint; the rate is then the schedule's (and the peak the config's)
        at that step, whatever the optimizer state brought back."""
        self.steps = state["last_epoch"]
        self.apply()
