"""A CPU rehearsal of the CUDA path: no tensor is made on the host inside the training step, the
validation loss, the model, the loss or decoding.

On CUDA a tensor created without `device=` lives on the host, and meeting a device tensor raises
(or, for a scalar, silently copies and syncs); inside a CUDA graph's capture, a read of the device
raises too. Two stand-ins catch that without a GPU, for the eager step and the captured one
(--cuda_graphs on, its capture and replay paths run against cuda_graphs.StandInGraphs):

- PyTorch's `meta` device, which raises the same way: train.py's real `Trainer` runs two optimizer
  steps (collation, forward, loss, backward, clipping, AdamW, the schedule) and the validation loss
  with the model, optimizer state and batches on it. Meta tensors hold no values, so the one read
  per step (`Trainer.on_any_rank`, whether any rank saw a non-finite step or a signal) is answered
  "no" after checking that it was handed a device tensor; everything else runs as written.
- Decoding reads a flag back at every step, which meta tensors cannot give. It runs on the CPU
  under `HostTensorAudit`, a torch function mode that records every tensor factory
  (`torch.zeros`, `torch.tensor`, ...) called from model.py, loss.py, decoding.py, cpu_kernels.py
  or train.py without a `device=`: on CUDA that call would make a host tensor.

fp16 and bf16 under CPU autocast with `GradScaler("cpu")`, resumes across `--amp` settings and the
`--amp auto` choice for V100, T4, A100 and H100 capabilities are in tests/test_precision.py.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import train
from config import PRESETS, get_config, parse_config
from nmt.inference.decoding import beam_search, greedy_decode, sample
from nmt.training import cuda_graphs
from nmt.training.loss import loss_sum
from nmt.training.ranks import GracefulStop, RankExchange, Ranks
from nmt.training.validation import validation_loss
from model import build_model
from synthetic_data import synthetic_pairs, write_hub_dataset
from nmt.corpora.tokenizer import PAD_ID, SOS_ID

AUDITED = {"model.py", "loss.py", "decoding.py", "cpu_kernels.py", "train.py", "schedule.py", "clock_plan.py",
           "validation.py", "step.py", "run_data.py", "cuda_graphs.py"}
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace}


class HostTensorAudit(TorchFunctionMode):
    """Records `file:line function` for each tensor factory called from the audited modules without
    a device."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            caller = sys._getframe(1)
            if Path(caller.f_code.co_filename).name in AUDITED:
                self.found.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hub_dataset(tmp_path_factory.mktemp("rehearsal") / "data",
                             {"train": synthetic_pairs(120, 1), "validation": synthetic_pairs(12, 2),
                              "test": synthetic_pairs(4, 3)})


def trainer_on(device: torch.device, data: Path, tmp_path: Path, *extra: str) -> train.Trainer:
    config = parse_config(["--datasource", str(data), "--preset", "tiny", "--batch_tokens", "200", "--max_steps", "2",
                           "--log_every", "1000", "--model_folder", str(tmp_path / "w"), "--runs_folder",
                           str(tmp_path / "r"), "--store_folder", str(tmp_path / "s"), "--dropout", "0.1", *extra])
    trainer = train.Trainer(config, device, Ranks(), time.monotonic())
    trainer.start_or_resume()
    return trainer


