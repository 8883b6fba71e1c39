"""What a run planned to its clock sizes before its model is built, on a CPU (clock_plan.py plans its
length once it runs).

A preset is set for its `num_epochs`; a CPU whose rough estimate of an epoch (`cpu_epoch_estimate`)
fits fewer of them in --max_minutes trains a model sized for the steps it can take: one layer fewer
(`planned_layers`) and smaller batches (`planned_batch_tokens`) under num_epochs, and where under a
quarter of them fit, a narrower model first (`planned_width`), whose estimate the depth and batch then
follow. What the command line gives (--num_layers, --batch_tokens, --d_model, --d_ff) is kept.
`planned_size` applies the rules; the run records what they chose in its checkpoints, and a resumed
run keeps it. docs/quality.md holds the runs that chose the thresholds.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np
import torch

from dataset import BilingualDataset
from model import train_flops
from nmt.cpu_kernels import linear
from nmt.diagnostics import log

WIDTH_SHARE = 0.75  # of the preset's d_model and d_ff: a very short CPU run's narrower model (planned_width)
BATCH_FLOOR = 0.5  # of the preset's batch: the smallest a CPU run's planned batch gets (planned_batch_tokens)
# What a plan may size: the checkpoint's record of what it chose, and the config keys that record covers.
PLANNED_SIZE = {"planned_layers": ("num_layers",), "planned_batch_tokens": ("batch_tokens",),
                "planned_width": ("d_model", "d_ff")}


def planned_layers(num_layers: int, estimated_epochs: float, preset_epochs: int) -> int:
    """The depth a run of about `estimated_epochs` epochs trains: `num_layers`, one fewer where the
    budget fits fewer than the `preset_epochs` its depth was chosen for, the threshold under which
    planned_batch_tokens shrinks the batch. A smaller model takes more steps in the same time, and a
    short run is limited by its steps, not by what the model can hold; a run that fits the preset's
    epochs trains the preset as designed."""
    if num_layers > 1 and preset_epochs > 0 and estimated_epochs < preset_epochs:
        return num_layers - 1
    return num_layers


def planned_width(d_model: int, d_ff: int, num_heads: int, estimated_epochs: float,
                  preset_epochs: int) -> tuple[int, int]:
    """The d_model and d_ff of a run of about `estimated_epochs` epochs: the preset's, narrowed to
    WIDTH_SHARE of them (d_model an even multiple of `num_heads`) where under a quarter of its
    `preset_epochs` fit. A narrower model takes more steps in the same time, and early in training
    more steps gain more than more width; a longer run keeps its width."""
    if preset_epochs <= 0 or estimated_epochs >= preset_epochs / 4:
        return d_model, d_ff
    unit = math.lcm(num_heads, 2)  # validate_config: heads of equal width, sinusoidal positions in pairs
    narrow = round(d_model * WIDTH_SHARE / unit) * unit
    if not 0 < narrow < d_model:
        return d_model, d_ff
    return narrow, round(d_ff * narrow / d_model)


def planned_batch_tokens(batch_tokens: int, estimated_epochs: float, preset_epochs: int) -> int:
    """The batch of a run of about `estimated_epochs` epochs: `batch_tokens`, set for the
    `preset_epochs` of a preset, times the square root of the share of them that fits, at least
    BATCH_FLOOR of it; never raised. Early in training a gradient's noise is small against its
    signal, so a smaller batch takes more steps from the same tokens without wasting them (the
    critical batch grows as the loss falls: McCandlish et al. 2018); a long run needs the large batch
    late. The square root is a choice between the two ends, not a measured law; below the floor a
    step costs more per token."""
    if preset_epochs <= 0:
        return batch_tokens
    share = max(BATCH_FLOOR, min(1.0, math.sqrt(max(estimated_epochs, 0.0) / preset_epochs)))
    return round(batch_tokens * share)


def cpu_epoch_estimate(config: dict[str, Any], batches: list[np.ndarray], dataset: BilingualDataset,
                       tgt_vocab: int, dtype: torch.dtype | None) -> float:
    """Roughly how many seconds one epoch takes on this CPU: the epoch's FLOPs over a share of the
    GFLOP/s of the model's own matrix product in the run's precision (`dtype`: autocast's, None for
    fp32), timed here in about a tenth of a second. Whole fp32 steps reach about half of it
    (benchmarks/bench.py); bf16 speeds the products more than the rest of a step, so its steps
    reach about a third."""
    flops = sum(train_flops(len(b), int(dataset.src_lens[b].max()), int(dataset.tgt_lens[b].max()), config,
                            tgt_vocab) for b in batches)
    rows, width = 1024, config["d_model"]
    generator = torch.Generator().manual_seed(0)  # not the global RNG: that drives dropout
    x = torch.randn(rows, width, generator=generator).to(dtype or torch.float32)
    weight = torch.randn(config["d_ff"], width, generator=generator).to(dtype or torch.float32)
    product = linear if dtype is None else torch.nn.functional.linear  # autocast skips cpu_kernels' fp32 path
    product(x, weight)  # warm-up
    started, repeats = time.perf_counter(), 0
    while time.perf_counter() - started < 0.1:
        product(x, weight)
        repeats += 1
    flops_per_second = 2 * rows * width * config["d_ff"] * repeats / (time.perf_counter() - started)
    return flops / ((0.5 if dtype is None else 0.35) * flops_per_second)


def cpu_epoch_line(seconds: float) -> str:
    """The start of a run's line on a CPU: roughly how long an epoch takes (`cpu_epoch_estimate`)."""
    minutes = seconds / 60
    if minutes < 1:
        return f"no GPU: one epoch will take roughly {seconds:.0f} s on this CPU"
    hint = "; --preset cpu trains a small model in minutes" if minutes > 10 else ""
    return f"no GPU: one epoch will take roughly {minutes:.0f} min on this CPU{hint}"


