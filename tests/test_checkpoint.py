"""checkpoint.py: atomic writes, retention of the last K plus the best, verified loading that
always lands on the CPU, and falling back past a damaged newest checkpoint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from checkpoint import (MANIFEST, CheckpointError, atomic_write, atomic_write_bytes, best_checkpoint,
                        checkpoint_candidates, checkpoint_name, load_checkpoint, load_latest, save_checkpoint)


def state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(4, 3, generator=generator), "b": torch.arange(3)},
            "config": {"step": step}, "epoch": step // 10, "global_step": step}


def test_atomic_write_leaves_the_old_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "file.bin"
    digest = atomic_write_bytes(path, b"old contents")
    assert digest == hashlib.sha256(b"old contents").hexdigest()

    def failing_writer(handle) -> None:
        handle.write(b"half of the new ")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(path, failing_writer)
    assert path.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]  # no temporary file left behind
    atomic_write(path, lambda handle: handle.write(b"new"))
    assert path.read_bytes() == b"new"


def test_keeps_the_last_k_plus_the_best(tmp_path: Path) -> None:
    bleus = {1: 5.0, 2: 20.0, 3: 7.0, 4: 9.0, 5: 3.0, 6: None}
    for step, bleu in bleus.items():
        save_checkpoint(tmp_path, state(step), step, keep=2, bleu=bleu)
    names = sorted(p.name for p in tmp_path.glob("ckpt_*.pt"))
    assert names == [checkpoint_name(2), checkpoint_name(5), checkpoint_name(6)]
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert sorted(manifest["checkpoints"]) == names
    assert manifest["latest"] == checkpoint_name(6)
    assert manifest["best"] == checkpoint_name(2) and manifest["best_bleu"] == 20.0
    assert best_checkpoint(tmp_path) == tmp_path / checkpoint_name(2)
    assert [p.name for p in checkpoint_candidates(tmp_path)] == names[::-1]
    # once the best is among the last K it is not counted twice
    save_checkpoint(tmp_path, state(7), 7, keep=2, bleu=30.0)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == [checkpoint_name(6), checkpoint_name(7)]


def test_round_trip_on_the_cpu(tmp_path: Path) -> None:
    original = state(3)
    path = save_checkpoint(tmp_path, original, 3, keep=3)
    loaded = load_checkpoint(path)
    assert loaded["config"] == original["config"] and loaded["global_step"] == 3
    for name, tensor in original["model"].items():
        assert loaded["model"][name].device.type == "cpu"
        assert torch.equal(loaded["model"][name], tensor)


def test_checkpoint_saved_on_a_gpu_loads_on_the_cpu(tmp_path: Path, save_as_if_from_cuda) -> None:
    """The file records its tensors as living on cuda:0, as a GPU run's checkpoint does. Plain
    torch.load fails on this CPU-only machine; load_checkpoint maps them to the CPU."""
    if torch.cuda.is_available():
        pytest.skip("this machine can load CUDA tensors, so the test would prove nothing")
    original = state(4)
    path = tmp_path / checkpoint_name(4)
    save_as_if_from_cuda(original, path)
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path, weights_only=True)
    loaded = load_checkpoint(path)
    for name, tensor in original["model"].items():
        assert loaded["model"][name].device.type == "cpu"
        assert torch.equal(loaded["model"][name], tensor)


def test_sha256_mismatch_is_detected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, state(1), 1, keep=3)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, which torch.load might not notice
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path)


def test_load_latest_falls_back_to_an_older_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, state(step), step, keep=5)
    (tmp_path / checkpoint_name(30)).write_bytes(b"not a checkpoint")
    (tmp_path / checkpoint_name(20)).write_bytes((tmp_path / checkpoint_name(20)).read_bytes()[:100])
    path, loaded = load_latest(tmp_path)
    assert path.name == checkpoint_name(10) and loaded["global_step"] == 10
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and checkpoint_name(30) in warnings[0] and checkpoint_name(20) in warnings[1]
    (tmp_path / checkpoint_name(10)).unlink()
    assert load_latest(tmp_path) is None
    assert load_latest(tmp_path / "never_created") is None


def test_unusable_files_give_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    not_ours = tmp_path / "weights_only.pt"
    torch.save({"w": torch.ones(2)}, not_ours)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(not_ours)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(garbage)
