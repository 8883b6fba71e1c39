"""clock_plan.py: the run's length planned to --max_minutes. Its arithmetic (plan_run and the steps
it validates, checkpoints and re-times at), the ClockPlan component on a fake clock (when it plans
and re-times, what it measures, the clock's stop, the ranks' agreement, a resumed plan), and a few
whole runs of train.py: a planned run resumed bit for bit, an explicit length, and the plan's fit."""
from __future__ import annotations

import itertools
import re
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from config import PRESETS, get_config, parse_config, runs_dir, weights_dir
from nmt.training import clock_plan
from nmt.training.checkpoint import MANIFEST, load_checkpoint
from nmt.training.clock_plan import ClockPlan, Costs, Plan, PlanRules, planned_dropout, validations_until
from nmt.training.schedule import LearningRate, Schedule
from synthetic_data import synthetic_pairs, write_hub_dataset


def plan_run(step: int, elapsed_s: float, budget_s: float, step_seconds: float, validation_seconds: float,
             checkpoint_seconds: float, steps_per_epoch: int, validate_every: int = 0, save_every: int = 0,
             warmup_steps: int = 100, warmup_fraction: float = 0.1, final_seconds: float = 0.0,
             dropout: float | None = None, dropout_epochs: int = 0, first_validation_seconds: float = 0.0) -> Plan:
    """clock_plan.plan_run from a row of figures, as the tests below state them."""
    return clock_plan.plan_run(step, elapsed_s, PlanRules(budget_s, steps_per_epoch, validate_every, save_every,
                                                          warmup_steps, warmup_fraction, dropout, dropout_epochs),
                               Costs(step_seconds, validation_seconds, checkpoint_seconds, final_seconds,
                                     first_validation_seconds))


# ---------------------------------------------------------------------------- the plan's arithmetic

def test_the_plan_fills_the_budget_with_steps_validations_and_checkpoints() -> None:
    plan = plan_run(15, 40, 900, 0.2, 5.0, 0.5, 112)
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
    fitted = plan_run(15, 40, 900, 0.2, 5.0, 0.5, 112, final_seconds=20.0)
    assert cost(fitted.total_steps) + 20 <= left < cost(fitted.total_steps + 1) + 20
    assert fitted.total_steps < plan.total_steps
    assert fitted.expected_end_s == pytest.approx(40 + cost(fitted.total_steps) + 20)
    # A fit over FIT_SHARE of the budget is left out of the run, and its time goes to steps.
    costly = plan_run(15, 40, 900, 0.2, 5.0, 0.5, 112, final_seconds=95.0)
    assert fitted.confidence_fit and not costly.confidence_fit and costly.total_steps == plan.total_steps
    assert "no confidence fit (it would take 95.0 s" in costly.describe()
    # A budget already spent still trains one more step, to end with a validated checkpoint.
    assert plan_run(15, 950, 900, 0.2, 5, 0.5, 112).total_steps == 16
    # A short run keeps its warmup's steps up to half the run; a warmup given as a share keeps it.
    short = plan_run(15, 40, 120, 0.2, 5, 0.5, 112, warmup_steps=1000)
    assert short.warmup_steps == short.total_steps // 2 and 100 < short.total_steps < 400
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, warmup_steps=0).warmup_steps == round(0.1 * plan.total_steps)
    # The dropout: kept where none is given to scale, scaled down to a run of fewer epochs, never raised.
    assert plan.dropout is None
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, dropout=0.15, dropout_epochs=61).dropout == \
        pytest.approx(0.15 * plan.epochs / 61, abs=1e-4)
    assert plan_run(15, 40, 900, 0.2, 5, 0.5, 112, dropout=0.15, dropout_epochs=21).dropout == 0.15
    assert planned_dropout(0.2, 6, 60) == 0.02 and planned_dropout(0.2, 6, 0) == 0.2


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
    short = plan_run(15, 10, 120, 0.25, 8.0, 0.5, 112)
    assert short.validate_from == short.total_steps and short.validated_epoch_ends == 0
    assert "validating the last step only (validations within 10% of the budget)" in short.describe()
    left = 120 - 10 - 3  # the margin: 3 s
    cost = lambda total: (total - 15) * 0.25 + 8.0 + validations_until(15, total, 112, 0) * 0.5  # noqa: E731
    assert cost(short.total_steps) <= left < cost(short.total_steps + 1)
    # 5 minutes at 5 s: the last five epoch ends and the last step, 30 s.
    five = plan_run(15, 10, 300, 0.29, 5.0, 0.5, 112)
    assert five.validated_epoch_ends == 5 and five.validate_from == ((five.total_steps - 1) // 112 - 4) * 112
    # Validations that all fit the share, or none to make, keep every epoch end's.
    every_end = plan_run(15, 10, 300, 0.29, 0.5, 0.5, 112)
    assert every_end.validate_from == 0 and every_end.validated_epoch_ends == (every_end.total_steps - 1) // 112
    assert plan_run(15, 10, 300, 0.29, 0.0, 0.5, 112).validate_from == 0
    # The fit's estimate is scaled as validations measured since the first estimate came out (2.1 s
    # against 5.3: 13.9 s become 5.5), never raised; a fit over 10% of the budget is left out.
    measured = plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112, final_seconds=13.9, first_validation_seconds=5.3)
    assert measured.fit_seconds == pytest.approx(13.9 * 2.1 / 5.3)
    assert "5.5 s for the confidence fit" in measured.describe()
    unscaled = plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112, final_seconds=13.9 * 2.1 / 5.3)
    assert measured.total_steps == unscaled.total_steps > plan_run(15, 10, 300, 0.29, 2.1, 0.5, 112,
                                                                   final_seconds=13.9).total_steps
    assert clock_plan.fit_seconds(16.0, 8.0, 6.8) == 16.0
    assert not plan_run(15, 10, 120, 0.25, 6.8, 0.5, 112, final_seconds=16.0,
                        first_validation_seconds=6.8).confidence_fit


