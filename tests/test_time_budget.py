"""time_budget.py and train.py's plan: the run's length planned to --max_minutes, stored in the
checkpoint, followed on resume bit for bit, and ended with its schedule; an explicit length wins."""
from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from nmt.training import time_budget
import train
from nmt.training.checkpoint import MANIFEST, load_checkpoint
from config import PRESETS, parse_config, runs_dir, weights_dir
from nmt.training.optimizer import decay_start, lr_factor
from synthetic_data import synthetic_pairs, write_hub_dataset
from nmt.training.time_budget import (plan_run, planned_batch_tokens, planned_dropout, planned_layers, planned_width,
                         validations_until)
from nmt.corpora.tokenizer import EOS_ID


def test_the_plan_fills_the_budget_with_steps_validations_and_checkpoints() -> None:
    plan = plan_run(step=15, elapsed_s=40, budget_s=900, step_seconds=0.2, validation_seconds=5.0,
                    checkpoint_seconds=0.5, steps_per_epoch=112, validate_every=0, save_every=0,
                    warmup_steps=100, warmup_fraction=0.1)
    left = 900 - 40 - 18  # the margin: 2% of the budget
    # Validations (5 s) within 10% of the budget: the last step's and the last 17 epoch ends' (the run
    # has 32); every epoch end checkpoints (0.5 s).
    cost = lambda total: (total - 15) * 0.2 + 18 * 5.0 + validations_until(15, total, 112, 0) * 0.5  # noqa: E731
    assert cost(plan.total_steps) <= left < cost(plan.total_steps + 1)
    assert plan.validate_from == ((plan.total_steps - 1) // 112 - 16) * 112 and plan.validated_epoch_ends == 17
    assert plan.expected_end_s == pytest.approx(40 + cost(plan.total_steps))
    assert plan.warmup_steps == 100  # the config's warmup, in steps, whatever the run's length
    assert 32 < plan.epochs < 33
    # Work after the last checkpoint (the confidence fit) is planned too.
    fitted = plan_run(15, 40, 900, 0.2, 5.0, 0.5, 112, 0, 0, 100, 0.1, final_seconds=20.0)
    assert cost(fitted.total_steps) + 20 <= left < cost(fitted.total_steps + 1) + 20
    assert fitted.total_steps < plan.total_steps
    assert fitted.expected_end_s == pytest.approx(40 + cost(fitted.total_steps) + 20)
    # A fit over FIT_SHARE of the budget is left out of the run, and its time goes to steps.
    costly = plan_run(15, 40, 900, 0.2, 5.0, 0.5, 112, 0, 0, 100, 0.1, final_seconds=95.0)
    assert fitted.confidence_fit and not costly.confidence_fit and costly.total_steps == plan.total_steps
    assert "no confidence fit (it would take 95.0 s" in costly.describe()
    # A budget already spent still trains one more step, to end with a validated checkpoint.
    assert plan_run(15, 950, 900, 0.2, 5, 0.5, 112, 0, 0, 100, 0.1).total_steps == 16
    # A short run keeps its warmup's steps up to half the run; a warmup given as a share keeps it.
    short = plan_run(15, 40, 120, 0.2, 5, 0.5, 112, 0, 0, 1000, 0.1)
    assert short.warmup_steps == short.total_steps // 2 and 100 < short.total_steps < 400
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, 0, 0, 0, 0.1).warmup_steps == round(0.1 * plan.total_steps)
    # The dropout: kept where none is given to scale, scaled down to a run of fewer epochs, never raised.
    assert plan.dropout is None
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, 0, 0, 100, 0.1, dropout=0.15, dropout_epochs=61).dropout == \
        pytest.approx(0.15 * plan.epochs / 61, abs=1e-4)
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, 0, 0, 100, 0.1, dropout=0.15, dropout_epochs=21).dropout == 0.15
    # The depth: one layer fewer under the preset's epochs (9-minute plans here: about 15), never
    # below one layer.
    assert planned_layers(3, 7.5, 21) == 2 and planned_layers(3, 15.5, 21) == 2 and planned_layers(3, 21, 21) == 3
    assert planned_layers(3, 25.7, 21) == 3 and planned_layers(1, 0.5, 21) == 1
    # The batch: the preset's times the square root of the share of its epochs that fits, at least
    # half of it, never raised.
    assert planned_batch_tokens(1500, 21 * 0.64, 21) == 1200 and planned_batch_tokens(1500, 3.4, 21) == 750
    assert planned_batch_tokens(1500, 30, 21) == 1500 and planned_batch_tokens(1500, 3.4, 0) == 1500
    # The width: three quarters under a quarter of the preset's epochs (2-minute plans here: 1.7-3.3;
    # 5-minute ones, 7.3-8.0, keep it), d_model a multiple of the heads.
    assert planned_width(256, 512, 4, 3.4, 21) == (192, 384) and planned_width(512, 2048, 8, 1, 21) == (384, 1536)
    assert planned_width(256, 512, 4, 5.25, 21) == (256, 512) and planned_width(256, 512, 4, 3.4, 0) == (256, 512)
    assert planned_width(32, 64, 2, 3.4, 21) == (24, 48) and planned_width(4, 8, 4, 0.1, 21) == (4, 8)
    assert planned_width(60, 240, 3, 1, 21) == (48, 192)  # even: sinusoidal positions come in pairs


def test_validations_are_counted_once_per_step() -> None:
    assert validations_until(0, 224, 112, 0) == 2  # two epoch ends, the second the run's end
    assert validations_until(0, 230, 112, 0) == 3  # ... and the run's end apart
    assert validations_until(0, 224, 112, 50) == 6  # 50, 100, 112, 150, 200, 224
    # From step 560 on: 560, 672 and the end; every 100 steps still validates: 100 to 700.
    assert validations_until(0, 784, 112, 0, validate_from=560) == 3
    assert validations_until(0, 784, 112, 100, validate_from=560) == 10


