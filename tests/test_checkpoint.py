"""checkpoint.py: atomic writes, retention of the last K plus the best (removing only what the
manifest lists), a manifest that outlives files the user moved out, verified loading that always
lands on the CPU, and falling back past a damaged newest checkpoint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from nmt.training.checkpoint import (DIGEST_KEY, MANIFEST, CheckpointError, atomic_write, atomic_write_bytes, best_checkpoint,
                        checkpoint_candidates, checkpoint_name, content_digest, load_checkpoint, load_latest,
                        reconcile_manifest, save_average, save_checkpoint)


def state(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(4, 3, generator=generator), "b": torch.arange(3)},
            "config": {"step": step}, "tokenizers": {}, "epoch": step // 10, "global_step": step}


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
        save_checkpoint(tmp_path, state(step), step, keep=2, metrics={"bleu": bleu} if bleu is not None else None)
    names = sorted(p.name for p in tmp_path.glob("ckpt_*.pt"))
    assert names == [checkpoint_name(2), checkpoint_name(5), checkpoint_name(6)]
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert sorted(manifest["checkpoints"]) == names
    assert manifest["latest"] == checkpoint_name(6)
    assert manifest["best"] == checkpoint_name(2) and (manifest["best_metric"], manifest["best_value"]) == ("bleu", 20.0)
    assert best_checkpoint(tmp_path) == tmp_path / checkpoint_name(2)
    assert [p.name for p in checkpoint_candidates(tmp_path)] == names[::-1]
    # once the best is among the last K it is not counted twice
    save_checkpoint(tmp_path, state(7), 7, keep=2, metrics={"bleu": 30.0})
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == [checkpoint_name(6), checkpoint_name(7)]


@pytest.mark.parametrize("metric, best_step", [("bleu", 2), ("chrf", 3), ("loss", 4)])
def test_the_best_is_chosen_by_best_metric_and_kept_out_of_rotation(tmp_path: Path, metric: str,
                                                                   best_step: int) -> None:
    scored = {1: (5.0, 30.0, 4.0), 2: (20.0, 40.0, 3.0), 3: (19.0, 45.0, 2.5), 4: (18.0, 44.0, 2.0),
              5: (3.0, 20.0, 5.0), 6: (2.0, 10.0, 6.0), 7: (1.0, 5.0, 7.0)}
    for step, (bleu, chrf, loss) in scored.items():
        save_checkpoint(tmp_path, state(step), step, keep=2, metrics={"bleu": bleu, "chrf": chrf, "loss": loss},
                        best_metric=metric)
    assert best_checkpoint(tmp_path) == tmp_path / checkpoint_name(best_step)
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == [checkpoint_name(s) for s in (best_step, 6, 7)]


def test_a_manifest_from_before_metrics_keeps_its_bleu_best(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(1), 1, keep=5, metrics={"bleu": 9.0})
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["checkpoints"][checkpoint_name(1)] = {**manifest["checkpoints"][checkpoint_name(1)], "bleu": 9.0}
    del manifest["checkpoints"][checkpoint_name(1)]["metrics"]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    save_checkpoint(tmp_path, state(2), 2, keep=5, metrics={"bleu": 8.0})
    assert best_checkpoint(tmp_path) == tmp_path / checkpoint_name(1)


def test_checkpoints_moved_out_count_for_nothing_and_the_new_one_is_never_rotated_out(tmp_path: Path,
                                                                                     capsys) -> None:
    """The issue's run: steps 10, 20 and 30 listed (30 the best), their files moved out, then a new run
    saves step 5. Before, rotation removed step 5 itself: the folder was left with no checkpoint."""
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, state(step), step, keep=3, metrics={"bleu": float(step)})
    for path in tmp_path.glob("ckpt_*.pt"):
        path.unlink()
    save_checkpoint(tmp_path, state(5), 5, keep=3, metrics={"bleu": 1.0})
    assert [p.name for p in tmp_path.glob("ckpt_*.pt")] == [checkpoint_name(5)]
    assert "left" in capsys.readouterr().err
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert list(manifest["checkpoints"]) == [checkpoint_name(5)] and manifest["best"] == checkpoint_name(5)
    # Listed checkpoints above the one written (a run resumed from an older one) do not rotate it out either.
    for step in (6, 7, 8):
        save_checkpoint(tmp_path, state(step), step, keep=1)
    save_checkpoint(tmp_path, state(2), 2, keep=1)
    assert (tmp_path / checkpoint_name(2)).is_file()


def test_reconciling_drops_what_is_gone_and_chooses_the_best_again(tmp_path: Path) -> None:
    for step, bleu in ((1, 5.0), (2, 9.0), (3, 7.0)):
        save_checkpoint(tmp_path, state(step), step, keep=5, metrics={"bleu": bleu})
    assert reconcile_manifest(tmp_path, "bleu") is None  # nothing gone: the manifest is not rewritten
    (tmp_path / checkpoint_name(2)).unlink()
    note = reconcile_manifest(tmp_path, "bleu")
    assert checkpoint_name(2) in note and f"the best is now {checkpoint_name(3)}" in note
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert sorted(manifest["checkpoints"]) == [checkpoint_name(1), checkpoint_name(3)]
    assert (manifest["best"], manifest["latest"]) == (checkpoint_name(3), checkpoint_name(3))


def test_a_best_whose_file_is_gone_falls_back_with_one_line(tmp_path: Path, capsys) -> None:
    """translate.py and friends: the best of those left, or the newest when none is scored; the
    manifest itself is not touched (a run may hold the folder)."""
    for step, bleu in ((1, 5.0), (2, 9.0), (3, None)):
        save_checkpoint(tmp_path, state(step), step, keep=5, metrics={"bleu": bleu} if bleu else None)
    recorded = (tmp_path / MANIFEST).read_bytes()
    (tmp_path / checkpoint_name(2)).unlink()
    assert best_checkpoint(tmp_path) == tmp_path / checkpoint_name(1)
    assert f"{checkpoint_name(2)}, is no longer in" in capsys.readouterr().err
    (tmp_path / checkpoint_name(1)).unlink()
    assert best_checkpoint(tmp_path) is None
    assert "using the newest" in capsys.readouterr().err
    assert (tmp_path / MANIFEST).read_bytes() == recorded


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
    with pytest.raises(CheckpointError, match=f"no usable checkpoint .*: {checkpoint_name(30)}, "
                                              f"{checkpoint_name(20)} do not load"):
        load_latest(tmp_path)  # not None: that would read as "nothing to resume", and training would start over
    assert load_latest(tmp_path / "never_created") is None


def test_unusable_files_give_checkpoint_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    not_ours = tmp_path / "weights_only.pt"
    torch.save({"w": torch.ones(2)}, not_ours)
    with pytest.raises(CheckpointError, match="not a checkpoint of this project"):
        load_checkpoint(not_ours)
    assert "warning" not in capsys.readouterr().err  # one line for the user: the error, not a warning before it
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(garbage)


def test_rotation_removes_only_what_the_manifest_lists(tmp_path: Path) -> None:
    """Files named like checkpoints that the user put in the folder are neither counted nor removed,
    by the rotation of checkpoints nor by the replacement of the average."""
    foreign = {checkpoint_name(1): b"the user's own checkpoint", "ckpt_00000002_avg2.pt": b"the user's average"}
    for name, data in foreign.items():
        (tmp_path / name).write_bytes(data)
    for step in (3, 4, 5, 6):
        save_checkpoint(tmp_path, state(step), step, keep=2)
        if step >= 4:
            save_average(tmp_path, 2)
    assert {name: (tmp_path / name).read_bytes() for name in foreign} == foreign
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.pt")) == sorted(
        [*foreign, checkpoint_name(5), checkpoint_name(6), "ckpt_00000006_avg2.pt"])


def test_a_file_the_manifest_does_not_list_is_never_replaced(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(4), 4, keep=2)
    theirs = tmp_path / checkpoint_name(5)
    theirs.write_bytes(b"copied in by the user")
    with pytest.raises(CheckpointError, match=f"will not replace .*{checkpoint_name(5)}: {MANIFEST} does not list it"):
        save_checkpoint(tmp_path, state(5), 5, keep=2)
    assert theirs.read_bytes() == b"copied in by the user"
    save_checkpoint(tmp_path, state(4), 4, keep=2)  # its own checkpoint it may write again


def test_the_content_digest_survives_a_round_trip_and_notices_one_changed_value(tmp_path: Path) -> None:
    original = dict(state(7), optimizer={"state": {0: {"step": torch.tensor(7.0)}}, "param_groups": [
        {"betas": (0.9, 0.98), "params": [0, 1]}]})
    path = save_checkpoint(tmp_path, original, 7, keep=1)
    loaded = torch.load(path, weights_only=True)
    assert loaded[DIGEST_KEY] == content_digest(original) == content_digest(loaded)
    assert content_digest(dict(loaded, epoch=1)) != loaded[DIGEST_KEY]
    loaded["model"]["w"][0, 0] += 1e-6
    assert content_digest(loaded) != loaded[DIGEST_KEY]


def test_an_unlisted_checkpoint_from_before_the_digest_loads_with_a_warning(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    old = tmp_path / "shared_by_a_colleague.pt"
    torch.save(state(2), old)  # what checkpoints were before they carried their digest
    assert load_checkpoint(old)["global_step"] == 2
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "loaded unverified" in warning[0] and old.name in warning[0]
