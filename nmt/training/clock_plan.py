"""A training run planned to its clock: how many steps fit the rest of `--max_minutes`.

A fixed epoch count either leaves a fast machine's budget unused or is cut short by the clock on a
slow one, its learning rate still high; a schedule that decays to the budget's end beats one cut
short (Li et al., "Budgeted training", ICLR 2020). With `--max_minutes` and neither `--num_epochs`
nor `--max_steps` given, train.py measures its first steps (after a few warm-up steps, and any
compile), estimates a validation and a checkpoint, and `plan_run` fixes the run's length in steps,
and with it the learning-rate schedule: the warmup keeps its length in steps (at most half the run),
the decay ends at the planned step. Where the dropout is the preset's (or the default), the plan
scales it to the run's length (`planned_dropout`): a run of fewer epochs sees each pair fewer times
and needs less. On a CPU whose rough epoch estimate (train.cpu_epoch_estimate, before the model is
built) fits under num_epochs (a preset's, set for its depth and batch), the run trains one layer
fewer (`planned_layers`), unless --num_layers is given, on smaller batches (`planned_batch_tokens`),
unless --batch_tokens is given; where it fits under a quarter of them, a narrower model first
(`planned_width`), unless --d_model or --d_ff is given, whose estimate the depth and batch then
follow. Only the last epoch ends that fit VALIDATION_SHARE of the budget validate
(`first_validated_step`); the others checkpoint, and their validations' time goes to steps; of those,
as many as fit CHECKPOINT_SHARE of the budget, evenly spread (`checkpoint_interval`). The
invocation that planned re-times the plan from the steps and validations it measured (a dozen steps
and a young model's decoding are a small sample of a shared machine, and a GPU's first epoch pays
once for each new batch shape): at every epoch end while the learning rate does not depend on the
run's length (inverse square root; wsd until its decay), and once halfway where the run's end or the
decay comes before the next epoch end (`halfway_retime_step`); once for cosine
(train.Trainer.retime); and a wsd plan once more halfway through its decay (`decay_retime_step`),
from the steps since its last re-time, its decay going on from the learning rate it stands at to the
new end (optimizer.lr_factor's `decay_from`), as does any re-time whose plan's decay would have
begun by then (train.Trainer.planned). A wsd plan whose kept validations all follow its decay
validates the last epoch end it re-times at where its estimate counts more than once after it, so
that the re-time measures one. The plan is stored in every checkpoint and followed by a resumed run,
so a resume stays bit-exact (it depends on the machine's speed: two runs of one seed on different
machines differ).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

PLAN_SKIP_STEPS = 3  # steps not timed: the first ones pay for allocation, caching and compiling
PLAN_TIMED_STEPS = 12  # steps timed; the plan is made after PLAN_SKIP_STEPS + PLAN_TIMED_STEPS steps
# Kept free of the budget for what the estimates miss (at least MARGIN_S). The last re-time is an
# epoch from the end, and the last validation's and the fit's estimates (a young model's decoding,
# run to the references' length) run long: 5-minute plans here ended 6 to 18 s before they expected.
MARGIN_FRACTION = 0.02
MARGIN_S = 3.0
FIT_SHARE = 0.1  # of the budget: a confidence fit estimated to cost more is left out of the run
WIDTH_SHARE = 0.75  # of the preset's d_model and d_ff: a very short CPU run's narrower model (planned_width)
BATCH_FLOOR = 0.5  # of the preset's batch: the smallest a CPU run's planned batch gets (planned_batch_tokens)
VALIDATION_SHARE = 0.1  # of the budget: what a planned run's epoch-end validations may cost
CHECKPOINT_SHARE = 0.05  # of the budget: what the checkpoints of epoch ends that do not validate may cost


@dataclass(frozen=True)
class Plan:
    """A run's planned length: `total_steps` optimizer steps with `warmup_steps` of warmup, what it
    was planned from, and when the run is expected to end (seconds since the process started)."""

    total_steps: int
    warmup_steps: int
    steps_per_epoch: int
    step_seconds: float
    validation_seconds: float
    checkpoint_seconds: float
    planned_at_step: int
    budget_s: float
    expected_end_s: float
    final_seconds: float = 0.0  # the confidence fit's estimate; 0 in older plans
    confidence_fit: bool = True  # whether the run ends with the fit (FIT_SHARE)
    dropout: float | None = None  # the run's dropout (planned_dropout); None: the config's, as in older plans
    validate_from: int = 0  # epoch ends before this step checkpoint without validating; 0: all validate
    first_validation_seconds: float = 0.0  # the first plan's validation_seconds (fit_seconds); 0 in older plans
    checkpoint_every: int = 1  # of the epoch ends that do not validate, every this-many-th checkpoints; 1 in older plans
    decay_from: int = 0  # re-timed in wsd's decay: the schedule's step it decays anew from (lr_factor); 0: not
    decay_from_lr: float = 1.0  # ... and the peak lr's multiplier at that step

    @property
    def fit_seconds(self) -> float:
        """The confidence fit's time (`plan_run`)."""
        return fit_seconds(self.final_seconds, self.validation_seconds, self.first_validation_seconds)

    @property
    def decay_anchor(self) -> tuple[int, float] | None:
        """optimizer.lr_factor's `decay_from`: where a decay re-timed while under way starts anew."""
        return (self.decay_from, self.decay_from_lr) if self.decay_from else None

    @property
    def epochs(self) -> float:
        return self.total_steps / self.steps_per_epoch

    @property
    def validated_epoch_ends(self) -> int:
        """The epoch ends from validate_from (all where it is 0) before the last step that validate."""
        before_last = (self.total_steps - 1) // self.steps_per_epoch
        return before_last - max(self.validate_from - 1, 0) // self.steps_per_epoch

    def validates_epoch_end(self, step: int, every: int) -> bool:
        """Whether the epoch end at `step` validates (as `check_steps` counts it): from validate_from
        on, at the last step, and on every `every`-th step (0: none)."""
        return step >= min(self.validate_from, self.total_steps) or bool(every and step % every == 0)

    def checkpoints_epoch_end(self, step: int, every: int) -> bool:
        """Whether the epoch end at `step` checkpoints: one that validates, or every
        `checkpoint_every`-th of the others (`checkpoint_interval`)."""
        return self.validates_epoch_end(step, every) or step // self.steps_per_epoch % self.checkpoint_every == 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (f"plan for --max_minutes {self.budget_s / 60:g}: {self.total_steps} steps ({self.epochs:.1f} epochs of "
                f"{self.steps_per_epoch}), warmup {self.warmup_steps}, at {self.step_seconds:.3f} s a step and "
                f"{self.validation_seconds:.1f} s a validation"
                + ("" if not self.final_seconds else f", {self.fit_seconds:.1f} s for the confidence fit"
                   if self.confidence_fit else f", no confidence fit (it would take {self.fit_seconds:.1f} s, over "
                   f"{FIT_SHARE:.0%} of the budget; evaluate.py --fit_confidence fits one later)")
                + ("" if self.dropout is None else f", dropout {self.dropout:g}")
                + self.describe_validations()
                + ("" if not self.decay_from else f", decaying from step {self.decay_from} ({self.decay_from_lr:.2f} "
                   "of the peak learning rate) to min_lr at its last step")
                + ("" if self.checkpoint_every == 1 else f", checkpointing every {self.checkpoint_every} epoch "
                   f"ends where it does not validate (at {self.checkpoint_seconds:.1f} s a checkpoint, within "
                   f"{CHECKPOINT_SHARE:.0%} of the budget)")
                + f"; expected to end {self.expected_end_s / 60:.1f} min after start")

    def describe_validations(self) -> str:
        if not self.validate_from:
            return ""
        ends = self.validated_epoch_ends
        which = "the last step only" if not ends else f"the last epoch end (step {self.validate_from}) and the last " \
            "step" if ends == 1 else f"the last {ends} epoch ends (from step {self.validate_from}) and the last step"
        return f", validating {which} (validations within {VALIDATION_SHARE:.0%} of the budget)"


