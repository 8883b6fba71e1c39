"""A non-finite loss skips its step and is counted; too many in a row stop the run with a
checkpoint of the last good weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import train
from synthetic_data import tiny_corpus


def poison_steps(monkeypatch: pytest.MonkeyPatch, bad_calls: set[int]) -> None:
    """Make the training loss NaN on the given calls (1-based; one call per micro-batch)."""
    real = train.loss_sum
    calls = {"n": 0}

    def loss_sum(logits, label, label_smoothing):
        if label_smoothing == 0.0:  # validation loss: leave it alone
            return real(logits, label, label_smoothing)
        calls["n"] += 1
        value = real(logits, label, label_smoothing)
        return value * float("nan") if calls["n"] in bad_calls else value

    monkeypatch.setattr(train, "loss_sum", loss_sum)


def args(tmp_path: Path, *extra: str) -> list[str]:
    data = tiny_corpus(tmp_path / "data")
    return ["--datasource", str(data), "--preset", "tiny", "--num_epochs", "100", "--model_folder",
            str(tmp_path / "weights"), "--runs_folder", str(tmp_path / "runs"),
            "--store_folder", str(tmp_path / "stores"),
            "--val_max_sentences", "4", *extra]


def newest_state(tmp_path: Path) -> dict:
    return torch.load(max((tmp_path / "weights").glob("*/ckpt_*.pt")), weights_only=True)


def test_isolated_nan_steps_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    poison_steps(monkeypatch, {3, 7})
    assert train.main(args(tmp_path, "--max_steps", "10")) == 0
    err = capsys.readouterr().err
    assert "step 3: non-finite loss or gradient, step skipped (1 in a row)" in err
    assert "step 7: non-finite loss or gradient, step skipped (1 in a row)" in err
    state = newest_state(tmp_path)
    assert state["global_step"] == 10
    assert state["scheduler"]["last_epoch"] == 8, "skipped steps do not advance the schedule"
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_consecutive_nans_stop_with_last_good_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    assert train.main(args(tmp_path, "--max_steps", "4", "--experiment_name", "good")) == 0
    good = newest_state(tmp_path)["model"]
    poison_steps(monkeypatch, set(range(1, 100)))
    code = train.main(args(tmp_path, "--max_steps", "40", "--experiment_name", "good", "--max_nonfinite_steps", "3"))
    assert code == 1
    assert "stopped after 3 non-finite steps in a row at step 7" in capsys.readouterr().err
    state = newest_state(tmp_path)
    assert state["global_step"] == 7
    for name, tensor in state["model"].items():
        assert torch.equal(tensor, good[name]), f"{name} changed by a skipped step"