def test_a_short_plan_spends_its_validations_time_on_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 minutes at 8 s a validation (10% of the budget is 12 s): only the last step validates, and the
    three epoch ends' validations it skips are steps."""
    short = plan_run(15, 10, 120, 0.25, 8.0, 0.5, 112, 0, 0, 100, 0.1)
    assert short.validate_from == short.total_steps and short.validated_epoch_ends == 0
    assert "validating the last step only (validations within 10% of the budget)" in short.describe()
    left = 120 - 10 - 3  # the margin: 3 s
    cost = lambda total: (total - 15) * 0.25 + 8.0 + validations_until(15, total, 112, 0) * 0.5  # noqa: E731
    assert cost(short.total_steps) <= left < cost(short.total_steps + 1)
    # 5 minutes at 5 s: the last five epoch ends and the last step, 30 s.
    five = plan_run(15, 10, 300, 0.29, 5.0, 0.5, 112, 0, 0, 100, 0.1)
    assert five.validated_epoch_ends == 5 and five.validate_from == ((five.total_steps - 1) // 112 - 4) * 112
    # Validations that all fit the share, or none to make, keep every epoch end's.
    every_end = plan_run(15, 10, 300, 0.29, 0.5, 0.5, 112, 0, 0, 100, 0.1)
    assert every_end.validate_from == 0 and every_end.validated_epoch_ends == (every_end.total_steps - 1) // 112
    assert plan_run(15, 10, 300, 0.29, 0.0, 0.5, 112, 0, 0, 100, 0.1).validate_from == 0
    # The fit's estimate is scaled as validations measured since the first estimate came out (2.1 s
    # against 5.3: 13.9 s become 5.5), never raised; a fit over 10% of the budget is left out.
    measured = plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112, 0, 0, 100, 0.1, final_seconds=13.9,
                        first_validation_seconds=5.3)
    assert measured.fit_seconds == pytest.approx(13.9 * 2.1 / 5.3)
    assert "5.5 s for the confidence fit" in measured.describe()
    unscaled = plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112, 0, 0, 100, 0.1, final_seconds=13.9 * 2.1 / 5.3)
    assert measured.total_steps == unscaled.total_steps > plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112, 0, 0, 100, 0.1,
                                                                   final_seconds=13.9).total_steps
    assert time_budget.fit_seconds(16.0, 8.0, 6.8) == 16.0
    assert not plan_run(15, 10, 120, 0.25, 6.8, 0.5, 112, 0, 0, 100, 0.1, final_seconds=16.0,
                        first_validation_seconds=6.8).confidence_fit
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 1.0)
    everything = plan_run(15, 10, 120, 0.25, 8.0, 0.5, 112, 0, 0, 100, 0.1)  # 2 minutes with every epoch end's
    assert everything.validate_from == 0 and short.total_steps - everything.total_steps >= 2 * 8.0 / 0.25


def test_a_plan_whose_checkpoints_cost_more_than_its_share_spreads_them_and_spends_the_rest_on_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200's paper base: 2 s a checkpoint, 38 steps of 0.042 s an epoch, 2 minutes. 5% of the
    budget holds 3 checkpoints of the 24 epoch ends that do not validate: every 8th."""
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 0.05)
    assert time_budget.checkpoint_interval(950, 38, 2.0, 120) == 8
    assert time_budget.checkpoint_steps(15, 950, 38, 0, 950, 8) == {304, 608, 912, 950}
    assert time_budget.checkpoint_interval(950, 38, 0.1, 120) == 1  # 60 fit: every epoch end
    assert time_budget.checkpoint_interval(950, 38, 30.0, 120) == 24  # none fits: one, the last epoch end
    assert time_budget.checkpoint_interval(30, 38, 2.0, 120) == 1  # no epoch end before the last step
    spread = plan_run(15, 10, 120, 0.042, 8.0, 2.0, 38, 0, 0, 100, 0.1)
    k = spread.checkpoint_every
    assert k > 1 and "checkpointing every %d epoch ends where it does not validate (at 2.0 s a checkpoint, " \
        "within 5%% of the budget)" % k in spread.describe()
    left = 120 - 10 - 3
    cost = lambda total: (total - 15) * 0.042 + 8.0 + 2.0 * len(time_budget.checkpoint_steps(  # noqa: E731
        15, total, 38, 0, spread.validate_from, k))
    assert cost(spread.total_steps) <= left < cost(spread.total_steps + 1)
    # Which epoch ends checkpoint: every k-th, and those that validate.
    ends = range(38, spread.total_steps, 38)
    assert [end for end in ends if spread.checkpoints_epoch_end(end, 0)] == [end for end in ends if end // 38 % k == 0]
    assert spread.checkpoints_epoch_end(38, 19)  # a validate_every_steps step validates, and checkpoints
    # Every epoch end's checkpoint (the share at 100%) leaves about 20 s fewer for steps.
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 1.0)
    every = plan_run(15, 10, 120, 0.042, 8.0, 2.0, 38, 0, 0, 100, 0.1)
    assert every.checkpoint_every == 1 and "checkpointing" not in every.describe()
    assert spread.total_steps - every.total_steps > 15 / 0.042


def test_a_planned_run_checkpoints_the_epoch_ends_its_plan_keeps(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Planted: a checkpoint estimated at 0.4 s (two 0.2 s clock readings) of a 30 s budget, of which
    5% holds three; only the last step validates. The epoch ends after the plan checkpoint as it
    says, and the last step."""
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 0.05)
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 0.0)
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    plan = final_state(planned, tmp_path)["plan"]
    spe, total, k = plan["steps_per_epoch"], plan["total_steps"], plan["checkpoint_every"]
    assert k > 1 and f"checkpointing every {k} epoch ends where it does not validate" in log
    folder = weights_dir(parse_config([*planned, "--model_folder", str(tmp_path / "w")]))
    saved = [int(step) for step in re.findall(rf"saved {folder}/ckpt_(\d+)\.pt", log)]
    after = [step for step in saved if step > plan["planned_at_step"]]
    assert after == sorted(time_budget.checkpoint_steps(plan["planned_at_step"], total, spe, 0, plan["validate_from"], k))
    assert len(after) < total // spe - plan["planned_at_step"] // spe  # fewer than the epoch ends
    # The re-time's step time leaves the checkpoints out. Each now takes 5 s: with one at every epoch
    # end, the re-time's window of 18 steps holds two more, which would add 0.56 s to a step.
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 1.0)
    clock, write = CountingClock(), train.save_checkpoint

    def slow_save(*args: Any, **kwargs: Any) -> Path:
        clock.now += 5.0
        return write(*args, **kwargs)

    monkeypatch.setattr(train, "save_checkpoint", slow_save)
    assert run(planned, tmp_path / "every", clock, monkeypatch) == 0
    every, thinned = plan_scalars(planned, tmp_path / "every", "step_seconds"), \
        plan_scalars(planned, tmp_path, "step_seconds")
    assert len(every) == len(thinned) == 2 and every[1][0] == thinned[1][0] == 27
    assert every[1][1] == pytest.approx(thinned[1][1], abs=0.05)  # a clock reading per checkpoint: 0.011 a step
    assert final_state(planned, tmp_path / "every")["plan"]["checkpoint_seconds"] == pytest.approx(5.2)