def test_two_training_steps_and_the_validation_loss_run_on_the_meta_device(data: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[torch.device] = []

    def no_step_is_skipped(self, *flags):
        reads.extend(flag.device for flag in flags if isinstance(flag, torch.Tensor))
        return [False] * len(flags)

    monkeypatch.setattr(RankExchange, "on_any_rank", no_step_is_skipped)
    trainer = trainer_on(torch.device("meta"), data, tmp_path)
    assert next(trainer.raw_model.parameters()).is_meta
    with GracefulStop() as graceful:
        assert trainer.train_epoch(graceful) == "max_steps"
    assert trainer.global_step == 2 and reads == [torch.device("meta")] * 2
    state = trainer.optimizer.state[next(trainer.raw_model.parameters())]
    assert state["exp_avg"].is_meta and int(state["step"]) == 2  # AdamW stepped (its step count lives on the host)
    assert trainer.learning_rate.steps == 2
    assert validation_loss(trainer.raw_model, trainer.val_ds, trainer.config, trainer.device)[0].is_meta


def test_a_training_step_on_the_cpu_makes_no_host_tensor_in_project_code(data: Path, tmp_path: Path) -> None:
    trainer = trainer_on(torch.device("cpu"), data, tmp_path)
    with HostTensorAudit() as audit, GracefulStop() as graceful:
        trainer.train_epoch(graceful)
        validation_loss(trainer.raw_model, trainer.val_ds, trainer.config, trainer.device)
    assert audit.found == []


@pytest.fixture
def graphs_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """--cuda_graphs on taken on the CPU and the meta device, where training_step captures into
    cuda_graphs.StandInGraphs: the capture and replay code, without CUDA."""
    monkeypatch.setattr(cuda_graphs, "GRAPH_DEVICES", ("cuda", "cpu", "meta"))


def test_the_captured_step_runs_on_the_meta_device_reading_nothing(data: Path, tmp_path: Path, graphs_anywhere: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The step train.py captures as CUDA graphs (--cuda_graphs on: length-bucketed batches, a graph
    per shape and one for the optimizer) runs its capture and replay paths with the model, the
    optimizer and every static tensor on the meta device, which raises on any read: nothing inside
    the graphs reads the device; the one read of a step is on_any_rank's, handed a device tensor."""
    reads: list[torch.device] = []

    def no_step_is_skipped(self, *flags):
        reads.extend(flag.device for flag in flags if isinstance(flag, torch.Tensor))
        return [False] * len(flags)

    monkeypatch.setattr(RankExchange, "on_any_rank", no_step_is_skipped)
    trainer = trainer_on(torch.device("meta"), data, tmp_path, "--cuda_graphs", "on", "--max_steps", "5")
    assert isinstance(trainer.step, cuda_graphs.CapturedStep) and trainer.batches.buckets is not None
    with GracefulStop() as graceful:
        assert trainer.train_epoch(graceful) == "max_steps"
    graphs = trainer.step.graphs
    assert trainer.global_step == 5 and reads == [torch.device("meta")] * 5
    assert graphs.captured == len(trainer.step.micro) + 1 and graphs.replayed >= 4  # the optimizer's, at least


def test_the_captured_step_on_the_cpu_makes_no_host_tensor_in_project_code(data: Path, tmp_path: Path,
                                                                           graphs_anywhere: None) -> None:
    trainer = trainer_on(torch.device("cpu"), data, tmp_path, "--cuda_graphs", "on", "--max_steps", "4")
    with HostTensorAudit() as audit, GracefulStop() as graceful:
        trainer.train_epoch(graceful)
    assert isinstance(trainer.step, cuda_graphs.CapturedStep) and trainer.step.graphs.replayed >= 3
    assert audit.found == []


def test_decoding_makes_no_host_tensor_in_project_code() -> None:
    """Greedy, beam search (with the brevity penalty and n-gram blocking, and with constraints) and
    sampling, over the model and its KV cache, and the training loss."""
    torch.manual_seed(0)
    config = {**get_config(), **PRESETS["tiny"]}
    model = build_model(config, 40, 50).eval()
    src = torch.randint(4, 40, (3, 9))
    src[0, -2:] = PAD_ID
    src_mask = (src != PAD_ID)[:, None, None, :]
    with HostTensorAudit() as audit:
        greedy_decode(model, src, src_mask, 12, no_repeat_ngram_size=2)
        beam_search(model, src, src_mask, 12, 3, length_penalty=1.0, n_best=2, no_repeat_ngram_size=2,
                    brevity_penalty=0.2, length_ratio=1.1)
        beam_search(model, src, src_mask, 12, 4, constraints=[[[5, 6]], None, [[[7], [8, 9]], [10]]])
        sample(model, src, src_mask, 12, samples=2, topk=5, topp=0.9, temperature=0.8)
        tgt = torch.full((3, 6), SOS_ID, device=src.device)
        loss_sum(model(src, tgt, src_mask), tgt, 0.1).backward()
    assert audit.found == []


def test_the_audit_finds_a_host_tensor() -> None:
    """The audit itself: a factory without a device, called from an audited file, is recorded."""
    with HostTensorAudit() as audit:
        exec(compile("import torch\ntorch.zeros(3)\ntorch.zeros(3, device='cpu')", "decoding.py", "exec"))
    assert audit.found == ["decoding.py:2 zeros"]
