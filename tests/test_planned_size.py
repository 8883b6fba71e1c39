"""planned_size.py: what a run planned to its clock sizes on a CPU before its model is built (depth,
width, batch), the rules on their own and applied, their records in a checkpoint, and two whole runs
of train.py that take a planned size and resume with it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import train
from config import PRESETS, get_config, parse_config, weights_dir
from nmt.training.checkpoint import MANIFEST
from nmt.training.planned_size import (planned_batch_tokens, planned_layers, planned_size, planned_width,
                                       size_records, sizes_of_records, sizes_plannable)
from test_clock_plan import CountingClock, final_state, planned, run  # noqa: F401  (planned: a fixture)

JUMP_AFTER_RETIME = 70  # a clock reading after the re-time and before the planned end


def test_the_rules_narrow_shallow_and_shrink_a_run_that_fits_few_of_its_presets_epochs() -> None:
    # The depth: one layer fewer under the preset's epochs, never below one layer.
    assert planned_layers(3, 7.5, 21) == 2 and planned_layers(3, 15.5, 21) == 2 and planned_layers(3, 21, 21) == 3
    assert planned_layers(3, 25.7, 21) == 3 and planned_layers(1, 0.5, 21) == 1
    # The batch: the preset's times the square root of the share of its epochs that fits, at least
    # half of it, never raised.
    assert planned_batch_tokens(1500, 21 * 0.64, 21) == 1200 and planned_batch_tokens(1500, 3.4, 21) == 750
    assert planned_batch_tokens(1500, 30, 21) == 1500 and planned_batch_tokens(1500, 3.4, 0) == 1500
    # The width: three quarters under a quarter of the preset's epochs, d_model a multiple of the heads.
    assert planned_width(256, 512, 4, 3.4, 21) == (192, 384) and planned_width(512, 2048, 8, 1, 21) == (384, 1536)
    assert planned_width(256, 512, 4, 5.25, 21) == (256, 512) and planned_width(256, 512, 4, 3.4, 0) == (256, 512)
    assert planned_width(32, 64, 2, 3.4, 21) == (24, 48) and planned_width(4, 8, 4, 0.1, 21) == (4, 8)
    assert planned_width(60, 240, 3, 1, 21) == (48, 192)  # even: sinusoidal positions come in pairs


def test_the_depth_and_batch_follow_the_narrower_models_estimate_and_what_is_given_is_kept(capsys) -> None:
    """An epoch of the preset's width estimated at 100 s, of the narrower one at 50: 60 s left fit
    0.6 epochs of 21, so the width narrows; then 1.2 epochs, so one layer fewer and half the batch."""
    config = {**get_config(), **PRESETS["cpu"], "max_minutes": 1.0}
    seconds = lambda sized: 100.0 if sized["d_model"] == 256 else 50.0  # noqa: E731
    assert planned_size(config, frozenset(), seconds, lambda: 60.0) == {"num_layers": 2, "batch_tokens": 750,
                                                                      "d_model": 192, "d_ff": 384}
    assert "about 1.2 epochs fit --max_minutes 1 at 50 s an epoch, of num_epochs 21: d_model 192 and d_ff 384 " \
        "instead of 256 and 512 (about 0.6 epochs at 100 s an epoch) and 2 + 2 layers instead of 3 + 3 and batches " \
        "of 750 tokens instead of 1500" in capsys.readouterr().err
    given = frozenset({"num_layers", "d_model", "batch_tokens"})
    assert planned_size(config, given, seconds, lambda: 60.0) == {}
    assert not sizes_plannable({**config, "num_layers": 1}, frozenset({"batch_tokens", "d_ff"}))
    assert not sizes_plannable(config, given) and sizes_plannable({**config, "num_layers": 1}, frozenset({"d_ff"}))
    assert planned_size(config, frozenset(), seconds, lambda: 10**6) == {}  # all the preset's epochs fit


def test_a_checkpoints_records_say_what_its_plan_sized() -> None:
    sizes = {"num_layers": 2, "d_model": 192, "d_ff": 384}
    records = size_records(sizes)
    assert records == {"planned_layers": 2, "planned_batch_tokens": None, "planned_width": {"d_model": 192, "d_ff": 384}}
    assert sizes_of_records(records) == sizes and sizes_of_records({}) == {}


def test_a_cpu_too_slow_for_the_presets_epochs_trains_a_smaller_model_and_a_resume_keeps_it(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Planted: an epoch estimated at 1 s, so about 30 of the 0.5 minutes' epochs fit, under a
    quarter of the preset's 600. The run trains d_model 24 and d_ff 48 instead of 32 and 64, and
    from the narrower model's estimate 1 + 1 layers instead of 2 + 2; the checkpoint's config (what
    the other programs build from) and config.json's decisions say so; a run resumed with that size
    given goes on bit for bit and keeps the record, so a resume without it is not refused;
    --num_layers and --d_model given keep theirs; --init_from with the preset and --d_model 24
    takes the checkpoint's d_ff and depth."""
    monkeypatch.setitem(PRESETS["tiny"], "num_layers", 2)
    monkeypatch.setitem(PRESETS["tiny"], "num_epochs", 600)
    monkeypatch.setattr(train, "cpu_epoch_estimate", lambda config, *args: 1.0 if config["d_model"] == 32 else 0.5)
    on_cpu = [*planned[:planned.index("--d_model")], *planned[planned.index("--d_model") + 2:], "--device", "cpu"]
    assert run(on_cpu, tmp_path / "unbroken", CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    assert "d_model 24 and d_ff 48 instead of 32 and 64" in log and "1 + 1 layers instead of 2 + 2" in log
    narrow, full = map(float, re.search(r"plan: about ([\d.]+) epochs .*\(about ([\d.]+) epochs at 1 s", log).groups())
    assert narrow == pytest.approx(2 * full, rel=0.05)  # the depth followed the narrower model's estimate
    unbroken = final_state(on_cpu, tmp_path / "unbroken")
    assert unbroken["planned_layers"] == 1 and unbroken["config"]["num_layers"] == 1
    assert unbroken["planned_width"] == {"d_model": 24, "d_ff": 48}
    assert unbroken["config"]["d_model"] == 24 and unbroken["config"]["d_ff"] == 48
    folder = weights_dir(parse_config([*on_cpu, "--model_folder", str(tmp_path / "unbroken" / "w")]))
    record = json.loads((folder / "config.json").read_text())
    assert {key: record["decided"][key] for key in ("num_layers", "d_model", "d_ff")} == {
        key: {"value": value, "by": "the plan to the clock"} for key, value in (("num_layers", 1), ("d_model", 24),
                                                                              ("d_ff", 48))}
    assert record["config"]["num_layers"] == 2 and record["config"]["d_model"] == 32  # the preset's, as given
    assert not any(".layers.1." in key for key in unbroken["model"])
    assert unbroken["model"]["encoder.layers.0.feed_forward.linear_1.weight"].shape == (48, 24)

    given = [*on_cpu, "--num_layers", "2", "--d_model", "32"]
    assert run(given, tmp_path / "given", CountingClock(), monkeypatch) == 0
    kept = final_state(given, tmp_path / "given")
    assert kept["planned_layers"] is None and any(".layers.1." in key for key in kept["model"])
    assert kept["planned_width"] is None and kept["config"]["d_model"] == 32 and kept["config"]["d_ff"] == 64

    started_from = [*on_cpu, "--d_model", "24", "--num_epochs", "1", "--init_from", str(folder / json.loads(
        (folder / MANIFEST).read_text())["latest"])]
    assert run(started_from, tmp_path / "started_from", CountingClock(), monkeypatch) == 0
    assert {key: final_state(started_from, tmp_path / "started_from")["config"][key] for key in
            ("num_layers", "d_model", "d_ff")} == {"num_layers": 1, "d_model": 24, "d_ff": 48}

    assert run(on_cpu, tmp_path / "resumed", CountingClock(jump_at=JUMP_AFTER_RETIME), monkeypatch) == 0
    assert final_state(on_cpu, tmp_path / "resumed")["global_step"] < unbroken["plan"]["total_steps"]
    same_size = [*on_cpu, "--num_layers", "1", "--d_model", "24"]
    assert run(same_size, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    resumed = final_state(same_size, tmp_path / "resumed")
    # kept: a later resume without --num_layers or --d_model is not refused
    assert resumed["planned_layers"] == 1 and resumed["planned_width"] == {"d_model": 24, "d_ff": 48}
    assert resumed["plan"] == unbroken["plan"] and resumed["global_step"] == unbroken["global_step"]
    for key, tensor in unbroken["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key
    assert run(on_cpu, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    assert "already trained the" in capsys.readouterr().err


def test_a_cpu_too_slow_for_the_presets_epochs_plans_smaller_batches_and_a_resume_keeps_them(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Planted: an epoch estimated at 1 s, so about 30 of the 0.5 minutes' epochs fit, a twentieth of
    the preset's 600: the tiny preset's 512-token batches become 256 (the floor, half), recorded in
    the checkpoint and config.json's decisions; a run resumed without --batch_tokens takes the same
    batches and goes on bit for bit; --batch_tokens given keeps its batch."""
    monkeypatch.setitem(PRESETS["tiny"], "num_epochs", 600)
    monkeypatch.setattr(train, "cpu_epoch_estimate", lambda *args: 1.0)
    preset_batch = planned[:planned.index("--batch_tokens")] + planned[planned.index("--batch_tokens") + 2:]
    on_cpu = [*preset_batch, "--device", "cpu"]
    assert run(on_cpu, tmp_path / "unbroken", CountingClock(), monkeypatch) == 0
    assert "batches of 256 tokens instead of 512" in capsys.readouterr().err
    unbroken = final_state(on_cpu, tmp_path / "unbroken")
    assert unbroken["planned_batch_tokens"] == 256 and unbroken["config"]["batch_tokens"] == 256
    assert unbroken["batch_settings"]["batch_tokens"] == 256
    folder = weights_dir(parse_config([*on_cpu, "--model_folder", str(tmp_path / "unbroken" / "w")]))
    assert json.loads((folder / "config.json").read_text())["decided"]["batch_tokens"]["value"] == 256

    given = [*on_cpu, "--batch_tokens", "512"]
    assert run(given, tmp_path / "given", CountingClock(), monkeypatch) == 0
    kept = final_state(given, tmp_path / "given")
    assert kept["planned_batch_tokens"] is None and kept["config"]["batch_tokens"] == 512
    assert kept["plan"]["steps_per_epoch"] < unbroken["plan"]["steps_per_epoch"]

    assert run(on_cpu, tmp_path / "resumed", CountingClock(jump_at=JUMP_AFTER_RETIME), monkeypatch) == 0
    assert final_state(on_cpu, tmp_path / "resumed")["global_step"] < unbroken["plan"]["total_steps"]
    capsys.readouterr()
    assert run(on_cpu, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    assert "--batch_tokens 256 -> 512" not in capsys.readouterr().err
    resumed = final_state(on_cpu, tmp_path / "resumed")
    assert resumed["planned_batch_tokens"] == 256
    assert resumed["plan"] == unbroken["plan"] and resumed["global_step"] == unbroken["global_step"]
    for key, tensor in unbroken["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key
