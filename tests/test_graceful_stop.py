"""SIGINT/SIGTERM finish the current step, checkpoint, and exit 0 with a resume hint; a second
Ctrl-C quits at once without a traceback."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]


def start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    data = tiny_corpus(tmp_path / "data", train=400)
    weights = tmp_path / "weights"
    process = subprocess.Popen(
        [sys.executable, "train.py", "--datasource", str(data), "--preset", "tiny", "--d_model", "64", "--d_ff",
         "256", "--num_epochs", "1000", "--save_every_steps", "2", "--model_folder", str(weights),
         "--runs_folder", str(tmp_path / "runs"), "--store_folder", str(tmp_path / "stores")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(weights.glob("*/ckpt_*.pt")):  # training is under way
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.05)
    return process, weights


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_checkpoints_and_exits_zero(tmp_path: Path, sig: signal.Signals) -> None:
    process, weights = start(tmp_path)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("stopped at step ") and "resume with: python train.py" in last_line
    stopped_at = int(last_line.split()[3].rstrip(";"))
    newest = max(weights.glob("*/ckpt_*.pt"))
    assert newest.name == f"ckpt_{stopped_at:08d}.pt"
    assert torch.load(newest, weights_only=True)["global_step"] == stopped_at


def test_second_ctrl_c_quits_at_once(tmp_path: Path) -> None:
    process, _ = start(tmp_path)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    # The second Ctrl-C may land after the first has already finished its step and saved.
    assert process.returncode in (0, 130), stderr
    assert "Traceback" not in stderr
