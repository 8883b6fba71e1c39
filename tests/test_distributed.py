"""torchrun with 2 CPU processes (gloo) equals one process with the same global batch.

Each global step holds world_size * accum_steps micro-batches; rank r trains on every
world_size-th one. So 2 ranks x accum 1 and 1 rank x accum 2 see the same micro-batches per step,
and with the loss normalised by the step's token count they must reach the same weights. The DDP
run is stopped at step 3 and resumed to step 6 to check resuming under DDP as well.

Adam's eps is raised to 1e-6 for the comparison: the key projection's bias has an exactly zero
true gradient (it shifts every attention score of a query equally), so it only ever sees rounding
noise, which eps 1e-9 would turn into full-size, order-dependent updates.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["train.py", "--datasource", str(data), "--preset", "tiny", "--d_model", "64", "--d_ff", "128",
            "--dropout", "0", "--adam_eps", "1e-6", "--num_epochs", "100", "--val_max_sentences", "4", "--model_folder", str(out / "w"),
            "--runs_folder", str(out / "r"), "--store_folder", str(out / "s"), *extra]


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(next((out / "w").iterdir()) / f"ckpt_{step:08d}.pt", weights_only=True)["model"]


def test_two_rank_ddp_equals_single_process_with_same_global_batch(tmp_path: Path) -> None:
    data = tiny_corpus(tmp_path / "data", train=400)
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    subprocess.run([sys.executable, *train_args(data, single, "--max_steps", "6", "--accum_steps", "2")], cwd=ROOT,
                   check=True, capture_output=True, timeout=240)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    for max_steps in ("3", "6"):
        result = subprocess.run([*torchrun, *train_args(data, ddp, "--max_steps", max_steps)], cwd=ROOT,
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
    assert "2 ranks" in result.stderr and "resuming from" in result.stderr

    expected, actual = weights(single, 6), weights(ddp, 6)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    at_resume = weights(ddp, 3)
    assert any(not torch.equal(at_resume[name], actual[name]) for name in actual), "the resumed run trained"