JUMP_AFTER_RETIME = 70  # a clock reading after the re-time and before the planned end


class CountingClock:
    """A clock that advances 0.2 s at each reading (`slow_seconds`, 1 s unless given, at the readings
    in `slow`): the same readings, the same plan."""

    def __init__(self, jump_at: int | None = None, slow: range = range(0), slow_seconds: float = 1.0) -> None:
        self.readings, self.jump_at, self.slow, self.now = itertools.count(), jump_at, slow, 0.0
        self.slow_seconds = slow_seconds

    def __call__(self) -> float:
        reading = next(self.readings)
        self.now += self.slow_seconds if reading in self.slow else 0.2
        return self.now + (1e6 if self.jump_at is not None and reading >= self.jump_at else 0.0)


class LeapingClock(CountingClock):
    """A CountingClock whose reading `at` is `to` seconds (if it is behind), counting on from there."""

    def __init__(self, at: int, to: float) -> None:
        super().__init__()
        self.at, self.to, self.taken = at, to, 0

    def __call__(self) -> float:
        if self.taken == self.at:
            self.now = max(self.now, self.to - 0.2)
        self.taken += 1
        return super().__call__()


@pytest.fixture(autouse=True)
def checkpoints_at_every_epoch_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted clocks make a checkpoint 0.2-0.4 s of a 30 s budget, which a plan would thin;
    the tests of other things keep every epoch end's, as `test_a_plan_thins_...` does not."""
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 1.0)


@pytest.fixture
def planned(tmp_path: Path) -> list[str]:
    data = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(300, 1), "validation": synthetic_pairs(8, 2),
                                                 "test": synthetic_pairs(8, 3)})
    # --num_examples 0: no examples, nor their attention heatmap (matplotlib: a third of these runs' time);
    # --d_model and --batch_tokens given: the plan sizes neither (the tests of that take them out)
    return ["--datasource", str(data), "--preset", "tiny", "--d_model", "32", "--batch_tokens", "256",
            "--val_max_sentences", "4", "--lr_schedule", "cosine", "--max_minutes", "0.5", "--store_folder",
            str(tmp_path / "s"), "--num_examples", "0"]