def test_a_plan_whose_checkpoints_cost_more_than_its_share_spreads_them_and_spends_the_rest_on_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A large model on a GPU: 2 s a checkpoint, 38 steps of 0.042 s an epoch, 2 minutes. 5% of the
    budget holds 3 checkpoints of the 24 epoch ends that do not validate: every 8th."""
    assert clock_plan.checkpoint_interval(950, 38, 2.0, 120) == 8
    assert clock_plan.checkpoint_steps(15, 950, 38, 0, 950, 8) == {304, 608, 912, 950}
    assert clock_plan.checkpoint_interval(950, 38, 0.1, 120) == 1  # 60 fit: every epoch end
    assert clock_plan.checkpoint_interval(950, 38, 30.0, 120) == 24  # none fits: one, the last epoch end
    assert clock_plan.checkpoint_interval(30, 38, 2.0, 120) == 1  # no epoch end before the last step
    spread = plan_run(15, 10, 120, 0.042, 8.0, 2.0, 38)
    k = spread.checkpoint_every
    assert k > 1 and "checkpointing every %d epoch ends where it does not validate (at 2.0 s a checkpoint, " \
        "within 5%% of the budget)" % k in spread.describe()
    left = 120 - 10 - 3
    cost = lambda total: (total - 15) * 0.042 + 8.0 + 2.0 * len(clock_plan.checkpoint_steps(  # noqa: E731
        15, total, 38, 0, spread.validate_from, k))
    assert cost(spread.total_steps) <= left < cost(spread.total_steps + 1)
    # Which epoch ends checkpoint: every k-th, and those that validate.
    ends = range(38, spread.total_steps, 38)
    assert [end for end in ends if spread.checkpoints_epoch_end(end, 0)] == [end for end in ends if end // 38 % k == 0]
    assert spread.checkpoints_epoch_end(38, 19)  # a validate_every_steps step validates, and checkpoints
    # Every epoch end's checkpoint (the share at 100%) leaves about 20 s fewer for steps.
    monkeypatch.setattr(clock_plan, "CHECKPOINT_SHARE", 1.0)
    every = plan_run(15, 10, 120, 0.042, 8.0, 2.0, 38)
    assert every.checkpoint_every == 1 and "checkpointing" not in every.describe()
    assert spread.total_steps - every.total_steps > 15 / 0.042


def test_a_plan_whose_length_is_fixed_before_the_next_epoch_end_is_retimed_halfway_there() -> None:
    """The epoch end's re-time comes too late where the plan ends (or wsd's decay begins) first."""
    assert clock_plan.halfway_retime_step(36, 62, 36) == 49
    assert clock_plan.halfway_retime_step(36, 72, 36) == 54  # the epoch end's re-time would be at the run's end
    assert clock_plan.halfway_retime_step(36, 73, 36) is None  # the epoch end re-times
    assert clock_plan.halfway_retime_step(36, 58, 36) is None  # 11 steps: too few to time
    assert clock_plan.halfway_retime_step(36, None, 36) is None  # cosine: its length is fixed from the start


def test_a_wsd_plan_is_retimed_halfway_through_its_decay() -> None:
    """Halfway from the decay's start to the run's end; not where too few steps since the last
    re-time would be timed, nor at the last steps."""
    assert clock_plan.decay_retime_step(134, 163, 126) == 148
    assert clock_plan.decay_retime_step(130, 158, 126) == 144  # an epoch end (of 9 steps) too: end_of_epoch's
    assert clock_plan.decay_retime_step(134, 163, 140) is None  # 148: 8 steps since the last re-time, too few
    assert clock_plan.decay_retime_step(160, 162, 126) is None  # 161: the last step


# ---------------------------------------------------------------------------- ClockPlan on a fake clock

class FakeClock:
    """Seconds that pass only when the test moves them on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def param_groups() -> Any:
    """What LearningRate sets of an optimizer: its parameter groups' rates (no optimizer needed)."""
    return SimpleNamespace(param_groups=[{}, {}])


