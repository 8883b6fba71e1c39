"""nmt/training/cuda_graphs.py without CUDA: the capture and replay code paths of CapturedStep run
against StandInGraphs on the CPU and take the eager step's steps bit for bit (dropout, several
shapes, accumulation, the schedule's learning rate), skip a non-finite step inside the optimizer's
work as the eager step skips it, and capture each shape once; when a run takes graphs."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from config import PRESETS, ConfigError, get_config
from dataset import BatchPlan, BilingualDataset, bucket_lengths
from model import build_model
from nmt.training.cuda_graphs import CapturedStep, EagerStep, StandInGraphs, graphs_decision, training_step
from nmt.training.loss import loss_sum
from nmt.training.optimizer import build_optimizer

CPU = torch.device("cpu")


def config_of(**values) -> dict:
    return {**get_config(), **PRESETS["tiny"], "dropout": 0.1, **values}


def test_graphs_are_taken_where_a_step_can_be_captured() -> None:
    cuda = torch.device("cuda")
    assert graphs_decision(config_of(), cuda, 1, torch.bfloat16) == {"cuda_graphs": "on"}
    assert graphs_decision(config_of(), cuda, 1, None) == {"cuda_graphs": "on"}  # fp32
    for config, device, world, dtype in ((config_of(), CPU, 1, None), (config_of(), cuda, 2, None),
                                         (config_of(), cuda, 1, torch.float16),
                                         (config_of(compile=True), cuda, 1, None),
                                         (config_of(deterministic=True), cuda, 1, None),
                                         (config_of(cuda_graphs="off"), cuda, 1, None)):
        assert graphs_decision(config, device, world, dtype) is None
    with pytest.raises(ConfigError, match=r"^--cuda_graphs on cannot capture this run's step: 2 ranks"):
        graphs_decision(config_of(cuda_graphs="on"), cuda, 2, None)
    with pytest.raises(ConfigError, match="a cpu device"):
        graphs_decision(config_of(cuda_graphs="on"), CPU, 1, None)
    assert graphs_decision(config_of(cuda_graphs="on"), cuda, 1, None) is None  # on already


def batches_of(config: dict, count: int) -> list[dict[str, torch.Tensor]]:
    """`count` bucketed batches of random pairs (three shapes or more), with their target tokens."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 30, (2, 300))
    offsets = np.zeros((2, 301), dtype=np.int64)
    offsets[:, 1:] = np.cumsum(lengths, axis=1)
    dataset = BilingualDataset(rng.integers(4, 40, offsets[0, -1]), rng.integers(4, 40, offsets[1, -1]), offsets)
    plan = BatchPlan(dataset, 160, seed=1, buckets=bucket_lengths(config["seq_len"]))
    chosen = plan.epoch_batches(0)[:count]
    return [{**dataset.collate(b, plan.shape_of(b)), "tokens": int(dataset.tgt_lens[b].sum())} for b in chosen]


def train_steps(step: EagerStep, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                batches: list[dict[str, torch.Tensor]], accum: int, nan_at: int = -1) -> list[bool]:
    """train.py's steps: `accum` micro-batches a step, the step's own dropout seed, the schedule's
    learning rate changing every step; whether each step was skipped."""
    def compute(batch: dict[str, torch.Tensor], scale) -> torch.Tensor:
        summed = loss_sum(model(batch["encoder_input"], batch["decoder_input"], batch["src_mask"]), batch["label"], 0.1)
        (summed * scale).backward()
        return summed.detach()

    skipped = []
    for first in range(0, len(batches) - accum + 1, accum):
        torch.manual_seed(first)
        group = batches[first:first + accum]
        step_loss = torch.zeros(())
        for batch in group:
            inputs = {k: v for k, v in batch.items() if k != "tokens"}
            step_loss += step.micro_batch(inputs, 1 / sum(b["tokens"] for b in group), compute)
        if first == nan_at:
            step_loss = step_loss + float("nan")
        nonfinite = bool(step.check(step_loss))
        step.apply(nonfinite)
        skipped.append(nonfinite)
        for g in optimizer.param_groups:
            g["lr"] *= 0.9
    return skipped


def pair(config: dict) -> list[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    torch.manual_seed(0)
    model = build_model(config, 40, 40).train()
    twin = copy.deepcopy(model)
    return [(m, build_optimizer(m, config)) for m in (model, twin)]


@pytest.mark.parametrize("accum", [1, 2])
def test_the_captured_step_takes_the_eager_steps_bit_for_bit(accum: int) -> None:
    config = config_of()
    batches = batches_of(config, 8)
    (eager_model, eager_opt), (captured_model, captured_opt) = pair(config)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    graphs = StandInGraphs()
    eager = EagerStep(eager_model, eager_opt, scaler, config["clip_grad"], CPU)
    captured = CapturedStep(captured_model, captured_opt, scaler, config["clip_grad"], CPU, graphs)
    assert train_steps(eager, eager_model, eager_opt, batches, accum) == [False] * (8 // accum)
    assert train_steps(captured, captured_model, captured_opt, batches, accum) == [False] * (8 // accum)
    for (name, a), b in zip(eager_model.state_dict().items(), captured_model.state_dict().values()):
        assert torch.equal(a, b), name
    shapes = {tuple(b["encoder_input"].shape) for b in batches}
    assert len(shapes) >= 3 and len(captured.micro) == len(shapes)
    assert graphs.captured == len(shapes) + 1  # one graph per shape, one for the optimizer
    assert graphs.replayed == (len(batches) - len(shapes)) + (8 // accum - 1)
    assert captured_opt.param_groups[0]["lr"] == eager_opt.param_groups[0]["lr"]  # numbers outside the graph
    assert not hasattr(captured_opt, "found_inf")


def test_a_non_finite_step_is_skipped_inside_the_optimizers_work() -> None:
    """Step 3 of 4 has a NaN loss: the captured optimizer work leaves the weights and AdamW's state,
    its step count included, as the eager step does (the skip is fused AdamW's found_inf)."""
    config = config_of()
    batches = batches_of(config, 4)
    (eager_model, eager_opt), (captured_model, captured_opt) = pair(config)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    eager = EagerStep(eager_model, eager_opt, scaler, config["clip_grad"], CPU)
    captured = CapturedStep(captured_model, captured_opt, scaler, config["clip_grad"], CPU, StandInGraphs())
    assert train_steps(eager, eager_model, eager_opt, batches, 1, nan_at=2) == [False, False, True, False]
    assert train_steps(captured, captured_model, captured_opt, batches, 1, nan_at=2) == [False, False, True, False]
    for a, b in zip(eager_model.parameters(), captured_model.parameters()):
        assert torch.equal(a, b)
        assert torch.equal(eager_opt.state[a]["exp_avg"], captured_opt.state[b]["exp_avg"])
        assert int(captured_opt.state[b]["step"]) == int(eager_opt.state[a]["step"]) == 3


def test_a_run_takes_the_captured_step_only_where_cuda_graphs_is_on() -> None:
    config = config_of()
    model = build_model(config, 40, 40)
    optimizer, scaler = build_optimizer(model, config), torch.amp.GradScaler("cpu", enabled=False)
    assert type(training_step(model, optimizer, scaler, config, CPU)) is EagerStep
    assert type(training_step(model, optimizer, scaler, {**config, "cuda_graphs": "on"}, CPU)) is CapturedStep
