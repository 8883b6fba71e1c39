"""Checkpoints that lie: truncated, bit-flipped, written to a full disk, or crafted to run code."""
from __future__ import annotations

import errno
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checkpoint
import train
from checkpoint import CheckpointError, load_checkpoint, load_for_inference, load_latest
from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An experiment folder whose newest checkpoint is at step 12 (every 4 steps and each epoch end)."""
    tmp = tmp_path_factory.mktemp("integrity")
    data = tiny_corpus(tmp / "data")
    assert train.main(["--datasource", str(data), "--preset", "tiny", "--max_steps", "12", "--num_epochs", "100",
                       "--save_every_steps", "4", "--model_folder", str(tmp / "weights"),
                       "--runs_folder", str(tmp / "runs"), "--store_folder", str(tmp / "stores"),
                       "--val_max_sentences", "4"]) == 0
    return next((tmp / "weights").iterdir())


def copy_experiment(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def translate(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "translate.py", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_newest_checkpoint_falls_back(trained: Path, tmp_path: Path, damage: str,
                                              capsys: pytest.CaptureFixture) -> None:
    folder = copy_experiment(trained, tmp_path / "exp")
    newest = folder / "ckpt_00000012.pt"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        for offset in range(len(data) // 3, len(data) // 3 + 16):
            data[offset] ^= 0xFF
    newest.write_bytes(bytes(data))

    second_newest = sorted(folder.glob("ckpt_*.pt"))[-2]
    path, state = load_latest(folder)
    assert path == second_newest and state["global_step"] == int(second_newest.stem.split("_")[1])
    assert "ckpt_00000012.pt" in capsys.readouterr().err

    with pytest.raises(CheckpointError, match="ckpt_00000012.pt"):
        load_checkpoint(newest)
    result = translate("--checkpoint", str(newest), "The cat sees the dog.")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "ckpt_00000012.pt" in result.stderr


def test_truncation_detected_without_manifest(trained: Path, tmp_path: Path) -> None:
    folder = copy_experiment(trained, tmp_path / "exp")
    (folder / checkpoint.MANIFEST).unlink()
    newest = folder / "ckpt_00000012.pt"
    newest.write_bytes(newest.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(newest)
    assert load_latest(folder)[0] == sorted(folder.glob("ckpt_*.pt"))[-2]


def test_full_disk_keeps_previous_checkpoint(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    before = {p.name: p.read_bytes() for p in folder.glob("ckpt_*.pt")}

    def disk_full(state, handle) -> None:
        handle.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    config = dict(torch.load(folder / "ckpt_00000012.pt", weights_only=True)["config"])
    code = train.main(["--datasource", config["datasource"], "--preset", "tiny", "--max_steps", "14",
                       "--num_epochs", "100", "--model_folder", str(tmp_path / "weights"),
                       "--runs_folder", str(tmp_path / "runs"), "--store_folder", str(tmp_path / "stores"),
                       "--val_max_sentences", "4"])
    assert code == 1
    error_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.py: error")]
    assert len(error_lines) == 1 and "No space left on device" in error_lines[0]
    assert "intact" in error_lines[0]
    assert {p.name: p.read_bytes() for p in folder.glob("ckpt_*.pt")} == before
    assert not [p for p in folder.iterdir() if ".tmp" in p.name], "temporary file left behind"
    monkeypatch.undo()
    assert load_latest(folder)[1]["global_step"] == 12


class RunsCode:
    """Unpickling this would create a marker file: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_crafted_pickle_is_refused_and_runs_nothing(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "pwned"
    evil = tmp_path / "ckpt_00000001.pt"
    payload = {"model": RunsCode(marker), "config": {}}
    if writer == "torch.save":
        torch.save(payload, evil)
    else:
        evil.write_bytes(pickle.dumps(payload))
    with pytest.raises(CheckpointError, match="refused|corrupt"):
        load_checkpoint(evil)
    result = translate("--checkpoint", str(evil), "Hello.")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert not marker.exists(), "loading the checkpoint ran code"


def test_config_inside_checkpoint_is_validated(trained: Path, tmp_path: Path) -> None:
    state = torch.load(trained / "ckpt_00000012.pt", weights_only=True)
    for key, value, message in (("d_model", "64", "must be int"), ("surprise", 1, "unknown config key"),
                                ("num_heads", 5, "not divisible")):
        bad = dict(state, config=dict(state["config"], **{key: value}))
        path = tmp_path / f"bad_{key}" / "ckpt_00000012.pt"
        path.parent.mkdir()
        torch.save(bad, path)
        with pytest.raises(CheckpointError, match=message):
            load_for_inference(path, path.parent, torch.device("cpu"))
