"""A training run planned to its clock: how many steps fit the rest of `--max_minutes`.

A fixed epoch count either leaves a fast machine's budget unused or is cut short by the clock on a
slow one, its learning rate still high; a schedule that decays to the budget's end beats one cut
short (Li et al., "Budgeted training", ICLR 2020). With `--max_minutes` and neither `--num_epochs`
nor `--max_steps` given, the run times its first steps (after a few warm-up steps, and any
compile), estimates a validation and a checkpoint, and `plan_run` fixes the run's length in steps,
and with it the learning-rate schedule (schedule.py): the warmup keeps its length in steps (at most
half the run), the decay ends at the planned step. Where the dropout is the preset's (or the
default), the plan scales it to the run's length (`planned_dropout`): a run of fewer epochs sees each
pair fewer times and needs less. What a plan sizes before the model is built (its depth, width and
batch on a CPU) is planned_size.py's.

Only the last epoch ends that fit VALIDATION_SHARE of the budget validate (`first_validated_step`);
the others checkpoint, and their validations' time goes to steps; of those, as many as fit
CHECKPOINT_SHARE of the budget, evenly spread (`checkpoint_interval`).

The invocation that planned re-times the plan from the steps and validations it measured (a dozen
steps and a young model's decoding are a small sample of a shared machine, and a GPU's first epoch
pays once for each new batch shape): at every epoch end while the learning rate does not depend on
the run's length (inverse square root; wsd until its decay), and once halfway where the run's end or
the decay comes before the next epoch end (`halfway_retime_step`); once for cosine, at the last epoch
end before its warmup ends; and a wsd plan once more halfway through its decay (`decay_retime_step`),
from the steps since its last re-time, its decay going on from the learning rate it stands at to the
new end (Schedule.anchor_for), as does any re-time whose plan's decay would have begun by then. A
plan whose kept validations all follow its decay validates the last epoch end it re-times at where
its estimate counts more than once after it, so that the re-time measures one.

`ClockPlan` is the component that does all of this for train.py: it is told when an epoch starts, a
step ends, a validation or a checkpoint is timed, and it answers when to validate and checkpoint,
whether the clock is up (its reserve keeps the last validation, checkpoint and fit inside the
budget) and whether the run has reached its end. It takes the clock and, under torchrun, the way to
agree with rank 0, whose plan every rank follows. Its state is saved in every checkpoint and
followed by a resumed run, so a resume stays bit-exact (the plan depends on the machine's speed:
two runs of one seed on different machines differ).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, NamedTuple

from nmt.diagnostics import log
from nmt.training.schedule import LearningRate, Schedule

PLAN_SKIP_STEPS = 3  # steps not timed: the first ones pay for allocation, caching and compiling
PLAN_TIMED_STEPS = 12  # steps timed; the plan is made after PLAN_SKIP_STEPS + PLAN_TIMED_STEPS steps
# Kept free of the budget for what the estimates miss (at least MARGIN_S): the last re-time is an
# epoch from the end, and the last validation's and the fit's estimates (a young model's decoding,
# run to the references' length) run long.
MARGIN_FRACTION = 0.02
MARGIN_S = 3.0
FIT_SHARE = 0.1  # of the budget: a confidence fit estimated to cost more is left out of the run
VALIDATION_SHARE = 0.1  # of the budget: what a planned run's epoch-end validations may cost
CHECKPOINT_SHARE = 0.05  # of the budget: what the checkpoints of epoch ends that do not validate may cost
# The fewest steps whose model translates at all: the cpu recipe on tatoeba at the sizes a very short
# plan chooses, trained a fixed number of steps (docs/quality.md); a plan of fewer says so.
LEARNING_STEPS = 300
SPEED_CHANGE = 1.5  # a re-time whose steps run this many times slower or faster than the plan's says so


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
    decay_from: int = 0  # re-timed in wsd's decay: the schedule's step it decays anew from; 0: not
    decay_from_lr: float = 1.0  # ... and the peak lr's multiplier at that step
    fitted: bool = True  # whether its steps fit the budget; False: the budget was spent, one step is left

    @property
    def fit_seconds(self) -> float:
        """The confidence fit's time (`plan_run`)."""
        return fit_seconds(self.final_seconds, self.validation_seconds, self.first_validation_seconds)

    @property
    def decay_anchor(self) -> tuple[int, float] | None:
        """Schedule's `decay_from`: where a decay re-timed while under way starts anew."""
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
                + (f"; expected to end {self.expected_end_s / 60:.1f} min after start" if self.fitted else
                   f"; the budget is spent: its one step, validation and checkpoint end about "
                   f"{self.expected_end_s / 60:.1f} min after start, past --max_minutes {self.budget_s / 60:g}"))

    def describe_validations(self) -> str:
        if not self.validate_from:
            return ""
        ends = self.validated_epoch_ends
        which = "the last step only" if not ends else f"the last epoch end (step {self.validate_from}) and the last " \
            "step" if ends == 1 else f"the last {ends} epoch ends (from step {self.validate_from}) and the last step"
        return f", validating {which} (validations within {VALIDATION_SHARE:.0%} of the budget)"


