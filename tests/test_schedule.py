"""schedule.py: the learning-rate schedules (warmup, inverse square root, cosine, wsd, a decay that
moves), and LearningRate, which sets the optimizer's rate as torch's LambdaLR would."""
from __future__ import annotations

import pytest
import torch

from config import PRESETS, get_config
from model import build_model
from nmt.training.optimizer import build_optimizer
from nmt.training.schedule import LearningRate, Schedule


def factor(step: int, config: dict, total: int, warmup: int | None = None,
           decay_from: tuple[int, float] | None = None) -> float:
    return Schedule.from_config(config, total, warmup, decay_from).factor(step)


def test_inverse_sqrt_schedule_without_warmup_decays_from_the_first_step() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=0, warmup_fraction=0.0)
    assert [factor(step, config, 100) for step in (0, 3, 99)] == pytest.approx([1.0, 0.5, 0.1])


def test_inverse_sqrt_schedule_peaks_at_warmup() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=100)
    factors = [factor(step, config, 1000) for step in range(400)]
    assert factors[99] == pytest.approx(1.0)
    assert factors[0] == pytest.approx(0.01)
    assert factors[399] == pytest.approx((100 / 400) ** 0.5)
    assert max(factors) == pytest.approx(1.0)


def test_warmup_is_a_fraction_of_the_run_unless_given_in_steps() -> None:
    config = dict(get_config(), lr=1e-3)  # the defaults: warmup_steps 0, warmup_fraction 0.1
    factors = [factor(step, config, 4600) for step in range(4600)]
    assert factors.index(max(factors)) == 459 and factors[459] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx((460 / 4600) ** 0.5)
    assert factor(99, dict(config, warmup_steps=100), 4600) == pytest.approx(1.0)


def test_cosine_schedule_ends_at_min_lr() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="cosine", min_lr=1e-5)
    assert factor(9, config, 100) == pytest.approx(1.0)
    assert factor(99, config, 100) == pytest.approx(1e-2)


def test_wsd_holds_the_peak_then_decays_linearly_to_min_lr() -> None:
    # 10 steps of warmup, 90 after it: the last 30% (27 steps) decay, the 63 before hold the peak.
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="wsd", decay_fraction=0.3, min_lr=1e-5)
    factors = [factor(step, config, 100) for step in range(100)]
    assert factors[9:73] == pytest.approx([1.0] * 64)
    assert factors[73] < 1.0 and factors[99] == pytest.approx(1e-2)
    drops = [a - b for a, b in zip(factors[72:], factors[73:])]
    assert drops == pytest.approx([drops[0]] * len(drops)) and drops[0] == pytest.approx(0.99 / 27)


def test_a_decay_whose_end_moved_goes_on_from_where_it_stood_to_min_lr_at_the_new_end() -> None:
    """Re-timed at step 85 of 100 (clock_plan.decay_retime_step), the run now ends at 95: from
    step 85 on the decay is linear from the multiplier it stood at to min_lr at step 95, no jump."""
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="wsd", decay_fraction=0.3, min_lr=1e-5)
    anchor = (85, factor(85, config, 100))
    moved = [factor(step, config, 95, 10, anchor) for step in range(95)]
    assert moved[:85] == pytest.approx([factor(step, config, 95) for step in range(85)])  # before it: the schedule's
    assert moved[85] == anchor[1] and moved[94] == pytest.approx(1e-2)
    drops = [a - b for a, b in zip(moved[85:], moved[86:])]
    assert drops == pytest.approx([(anchor[1] - 1e-2) / 9] * 9)
    assert factor(85, config, 95) < anchor[1] - 0.1  # the schedule of 95 steps alone jumps down at 85


def test_each_kind_says_from_which_step_its_length_can_no_longer_change() -> None:
    config = dict(get_config(), lr=1e-3, warmup_steps=10, decay_fraction=0.3, min_lr=1e-5)
    wsd, inverse, cosine = (Schedule.from_config(dict(config, lr_schedule=kind), 100)
                            for kind in ("wsd", "inverse_sqrt", "cosine"))
    assert (wsd.decay_start(), wsd.length_free_until()) == (73, 73) and wsd.decay_can_move
    assert (inverse.decay_start(), inverse.length_free_until()) == (10, 100) and not inverse.decay_can_move
    assert (cosine.decay_start(), cosine.length_free_until()) == (10, None) and not cosine.length_free(5)
    assert wsd.length_free(72) and not wsd.length_free(73)


def test_a_shorter_schedule_decays_from_where_a_wsd_run_stands_once_its_decay_would_have_begun() -> None:
    """A re-timed plan: 100 steps shortened at step 70 to 90 (whose decay starts at step 66) goes on
    from the multiplier at 70; shortened to 98 (decay from 72) it keeps the peak; inverse square root
    and cosine never anchor; a decay under way always does."""
    config = dict(get_config(), lr=1e-3, warmup_steps=10, lr_schedule="wsd", decay_fraction=0.3, min_lr=1e-5)
    wsd = Schedule.from_config(config, 100)
    assert wsd.anchor_for(90, 10, 70, decaying=False) == (70, wsd.factor(70)) == (70, 1.0)
    assert wsd.anchor_for(98, 10, 70, decaying=False) is None
    assert wsd.anchor_for(98, 10, 80, decaying=True) == (80, wsd.factor(80)) and wsd.factor(80) < 1.0
    for kind in ("inverse_sqrt", "cosine"):
        assert Schedule.from_config(dict(config, lr_schedule=kind), 100).anchor_for(90, 10, 70, True) is None


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)`")
def test_the_learning_rate_is_what_lambda_lr_sets_step_for_step_and_resumes_at_its_count() -> None:
    """Golden: torch's LambdaLR over the same multiplier gives the same rates, bit for bit, after each
    step; a skipped step (no step()) leaves the rate; a new schedule applies from the next step; a
    state_dict of either resumes in the other at the same rate."""
    config = {**get_config(), **PRESETS["tiny"], "lr": 3e-3, "warmup_steps": 4, "lr_schedule": "wsd"}
    model = build_model(config, 40, 50)
    ours, theirs = build_optimizer(model, config), build_optimizer(build_model(config, 40, 50), config)
    rate = LearningRate(ours, Schedule.from_config(config, 20))
    reference = torch.optim.lr_scheduler.LambdaLR(theirs, Schedule.from_config(config, 20).factor)
    for _ in range(12):
        assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in theirs.param_groups]
        rate.step()
        reference.step()
    shorter = Schedule.from_config(config, 16)
    rate.follow(shorter)
    assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"]  # the step under way keeps its rate
    rate.step()
    assert ours.param_groups[0]["lr"] == config["lr"] * shorter.factor(13)
    resumed = LearningRate(build_optimizer(model, config), shorter)
    resumed.load_state_dict(reference.state_dict())
    assert resumed.steps == 12 and resumed.optimizer.param_groups[0]["lr"] == config["lr"] * shorter.factor(12)
    assert rate.state_dict() == {"last_epoch": 13}