def component(clock: FakeClock, steps_per_epoch: int = 30, *, estimate: tuple[float, float, float] = (1.0, 0.0, 0.1),
              given: frozenset[str] = frozenset(), dropouts: list[float] | None = None, planning: bool = True,
              agree: Callable[[Any], Any] = lambda value: value, is_main: bool = True,
              **settings: Any) -> ClockPlan:
    """A ClockPlan of a tiny run of `steps_per_epoch` steps an epoch planned to one minute by default
    (`settings` override the config), its learning rate on a one-parameter optimizer."""
    config = {**get_config(), **PRESETS["tiny"], "max_minutes": 1.0, "confidence_sentences": 0, **settings}
    learning_rate = LearningRate(param_groups(), Schedule.from_config(config, config["num_epochs"] * steps_per_epoch))
    return ClockPlan(config, clock, 0.0, steps_per_epoch, learning_rate, planning=planning, given=given,
                     set_dropout=(dropouts if dropouts is not None else []).append, estimate=lambda: estimate,
                     agree=agree, is_main=is_main)


class Run:
    """train.py's calls to its clock plan (Trainer.train_epoch, end_of_epoch, validate, save) over a
    run whose steps take `step_seconds(step)`, whose validations take `validation_seconds` and whose
    checkpoints `checkpoint_seconds`; `plans` records each plan as it changes, with its step, and
    `validated` / `saved` the steps that validated and checkpointed."""

    def __init__(self, plan: ClockPlan, clock: FakeClock, step_seconds: Callable[[int], float] = lambda step: 0.1,
                 validation_seconds: float = 1.0, checkpoint_seconds: float = 0.1) -> None:
        self.plan, self.clock, self.step_seconds = plan, clock, step_seconds
        self.validation_seconds, self.checkpoint_seconds = validation_seconds, checkpoint_seconds
        self.step = 0
        self.plans: list[tuple[int, Plan]] = []
        self.validated: list[int] = []
        self.saved: list[int] = []

    def watched(self, call: Callable[[], Any]) -> Any:
        before = self.plan.plan
        result = call()
        if self.plan.plan is not before:
            self.plans.append((self.step, self.plan.plan))
        return result

    def validate(self) -> None:
        with self.plan.timing_validation():
            self.clock.now += self.validation_seconds
        self.validated.append(self.step)

    def save(self) -> None:
        with self.plan.timing_checkpoint():
            self.clock.now += self.checkpoint_seconds
        self.saved.append(self.step)

    def train(self, until: int | None = None) -> str:
        """Steps until the plan's end, the clock's stop or the step `until` (after its epoch end's
        work, where it is one); why it stopped. A later call goes on from there."""
        plan, spe = self.plan, self.plan.steps_per_epoch
        while plan.epochs_left(self.step // spe):
            if self.step % spe == 0:
                plan.epoch_started(self.step)
            self.clock.now += self.step_seconds(self.step + 1)
            out_of_time = plan.out_of_time()
            plan.learning_rate.step()
            self.step += 1
            epoch_end = self.step % spe == 0
            self.watched(lambda: plan.step_done(self.step, epoch_end))
            if plan.reached_end(self.step):
                return "planned_end"
            if out_of_time:
                return "max_minutes"
            if not epoch_end:
                if self.watched(lambda: plan.retime_within_epoch(self.step)):
                    self.save()
            else:
                self.end_of_epoch()
            if self.step == until:
                return "until"
        return "epochs"

    def end_of_epoch(self) -> None:
        thinned = not self.plan.validates_epoch_end(self.step)
        if not thinned:
            self.validate()
        if self.watched(lambda: self.plan.retime_at_epoch_end(self.step)):
            thinned = False
        if not thinned or self.plan.checkpoints_epoch_end(self.step):
            self.save()


def test_the_first_plan_is_made_after_the_timed_window_from_its_steps_alone() -> None:
    """Three warm-up steps (allocation, compiling) are left out, twelve are timed at 0.1 s, the
    estimate gives a validation's and a checkpoint's cost; the run's learning rate follows the plan
    from there and the preset's dropout is scaled to it."""
    clock, dropouts = FakeClock(), []
    plan = component(clock, 50, estimate=(2.0, 0.0, 0.3), dropouts=dropouts, dropout=0.2, num_epochs=60)
    run = Run(plan, clock, step_seconds=lambda step: 3.0 if step <= 3 else 0.1)
    assert run.train(until=16) == "until"
    (at, first), = run.plans
    assert at == clock_plan.PLAN_SKIP_STEPS + clock_plan.PLAN_TIMED_STEPS == 15
    assert first.step_seconds == pytest.approx(0.1) and first.planned_at_step == 15
    assert (first.validation_seconds, first.checkpoint_seconds, first.first_validation_seconds) == (2.0, 0.3, 2.0)
    assert first.expected_end_s <= 60 - clock_plan.MARGIN_S < first.expected_end_s + 0.1 + 2.0 + 0.3
    schedule = plan.learning_rate.schedule
    assert (schedule.total_steps, schedule.warmup_steps) == (first.total_steps, first.warmup_steps)
    assert dropouts == [first.dropout] == [planned_dropout(0.2, first.epochs, 60)]
    assert not plan.planning and plan.reached_end(first.total_steps) and not plan.reached_end(first.total_steps - 1)


def test_a_first_epoch_shorter_than_the_timed_window_is_planned_at_its_end() -> None:
    clock = FakeClock()
    run = Run(component(clock, 8), clock)
    run.train(until=9)
    assert [step for step, _ in run.plans] == [8]
    assert run.plans[0][1].step_seconds == pytest.approx(0.1)


def test_a_plan_leaves_dropout_given_or_compiled_as_it_is() -> None:
    for settings in ({"given": frozenset({"dropout"})}, {"compile": True}):
        clock, dropouts = FakeClock(), []
        run = Run(component(clock, dropouts=dropouts, dropout=0.2, num_epochs=60, **settings), clock)
        run.train(until=16)
        assert run.plans[0][1].dropout is None and dropouts == [], settings


def test_an_inverse_sqrt_plan_is_retimed_at_every_epoch_end_from_the_validations_and_steps_it_measured(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After warmup the inverse square root does not depend on the run's length: re-timed at every
    epoch end. A first epoch that pays for its new shapes inflates the first re-time, not the
    next, measured from the first re-time on; validations' and checkpoints' seconds are left out
    of a step's and counted apart (every epoch end validates: the share at 100%)."""
    monkeypatch.setattr(clock_plan, "VALIDATION_SHARE", 1.0)
    clock = FakeClock()
    plan = component(clock, lr_schedule="inverse_sqrt", estimate=(3.0, 0.0, 1.0))
    run = Run(plan, clock, step_seconds=lambda step: 0.5 if 20 <= step <= 25 else 0.1, validation_seconds=0.5,
              checkpoint_seconds=0.2)
    assert run.train() == "planned_end"
    steps = [step for step, _ in run.plans]
    assert steps[0] == 15 and steps[1:] == list(range(30, steps[-1] + 1, 30)) and len(steps) > 5
    first_retime, second_retime = run.plans[1][1], run.plans[2][1]
    assert first_retime.step_seconds == pytest.approx((15 * 0.1 + 6 * 0.4) / 15, rel=1e-6)  # steps 16-30
    assert second_retime.step_seconds == pytest.approx(0.1)  # from the first re-time on
    assert second_retime.validation_seconds == pytest.approx(0.5) and second_retime.checkpoint_seconds == \
        pytest.approx(0.2)  # measured, not the estimate's 3 and 1
    assert run.step == run.plans[-1][1].total_steps and clock.now <= 60


def test_a_cosine_plan_is_retimed_once_at_the_last_epoch_end_before_its_warmup_ends() -> None:
    """Cosine spreads its decay over the whole run: its length may change only until the decay
    starts, at the warmup's end."""
    clock = FakeClock()
    run = Run(component(clock, 20, lr_schedule="cosine", warmup_steps=70), clock)
    assert run.train() == "planned_end"
    assert [step for step, _ in run.plans] == [15, 60]


def test_a_wsd_plan_is_retimed_until_its_decay_then_halfway_through_it_from_where_its_rate_stands() -> None:
    """Until wsd's decay the rate does not depend on the run's length: re-timed at every epoch end
    before it. Steps that slow for good after the last one (a shared machine) bring the decay's
    re-time, halfway through it: the plan shortens, its decay going on from the rate it stood at to
    min_lr at the new end, inside the budget, and no re-time follows it."""
    clock = FakeClock()
    plan = component(clock, lr_schedule="wsd", decay_fraction=0.4)
    run = Run(plan, clock, step_seconds=lambda step: 0.15 if step > 300 else 0.1, validation_seconds=0.5)
    assert run.train() == "planned_end"
    *retimes, (decay_at, decaying) = run.plans
    (last_at, last), before = retimes[-1], Schedule.from_plan(plan.config, retimes[-1][1])
    assert all(step % 30 == 0 for step, _ in retimes[1:]) and last_at < before.decay_start() <= last_at + 30
    assert decay_at == clock_plan.decay_retime_step(before.decay_start(), last.total_steps, last_at)
    assert decaying.total_steps < last.total_steps and decaying.decay_anchor == (decay_at, before.factor(decay_at))
    after = Schedule.from_plan(plan.config, decaying)
    assert after.factor(decay_at) == pytest.approx(before.factor(decay_at), rel=1e-12)  # no jump ...
    assert after.factor(decay_at + 1) < after.factor(decay_at) < 1.0  # ... into a decay under way
    assert after.factor(decaying.total_steps - 1) == pytest.approx(plan.config["min_lr"] / plan.config["lr"])
    assert run.step == decaying.total_steps and clock.now <= 60


def test_a_wsd_plan_shortened_into_its_decay_decays_from_the_peak_without_a_jump() -> None:
    """4 s lost just before an epoch end: re-timed there, the plan ends so soon that its decay
    would have begun already; the rate would drop from its peak at once. It decays from where it
    stands, the peak, to min_lr at its end instead, and re-times no more."""
    clock = FakeClock()
    plan = component(clock, lr_schedule="wsd", decay_fraction=0.3)
    run = Run(plan, clock, step_seconds=lambda step: 4.0 if step == 329 else 0.1)
    run.train()
    (at, shortened), schedule = run.plans[-1], Schedule.from_plan(plan.config, run.plans[-1][1])
    assert at == 330 and shortened.decay_anchor == (330, 1.0) and shortened.planned_at_step == 330
    assert Schedule.from_config(plan.config, shortened.total_steps, shortened.warmup_steps).decay_start() < 330
    assert schedule.factor(240) == 1.0 and schedule.factor(shortened.total_steps - 1) == pytest.approx(
        plan.config["min_lr"] / plan.config["lr"])


def test_a_decay_retime_that_falls_on_an_epoch_end_is_made_there_and_checkpointed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Halfway through the decay may be an epoch end, which the step loop leaves to the epoch's
    end: the re-time is made there, and that epoch end checkpoints though the plan keeps it out."""
    monkeypatch.setattr(clock_plan, "CHECKPOINT_SHARE", 0.0)
    monkeypatch.setattr(clock_plan, "VALIDATION_SHARE", 0.0)
    ends = []

    def at_the_next_epoch_end(start: int, total: int, last_retime: int) -> int:
        ends.append((start // 30 + 1) * 30)
        return ends[-1]

    monkeypatch.setattr(clock_plan, "decay_retime_step", at_the_next_epoch_end)
    clock = FakeClock()
    plan = component(clock, lr_schedule="wsd")
    run = Run(plan, clock)
    run.train()
    at, last = run.plans[-1]
    assert at == ends[-1] == last.decay_from and at in run.saved and not last.checkpoints_epoch_end(at, 0)


def test_a_plan_fixed_before_the_next_epoch_end_is_retimed_halfway_there_and_checkpointed() -> None:
    """An epoch longer than the run: the plan made after 15 steps ends inside the first epoch, so
    the epoch end's re-time never comes; one halfway to the end measures the steps that sped up."""
    clock = FakeClock()
    plan = component(clock, 1000, lr_schedule="inverse_sqrt", max_minutes=0.5)
    run = Run(plan, clock, step_seconds=lambda step: 0.2 if step <= 15 else 0.1)
    assert run.train() == "planned_end"
    (_, first), (halfway, retimed) = run.plans
    assert halfway == 15 + (first.total_steps - 15) // 2 and halfway in run.saved
    assert retimed.step_seconds == pytest.approx(0.1) and retimed.total_steps > first.total_steps


def test_the_clock_stop_reserves_the_last_validation_a_checkpoint_and_the_fit() -> None:
    """A planned run may validate only at its end: before it has timed one, its clock stop keeps the
    plan's estimate of the validation, the checkpoint and the confidence fit inside the budget;
    then the last validation's time and the mean checkpoint's. Rank 0 alone reads the clock."""
    clock = FakeClock()
    plan = component(clock, estimate=(2.0, 4.0, 0.5), confidence_sentences=100)
    Run(plan, clock).train(until=15)
    first = plan.plan
    assert first.confidence_fit and plan.ends_with_fit
    assert plan.reserve() == pytest.approx(2.0 + 0.5 + first.fit_seconds)
    with plan.timing_validation():
        clock.now += 1.5
    for seconds in (0.2, 0.4):
        with plan.timing_checkpoint():
            clock.now += seconds
    assert plan.reserve() == pytest.approx(1.5 + 0.3 + first.fit_seconds)
    clock.now = 60 - plan.reserve() - 0.01
    assert not plan.out_of_time()
    clock.now += 0.01
    assert plan.out_of_time()
    assert not component(clock, is_main=False).out_of_time() and not component(clock, max_minutes=0).out_of_time()


def test_a_thinned_plan_validates_its_last_epoch_ends_and_every_validate_every_steps() -> None:
    clock = FakeClock()
    plan = component(clock, 9, validate_every_steps=18, planning=False)
    plan.follow(Plan(total_steps=90, warmup_steps=10, steps_per_epoch=9, step_seconds=0.1, validation_seconds=1.0,
                     checkpoint_seconds=0.1, planned_at_step=15, budget_s=60, expected_end_s=50, validate_from=72,
                     checkpoint_every=2))
    assert [end for end in range(9, 90, 9) if plan.validates_epoch_end(end)] == [18, 36, 54, 72, 81]
    assert [end for end in range(9, 90, 9) if plan.checkpoints_epoch_end(end)] == [18, 36, 54, 72, 81]
    unplanned = component(clock, 9, planning=False)
    assert all(unplanned.validates_epoch_end(end) and unplanned.checkpoints_epoch_end(end) for end in (9, 10, 11))


def test_a_wsd_plan_whose_validations_all_follow_its_decay_measures_one_before_its_length_is_fixed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the plan counts the first estimate (a young model's decoding, 3 s where validations
    take 0.5) more than once after the last epoch end before its decay, that epoch end validates,
    though the plan thins it, and the re-time there plans from a measured validation; a plan that
    validates its last step only and leaves the fit out counts it once, and keeps it."""
    for share in (0.1, 0.001):
        monkeypatch.setattr(clock_plan, "VALIDATION_SHARE", share)
        clock = FakeClock()
        plan = component(clock, lr_schedule="wsd", estimate=(3.0, 0.0, 0.1))
        run = Run(plan, clock, validation_seconds=0.5)
        run.train()
        if share == 0.001:
            assert run.validated == [] and run.plans[-1][1].validation_seconds == 3.0
            continue
        first = run.validated[0]
        thinning = [made for step, made in run.plans if step < first][-1]  # the plan in force there
        assert first < thinning.validate_from and not thinning.validates_epoch_end(first, 0)
        assert first < Schedule.from_plan(plan.config, thinning).decay_start() <= first + 30
        assert [made.validation_seconds for step, made in run.plans if step >= first] == \
            pytest.approx([0.5] * len([step for step, _ in run.plans if step >= first]))


def test_every_rank_follows_rank_0s_plan_and_only_rank_0_times_the_run() -> None:
    """Rank 0 plans from its clock and hands the plan over (`agree`); another rank, whatever its own
    clock says, follows it, never estimates, and makes the same re-times when rank 0 does."""
    posted: list[Any] = []

    def post(value: Any) -> Any:
        posted.append(value)
        return value

    def never() -> tuple[float, float, float]:
        raise AssertionError("only rank 0 estimates")

    main_clock, other_clock = FakeClock(), FakeClock()
    main = component(main_clock, lr_schedule="inverse_sqrt", agree=post)
    other = ClockPlan(main.config, other_clock, 0.0, 30, LearningRate(param_groups(), main.learning_rate.schedule),
                      planning=True, estimate=never, agree=lambda value: posted.pop(0), is_main=False)
    runs = Run(main, main_clock), Run(other, other_clock, step_seconds=lambda step: 0.01)
    for until in (15, 30, 60):
        for run in runs:
            run.train(until=until)
    assert [step for step, _ in runs[1].plans] == [step for step, _ in runs[0].plans] == [15, 30, 60]
    assert runs[1].plans[-1][1] == runs[0].plans[-1][1] and other.learning_rate.schedule == main.learning_rate.schedule
    other_clock.now = 10**6
    assert not other.out_of_time()


def test_a_resumed_run_follows_its_checkpoints_plan_and_never_retimes(capsys: pytest.CaptureFixture) -> None:
    clock, dropouts = FakeClock(), []
    planner = component(clock, lr_schedule="inverse_sqrt", dropout=0.2, num_epochs=60)
    Run(planner, clock).train(until=40)
    state = json.loads(json.dumps(planner.state_dict()))  # as a checkpoint holds it: plain data
    for given, expected in ((frozenset(), [planner.plan.dropout]), (frozenset({"dropout"}), [])):
        dropouts.clear()
        resumed = component(FakeClock(), planning=True, given=given, dropouts=dropouts, lr_schedule="inverse_sqrt",
                            dropout=0.2, num_epochs=60)
        resumed.load_state_dict(state)
        assert resumed.plan == planner.plan and resumed.learning_rate.schedule == planner.learning_rate.schedule
        assert dropouts == expected and "following the run's plan" in capsys.readouterr().err
    run = Run(resumed, resumed.clock, step_seconds=lambda step: 0.05)
    assert run.train() == "planned_end" and run.plans == [] and run.step == planner.plan.total_steps
    assert "already trained the" in resumed.already_done(run.step, run.step // 30)
    unplanned = component(FakeClock(), planning=False)
    unplanned.load_state_dict(None)
    assert unplanned.plan is None and unplanned.epochs_left(1) and not unplanned.epochs_left(2)
    assert unplanned.already_done(0, 2) == "already trained 2 epochs; raise --num_epochs to go on"


# ---------------------------------------------------------------------------- whole runs of train.py

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


@pytest.fixture
def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    # The planted clocks make a checkpoint 0.2-0.4 s of a 30 s budget, which a plan would thin.
    monkeypatch.setattr(clock_plan, "CHECKPOINT_SHARE", 1.0)
    data = write_hub_dataset(tmp_path / "data", {"train": synthetic_pairs(300, 1), "validation": synthetic_pairs(8, 2),
                                                 "test": synthetic_pairs(8, 3)})
    # --num_examples 0: no examples, nor their attention heatmap (matplotlib: a third of these runs' time);
    # --d_model and --batch_tokens given: the plan sizes neither (test_planned_size's runs take them out)
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


def scalars(args: list[str], folder: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(runs_dir(parse_config([*args, "--runs_folder", str(folder / "r")]))),
                              size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_a_planned_run_ends_its_schedule_at_the_planned_step_and_resumes_bit_exactly(
        planned: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(clock_plan, "VALIDATION_SHARE", 0.04)  # of 30 s: fewer validations than epoch ends
    assert run(planned, tmp_path / "unbroken", CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    unbroken = final_state(planned, tmp_path / "unbroken")
    plan, steps_per_epoch = unbroken["plan"], unbroken["plan"]["steps_per_epoch"]
    # The preset's 2 epochs are only the starting point: the clock's budget holds more.
    assert plan["total_steps"] > 2 * steps_per_epoch and unbroken["global_step"] == plan["total_steps"]
    assert f"plan for --max_minutes 0.5: {plan['total_steps']} steps" in log
    assert f"finished the plan: {plan['total_steps']} steps" in log
    assert plan["final_seconds"] > 0 and plan["first_validation_seconds"] > 0  # the fit is planned, and scaled
    # The re-time measured its window's checkpoints, two clock readings each (0.2 s).
    assert plan["checkpoint_seconds"] == pytest.approx(0.2)
    # The schedule ends where the run does: the cosine is at min_lr at the last step.
    config = parse_config(planned)
    schedule = Schedule.from_config(config, plan["total_steps"], plan["warmup_steps"])
    assert unbroken["optimizer"]["param_groups"][0]["lr"] == pytest.approx(config["lr"] *
                                                                           schedule.factor(plan["total_steps"]))
    assert schedule.factor(plan["total_steps"] - 1) == pytest.approx(config["min_lr"] / config["lr"])
    # Validated: the last epoch ends that fit 4% of the budget, and the last step.
    validated = [step for step, _ in scalars(planned, tmp_path / "unbroken", "val/loss")]
    assert steps_per_epoch < plan["validate_from"] < plan["total_steps"]
    assert validated == sorted(clock_plan.check_steps(0, plan["total_steps"], steps_per_epoch, 0, plan["validate_from"]))
    # Re-timed once (cosine), at the first epoch end after the plan.
    assert plan["planned_at_step"] % steps_per_epoch == 0 and log.count("re-timed plan for") == 1

    # The same run stopped by its clock after the re-time, then resumed on a fresh clock: it follows
    # the stored plan bit for bit.
    assert run(planned, tmp_path / "resumed", CountingClock(jump_at=55), monkeypatch) == 0
    first = capsys.readouterr().err
    assert "re-timed plan for --max_minutes 0.5" in first and "reached --max_minutes 0.5" in first
    halfway = final_state(planned, tmp_path / "resumed")
    assert halfway["plan"] == plan and plan["planned_at_step"] <= halfway["global_step"] < plan["total_steps"]
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
    monkeypatch.setattr(clock_plan, "FIT_SHARE", 0.0)  # any fit is over the share
    assert run(planned, tmp_path, CountingClock(), monkeypatch) == 0
    log = capsys.readouterr().err
    assert final_state(planned, tmp_path)["plan"]["confidence_fit"] is False
    assert "no confidence calibrator: the plan left the fit out" in log
    assert "warning: no confidence calibrator" not in log  # the fit was not tried


def test_an_explicit_length_means_what_it_says(planned: list[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    assert run([*planned, "--num_epochs", "2"], tmp_path, CountingClock(), monkeypatch) == 0
    assert "plan for" not in capsys.readouterr().err
    state = final_state([*planned, "--num_epochs", "2"], tmp_path)
    assert state["plan"] is None and state["epoch"] == 2


# ---------------------------------------------------------------------------- a plan that cannot work

def test_a_plan_too_short_to_learn_says_so_with_the_budget_that_would_hold_enough_steps(
        capsys: pytest.CaptureFixture) -> None:
    """Steps of 2 s (a loaded machine) in one minute: under LEARNING_STEPS. The plan says so, naming
    the --max_minutes that holds them at the steps measured (to a tenth of a minute), and says it
    again when the run ends; a plan of enough steps says nothing."""
    clock = FakeClock()
    plan = component(clock, estimate=(5.0, 0.0, 0.5))
    Run(plan, clock, step_seconds=lambda step: 2.0).train(until=15)
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")]
    minutes = float(re.search(r"--max_minutes ([\d.]+) holds", warning[0]).group(1))
    assert len(warning) == 1 and plan.plan.total_steps < clock_plan.LEARNING_STEPS
    assert f"{plan.plan.total_steps} steps are fewer than the {clock_plan.LEARNING_STEPS}" in warning[0]
    costs = Costs(2.0, 5.0, 0.5, 0.0, 5.0)
    enough = lambda budget: clock_plan.plan_run(15, 30.0, replace(plan.rules, budget_s=60 * budget),  # noqa: E731
                                                costs).total_steps
    assert enough(minutes) >= clock_plan.LEARNING_STEPS > enough(minutes - 0.1)
    assert plan.shortfall_at_end(plan.plan.total_steps) == warning[0]
    assert plan.shortfall_at_end(clock_plan.LEARNING_STEPS) is None
    fast_clock = FakeClock()
    fast = component(fast_clock)
    Run(fast, fast_clock).train(until=15)
    assert "warning" not in capsys.readouterr().err and fast.shortfall_at_end(10) is None


def test_a_retime_says_when_the_machine_slowed_or_sped_up_since_the_plan_was_made(
        capsys: pytest.CaptureFixture) -> None:
    for late_seconds, said in ((0.2, "slowed"), (0.05, "sped up"), (0.12, None)):
        clock = FakeClock()
        plan = component(clock, lr_schedule="inverse_sqrt")
        Run(plan, clock, step_seconds=lambda step: 0.1 if step <= 15 else late_seconds).train(until=30)
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: steps now take")]
        if said is None:
            assert lines == []
            continue
        assert len(lines) == 1 and f"this machine {said}" in lines[0] and f"ends at step {plan.plan.total_steps}" \
            in lines[0], lines
        assert f"{late_seconds / 0.1:.2g} times the 0.100 s" in lines[0]


def test_a_plan_never_reports_an_end_past_a_budget_it_fitted() -> None:
    """A plan whose steps fit ends within the budget; one made once the budget is spent (a validation
    that took most of it) has one step left, and says the budget is spent instead of an end."""
    for elapsed in (10, 60, 100):
        fitted = plan_run(15, elapsed, 120, 0.25, 8.0, 0.5, 112)
        assert fitted.fitted and fitted.expected_end_s <= 120 and "expected to end" in fitted.describe()
    spent = plan_run(15, 117, 120, 0.25, 8.0, 0.5, 112)
    assert not spent.fitted and spent.total_steps == 16 and spent.expected_end_s > 120
    assert "expected to end" not in spent.describe()
    assert "the budget is spent: its one step, validation and checkpoint end about 2.1 min after start, past " \
        "--max_minutes 2" in spent.describe()