def plan_from_dict(state: dict[str, Any] | None) -> Plan | None:
    """A checkpoint's stored plan (None: the run was not planned, or predates plans)."""
    return Plan(**state) if state else None


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
    `free_until` (the step from which its length is fixed: Schedule.length_free_until) where that
    comes before the next epoch end, whose re-time would then be too late; None where it does not,
    or where fewer than PLAN_TIMED_STEPS steps would be timed. A GPU's first epoch, whose every batch
    is a new shape, can take many times as long a step as the next ones: a plan of a few epochs
    needs a re-time made from steady steps before its length is fixed."""
    if free_until is None or free_until > (step // steps_per_epoch + 1) * steps_per_epoch:
        return None
    halfway = step + (free_until - step) // 2
    return halfway if halfway - step >= PLAN_TIMED_STEPS else None


def decay_retime_step(decay_start: int, total: int, last_retime: int) -> int | None:
    """The step halfway through a wsd plan's decay (from `decay_start` to `total`) at which the plan
    is re-timed once more, from the steps timed since its last re-time (at step `last_retime`); None
    where fewer than PLAN_TIMED_STEPS steps would be timed, or no step is left to plan. Without it,
    steps that slow after the last epoch end before the decay (a shared machine) stop the run on its
    clock with the learning rate still far above min_lr."""
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
    through the run; but a large model's (AdamW's moments too) can take longer to hash, write and
    fsync than a short epoch on a GPU takes to train. A validated epoch end checkpoints whatever
    this says: it may be the best."""
    ends = (total - 1) // steps_per_epoch
    if checkpoint_seconds <= 0 or ends <= 0:
        return 1
    affordable = max(1, math.floor(CHECKPOINT_SHARE * budget_s / checkpoint_seconds))
    return max(1, math.ceil(ends / affordable))


def first_validated_step(total: int, steps_per_epoch: int, validation_seconds: float, budget_s: float) -> int:
    """The first epoch end a planned run of `total` steps validates at: as many of its last epoch
    ends as fit VALIDATION_SHARE of the budget with the last step's validation, 0 (all) where
    they all fit. An epoch end before it still checkpoints. A validation decodes the subset to
    pick the best checkpoint; a decaying run's best is one of its last, and a young model's loops
    make the early ones the dearest. The share keeps some validations before the decay, whose
    measured cost corrects the first estimate's."""
    if validation_seconds <= 0:
        return 0
    ends = math.floor(VALIDATION_SHARE * budget_s / validation_seconds) - 1
    last_end = (total - 1) // steps_per_epoch * steps_per_epoch
    if ends >= last_end // steps_per_epoch:
        return 0
    return last_end - (ends - 1) * steps_per_epoch if ends > 0 else total


@dataclass(frozen=True)
class Costs:
    """What a plan is made from: the seconds of a step, a validation and a checkpoint as measured or
    estimated, the confidence fit's estimate (`final_seconds`, 0 without a fit) and the first plan's
    validation estimate, which the fit's was made with (`fit_seconds`)."""

    step_seconds: float
    validation_seconds: float
    checkpoint_seconds: float
    final_seconds: float = 0.0
    first_validation_seconds: float = 0.0


