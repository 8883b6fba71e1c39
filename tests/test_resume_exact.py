"""Exact mid-epoch resume: a run killed with SIGKILL and restarted equals an unbroken run.

Run A trains uninterrupted. Run B is the same command, killed at a random moment after its
first step checkpoint and started again. On CPU every loss B logs after the resume, and its final
weights, must equal A's bit for bit.

A runs while B is killed and resumed, each with one thread (OMP_NUM_THREADS=1): on two cores the
two runs then take one core each, instead of one after the other, and their arithmetic is the same.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]
MAX_STEPS = 20
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def command(data: Path, run: Path) -> list[str]:
    # dropout on, so that exactness needs the RNG state to be restored too
    return [sys.executable, "train.py", "--datasource", str(data), "--preset", "tiny", "--d_model", "64",
            "--d_ff", "256", "--num_layers", "2", "--dropout", "0.1", "--num_epochs", "100", "--max_steps",
            str(MAX_STEPS), "--save_every_steps", "3", "--keep_checkpoints", "50", "--log_every", "1",
            "--model_folder", str(run / "weights"), "--runs_folder", str(run / "runs"),
            "--store_folder", str(run / "stores"),
            "--val_max_sentences", "8"]


def losses(run: Path) -> dict[int, float]:
    events = EventAccumulator(str(next((run / "runs").iterdir())), size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/loss")}


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    folder = next((run / "weights").iterdir())
    return torch.load(folder / f"ckpt_{MAX_STEPS:08d}.pt", weights_only=True)["model"]


def test_sigkill_then_resume_matches_unbroken_run(tmp_path: Path) -> None:
    data = tiny_corpus(tmp_path / "data", train=400)
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    with open(tmp_path / "a.log", "w") as log_a:
        unbroken = subprocess.Popen(command(data, run_a), cwd=ROOT, env=ONE_THREAD, stdout=subprocess.DEVNULL,
                                    stderr=log_a)
        try:
            resumed_from = kill_and_resume(data, run_b)
            assert unbroken.wait(timeout=240) == 0, (tmp_path / "a.log").read_text()[-3000:]
        finally:
            if unbroken.poll() is None:
                unbroken.kill()
                unbroken.wait()

    loss_a, loss_b = losses(run_a), losses(run_b)
    assert sorted(loss_b) == list(range(1, MAX_STEPS + 1)), "every step logged exactly once"
    for step in range(resumed_from + 1, MAX_STEPS + 1):
        assert loss_b[step] == loss_a[step], f"loss differs at step {step}"
    weights_a, weights_b = final_weights(run_a), final_weights(run_b)
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name


def kill_and_resume(data: Path, run_b: Path) -> int:
    """Run B: SIGKILL at a seeded random moment after its first checkpoint, then the same command
    again to the end; the step it resumed from."""
    victim = subprocess.Popen(command(data, run_b), cwd=ROOT, env=ONE_THREAD, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    manifest = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and victim.poll() is None:
        folders = list((run_b / "weights").glob("*/checkpoints.json"))
        if folders:
            manifest = folders[0]
            break
        time.sleep(0.01)
    assert manifest is not None, "run B wrote no checkpoint before finishing"
    delay = random.Random(20261122).uniform(0.0, 0.5)
    print(f"killing run B {delay:.3f} s after its first checkpoint")
    time.sleep(delay)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL, "run B finished before it could be killed"
    steps_saved = sorted(int(p.stem.split("_")[1]) for p in manifest.parent.glob("ckpt_*.pt"))
    resumed_from = steps_saved[-1]
    assert resumed_from < MAX_STEPS

    restarted = subprocess.run(command(data, run_b), cwd=ROOT, env=ONE_THREAD, capture_output=True, text=True,
                               timeout=240)
    assert restarted.returncode == 0, restarted.stderr
    assert f"step {resumed_from})" in restarted.stderr
    return resumed_from