def run(args: list[str], folder: Path, clock: CountingClock, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(train, "clock", clock)
    return train.main([*args, "--model_folder", str(folder / "w"), "--runs_folder", str(folder / "r")])


def final_state(args: list[str], folder: Path) -> dict:
    config = parse_config([*args, "--model_folder", str(folder / "w")])
    manifest = json.loads((weights_dir(config) / MANIFEST).read_text())
    return load_checkpoint(weights_dir(config) / manifest["latest"])


def test_a_planned_run_ends_its_schedule_at_the_planned_step_and_resumes_bit_exactly(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 0.04)  # of 30 s: fewer validations than epoch ends
    assert run(planned, tmp_path / "unbroken", CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    plan = final_state(planned, tmp_path / "unbroken")["plan"]
    steps_per_epoch = plan["steps_per_epoch"]
    # The preset's 2 epochs are only the starting point: the clock's budget holds more.
    assert plan["total_steps"] > 2 * steps_per_epoch
    assert f"plan for --max_minutes 0.5: {plan['total_steps']} steps" in log
    assert plan["final_seconds"] > 0  # the confidence fit after the last checkpoint is in the plan
    assert plan["first_validation_seconds"] > 0  # kept through the re-time: what the fit's estimate scales by
    # The re-time measured its window's checkpoints, two clock readings each (0.2 s), and counts them
    # instead of the estimate (0.4 s: twice a serialisation in memory) and apart from the steps.
    assert plan["checkpoint_seconds"] == pytest.approx(0.2)
    assert f"finished the plan: {plan['total_steps']} steps" in log
    unbroken = final_state(planned, tmp_path / "unbroken")
    assert unbroken["global_step"] == plan["total_steps"]
    config = parse_config(planned)
    # The schedule ends where the run does: the cosine is at min_lr at the last step.
    assert unbroken["optimizer"]["param_groups"][0]["lr"] == pytest.approx(
        config["lr"] * lr_factor(plan["total_steps"], config, plan["total_steps"], plan["warmup_steps"]))
    assert lr_factor(plan["total_steps"] - 1, config, plan["total_steps"], plan["warmup_steps"]) == \
        pytest.approx(config["min_lr"] / config["lr"])
    # Validated: the last epoch ends that fit 4% of the budget, and the last step; every epoch end
    # before them checkpointed without.
    validated = [step for step, _ in scalars(planned, tmp_path / "unbroken", "val/loss")]
    assert steps_per_epoch < plan["validate_from"] < plan["total_steps"] and plan["validate_from"] % steps_per_epoch == 0
    assert validated == sorted(time_budget.check_steps(0, plan["total_steps"], steps_per_epoch, 0, plan["validate_from"]))
    assert re.search(rf"validating the last (\d+ epoch ends \(from step|epoch end \(step) {plan['validate_from']}\) "
                     r"and the last step \(validations within 4% of the budget\)", log)
    assert f"saved {weights_dir(parse_config([*planned, '--model_folder', str(tmp_path / 'unbroken' / 'w')]))}" \
        f"/ckpt_{steps_per_epoch:08d}.pt" in log

    # The plan was re-timed once, at the first epoch's end after it, from every step since.
    assert plan["planned_at_step"] % steps_per_epoch == 0 and plan["planned_at_step"] > steps_per_epoch
    first_plan, retimed = log.split("re-timed plan for")
    assert "plan for --max_minutes 0.5" in first_plan and f": {plan['total_steps']} steps" in retimed
    assert log.count("re-timed plan for") == 1

    # The same run stopped by its clock after the re-time, then resumed on a fresh clock: it follows
    # the stored plan bit for bit. The clock jumps at a reading after the re-time and before the
    # planned end (earlier than JUMP_AFTER_RETIME: epoch ends before validate_from read the clock
    # for no validation), so that the re-time's checkpoint is still kept.
    assert run(planned, tmp_path / "resumed", CountingClock(jump_at=55), monkeypatch) == 0
    first = capsys.readouterr().err
    assert "re-timed plan for --max_minutes 0.5" in first and "reached --max_minutes 0.5" in first
    halfway = final_state(planned, tmp_path / "resumed")
    assert halfway["plan"] == plan and plan["planned_at_step"] <= halfway["global_step"] < plan["total_steps"]
    config = parse_config([*planned, "--model_folder", str(tmp_path / "resumed" / "w")])
    at_retime = load_checkpoint(weights_dir(config) / f"ckpt_{plan['planned_at_step']:08d}.pt")
    assert at_retime["plan"] == plan  # the checkpoint of the re-time's epoch end holds the plan followed from there
    assert run(planned, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    second = capsys.readouterr().err
    assert "following the run's plan" in second and "plan for" not in second
    resumed = final_state(planned, tmp_path / "resumed")
    assert resumed["global_step"] == plan["total_steps"]
    for key, tensor in unbroken["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key

    # Stopped before the re-time, a resumed run keeps the first plan: only the planning invocation
    # has the timings to re-time it.
    assert run(planned, tmp_path / "early", CountingClock(jump_at=35), monkeypatch) == 0
    early = final_state(planned, tmp_path / "early")
    assert early["plan"]["planned_at_step"] < plan["planned_at_step"] and early["global_step"] < plan["planned_at_step"]
    capsys.readouterr()
    assert run(planned, tmp_path / "early", CountingClock(), monkeypatch) == 0
    assert "re-timed" not in capsys.readouterr().err
    assert final_state(planned, tmp_path / "early")["global_step"] == early["plan"]["total_steps"]


def test_a_plan_that_leaves_the_fit_out_ends_without_one(planned: list[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(time_budget, "FIT_SHARE", 0.0)  # any fit is over the share
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    assert final_state(planned, tmp_path)["plan"]["confidence_fit"] is False
    assert "no confidence calibrator: the plan left the fit out" in log
    assert "warning: no confidence calibrator" not in log  # the fit was not tried


def test_a_thinned_plan_still_validates_every_validate_every_steps_and_its_clock_stop_keeps_a_validations_time(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--validate_every_steps validates on its steps, an epoch end among them too; a plan that
    validates only at its end has timed no validation when its clock runs out: the stop reserves
    the plan's estimate of one, so that validation ends within the budget."""
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 0.04)
    every = [*planned, "--validate_every_steps", "18"]  # every second epoch end (9 steps an epoch)
    assert run(every, tmp_path / "every", CountingClock(), monkeypatch) == 0
    plan = final_state(every, tmp_path / "every")["plan"]
    assert plan["steps_per_epoch"] == 9 and 18 < plan["validate_from"] < plan["total_steps"]
    validated = [step for step, _ in scalars(every, tmp_path / "every", "val/loss")]
    assert validated == sorted(time_budget.check_steps(0, plan["total_steps"], 9, 18, plan["validate_from"]))
    assert 18 in validated and 27 not in validated

    monkeypatch.setattr(train.Trainer, "estimated_validation_seconds", lambda self: (10.0, 0.0))
    clock = LeapingClock(at=35, to=0.2 + 25.0)  # after the plan: 25 s into the run, 5 before its end
    capsys.readouterr()
    assert run(planned, tmp_path / "late", clock, monkeypatch) == 0
    log = capsys.readouterr().err
    assert "validating the last step only" in log and "reached --max_minutes 0.5" in log
    assert clock.now - 0.2 < 30  # the stop's validation and checkpoint within the budget


def test_a_clock_stop_keeps_the_fits_time_inside_the_budget(planned: list[str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    """Steps that slow after the plan (a shared machine) bring its clock stop: the stop reserves
    the validation, the checkpoint and the confidence fit still to come, so the run ends, fit
    included, within its budget. Planted: a fit estimated at 2.5 s that takes 2 (estimates run
    long: time_budget.fit_seconds), and a leap to 24 s after the re-time."""
    monkeypatch.setattr(train.Trainer, "estimated_validation_seconds", lambda self: (1.0, 2.5))
    clock = LeapingClock(at=JUMP_AFTER_RETIME, to=0.2 + 24.0)
    fit = train.Trainer.fit_confidence

    def fit_taking_two_seconds(self: train.Trainer) -> None:
        fit(self)
        clock.now += 2.0

    monkeypatch.setattr(train.Trainer, "fit_confidence", fit_taking_two_seconds)
    assert run(planned, tmp_path, clock, monkeypatch) == 0
    log = capsys.readouterr().err
    assert "2.5 s for the confidence fit" in log and "reached --max_minutes 0.5" in log
    assert "calibration needs at least 20 sentences, got 8" in log  # the fit ran: 8 validation pairs fit none
    assert clock.now - 0.2 < 30


def test_a_plan_scales_the_presets_dropout_and_a_resumed_run_follows_it(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A preset's dropout, set for its epoch count, is scaled to the plan's length; the checkpoint
    holds it, a resumed run applies it (bit for bit), and --dropout given on the command line wins,
    also over a resumed plan's."""
    monkeypatch.setitem(PRESETS["tiny"], "dropout", 0.2)
    monkeypatch.setitem(PRESETS["tiny"], "num_epochs", 60)
    assert run(planned, tmp_path / "unbroken", CountingClock(), monkeypatch) == 0
    plan = final_state(planned, tmp_path / "unbroken")["plan"]
    epochs = plan["total_steps"] / plan["steps_per_epoch"]
    assert 0 < plan["dropout"] == planned_dropout(0.2, epochs, 60) < 0.1
    assert f"dropout {plan['dropout']:g}" in capsys.readouterr().err

    given = [*planned, "--dropout", "0.2"]
    assert run(given, tmp_path / "given", CountingClock(), monkeypatch) == 0
    kept = final_state(given, tmp_path / "given")
    assert kept["plan"]["dropout"] is None and kept["plan"]["total_steps"] == plan["total_steps"]
    unbroken = final_state(planned, tmp_path / "unbroken")["model"]
    assert any(not torch.equal(tensor, kept["model"][key]) for key, tensor in unbroken.items())  # it trained at 0.2

    assert run(planned, tmp_path / "resumed", CountingClock(jump_at=JUMP_AFTER_RETIME), monkeypatch) == 0
    assert final_state(planned, tmp_path / "resumed")["global_step"] < plan["total_steps"]
    shutil.copytree(tmp_path / "resumed", tmp_path / "overridden")
    assert run(planned, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    resumed = final_state(planned, tmp_path / "resumed")
    assert resumed["plan"] == plan
    for key, tensor in unbroken.items():
        assert torch.equal(tensor, resumed["model"][key]), key

    # Given when resuming, --dropout wins over the plan's for the rest of the run; the plan is kept.
    assert run(given, tmp_path / "overridden", CountingClock(), monkeypatch) == 0
    overridden = final_state(planned, tmp_path / "overridden")
    assert overridden["plan"] == plan and overridden["global_step"] == plan["total_steps"]
    assert any(not torch.equal(tensor, overridden["model"][key]) for key, tensor in unbroken.items())


def test_a_cpu_too_slow_for_the_presets_epochs_trains_a_smaller_model_and_a_resume_keeps_it(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Planted: an epoch estimated at 1 s, so about 30 of the 0.5 minutes' epochs fit, under a
    quarter of the preset's 600. The run trains d_model 24 and d_ff 48 instead of 32 and 64, and
    from the narrower model's estimate (0.5 s: about 60 epochs, still under 600) 1 + 1 layers
    instead of 2 + 2; config.json and the checkpoint's config (what the other programs build from)
    say so; a run resumed with that size given goes on bit for bit and keeps the record, so a resume
    without it is not refused; --num_layers and --d_model given keep theirs; --init_from with the
    preset and --d_model 24 takes the checkpoint's d_ff and depth."""
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
    assert {key: json.loads((folder / "config.json").read_text())[key] for key in ("num_layers", "d_model", "d_ff")} \
        == {"num_layers": 1, "d_model": 24, "d_ff": 48}
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
    config.json and the checkpoint; a run resumed without --batch_tokens takes the same batches and
    goes on bit for bit; --batch_tokens given keeps its batch."""
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
    assert json.loads((folder / "config.json").read_text())["batch_tokens"] == 256

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


def test_an_explicit_length_means_what_it_says(planned: list[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert run([*planned, "--num_epochs", "2"], tmp_path, CountingClock(), monkeypatch) == 0
    assert "plan for" not in capsys.readouterr().err
    state = final_state([*planned, "--num_epochs", "2"], tmp_path)
    assert state["plan"] is None and state["epoch"] == 2


def test_the_validation_estimate_decodes_to_the_references_length_not_the_cap(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young model rarely ends a sentence: decoded to the cap, a validation's estimate would be
    several times what validations cost later, and the plan would leave much of its budget unused."""
    from nmt.inference.decoding import max_output_tokens
    from nmt.inference.translator import TorchTranslator
    calls, decode = [], TorchTranslator.translate_batch

    def recorded(self, sources, options, max_tokens, *constraints):
        calls.append((max_tokens, max_output_tokens(max(len(source.ids) for source in sources), self.seq_len)))
        return decode(self, sources, options, max_tokens, *constraints)

    monkeypatch.setattr(TorchTranslator, "translate_batch", recorded)
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    assert any(bound < cap for bound, cap in calls), calls  # the estimate's, below the cap validation decodes to



def test_a_sample_that_ends_at_once_is_timed_as_if_it_ran_to_the_references_length(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A young model may end every sentence at its first step and decode the estimate's sample in
    a moment; validations later run to the references' length. The plan's decodes run to the bound
    they are given whatever the model writes."""
    from model import Transformer
    from nmt.inference.translator import TorchTranslator
    project, decode, ran = Transformer.project, TorchTranslator.translate_batch, []

    def ends_at_once(self, x):  # in evaluation, [EOS] first, far ahead of every other token
        logits = project(self, x)
        return logits if self.training else logits.index_fill(-1, torch.tensor([EOS_ID], device=x.device), 1e4)

    def recorded(self, sources, options, max_tokens, *constraints):
        found = decode(self, sources, options, max_tokens, *constraints)
        ran.append((max_tokens, {hypotheses[0].length for hypotheses in found}))
        return found

    monkeypatch.setattr(Transformer, "project", ends_at_once)
    monkeypatch.setattr(TorchTranslator, "translate_batch", recorded)
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    # The plan's decodes come first, each twice (the second timed): validation's, then the fit's.
    assert len({bound for bound, _ in ran[:4]}) == 1 and all(lengths == {bound} for bound, lengths in ran[:4]), ran
    assert ran[4][1] == {1}, ran[4]  # validation itself: the model ends every sentence at once


def test_the_validation_estimate_times_a_decode_whose_shapes_it_has_seen(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A first decode pays once for its new shapes (on a GPU: kernels loaded, memory allocated), which
    a validation pays once, not once per batch: the plan times the sample's second decode."""
    from nmt.inference.translator import TorchTranslator
    decode, estimates = TorchTranslator.translate_batch, {}
    for first in ("cold", "warm"):
        calls = []

        def first_decodes_cold(self, sources, options, max_tokens, *constraints):
            calls.append(options)
            if first == "cold" and calls.count(options) == 1:
                for _ in range(50):  # 10 s on the counting clock
                    train.clock()
            return decode(self, sources, options, max_tokens, *constraints)

        monkeypatch.setattr(TorchTranslator, "translate_batch", first_decodes_cold)
        assert run(planned, tmp_path / first, CountingClock(), monkeypatch) == 0
        first_plan = re.search(r"(?<!re-timed )plan for [^;]*? and ([0-9.]+) s a validation", capsys.readouterr().err)
        estimates[first] = float(first_plan.group(1))
    assert estimates["cold"] == estimates["warm"], estimates


def scalars(args: list[str], folder: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(runs_dir(parse_config([*args, "--runs_folder", str(folder / "r")]))),
                              size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def plan_scalars(args: list[str], folder: Path, name: str) -> list[tuple[int, float]]:
    return scalars(args, folder, f"plan/{name}")


def test_a_wsd_plan_is_retimed_at_every_epoch_end_before_its_decay_and_once_halfway_through_it(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Until wsd's decay the learning rate does not depend on the run's length: the plan is
    re-timed at every epoch end before it, the last one the last epoch end before the decay, and
    uses the validations measured by then. Halfway through the decay, once more, from the steps
    since: planted, every clock reading from the 190th on takes 0.3 s instead of 0.2 (steps that
    slowed for good after that last re-time), and the plan shortens, its decay going on from where
    it stood to min_lr at the new end, inside the budget. Without that re-time the clock stopped
    this run at step 156 of 163 with the learning rate at 13% of its peak, 60.9 s into its 60. One
    step is skipped (a NaN loss): the schedule, and the decay's anchor, count one step fewer."""
    args = [*planned, "--lr_schedule", "wsd", "--max_minutes", "1", "--decay_fraction", "0.4", "--keep_checkpoints",
            "30"]  # long enough that the decay is epochs away, and its checkpoints all kept
    clock, loss, batches = CountingClock(slow=range(190, 10**6), slow_seconds=0.3), train.loss_sum, itertools.count(1)

    def nan_at_the_30th_batch(logits: torch.Tensor, label: torch.Tensor, label_smoothing: float) -> torch.Tensor:
        value = loss(logits, label, label_smoothing)
        return value * float("nan") if label_smoothing and next(batches) == 30 else value  # not validation's

    monkeypatch.setattr(train, "loss_sum", nan_at_the_30th_batch)
    assert run(args, tmp_path / "unbroken", clock, monkeypatch) == 0
    log = capsys.readouterr().err
    unbroken, config = final_state(args, tmp_path / "unbroken"), parse_config(args)
    plan = unbroken["plan"]
    spe, warmup = plan["steps_per_epoch"], plan["warmup_steps"]
    totals = plan_scalars(args, tmp_path / "unbroken", "total_steps")
    (retimed_at, total_before), (decay_at, total) = [(step, int(value)) for step, value in totals[-2:]]
    start = decay_start(config, total_before, warmup)
    assert retimed_at % spe == 0 and retimed_at < start <= retimed_at + spe and retimed_at > 2 * spe
    assert len(totals) > 5 and all(step % spe == 0 for step, _ in totals[1:-1]), totals  # at epoch ends, not once
    assert decay_at == time_budget.decay_retime_step(start, total_before, retimed_at)
    assert unbroken["scheduler"]["last_epoch"] == total - 1 and plan["decay_from"] == decay_at - 1  # one skipped
    assert plan["decay_from_lr"] == pytest.approx(lr_factor(decay_at - 1, config, total_before, warmup))
    assert decay_at < total < total_before and f"re-timed in the decay: plan for --max_minutes 1: {total} steps" in log
    assert f"finished the plan: {total} steps" in log and clock.now - 0.2 < 60
    assert unbroken["global_step"] == total
    # The learning rate logged after the re-time (at step s, the schedule's s - 1): the decay from
    # where it stood, not the schedule of the new length alone, which would have jumped down.
    anchor, logged = (decay_at - 1, plan["decay_from_lr"]), scalars(args, tmp_path / "unbroken", "train/lr")
    after = [(step, lr) for step, lr in logged if decay_at <= step < total]
    assert after and [lr for _, lr in after] == pytest.approx(
        [config["lr"] * lr_factor(step - 1, config, total, warmup, anchor) for step, _ in after], rel=1e-6)
    assert lr_factor(decay_at - 1, config, total, warmup) < plan["decay_from_lr"] - 0.1
    first_plan = re.search(r"(?<!re-timed )plan for [^;]*? at [0-9.]+ s a step and ([0-9.]+) s a validation", log)
    assert plan["validation_seconds"] != pytest.approx(float(first_plan.group(1)), abs=0.05)  # measured

    # Resumed from the decay's re-time, a run follows its plan and decay bit for bit.
    monkeypatch.setattr(train, "loss_sum", loss)
    folder = weights_dir(parse_config([*args, "--model_folder", str(tmp_path / "unbroken" / "w")]))
    assert load_checkpoint(folder / f"ckpt_{decay_at:08d}.pt")["plan"] == plan
    resumed_args = [*args, "--preload", str(folder / f"ckpt_{decay_at:08d}.pt")]
    assert run(resumed_args, tmp_path / "resumed", CountingClock(), monkeypatch) == 0
    assert "following the run's plan" in capsys.readouterr().err
    resumed = final_state(resumed_args, tmp_path / "resumed")
    assert resumed["global_step"] == total
    for key, tensor in unbroken["model"].items():
        assert torch.equal(tensor, resumed["model"][key]), key


def test_a_wsd_plan_shortened_into_its_decay_decays_from_the_peak_without_a_jump(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """Planted: 5 s lost just before the last epoch end before the decay (step 126 of a plan of
    162, whose decay starts at 134). Re-timed there, the plan ends at step 145, whose decay would
    have begun at 120: the learning rate would drop from its peak to 72% of it at once. The plan
    decays from where it stands, the peak, to min_lr at its end instead, and re-times no more."""
    args = [*planned, "--lr_schedule", "wsd", "--max_minutes", "1"]
    assert run(args, tmp_path, LeapingClock(at=215, to=48.0), monkeypatch) == 0
    log = capsys.readouterr().err
    plan, config = final_state(args, tmp_path)["plan"], parse_config(args)
    spe, total, warmup = plan["steps_per_epoch"], plan["total_steps"], plan["warmup_steps"]
    retimed_at = plan["planned_at_step"]
    assert retimed_at % spe == 0 and plan["decay_from"] == retimed_at and plan["decay_from_lr"] == 1.0
    assert decay_start(config, total, warmup) < retimed_at and "re-timed in the decay" not in log
    logged = [(step, lr) for step, lr in scalars(args, tmp_path, "train/lr") if step >= retimed_at]
    assert [lr for _, lr in logged] == pytest.approx(
        [config["lr"] * lr_factor(step, config, total, warmup, (retimed_at, 1.0)) for step, _ in logged], rel=1e-6)
    assert lr_factor(retimed_at, config, total, warmup) < 0.75  # the schedule of the new length alone
    assert f"finished the plan: {total} steps" in log


def test_a_decay_retime_that_falls_on_an_epoch_end_is_made_there_and_checkpointed(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Halfway through the decay may be an epoch end, which the step loop leaves to end_of_epoch:
    the re-time is made there, and that epoch end checkpoints though the plan keeps it out (planted:
    the validations' and checkpoints' shares at 0), so that a resumed run follows the plan it made."""
    monkeypatch.setattr(time_budget, "CHECKPOINT_SHARE", 0.0)
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 0.0)
    ends = []

    def at_the_next_epoch_end(start: int, total: int, last_retime: int) -> int:
        ends.append((start // 9 + 1) * 9)  # 9 steps an epoch
        return ends[-1]

    monkeypatch.setattr(train, "decay_retime_step", at_the_next_epoch_end)
    args = [*planned, "--lr_schedule", "wsd", "--max_minutes", "1", "--keep_checkpoints", "30"]
    assert run(args, tmp_path, CountingClock(), monkeypatch) == 0
    plan = final_state(args, tmp_path)["plan"]
    assert plan["steps_per_epoch"] == 9 and plan["decay_from"] == plan["planned_at_step"] == ends[-1]
    folder = weights_dir(parse_config([*args, "--model_folder", str(tmp_path / "w")]))
    assert load_checkpoint(folder / f"ckpt_{ends[-1]:08d}.pt")["plan"] == plan
    assert not time_budget.plan_from_dict(plan).checkpoints_epoch_end(ends[-1], 0)  # thinned, but for the re-time


def test_an_inverse_sqrt_plan_is_retimed_at_every_epoch_end_from_the_first_epochs_end_on(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After warmup the inverse square root does not depend on the run's length: re-timed at every
    epoch end. A first epoch pays once for each new batch shape (a GPU's first epoch ran 6x slower
    than the next): slow clock readings before the first re-time inflate that one, not the last.
    Every epoch end validates in both runs (the share at 100%), as the clock's readings would
    differ between them otherwise."""
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 1.0)
    args = [*planned, "--lr_schedule", "inverse_sqrt", "--max_minutes", "1"]
    step_seconds = {}
    for name, clock in (("even", CountingClock()), ("slow first epochs", CountingClock(slow=range(35, 45)))):
        assert run(args, tmp_path / name, clock, monkeypatch) == 0
        step_seconds[name] = plan_scalars(args, tmp_path / name, "step_seconds")
    spe = final_state(args, tmp_path / "even")["plan"]["steps_per_epoch"]
    planned_at = [step for step, _ in step_seconds["even"]]
    assert len(planned_at) > 5 and all(step % spe == 0 for step in planned_at), planned_at
    even, slow = step_seconds["even"], step_seconds["slow first epochs"]
    assert even[1][0] == slow[1][0] and slow[1][1] > 2 * even[1][1], (even, slow)  # the first re-time saw them
    torch.testing.assert_close(slow[2], even[2])  # the next did not: measured from the first re-time on


def test_a_plan_whose_length_is_fixed_before_the_next_epoch_end_is_retimed_halfway_there() -> None:
    """The epoch end's re-time comes too late where the plan ends (or wsd's decay begins) first."""
    assert time_budget.halfway_retime_step(36, 62, 36) == 49
    assert time_budget.halfway_retime_step(36, 72, 36) == 54  # the epoch end's re-time would be at the run's end
    assert time_budget.halfway_retime_step(36, 73, 36) is None  # the epoch end re-times
    assert time_budget.halfway_retime_step(36, 58, 36) is None  # 11 steps: too few to time
    assert time_budget.halfway_retime_step(36, None, 36) is None  # cosine: its length is fixed from the start


def test_a_wsd_plan_is_retimed_halfway_through_its_decay() -> None:
    """Halfway from the decay's start to the run's end; not where too few steps since the last
    re-time would be timed, nor at the last steps."""
    assert time_budget.decay_retime_step(134, 163, 126) == 148
    assert time_budget.decay_retime_step(130, 158, 126) == 144  # an epoch end (of 9 steps) too: end_of_epoch's
    assert time_budget.decay_retime_step(134, 163, 140) is None  # 148: 8 steps since the last re-time, too few
    assert time_budget.decay_retime_step(160, 162, 126) is None  # 161: the last step


def test_a_first_epoch_of_slow_steps_is_corrected_by_a_retime_before_the_plan_ends(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU's first epoch pays for every new batch shape: re-timed at its end, the plan ends
    before the next epoch end, and only a re-time halfway there measures the warm steps; the
    checkpoint written with it holds the plan it made."""
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", 1.0)
    args = [*planned, "--lr_schedule", "inverse_sqrt", "--batch_tokens", "64"]
    assert run(args, tmp_path, CountingClock(slow=range(50, 54)), monkeypatch) == 0  # slow steps in epoch 0
    spe = final_state(args, tmp_path)["plan"]["steps_per_epoch"]
    totals = plan_scalars(args, tmp_path, "total_steps")
    step_seconds = dict(plan_scalars(args, tmp_path, "step_seconds"))
    (epoch_end, short), (halfway, longer) = totals[1], totals[2]
    assert epoch_end == spe and short < 2 * spe, totals  # the first epoch's end planned to end inside the next
    assert halfway == time_budget.halfway_retime_step(spe, short, spe), totals
    assert longer > short and step_seconds[halfway] < 0.7 * step_seconds[epoch_end], (totals, step_seconds)
    config = parse_config([*args, "--model_folder", str(tmp_path / "w")])
    assert load_checkpoint(weights_dir(config) / f"ckpt_{halfway:08d}.pt")["plan"]["planned_at_step"] == halfway
    assert final_state(args, tmp_path)["global_step"] == totals[-1][1] > short


@pytest.mark.parametrize("share, fit, measured", [
    (0.03, None, True),  # of 60 s: only epoch ends after the decay validate
    (0.001, 0.8, True),  # the last step only, and a fit estimated at twice a validation
    (0.001, 0.2, False),  # the last step only, a fit under one validation: the estimate is counted once
])
def test_a_wsd_plan_whose_validations_all_follow_its_decay_measures_one_at_its_last_retime(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: float, fit: float | None,
        measured: bool) -> None:
    """Where the plan counts the first estimate more than once after its last re-time, that re-time's
    epoch end validates; otherwise the estimate would stand to the run's end."""
    monkeypatch.setattr(time_budget, "VALIDATION_SHARE", share)
    if fit is not None:  # a validation estimated at 0.4 s, the fit at `fit`
        monkeypatch.setattr(train.Trainer, "estimated_validation_seconds", lambda self: (0.4, fit))
    args = [*planned, "--lr_schedule", "wsd", "--max_minutes", "1"]
    assert run(args, tmp_path, CountingClock(), monkeypatch) == 0
    plan, config = final_state(args, tmp_path)["plan"], parse_config(args)
    (last_retime, total_then), (decay_at, _) = [(step, int(value)) for step, value in
                                                plan_scalars(args, tmp_path, "total_steps")[-2:]]
    spe = plan["steps_per_epoch"]
    assert last_retime % spe == 0 and decay_at == plan["decay_from"]  # the decay's re-time follows it
    assert last_retime < decay_start(config, total_then, plan["warmup_steps"]) <= last_retime + spe
    validated = [step for step, _ in scalars(args, tmp_path, "val/loss")]
    if not measured:
        assert validated == [plan["total_steps"]], validated
        return
    assert validated[0] == last_retime, validated  # the first validation, which the re-time measured
    assert plan["validation_seconds"] < plan["first_validation_seconds"]  # measured: less than the estimate