def validations_until(step: int, total: int, steps_per_epoch: int, every: int, validate_from: int = 0) -> int:
    """Validations after `step` up to and including `total`: each epoch's end from `validate_from`
    on, every `every` steps (0: none), and the run's end, each step counted once."""
    return len(check_steps(step, total, steps_per_epoch, every, validate_from))


def check_steps(step: int, total: int, steps_per_epoch: int, every: int, validate_from: int = 0) -> set[int]:
    """The steps after `step` up to and including `total` that validate (`validations_until`); with
    `validate_from` 0, the epoch ends, validations and the last step, each of which checkpoints."""
    first_end = (max(step, validate_from - 1) // steps_per_epoch + 1) * steps_per_epoch
    at = set(range(first_end, total + 1, steps_per_epoch))
    if every:
        at |= set(range((step // every + 1) * every, total + 1, every))
    return at | {total}


def halfway_retime_step(step: int, free_until: int | None, steps_per_epoch: int) -> int | None:
    """The step between epoch ends at which a plan made at `step` is re-timed once more: halfway to
    `free_until` (the step from which its length is fixed: optimizer.length_free_until) where that
    comes before the next epoch end, whose re-time would then be too late; None where it does not,
    or where fewer than PLAN_TIMED_STEPS steps would be timed. On an H200 with cuDNN's attention
    (device.py turns it off since) a paper-base first epoch (every batch a new shape) cost 0.82 s a
    step (another H200's later epochs: 0.05): re-timed at its end, a 2-minute plan ended at step 71,
    inside the second epoch, after 1.7 minutes."""
    if free_until is None or free_until > (step // steps_per_epoch + 1) * steps_per_epoch:
        return None
    halfway = step + (free_until - step) // 2
    return halfway if halfway - step >= PLAN_TIMED_STEPS else None


def decay_retime_step(decay_start: int, total: int, last_retime: int) -> int | None:
    """The step halfway through a wsd plan's decay (from `decay_start` to `total`) at which the plan
    is re-timed once more, from the steps timed since its last re-time (at step `last_retime`); None
    where fewer than PLAN_TIMED_STEPS steps would be timed, or no step is left to plan. Without it,
    steps that slowed after the last epoch end before the decay stop the run on its clock: a
    12-minute plan here, whose steps ran about a tenth slower after its last re-time, stopped at
    step 3,124 of 3,189 with the learning rate at 12% of its peak instead of min_lr."""
    halfway = decay_start + (total - decay_start) // 2
    return halfway if halfway - last_retime >= PLAN_TIMED_STEPS and halfway < total - 1 else None


def checkpoint_steps(step: int, total: int, steps_per_epoch: int, every: int, validate_from: int,
                     checkpoint_every: int) -> set[int]:
    """The steps after `step` up to and including `total` that checkpoint at an epoch end or a
    validation: those that validate (`check_steps`), and every `checkpoint_every`-th epoch end."""
    first_end = (step // steps_per_epoch + 1) * steps_per_epoch
    ends = {end for end in range(first_end, total + 1, steps_per_epoch)
            if end // steps_per_epoch % checkpoint_every == 0}
    return check_steps(step, total, steps_per_epoch, every, validate_from) | ends


def checkpoint_interval(total: int, steps_per_epoch: int, checkpoint_seconds: float, budget_s: float) -> int:
    """Every how many epoch ends a planned run of `total` steps checkpoints where it does not
    validate: 1 (every one) where all of them fit CHECKPOINT_SHARE of the budget, else evenly
    spread, at least one. A checkpoint is what a killed run resumes from, so they keep coming
    through the run; but a paper-base one (AdamW's moments too, about 700 MB) took 1.7-2.3 s to
    hash, write and fsync on an H200, whose tatoeba epoch (38 steps) took 1.6-2.0: checkpointed at
    every epoch end, a 2-minute run there spent 48 s on them and trained 827 steps (seed 42; 950
    for seed 1), thinned to 5% 7.6 s and 1,445 (1,672). A validated epoch end checkpoints
    whatever this says: it may be the best."""
    ends = (total - 1) // steps_per_epoch
    if checkpoint_seconds <= 0 or ends <= 0:
        return 1
    affordable = max(1, math.floor(CHECKPOINT_SHARE * budget_s / checkpoint_seconds))
    return max(1, math.ceil(ends / affordable))


def first_validated_step(total: int, steps_per_epoch: int, validation_seconds: float, budget_s: float) -> int:
    """The first epoch end a planned run of `total` steps validates at: as many of its last epoch
    ends as fit VALIDATION_SHARE of the budget with the last step's validation, 0 (all) where
    they all fit. An epoch end before it still checkpoints. A validation decodes the subset to
    pick the best checkpoint; a wsd or cosine run's best is one of its last (seeds 42/1/2 at 15
    minutes: the last or the one before, of 19-21), and a young model's loops make the early ones
    the dearest: 8.0 s for the first of a 2-minute run here, 4.0 for the next, a sixth of its
    budget in all. The share keeps a 15-minute run's validations from before the decay, whose
    measured cost corrects the estimate's (a 32-sentence sample decoded to its longest reference:
    10.9 s, where they take about 4.5): at 5% only its last 3 epoch ends validated, and the run
    ended 63 s early."""
    if validation_seconds <= 0:
        return 0
    ends = math.floor(VALIDATION_SHARE * budget_s / validation_seconds) - 1
    last_end = (total - 1) // steps_per_epoch * steps_per_epoch
    if ends >= last_end // steps_per_epoch:
        return 0
    return last_end - (ends - 1) * steps_per_epoch if ends > 0 else total


def plan_run(step: int, elapsed_s: float, budget_s: float, step_seconds: float, validation_seconds: float,
             checkpoint_seconds: float, steps_per_epoch: int, validate_every: int, save_every: int,
             warmup_steps: int, warmup_fraction: float, final_seconds: float = 0.0,
             dropout: float | None = None, dropout_epochs: int = 0, first_validation_seconds: float = 0.0) -> Plan:
    """The most steps whose cost fits what is left of `budget_s` after `elapsed_s`, a margin kept:
    each remaining step at `step_seconds`, each validation still to come (those
    `first_validated_step` keeps), the checkpoints of those and of the epoch ends
    `checkpoint_interval` keeps, those of `save_every`, and
    `final_seconds` of work after the last checkpoint (the confidence fit), unless that is over
    FIT_SHARE of the budget: then the run leaves the fit out; with `first_validation_seconds`, the
    fit's estimate is scaled as the validations measured since (`fit_seconds`). Never fewer than
    `step` + 1. The warmup: the config's `warmup_steps`, at most half the run; where it is 0,
    `warmup_fraction` of the run. The dropout: `planned_dropout` of `dropout` (None: the run keeps
    its config's)."""
    left = budget_s - elapsed_s - max(MARGIN_S, MARGIN_FRACTION * budget_s)
    # A 2-minute run here counted 28.8 s for a fit (beam 5 over 500 sentences) that a model so young
    # cannot pass (every sentence below the chrF threshold): a quarter of the budget, steps not taken.
    fitting = fit_seconds(final_seconds, validation_seconds, first_validation_seconds)
    fit = fitting <= FIT_SHARE * budget_s
    after_last = fitting if fit else 0.0

    def cost(total: int) -> float:
        validate_from = first_validated_step(total, steps_per_epoch, validation_seconds, budget_s)
        validated = validations_until(step, total, steps_per_epoch, validate_every, validate_from)
        checkpoints = checkpoint_steps(step, total, steps_per_epoch, validate_every, validate_from,
                                       checkpoint_interval(total, steps_per_epoch, checkpoint_seconds, budget_s))
        saves = (total // save_every - step // save_every) if save_every else 0
        return (total - step) * step_seconds + validated * validation_seconds + \
            (len(checkpoints) + saves) * checkpoint_seconds + after_last

    low, high = step + 1, step + 1 + max(1, int(left / max(step_seconds, 1e-9)))
    # The largest total whose cost fits: cost grows with total, but for the checkpoints' spacing,
    # which can drop one or two as the run lengthens (a few seconds: at most CHECKPOINT_SHARE).
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= left:
            low = middle
        else:
            high = middle - 1
    total = low
    # Warmup steadies the first updates of a model still at its random start (Adam's moments, the
    # attention's softmax): it takes steps, whatever the run's length. Shrunk with the run (24 of a
    # planned 577), the full learning rate came too early and 5 minutes ended at a validation loss
    # of 4.04, where the fixed schedule stood at 3.26 at the same step.
    warmup = min(warmup_steps, total // 2) if warmup_steps else round(warmup_fraction * total)
    return Plan(total, warmup, steps_per_epoch, step_seconds, validation_seconds, checkpoint_seconds, step,
                budget_s, elapsed_s + cost(total), final_seconds, fit,
                None if dropout is None else planned_dropout(dropout, total / steps_per_epoch, dropout_epochs),
                first_validated_step(total, steps_per_epoch, validation_seconds, budget_s), first_validation_seconds,
                checkpoint_interval(total, steps_per_epoch, checkpoint_seconds, budget_s))


def fit_seconds(estimated_fit_seconds: float, validation_seconds: float, first_validation_seconds: float) -> float:
    """The confidence fit's time: its estimate (train.Trainer.estimated_validation_seconds, made
    with the validation's, `first_validation_seconds`) scaled as validations measured since came
    out (`validation_seconds`); unscaled without a first estimate (0), never raised. Both estimates
    decode a sample to its longest reference, in one batch: a 5-minute plan here counted 5.3 s a
    validation and 13.9 s for the fit, and measured validations took 2.1, so the fit, about 5 s,
    left 9 s of the budget unused. A 2-minute plan measures its one validation at its end, and keeps
    the estimate: a model that young loops to the limit, and its fit (16 s) is left out."""
    if first_validation_seconds <= 0:
        return estimated_fit_seconds
    return estimated_fit_seconds * min(1.0, validation_seconds / first_validation_seconds)


def planned_dropout(dropout: float, epochs: float, dropout_epochs: int) -> float:
    """`dropout`, set for runs of `dropout_epochs` epochs (a preset's epoch count), scaled down in
    proportion for a run of fewer `epochs`; never raised. Dropout trades how fast a model fits for
    how well it generalises once it sees each pair many times: the cpu preset's 0.15 was tuned for
    its 21 epochs, and a 5-minute run here has about 6. Seed 1 at 650 steps (5.8 epochs, wsd):
    dropout 0.15 ended at validation loss 3.084 and greedy BLEU 15.07, 0.05 at 2.859 and 21.55,
    0 at 2.873 and 21.48; this rule gives 0.041."""
    if dropout_epochs <= 0:
        return dropout
    return round(dropout * min(1.0, epochs / dropout_epochs), 4)


def planned_layers(num_layers: int, estimated_epochs: float, preset_epochs: int) -> int:
    """The depth a run of about `estimated_epochs` epochs trains: `num_layers`, one fewer where the
    budget fits fewer than the `preset_epochs` its depth was chosen for, the threshold under which
    planned_batch_tokens shrinks the batch. A smaller model takes more steps in the same time, and a
    short run is limited by its steps, not by what the model can hold. The cpu preset (3 + 3, 21
    epochs) on a 2-core Zen 4, planned 3 + 3 against 2 + 2 (grouped validation BLEU; test BLEU at
    beam 5, docs/quality.md): 5 minutes (about 7 epochs of 3 + 3 estimated; seeds 42 / 1 / 2), test
    +2.26 / +1.92 / -0.22 for 2 + 2, chrF2 p 0.001 each; 9 minutes (13.7-15.5 estimated; 42 / 1 /
    2), validation 32.06 / 32.07 / 32.45 for 3 + 3, 31.95 / 32.22 / 33.60 for 2 + 2, test +1.67 /
    +0.30 / +1.78, chrF2 p <= 0.02 each; 12 minutes (16.8 / 20.7 estimated; 42 / 1), validation
    33.91 / 33.25 for 3 + 3, 33.57 / 33.59 for 2 + 2, test +0.41 / -0.09 (p 0.18 / 0.35); 15 minutes
    (25.7 estimated; 42 / 1 / 2), validation 34.22 / 34.33 / 34.41 for 3 + 3, 35.59 / 34.45 / 35.01
    for 2 + 2, test -0.71 / -0.14 / +0.38, no p under 0.09. The smaller model wins where the preset's
    epochs are far from fitting and ties near them, so a run that fits them trains the preset as
    designed, the 15-minute plan among them; past 25.7 estimated epochs 2 + 2 is not measured."""
    if num_layers > 1 and preset_epochs > 0 and estimated_epochs < preset_epochs:
        return num_layers - 1
    return num_layers


def planned_width(d_model: int, d_ff: int, num_heads: int, estimated_epochs: float,
                  preset_epochs: int) -> tuple[int, int]:
    """The d_model and d_ff of a run of about `estimated_epochs` epochs: the preset's, narrowed to
    WIDTH_SHARE of them (d_model an even multiple of `num_heads`) where under a quarter of its
    `preset_epochs` fit. A narrower model takes more steps in the same time, and early in training
    more steps gain more than more width. The cpu preset on a 2-core Zen 4 (2 + 2 layers;
    grouped validation BLEU, beam 5; seeds 42 / 1 / 2): 2 minutes (1.7-3.3 epochs estimated), d_model
    192 and d_ff 384 against 256 and 512, 1,108 / 844 / 1,004 steps against 744 / 686 / 805,
    validation 25.62 / 22.40 / 23.48 against 21.99 / 21.23 / 24.14 (test +3.84 / +2.20 / +0.57, p
    0.001 / 0.001 / 0.13); 5 minutes (7.3-8.0 estimated), 30.76 / 29.78 / 29.60 against 30.84 /
    29.54 / 29.53, a tie, so a longer run keeps its width."""
    if preset_epochs <= 0 or estimated_epochs >= preset_epochs / 4:
        return d_model, d_ff
    unit = math.lcm(num_heads, 2)  # validate_config: heads of equal width, sinusoidal positions in pairs
    narrow = round(d_model * WIDTH_SHARE / unit) * unit
    if not 0 < narrow < d_model:
        return d_model, d_ff
    return narrow, round(d_ff * narrow / d_model)


def planned_batch_tokens(batch_tokens: int, estimated_epochs: float, preset_epochs: int) -> int:
    """The batch of a run of about `estimated_epochs` epochs: `batch_tokens`, set for the
    `preset_epochs` of a preset, times the square root of the share of them that fits, at least
    BATCH_FLOOR of it; never raised. Early in training a gradient's noise is small against its
    signal, so a smaller batch takes more steps from the same tokens without wasting them (the
    critical batch grows as the loss falls: McCandlish et al. 2018); a long run needs the large batch
    late. On a 2-core Zen 4, 2-minute plans (3.4 epochs estimated) with batches of 1,500 / 1,000 /
    700 / 500 tokens took 446 / 659 / 893 / 1,032 steps (seed 42) and ended at validation loss
    3.146 / 3.020 / 2.982 / 3.147, greedy BLEU 10.74 / 13.74 / 19.30 / 14.24; seed 1: 3.268 /
    3.022 / 3.166 / 3.049, BLEU 8.03 / 13.60 / 12.41 / 14.32. Under 700 a step costs more per token
    (1,032 steps of 500 against 893 of 700). This rule gives 750; the square root is a choice
    between the two ends, not a measured law."""
    if preset_epochs <= 0:
        return batch_tokens
    share = max(BATCH_FLOOR, min(1.0, math.sqrt(max(estimated_epochs, 0.0) / preset_epochs)))
    return round(batch_tokens * share)


def plan_from_dict(state: dict[str, Any] | None) -> Plan | None:
    """A checkpoint's stored plan (None: the run was not planned, or predates plans)."""
    return Plan(**state) if state else None


def timed_window(step: int) -> bool:
    """Whether optimizer step `step` (1-based, the step just finished) ends inside the timed window."""
    return PLAN_SKIP_STEPS < step <= PLAN_SKIP_STEPS + PLAN_TIMED_STEPS


def is_planning_step(step: int, steps_per_epoch: int) -> bool:
    """Whether the plan is made after optimizer step `step`: after the timed window, or at the end of
    a first epoch too short to hold it."""
    return step == min(PLAN_SKIP_STEPS + PLAN_TIMED_STEPS, max(steps_per_epoch, 1))


def window_start(steps_per_epoch: int) -> int:
    """The step after which timing starts: PLAN_SKIP_STEPS, or fewer in a very short first epoch."""
    end = min(PLAN_SKIP_STEPS + PLAN_TIMED_STEPS, max(steps_per_epoch, 1))
    return min(PLAN_SKIP_STEPS, max(end - 1, 0))


def expected_epochs(plan: Plan) -> int:
    return math.ceil(plan.total_steps / plan.steps_per_epoch)