def sizes_plannable(config: dict[str, Any], given: frozenset[str]) -> bool:
    """Whether anything is left for `planned_size` to choose: a depth above one, a batch or a width
    that the command line did not give."""
    return not ("num_layers" in given or config["num_layers"] == 1) or "batch_tokens" not in given or \
        not {"d_model", "d_ff"} & given


def planned_size(config: dict[str, Any], given: frozenset[str], epoch_seconds: Callable[[dict[str, Any]], float],
                 seconds_left: Callable[[], float]) -> dict[str, int]:
    """The sizes the rules choose for what is left of the budget (`seconds_left`, read after each
    estimate) at `epoch_seconds` an epoch of the model a config describes, against the config's
    num_epochs (a preset's): {key: value} for each size they change (d_model and d_ff together),
    logged in one line."""
    def estimate(sized: dict[str, Any]) -> tuple[float, float]:
        seconds = epoch_seconds(sized)
        return seconds_left() / max(seconds, 1e-9), seconds

    preset_epochs, changes = config["num_epochs"], []
    epochs, seconds = estimate(config)
    width = config["d_model"], config["d_ff"]
    if not {"d_model", "d_ff"} & given:
        width = planned_width(*width, config["num_heads"], epochs, preset_epochs)
    if width != (config["d_model"], config["d_ff"]):
        changes.append(f"d_model {width[0]} and d_ff {width[1]} instead of {config['d_model']} and "
                       f"{config['d_ff']} (about {epochs:.1f} epochs at {seconds:.0f} s an epoch)")
        epochs, seconds = estimate({**config, "d_model": width[0], "d_ff": width[1]})
    layers, batch = config["num_layers"], config["batch_tokens"]
    if "num_layers" not in given:
        layers = planned_layers(layers, epochs, preset_epochs)
    if "batch_tokens" not in given:
        batch = planned_batch_tokens(batch, epochs, preset_epochs)
    if layers != config["num_layers"]:
        changes.append(f"{layers} + {layers} layers instead of {config['num_layers']} + {config['num_layers']}")
    if batch != config["batch_tokens"]:
        changes.append(f"batches of {batch} tokens instead of {config['batch_tokens']}")
    if changes:
        log(f"plan: about {epochs:.1f} epochs fit --max_minutes {config['max_minutes']:g} at {seconds:.0f} s an "
            f"epoch, of num_epochs {preset_epochs}: {' and '.join(changes)} (--num_layers, --batch_tokens, "
            f"--d_model, --d_ff keep theirs)")
    sizes = {"num_layers": layers} if layers != config["num_layers"] else {}
    if batch != config["batch_tokens"]:
        sizes["batch_tokens"] = batch
    if width != (config["d_model"], config["d_ff"]):
        sizes.update(d_model=width[0], d_ff=width[1])
    return sizes


def size_records(sizes: dict[str, int]) -> dict[str, Any]:
    """A checkpoint's records (PLANNED_SIZE) of the sizes a plan chose: None where it chose none."""
    return {"planned_layers": sizes.get("num_layers"), "planned_batch_tokens": sizes.get("batch_tokens"),
            "planned_width": {key: sizes[key] for key in ("d_model", "d_ff")} if "d_model" in sizes else None}


def sizes_of_records(state: dict[str, Any]) -> dict[str, int]:
    """The sizes a checkpoint's records (PLANNED_SIZE) say its plan chose."""
    sizes: dict[str, int] = {}
    for record, keys in PLANNED_SIZE.items():
        if planned := state.get(record):
            sizes.update(planned if isinstance(planned, dict) else {keys[0]: planned})
    return sizes