@dataclass(frozen=True)
class PlanRules:
    """What a run's plans keep from its config: the budget, the epoch's steps, the steps that validate
    (`validate_every`) and checkpoint (`save_every`), the warmup (`warmup_steps`, else
    `warmup_fraction` of the run) and the dropout to scale (None: the run keeps its own) from the
    `dropout_epochs` it was set for."""

    budget_s: float
    steps_per_epoch: int
    validate_every: int = 0
    save_every: int = 0
    warmup_steps: int = 0
    warmup_fraction: float = 0.0
    dropout: float | None = None
    dropout_epochs: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any], steps_per_epoch: int, scale_dropout: bool) -> PlanRules:
        return cls(60 * config["max_minutes"], steps_per_epoch, config["validate_every_steps"],
                   config["save_every_steps"], config["warmup_steps"], config["warmup_fraction"],
                   config["dropout"] if scale_dropout else None, config["num_epochs"])


def plan_run(step: int, elapsed_s: float, rules: PlanRules, costs: Costs) -> Plan:
    """The most steps whose cost fits what is left of the budget after `elapsed_s`, a margin kept:
    each remaining step at its seconds, each validation still to come (those `first_validated_step`
    keeps), the checkpoints of those and of the epoch ends `checkpoint_interval` keeps, those of
    `save_every`, and the confidence fit after the last checkpoint, unless that is over FIT_SHARE of
    the budget: then the run leaves the fit out. Never fewer than `step` + 1. The warmup: the rules'
    `warmup_steps`, at most half the run; where it is 0, `warmup_fraction` of the run. The dropout:
    `planned_dropout` of the rules' (None: the run keeps its config's)."""
    budget_s, steps_per_epoch = rules.budget_s, rules.steps_per_epoch
    left = budget_s - elapsed_s - max(MARGIN_S, MARGIN_FRACTION * budget_s)
    # A young model's fit can cost a quarter of a short budget and pass nothing (every sentence below
    # the chrF threshold): over the share, its time goes to steps.
    fitting = fit_seconds(costs.final_seconds, costs.validation_seconds, costs.first_validation_seconds)
    fit = fitting <= FIT_SHARE * budget_s

    def cost(total: int) -> float:
        validate_from = first_validated_step(total, steps_per_epoch, costs.validation_seconds, budget_s)
        validated = validations_until(step, total, steps_per_epoch, rules.validate_every, validate_from)
        checkpoints = checkpoint_steps(step, total, steps_per_epoch, rules.validate_every, validate_from,
                                       checkpoint_interval(total, steps_per_epoch, costs.checkpoint_seconds, budget_s))
        saves = (total // rules.save_every - step // rules.save_every) if rules.save_every else 0
        return (total - step) * costs.step_seconds + validated * costs.validation_seconds + \
            (len(checkpoints) + saves) * costs.checkpoint_seconds + (fitting if fit else 0.0)

    low, high = step + 1, step + 1 + max(1, int(left / max(costs.step_seconds, 1e-9)))
    # The largest total whose cost fits: cost grows with total, but for the checkpoints' spacing,
    # which can drop one or two as the run lengthens (a few seconds: at most CHECKPOINT_SHARE).
    while low < high:
        middle = (low + high + 1) // 2
        if cost(middle) <= left:
            low = middle
        else:
            high = middle - 1
    total, fitted = low, cost(low) <= left
    # Warmup steadies the first updates of a model still at its random start (Adam's moments, the
    # attention's softmax): it takes steps, whatever the run's length; shrunk with a short run, the
    # full learning rate comes too early.
    warmup = min(rules.warmup_steps, total // 2) if rules.warmup_steps else round(rules.warmup_fraction * total)
    dropout = None if rules.dropout is None else planned_dropout(rules.dropout, total / steps_per_epoch,
                                                                  rules.dropout_epochs)
    return Plan(total_steps=total, warmup_steps=warmup, steps_per_epoch=steps_per_epoch,
                step_seconds=costs.step_seconds, validation_seconds=costs.validation_seconds,
                checkpoint_seconds=costs.checkpoint_seconds, planned_at_step=step, budget_s=budget_s,
                expected_end_s=elapsed_s + cost(total), final_seconds=costs.final_seconds, confidence_fit=fit,
                dropout=dropout, validate_from=first_validated_step(total, steps_per_epoch, costs.validation_seconds,
                                                                    budget_s),
                first_validation_seconds=costs.first_validation_seconds,
                checkpoint_every=checkpoint_interval(total, steps_per_epoch, costs.checkpoint_seconds, budget_s),
                fitted=fitted)


def budget_for(steps: int, step: int, elapsed_s: float, rules: PlanRules, costs: Costs) -> float:
    """The least --max_minutes budget, in seconds, whose plan made at `step` after `elapsed_s` holds
    `steps` steps at these costs (to a second): what a plan too short to learn names."""
    low, high = rules.budget_s, max(2 * rules.budget_s, 60.0)
    while plan_run(step, elapsed_s, replace(rules, budget_s=high), costs).total_steps < steps:
        low, high = high, 2 * high
    while high - low > 1.0:
        middle = (low + high) / 2
        if plan_run(step, elapsed_s, replace(rules, budget_s=middle), costs).total_steps < steps:
            low = middle
        else:
            high = middle
    return high


def fit_seconds(estimated_fit_seconds: float, validation_seconds: float, first_validation_seconds: float) -> float:
    """The confidence fit's time: its estimate (made with the first plan's validation estimate,
    `first_validation_seconds`) scaled as the validations measured since came out
    (`validation_seconds`); unscaled without a first estimate (0), never raised. Both estimates
    decode a sample to its longest reference, so both run long by about the same factor."""
    if first_validation_seconds <= 0:
        return estimated_fit_seconds
    return estimated_fit_seconds * min(1.0, validation_seconds / first_validation_seconds)


def planned_dropout(dropout: float, epochs: float, dropout_epochs: int) -> float:
    """`dropout`, set for runs of `dropout_epochs` epochs (a preset's epoch count), scaled down in
    proportion for a run of fewer `epochs`; never raised. Dropout trades how fast a model fits for
    how well it generalises once it sees each pair many times: a run that sees each pair a few
    times gains little from it and fits more slowly (docs/quality.md)."""
    if dropout_epochs <= 0:
        return dropout
    return round(dropout * min(1.0, epochs / dropout_epochs), 4)


class PlanMark(NamedTuple):
    """Where a plan's timing starts: the step, the clock, and the validations' and checkpoints'
    seconds and counts so far, which the steps' time leaves out."""

    step: int
    clock: float
    validation_seconds: float
    validations: int
    checkpoint_seconds: float
    checkpoints: int


class ClockPlan:
    """A run's length and its clock: planned to --max_minutes (`planning`: the plan is made once
    enough steps are timed), followed from a checkpoint's plan, or the config's epochs, and the
    clock's stop of any run with --max_minutes.

    `learning_rate` follows each plan's schedule; `set_dropout` is called with a plan's dropout
    (unless --dropout was given); `estimate` returns a validation's, the confidence fit's and a
    checkpoint's estimated seconds for the first plan; `agree` hands rank 0's value to every rank
    (torchrun) and `is_main` says whether this is rank 0, which alone plans and reads the clock for
    the stop. `writer`, once set, is rank 0's TensorBoard writer."""

    def __init__(self, config: dict[str, Any], clock: Callable[[], float], started: float, steps_per_epoch: int,
                 learning_rate: LearningRate, *, planning: bool, given: frozenset[str] = frozenset(),
                 set_dropout: Callable[[float], None] = lambda dropout: None,
                 estimate: Callable[[], tuple[float, float, float]] = lambda: (0.0, 0.0, 0.0),
                 agree: Callable[[Any], Any] = lambda value: value, is_main: bool = True) -> None:
        self.config, self.clock, self.started, self.steps_per_epoch = config, clock, started, steps_per_epoch
        self.learning_rate, self.given, self.set_dropout, self.estimate = learning_rate, given, set_dropout, estimate
        self.agree, self.is_main, self.writer = agree, is_main, None
        # A plan scales the config's dropout, unless --dropout was given; not when compiling either
        # (a new value would compile every graph again), but a resumed run follows it.
        self.rules = PlanRules.from_config(config, steps_per_epoch, "dropout" not in given and not config["compile"])
        self.planning, self.plan = planning, None
        self.step_times: list[tuple[int, float, float]] = []  # (step, clock, validation seconds so far)
        self.plan_mark: PlanMark | None = None  # where the plan's (or first re-time's) timing starts
        self.last_mark: PlanMark | None = None  # where the last plan or re-time was made: a decay re-time times from it
        self.retimed = False  # re-timed since planning: later re-times measure from the first
        self.halfway_retime: int | None = None  # a re-time between epoch ends (halfway_retime_step)
        self.decay_retime: int | None = None  # a re-time halfway through the decay (decay_retime_step)
        self.validations, self.validation_seconds, self.last_validation_seconds = 0, 0.0, 0.0  # this invocation's
        self.checkpoints, self.checkpoint_seconds = 0, 0.0  # written (or waited for) in this invocation
        self.needed_budget_s = 0.0  # where the plan fell under LEARNING_STEPS: the budget that holds them

    # ------------------------------------------------------------------ the run's length

    def epochs_left(self, epoch: int) -> bool:
        """Whether epoch `epoch` is trained: a planned run ends at its planned step, however many
        epochs that is; another at its config's epoch count."""
        return self.planning or self.plan is not None or epoch < self.config["num_epochs"]

    def reached_end(self, step: int) -> bool:
        """Whether `step` is the plan's last."""
        return self.plan is not None and step >= self.plan.total_steps

    def already_done(self, step: int, epoch: int) -> str | None:
        """Why a resumed run has nothing left to train (None: it has)."""
        config = self.config
        if config["max_steps"] and step >= config["max_steps"]:
            return f"already trained {step} steps (--max_steps {config['max_steps']}); raise --max_steps to go on"
        if self.reached_end(step):
            return (f"already trained the {self.plan.total_steps} steps of the run's plan; start a new run "
                    f"(--experiment_name) for another")
        if not self.epochs_left(epoch):
            return f"already trained {epoch} epochs; raise --num_epochs to go on"
        return None

    @property
    def ends_with_fit(self) -> bool:
        """Whether training ends with the confidence fit: with --confidence_sentences, unless the
        plan left it out (FIT_SHARE)."""
        return bool(self.config["confidence_sentences"]) and (self.plan is None or self.plan.confidence_fit)

    # ------------------------------------------------------------------ the clock

    def elapsed_minutes(self) -> float:
        return (self.clock() - self.started) / 60

    def out_of_time(self) -> bool:
        """Whether rank 0's clock, with the reserve for what a stop still does, is past --max_minutes."""
        budget = self.config["max_minutes"]
        return self.is_main and bool(budget) and self.clock() - self.started + self.reserve() >= 60 * budget

    def reserve(self) -> float:
        """The seconds a clock stop still spends after its step, kept inside --max_minutes: its
        validation (the last one's time, or before any the plan's estimate: a planned run may
        validate only at its end), its checkpoint (this invocation's mean, or the plan's estimate),
        and the confidence fit a plan keeps (steps that slow after the last re-time would otherwise
        push the fit past the budget)."""
        plan = self.plan
        validation = self.last_validation_seconds or (plan.validation_seconds if plan is not None else 0.0)
        checkpoint = self.checkpoint_seconds / self.checkpoints if self.checkpoints else \
            (plan.checkpoint_seconds if plan is not None else 0.0)
        fit = plan.fit_seconds if plan is not None and self.ends_with_fit else 0.0
        return validation + checkpoint + fit

    @contextlib.contextmanager
    def timing_validation(self) -> Iterator[None]:
        """Times a validation: its seconds are left out of the steps' and go to the plan's estimate."""
        started = self.clock()
        yield
        self.last_validation_seconds = self.clock() - started
        self.validation_seconds += self.last_validation_seconds
        self.validations += 1

    @contextlib.contextmanager
    def timing_checkpoint(self) -> Iterator[None]:
        """Times a checkpoint (or rank 0's, waited for): left out of the steps' time, as validations."""
        started = self.clock()
        yield
        self.checkpoints += 1
        self.checkpoint_seconds += self.clock() - started

    # ------------------------------------------------------------------ planning and re-timing

    def epoch_started(self, step: int) -> None:
        if self.planning:
            self.step_times.append((step, self.clock(), self.validation_seconds))

    def step_done(self, step: int, epoch_ended: bool) -> None:
        """Records the clock after a step while planning; once enough steps are timed (or the first
        epoch ends before), makes the plan: rank 0's, which every rank follows."""
        if not self.planning:
            return
        self.step_times.append((step, self.clock(), self.validation_seconds))
        if len(self.step_times) - 1 < PLAN_SKIP_STEPS + PLAN_TIMED_STEPS and not epoch_ended:
            return
        self.follow_agreed(self.first_plan(step) if self.is_main else None)
        self.plan_mark = self.last_mark = self.mark(step)
        self.schedule_halfway_retime(step)
        self.schedule_decay_retime()

    def first_plan(self, step: int) -> Plan:
        """The plan from the timed steps (the first PLAN_SKIP_STEPS left out where there are more),
        the estimated validation, fit and checkpoint, and the clock."""
        skip = min(PLAN_SKIP_STEPS, len(self.step_times) - 2)
        (first, started, validated), (last, ended, validated_end) = self.step_times[skip], self.step_times[-1]
        step_seconds = max(ended - started - (validated_end - validated), 0.0) / max(last - first, 1)
        validation_seconds, fit, checkpoint_seconds = self.estimate()
        return self.planned(step, Costs(step_seconds, validation_seconds, checkpoint_seconds, fit, validation_seconds),
                            "")

    def retime_within_epoch(self, step: int) -> bool:
        """The re-time due at `step` between epoch ends, if any (halfway_retime_step, or halfway
        through the decay); whether one was made: its checkpoint holds the plan."""
        if step == self.halfway_retime:
            self.retime(step, epoch_end=False)
            return True
        if step == self.decay_retime:
            self.retime_decay(step)
            return True
        return False

    def retime_at_epoch_end(self, step: int) -> bool:
        """The epoch end's re-time, then the decay's if it falls here; whether the decay's was made
        (its checkpoint holds the plan, though the epoch end would not checkpoint)."""
        self.retime(step)
        if step == self.decay_retime:
            self.retime_decay(step)
            return True
        return False

    def retime(self, step: int, epoch_end: bool = True) -> None:
        """The plan again from the steps and validations measured, by the invocation that planned,
        the checkpoint's and the fit's estimates kept where none was measured: at every epoch end
        while the rate does not depend on the run's length (from the first epoch's end on, which
        pays once for each new batch shape), else once, at the last epoch end before the decay
        starts; where the plan's length is fixed before the next epoch end, once more halfway there
        (`epoch_end` False). Made before a checkpoint, which holds it: a run resumed from there
        follows it bit for bit and keeps it."""
        plan, mark = self.plan, self.plan_mark
        if plan is None or mark is None or step - mark.step < PLAN_TIMED_STEPS or step >= plan.total_steps:
            return
        schedule = self.learning_rate.schedule
        again = schedule.length_free(step)
        if not again and (self.retimed or step + self.steps_per_epoch <= schedule.decay_start()):
            return
        retimed = self.measured_plan(step, mark, "re-timed ")
        if not again:
            self.plan_mark = None
        elif not self.retimed:
            self.plan_mark = self.mark(step)
        self.retimed = True
        self.follow_agreed(retimed)
        self.halfway_retime = None
        if self.plan.decay_anchor is not None:  # its decay has begun (`planned`): the last re-time
            self.end_retiming()
            return
        if epoch_end:
            self.schedule_halfway_retime(step)
        self.schedule_decay_retime()

    def retime_decay(self, step: int) -> None:
        """Halfway through a decay that can move (decay_retime_step): the plan once more from the
        steps since its last re-time, its decay going on from the rate it stands at to the new last
        step. The last re-time."""
        self.follow_agreed(self.measured_plan(step, self.last_mark, "re-timed in the decay: ", decaying=True))
        self.end_retiming()

    def end_retiming(self) -> None:
        """After a re-time whose decay starts anew from where it stands: no re-time follows it."""
        self.plan_mark = self.last_mark = self.decay_retime = None

    def measured_plan(self, step: int, mark: PlanMark, label: str, decaying: bool = False) -> Plan | None:
        """Rank 0's plan from the steps, validations and checkpoints measured since `mark`, the
        first plan's estimates where none was measured; None on the other ranks. Every rank marks
        here where a decay re-time's measurement starts (`last_mark`)."""
        self.last_mark = self.mark(step)
        if not self.is_main:
            return None
        plan = self.plan
        validated = self.validation_seconds - mark.validation_seconds
        saved = self.checkpoint_seconds - mark.checkpoint_seconds
        step_seconds = max(self.last_mark.clock - mark.clock - validated - saved, 0.0) / (step - mark.step)
        validations, checkpoints = self.validations - mark.validations, self.checkpoints - mark.checkpoints
        # The checkpoints measured replace the estimate, a serialisation in memory: writing and
        # fsyncing depend on the disk.
        return self.planned(step, Costs(step_seconds, validated / validations if validations else plan.validation_seconds,
                                        saved / checkpoints if checkpoints else plan.checkpoint_seconds,
                                        plan.final_seconds, plan.first_validation_seconds), label, decaying)

    def planned(self, step: int, costs: Costs, label: str, decaying: bool = False) -> Plan:
        """The plan for what is left of the clock from `step`, logged and recorded in TensorBoard. A
        re-timed plan whose decay is under way (`decaying`), or would have begun by now, decays from
        the rate it stands at (Schedule.anchor_for), at the schedule's step count, which skipped
        steps do not advance."""
        elapsed = self.clock() - self.started
        plan = plan_run(step, elapsed, self.rules, costs)
        if self.plan is not None:
            anchor = self.learning_rate.schedule.anchor_for(plan.total_steps, plan.warmup_steps,
                                                            self.learning_rate.steps, decaying)
            if anchor is not None:
                plan = replace(plan, decay_from=anchor[0], decay_from_lr=anchor[1])
        log(label + plan.describe())
        self.warn(plan, step, elapsed, costs)
        if self.writer is not None:
            self.writer.add_text("plan", label + plan.describe(), step)
            for name in ("total_steps", "warmup_steps", "step_seconds", "validation_seconds", "expected_end_s"):
                self.writer.add_scalar(f"plan/{name}", getattr(plan, name), step)
            if plan.dropout is not None:
                self.writer.add_scalar("plan/dropout", plan.dropout, step)
            self.writer.add_scalar("plan/epochs", plan.epochs, step)
        return plan

    def warn(self, plan: Plan, step: int, elapsed: float, costs: Costs) -> None:
        """One line where a re-time's steps run SPEED_CHANGE times slower or faster than those the
        plan was made from (another load on the machine: the plan's length follows it), and one
        where the plan falls under LEARNING_STEPS (at the first plan, and where a re-time falls
        under them), naming the budget that would hold them on this machine as measured."""
        if self.plan is not None and self.plan.step_seconds > 0:
            ratio = costs.step_seconds / self.plan.step_seconds
            if ratio >= SPEED_CHANGE or ratio <= 1 / SPEED_CHANGE:
                log(f"warning: steps now take {costs.step_seconds:.3f} s, {ratio:.2g} times the "
                    f"{self.plan.step_seconds:.3f} s the plan was made from: this machine "
                    f"{'slowed' if ratio > 1 else 'sped up'} (other work on it?); the plan now ends at step "
                    f"{plan.total_steps}")
        if plan.total_steps < LEARNING_STEPS and (self.plan is None or self.plan.total_steps >= LEARNING_STEPS):
            self.needed_budget_s = budget_for(LEARNING_STEPS, step, elapsed, self.rules, costs)
            log(self.shortfall(plan.total_steps))

    def shortfall_at_end(self, steps: int) -> str | None:
        """The warning again at the run's end, where a plan too short to learn ended with `steps`."""
        return self.shortfall(steps) if self.needed_budget_s and steps < LEARNING_STEPS else None

    def shortfall(self, steps: int) -> str:
        """The warning of a plan of `steps` steps, fewer than LEARNING_STEPS (`warn`)."""
        return (f"warning: {steps} steps are fewer than the {LEARNING_STEPS} the cpu recipe needs on tatoeba to "
                f"translate at all (docs/quality.md): the model will barely translate; at the steps measured, "
                f"--max_minutes {math.ceil(self.needed_budget_s / 6) / 10:g} holds {LEARNING_STEPS} steps on this "
                f"machine")

    def mark(self, step: int) -> PlanMark:
        return PlanMark(step, self.clock(), self.validation_seconds, self.validations, self.checkpoint_seconds,
                        self.checkpoints)

    def schedule_halfway_retime(self, step: int) -> None:
        """After the plan or an epoch end's re-time: the step between epoch ends to re-time at, if any."""
        free_until = self.learning_rate.schedule.length_free_until()
        self.halfway_retime = halfway_retime_step(step, free_until, self.steps_per_epoch)

    def schedule_decay_retime(self) -> None:
        """After the plan or a re-time: the step halfway through a decay that can move, if any."""
        schedule = self.learning_rate.schedule
        self.decay_retime = None if not schedule.decay_can_move or self.last_mark is None else decay_retime_step(
            schedule.decay_start(), schedule.total_steps, self.last_mark.step)

    def follow_agreed(self, plan: Plan | None) -> None:
        """`follow` rank 0's plan (`plan` on rank 0, None on the others), on every rank."""
        self.follow(plan_from_dict(self.agree(plan.as_dict() if plan is not None else None)))

    def follow(self, plan: Plan) -> None:
        """From here on the run's length, learning-rate schedule and dropout (unless given) are the plan's."""
        self.plan, self.planning = plan, False
        self.learning_rate.follow(Schedule.from_plan(self.config, plan))
        if plan.dropout is not None and "dropout" not in self.given:
            self.set_dropout(plan.dropout)

    # ------------------------------------------------------------------ validations and checkpoints

    def validates_epoch_end(self, step: int) -> bool:
        """Whether the epoch end at `step` validates: every one without a plan; with one, those it
        keeps (Plan.validates_epoch_end), and the last to re-time before the plan's length is fixed
        where no validation was measured yet (`last_retime_measures_a_validation`)."""
        return self.plan is None or self.plan.validates_epoch_end(step, self.config["validate_every_steps"]) or \
            self.last_retime_measures_a_validation(step)

    def checkpoints_epoch_end(self, step: int) -> bool:
        """Whether the epoch end at `step` checkpoints: every one without a plan; with one, those it keeps."""
        return self.plan is None or self.plan.checkpoints_epoch_end(step, self.config["validate_every_steps"])

    def last_retime_measures_a_validation(self, step: int) -> bool:
        """Whether this epoch end validates though the plan thins it: the last epoch end to re-time
        before the plan's length is fixed, where no validation has been measured since the plan (or
        its first re-time) and the plan counts the estimate more than one validation's worth after
        it (a validated epoch end besides the last step, or a fit that costs more than one).
        Without it the first estimate (a young model's decoding, run to the references' length)
        stands to the end, and the run ends well before its budget. The re-time after it plans the
        rest."""
        plan, mark = self.plan, self.plan_mark
        if mark is None or self.validations > mark.validations:
            return False
        if not plan.validated_epoch_ends and not (plan.confidence_fit and plan.fit_seconds > plan.validation_seconds):
            return False
        free_until = self.learning_rate.schedule.length_free_until()
        return free_until is not None and step < free_until <= step + self.steps_per_epoch

    # ------------------------------------------------------------------ a checkpoint's share

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint holds of the plan (its "plan"): None for a run that was not planned."""
        return self.plan.as_dict() if self.plan is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """A checkpoint's plan, followed from here (none: the run keeps its config's length)."""
        if (plan := plan_from_dict(state)) is not None:
            self.follow(plan)
            log(f"following the run's plan: {plan.total_steps} steps ({plan.epochs:.1f} epochs); --max_minutes "
                f"{self.config['max_minutes']:g} bounds this invocation's own clock")
