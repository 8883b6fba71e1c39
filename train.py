"""Train the Transformer: `python train.py [--preset cpu] [--key value ...]`.

A run reads top to bottom, one phase after another (`Trainer.run`):
1. `train`: the ranks of a torchrun job, the device, the run lock, then a `Trainer` (modules: nmt/training/).
2. `Trainer.start_or_resume`: the checkpoint to continue, if any (resume.py); the data and tokenizers
   (run_data.py: a text and a token store per corpus of `datasource`, cleaned, the counts by reason
   in TensorBoard); what the data decides (length_ratio, no_repeat_ngram_size), the batches
   (batch_size.py), a CPU's plan to the clock (planned_size.py); then `build`: the model, AdamW, its
   learning rate (schedule.py), the loss scaler, the clock plan and the step (cuda_graphs.py).
3. `Trainer.train_epoch`: `forward_backward` of each micro-batch (AMP, gradient accumulation);
   `optimizer_step` after the last one of each step (clipping, skipping a non-finite step, an fp16
   overflow included); then `stop_decision` (max_steps, the plan's end, max_minutes, a signal, too
   many non-finite steps in a row).
4. `Trainer.end_of_epoch`, `validate` and `save`: at the epoch ends the clock plan keeps, every
   `validate_every_steps` and when training stops, the loss and the decoding of a fixed subset of
   validation (validation.py), early stopping by `best_metric`, and a checkpoint (also every
   `save_every_steps`, and on SIGINT/SIGTERM).
5. `Trainer.finish`: the checkpoint average, the confidence calibrator, and the run's last line.
The clock plan (clock_plan.py) is told when an epoch starts, a step ends and a validation or a
checkpoint is timed, and answers when to validate, checkpoint and stop. The user's config is read,
never written: what the data, the plan or a checkpoint decides is recorded as such (`decide`), in
weights/<experiment>/config.json and in every checkpoint.

Under `torchrun --nproc_per_node N train.py ...` each rank trains on a disjoint share of every
global step (DistributedDataParallel); rank 0 writes tokenizers, checkpoints (so does a rank on each
node with a disk of its own: nodes.py), TensorBoard and the progress bar; every rank decodes its
share of validation, and rank 0 scores them. ranks.py makes the ranks fail and stop together.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from config import TRAIN, ConfigError, OneLineParser, Resolved, build_parser, parse_args, runs_dir, weights_dir
from dataset import CorpusMix, padding_waste
from model import build_model, set_dropout
from nmt.atomic_files import atomic_write_bytes
from nmt.corpora.cleaning import cleaning_scalars
from nmt.corpora.sources import DataError
from nmt.corpora.store import DATA_RECORD
from nmt.corpora.tokenizer import TokenizerError
from nmt.cpu_kernels import keep_freed_memory
from nmt.device import pick_device
from nmt.diagnostics import log
from nmt.inference.scoring import improves
from nmt.precision import allow_tf32, amp_dtype, autocast_context, grad_scaler, load_scaler_state
from nmt.training.batch_size import decide_batches
from nmt.training.checkpoint import CheckpointError, load_weights, read_manifest, save_average, save_checkpoint
from nmt.training.clock_plan import FIT_SHARE, ClockPlan
from nmt.training.cuda_graphs import training_step
from nmt.training.loss import loss_sum
from nmt.training.nodes import common_start, lock_run_folder
from nmt.training.optimizer import apply_settings, build_optimizer
from nmt.training.planned_size import PLANNED_SIZE, cpu_epoch_estimate, cpu_epoch_line, planned_size, size_records, \
    sizes_of_records, sizes_plannable
from nmt.training.ranks import GracefulStop, RankExchange, RankFailed, Ranks, RankWatch, StopRequested, join_ranks
from nmt.training.resume import batch_settings, resumed_position, take_model_from
from nmt.training.run_data import batch_plan, corpus_labels, epoch_loader, prepare_data, repeat_limit, step_seed
from nmt.training.run_lock import RunLock, RunLockError
from nmt.training.schedule import LearningRate, Schedule
from nmt.training.step import OutOfMemory, compile_for_training, out_of_memory_names
from nmt.training.validation import checkpoint_cost, fit_confidence, validation_cost, validation_metrics, \
    validation_share, validation_subset

clock = time.monotonic  # the run's clock: its plan and --max_minutes (tests plant another)


def stop_message(stop: str | None, config: dict[str, Any], step: int, epochs: float, minutes: float,
                 stale_validations: int, nonfinite_run: int) -> str:
    """The run's last line, by why it stopped (Trainer.stop_decision; None: its epochs ran out)."""
    command = " ".join(["python", "train.py", *sys.argv[1:]])
    metric = {"bleu": "BLEU", "chrf": "chrF", "loss": "loss"}[config["best_metric"]]
    return {
        None: f"finished {config['num_epochs']} epochs ({step} steps)",
        "max_steps": f"reached --max_steps {config['max_steps']}",
        "planned_end": f"finished the plan: {step} steps ({epochs:.1f} epochs) in {minutes:.1f} min",
        "max_minutes": f"reached --max_minutes {config['max_minutes']} ({step} steps)",
        "early_stopping": f"stopped early: no better validation {metric} in {stale_validations} validations",
        "signal": f"stopped at step {step}; resume with: {command}",
        "nonfinite": f"stopped after {nonfinite_run} non-finite steps in a row at step {step}; the checkpoint "
                     f"holds the last good weights (try a lower --lr or --amp off)",
    }[stop]


class Trainer:
    """One training run, phase by phase (see the module docstring). `config` is the run's config as
    the user gave it (`given`: the keys given on the command line or in --config; `preset`: the
    preset's name); `initial` is the --init_from checkpoint, whose model keys the run takes (`taken`)."""

    def __init__(self, config: dict[str, Any], device: torch.device, ranks: Ranks, started: float, *,
                 given: frozenset[str] = frozenset(), preset: str | None = None,
                 initial: dict[str, Any] | None = None, taken: dict[str, Any] | None = None,
                 keep_freed: bool = False, watch: RankWatch | None = None, plan_to_clock: bool = False,
                 folder_owner: bool = True) -> None:
        self.run_config = config  # what the user gave, resolved: read, never written
        self.config = dict(config)  # ... with what the run decided since (`decide`): what it trains with
        self.decided: dict[str, dict[str, Any]] = {}
        self.device, self.ranks, self.started, self.given, self.preset = device, ranks, started, given, preset
        self.watch, self.exchange = watch, RankExchange(ranks, watch, device)
        self.initial, self.keep_freed, self.plan_to_clock = initial, keep_freed, plan_to_clock
        self.folder_owner = folder_owner  # whether this rank writes the run's folder: rank 0, and nodes.py's
        if taken:
            self.decide(taken, f"the checkpoint --init_from {config['init_from']}")
        self.folder = weights_dir(self.config)
        # Where training is: the epoch, how many of its batches (all ranks) and steps are done.
        self.epoch = self.batches_done = self.step_in_epoch = self.global_step = 0
        self.best_value, self.stale_validations = None, 0  # of --best_metric
        self.nonfinite_run, self.saved_step, self.log_skipped = 0, -1, 0  # saved_step: this process's last
        self.size_records: dict[str, Any] = {}  # what a plan sized (planned_size.PLANNED_SIZE), for checkpoints
        self.cleaning_reports: list[dict[str, Any]] = []  # rank 0's: what cleaning removed from each corpus
        self.writer = None
        self.data_record: dict[str, Any] | None = None  # what the run trains on (store.data_record): rank 0's

    def decide(self, values: dict[str, Any], by: str) -> None:
        """Keys of the run's config that the data, a plan or a checkpoint decided, recorded as such."""
        self.config.update(values)
        self.decided.update({key: {"value": value, "by": by} for key, value in values.items()})

    def run(self) -> int:
        with GracefulStop(self.watch) as graceful:
            with graceful.at_once():  # before the first step there is nothing to save
                self.start_or_resume()
                finished = self.clock_plan.already_done(self.global_step, self.epoch)
                if finished is not None:
                    log(finished)
                    return 0
            if self.keep_freed:
                # After data preparation, whose freed heap is handed back first: kept, it would stay in
                # the process's memory for the whole run.
                keep_freed_memory()
            self.model.train()
            stop = None
            while stop is None and self.clock_plan.epochs_left(self.epoch):
                stop = self.train_epoch(graceful)
                stop = self.end_of_epoch(stop, graceful)
        return self.finish(stop)

    # ------------------------------------------------------------------ 1. start or resume

    def start_or_resume(self) -> None:
        config, ranks = self.config, self.ranks
        torch.manual_seed(config["seed"])  # the initial weights

        def adopt(state: dict[str, Any]) -> None:
            # A checkpoint's plan sized the run: it resumes with those sizes, but for what the command
            # line gives (a different size is then refused like any other model change, a different
            # batch starts the next epoch; the same keeps the record, so a later resume without it
            # still resumes).
            sizes = sizes_of_records(state)
            self.decide({key: value for key, value in sizes.items() if key not in self.given}, "the checkpoint's plan")
            self.size_records.update({record: state[record] for record, keys in PLANNED_SIZE.items()
                                      if state.get(record) and all(config[key] == sizes[key] for key in keys)})

        start = common_start(self.exchange, ranks, self.folder, config, adopt)  # every rank at the same batch
        if start.state is None and self.initial is not None:
            log(f"starting from {config['init_from']}: its weights, tokenizers and architecture, with a new "
                f"optimizer, schedule and step count")
        origin = str(start.path if start.state is not None else config["init_from"])
        data = prepare_data(config, self.folder, self.exchange, ranks.is_main, start.state or self.initial, origin,
                            start.held_out_from, self.folder_owner)
        self.text, self.tokens, self.tok_src, self.tok_tgt = data.held_out, data.tokens, data.tok_src, data.tok_tgt
        self.data_record, self.cleaning_reports = data.record, data.cleaning_reports
        self.train_ds = CorpusMix([store.dataset("train") for store in self.tokens])
        if len(self.train_ds) and not config["length_ratio"]:
            # Both sides counting [EOS]: src_lens also count [SOS], tgt_lens count one of [SOS]/[EOS].
            ratio = round(float(self.train_ds.tgt_lens.sum() / (self.train_ds.src_lens - 1).sum()), 4)
            self.decide({"length_ratio": ratio}, "the training data")
            log(f"length_ratio {ratio}: target over source tokens in the training data, what the brevity penalty "
                f"expects")
        if config["no_repeat_ngram_size"] < 0:
            self.decide({"no_repeat_ngram_size": repeat_limit(self.train_ds, config["seed"])}, "the training targets")
        self.val_ds = self.tokens[0].dataset("validation") if "validation" in self.text.splits() else None
        self.val_pairs = validation_subset(self.text.pairs("validation"), config["val_max_sentences"], config["seed"])
        if len(self.train_ds) == 0:
            raise DataError(f"no training pairs fit in --seq_len {config['seq_len']}")
        decide_batches(config, self.decide, self.given, self.device, self.exchange, ranks, self.train_ds, start.state,
                       (self.tok_src.get_vocab_size(), self.tok_tgt.get_vocab_size()))
        self.batches = batch_plan(self.train_ds, config, ranks)
        if self.plan_to_clock and start.state is None and self.initial is None and \
                sizes_plannable(config, self.given):
            self.size_to_clock()
        if self.folder_owner:
            self.folder.mkdir(parents=True, exist_ok=True)
            record = {"config": self.run_config, "given": sorted(self.given), "preset": self.preset,
                      "decided": self.decided}
            atomic_write_bytes(self.folder / "config.json", json.dumps(record, indent=1).encode("utf-8"))
            atomic_write_bytes(self.folder / DATA_RECORD, json.dumps(self.data_record, indent=1).encode("utf-8"))
        self.build(start.path, start.state, start.data_changed)
        if ranks.is_main and self.clock_plan.already_done(self.global_step, self.epoch) is None:
            self.start_logging()  # no TensorBoard run for one that trains nothing

    def size_to_clock(self) -> None:
        """Before the model is built, on a CPU, from rank 0's rough estimate of an epoch against
        num_epochs (a preset's): the sizes planned_size chooses, every rank taking rank 0's."""
        sizes = None
        if self.ranks.is_main and self.device.type == "cpu":
            config, batches, vocab = self.config, self.batches.epoch_batches(0), self.tok_tgt.get_vocab_size()
            # Each rank trains its share of the epoch's batches.
            sizes = planned_size(config, self.given, lambda sized: cpu_epoch_estimate(
                sized, batches, self.train_ds, vocab, amp_dtype(sized, self.device)) / self.ranks.world_size,
                lambda: 60 * config["max_minutes"] - (clock() - self.started))
        sizes = self.exchange.from_rank0(sizes)
        if sizes:
            self.decide(sizes, "the plan to the clock")
            self.size_records = size_records(sizes)
            if "batch_tokens" in sizes:
                self.batches = batch_plan(self.train_ds, self.config, self.ranks)

    def build(self, path: Path | None, resume: dict[str, Any] | None, data_changed: bool) -> None:
        """The model, AdamW, its learning rate and the loss scaler, from the checkpoint resumed or
        the one fine-tuned from, and the clock plan; compiled and wrapped for DDP as asked."""
        config, ranks, device = self.config, self.ranks, self.device
        self.model = self.raw_model = build_model(config, self.tok_src.get_vocab_size(),
                                                  self.tok_tgt.get_vocab_size()).to(device)
        self.optimizer = build_optimizer(self.model, config)
        self.steps_per_epoch = self.batches.steps_per_epoch(0)
        if self.steps_per_epoch == 0:
            raise DataError(f"too little training data for one step of {ranks.world_size * config['accum_steps']} "
                            f"batches")
        # A run of a fixed length: the config's; a planned one follows its plan once it is made.
        total = config["max_steps"] or config["num_epochs"] * self.steps_per_epoch
        self.learning_rate = LearningRate(self.optimizer, Schedule.from_config(config, total))
        self.autocast_dtype, self.tf32 = amp_dtype(config, device), allow_tf32(device)
        self.autocast = autocast_context(device, self.autocast_dtype, cache=config["cuda_graphs"] != "on")
        self.scaler = grad_scaler(device, self.autocast_dtype)

        def estimate() -> tuple[float, float, float]:
            return (*validation_cost(self.raw_model, self.val_ds, self.val_pairs, self.tok_src, self.tok_tgt, config,
                                     device, clock, ranks.rank, ranks.world_size),
                    checkpoint_cost(self.raw_model, self.optimizer, clock))

        self.clock_plan = ClockPlan(config, clock, self.started, self.steps_per_epoch, self.learning_rate,
                                    planning=self.plan_to_clock, given=self.given, estimate=estimate,
                                    set_dropout=lambda dropout: set_dropout(self.raw_model, dropout),
                                    agree=self.exchange.from_rank0, is_main=ranks.is_main)
        if resume is not None:
            self.restore(resume, path, data_changed)
        elif self.initial is not None:
            load_weights(self.model, self.initial["model"], Path(config["init_from"]))
        self.initial = None  # free the CPU copy of the weights
        if config["compile"]:
            self.model = compile_for_training(self.model)
        if ranks.distributed:
            self.model = DistributedDataParallel(self.model, device_ids=[device.index]
                                                 if device.type == "cuda" else None)
        self.step = training_step(self.model, self.optimizer, self.scaler, config, device)  # eager, or CUDA graphs

    def restore(self, state: dict[str, Any], path: Path, data_changed: bool) -> None:
        """Weights, the plan, optimizer, learning rate, scaler and position from a checkpoint; the
        config's optimizer settings applied, and a changed batch setting never silent
        (resume.resumed_position)."""
        load_weights(self.model, state["model"], path)
        self.clock_plan.load_state_dict(state.get("plan"))
        self.optimizer.load_state_dict(state["optimizer"])
        apply_settings(self.optimizer, self.config, state["config"])
        self.learning_rate.load_state_dict(state["scheduler"])
        if note := load_scaler_state(self.scaler, state["scaler"]):
            log(note)
        self.global_step, self.best_value, self.stale_validations = \
            state["global_step"], state["best_value"], state["stale_validations"]
        saved_metric = state["config"].get("best_metric", "bleu")
        if saved_metric != self.config["best_metric"]:
            log(f"--best_metric {saved_metric} -> {self.config['best_metric']}: early stopping counts from here")
            self.best_value, self.stale_validations = None, 0
        current = batch_settings(self.config, self.ranks.world_size, self.text.meta["key"]["cleaning"])
        self.epoch, self.batches_done, self.step_in_epoch = resumed_position(
            state["batch_settings"], current, data_changed, state["epoch"], state["batches_done"],
            state["step_in_epoch"])

    def start_logging(self) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow to import; rank 0 only
        config, ranks = self.config, self.ranks
        # purge_step drops events a killed run logged after its last checkpoint, so no step is logged twice.
        self.writer = SummaryWriter(str(runs_dir(config)),
                                    purge_step=self.global_step + 1 if self.global_step else None)
        self.clock_plan.writer = self.writer
        if self.cleaning_reports:  # at the step the run starts from: a resumed run writes its own
            for name, count in cleaning_scalars(self.cleaning_reports).items():
                self.writer.add_scalar(f"data/cleaning/{name}", count, self.global_step)
        batches = self.batches.epoch_batches(self.epoch)
        waste = padding_waste(batches, self.train_ds.src_lens, self.train_ds.tgt_lens, self.batches.shape_of)
        log(f"{len(self.train_ds)} training pairs, {self.steps_per_epoch} steps per epoch, {waste:.1%} padding, "
            f"{sum(p.numel() for p in self.raw_model.parameters()):,} parameters, device {self.device}"
            + (f", {ranks.world_size} ranks" if ranks.distributed else "")
            + (f", autocast {str(self.autocast_dtype).replace('torch.', '')}" if self.autocast_dtype else "")
            + (", TF32 matrix products" if self.tf32 else ""))
        if self.device.type == "cpu":
            log(cpu_epoch_line(cpu_epoch_estimate(config, batches, self.train_ds, self.tok_tgt.get_vocab_size(),
                                                  self.autocast_dtype)))

    # ------------------------------------------------------------------ 2. training

    def train_epoch(self, graceful: GracefulStop) -> str | None:
        """Train from the current position to the end of the epoch, or until a stop; returns the
        reason for stopping (None at the epoch's end)."""
        config, device, ranks = self.config, self.device, self.ranks
        epoch_steps = self.step_in_epoch + self.batches.steps_per_epoch(self.epoch, self.batches_done)
        loader = epoch_loader(self.train_ds, self.batches, self.epoch, self.batches_done, config, device)
        epoch_started = time.monotonic()
        progress = tqdm(total=epoch_steps, initial=self.step_in_epoch, desc=f"epoch {self.epoch}",
                        disable=not ranks.is_main, file=sys.stderr, dynamic_ncols=True)
        step_loss = torch.zeros((), device=device)
        self.log_loss, self.log_tokens, self.log_started = torch.zeros((), device=device), 0, time.monotonic()
        stop = None
        self.clock_plan.epoch_started(self.global_step)
        if ranks.is_main:
            counts = list(zip(corpus_labels(config), self.batches.corpus_pairs()))
            log(f"epoch {self.epoch}: " + ", ".join(f"corpus {name} gave {count} pairs" for name, count in counts))
            for name, count in counts if self.batches_done == 0 else []:  # not again on a resume within it
                self.writer.add_scalar(f"data/pairs/{name}", count, self.epoch)
        try:  # closed also on an error: the bar's line ends before the error's one-line message
            for index, batch in enumerate(loader):
                step_loss += self.forward_backward(batch, index)
                if index % config["accum_steps"] != config["accum_steps"] - 1:
                    continue
                signal_seen, out_of_time = self.optimizer_step(step_loss, graceful)
                step_loss = torch.zeros((), device=device)
                progress.update(1)
                self.clock_plan.step_done(self.global_step, self.step_in_epoch >= epoch_steps)
                stop = self.stop_decision(signal_seen, out_of_time)
                if stop:
                    break
                if self.step_in_epoch >= epoch_steps:
                    continue  # the epoch's end validates and saves
                retimed = self.clock_plan.retime_within_epoch(self.global_step)  # its checkpoint holds the plan
                if config["validate_every_steps"] and self.global_step % config["validate_every_steps"] == 0:
                    progress.clear()  # validation's and the checkpoint's lines start on a line of their own
                    metrics, stop = self.validate(graceful)
                    self.save(metrics)
                    if stop:
                        break
                elif retimed or config["save_every_steps"] and self.global_step % config["save_every_steps"] == 0:
                    self.save()
        finally:
            progress.close()
        if self.step_in_epoch >= epoch_steps:
            if ranks.is_main:
                log(f"epoch {self.epoch} trained in {time.monotonic() - epoch_started:.1f} s")
            self.epoch, self.batches_done, self.step_in_epoch = self.epoch + 1, 0, 0
        return stop

    def forward_backward(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
        """One micro-batch through the step (eager, or its shape's CUDA graph: cuda_graphs.py);
        gradients accumulate over the step's micro-batches. Returns its summed loss, on the device."""
        config, ranks = self.config, self.ranks
        if index % config["accum_steps"] == 0:
            torch.manual_seed(step_seed(config["seed"], ranks.rank, self.global_step))
        # Token counts stay on the host: reading them back from the device would sync.
        step_tokens, num_tokens = int(batch.pop("step_tokens")), int(batch.pop("num_tokens"))
        self.log_tokens += num_tokens
        last_micro = index % config["accum_steps"] == config["accum_steps"] - 1
        # DDP all-reduces gradients only on the last micro-batch of a step.
        sync = self.model.no_sync() if ranks.distributed and not last_micro else contextlib.nullcontext()
        with sync, out_of_memory_names(batch, self.global_step + 1, config):
            # Normalised by the whole global step's target tokens; DDP averages over ranks.
            return self.step.micro_batch(batch, ranks.world_size / step_tokens, self.loss_backward)

    def loss_backward(self, batch: dict[str, torch.Tensor], scale: float | torch.Tensor) -> torch.Tensor:
        """A micro-batch on the device: forward, label-smoothed loss, backward of it times `scale`; its sum."""
        with self.autocast:
            logits = self.model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
        summed = loss_sum(logits, batch["label"], self.config["label_smoothing"])
        del logits  # backward needs only the gradient the loss stored: free the logits
        self.scaler.scale(summed * scale).backward()
        return summed.detach()

    def optimizer_step(self, step_loss: torch.Tensor, graceful: GracefulStop) -> tuple[bool, bool]:
        """Clip, then apply the step, or skip it (weights, optimizer and learning rate untouched) when
        its loss or gradient is not finite on any rank, an fp16 overflow included; log every
        `log_every` steps. Returns whether any rank has seen a stop signal, and whether rank 0's clock
        says the time is up: every rank learns both here, in the one exchange of the step, so all
        ranks decide alike."""
        # The one device->host read of a step (on_any_rank) decides to apply it (as a captured step did).
        nonfinite, signal_seen, out_of_time = self.exchange.on_any_rank(
            self.step.check(step_loss), graceful.requested, self.clock_plan.out_of_time())
        self.step.apply(nonfinite)
        if not nonfinite:
            self.learning_rate.step()
            self.nonfinite_run = 0
            self.log_loss += step_loss
        else:
            self.nonfinite_run += 1
            self.log_skipped += 1
            log(f"step {self.global_step + 1}: non-finite loss or gradient, step skipped "
                f"({self.nonfinite_run} in a row)" + ("; the fp16 loss scale is halved" if self.scaler.is_enabled()
                                                       else ""))
        self.global_step += 1
        self.step_in_epoch += 1
        self.batches_done += self.batches.per_step
        if self.ranks.is_main and self.global_step % self.config["log_every"] == 0:
            self.log_progress()
        return signal_seen, out_of_time

    def log_progress(self) -> None:
        """TensorBoard's train/ scalars since the last time: mean loss, learning rate, tokens/s, skips."""
        elapsed = time.monotonic() - self.log_started
        scalars = {"loss": float(self.log_loss) / max(1, self.log_tokens), "lr": self.optimizer.param_groups[0]["lr"],
                   "tokens_per_second": self.log_tokens * self.ranks.world_size / max(elapsed, 1e-9),
                   "skipped_steps": self.log_skipped}
        if self.scaler.is_enabled():
            scalars["loss_scale"] = self.scaler.get_scale()
        for name, value in scalars.items():
            self.writer.add_scalar(f"train/{name}", value, self.global_step)
        self.log_loss, self.log_tokens, self.log_started = torch.zeros((), device=self.device), 0, time.monotonic()
        self.log_skipped = 0

    def stop_decision(self, signal_seen: bool, out_of_time: bool) -> str | None:
        """Why training stops after this step, if it does: from values every rank shares."""
        config = self.config
        if self.nonfinite_run >= config["max_nonfinite_steps"]:
            return "nonfinite"
        if config["max_steps"] and self.global_step >= config["max_steps"]:
            return "max_steps"
        if self.clock_plan.reached_end(self.global_step):
            return "planned_end"
        if out_of_time:
            return "max_minutes"
        if signal_seen:
            return "signal"
        return None

    # ------------------------------------------------------------------ 3. end of an epoch

    def end_of_epoch(self, stop: str | None, graceful: GracefulStop) -> str | None:
        """Validation (unless a signal or non-finite steps stopped the run: a SIGTERM abandons it, or
        the clock plan validates only later epoch ends) and a checkpoint, unless the step loop has
        just done both; returns the stop reason, which early stopping or a stop signal during
        validation may set."""
        step = self.global_step
        if self.saved_step == step:
            return stop
        metrics = None
        thinned = stop is None and not self.clock_plan.validates_epoch_end(step)
        if stop not in ("signal", "nonfinite") and not thinned:
            metrics, stop = self.validate(graceful, stop)
        if stop is None and self.clock_plan.retime_at_epoch_end(step):
            thinned = False  # the decay's re-time: its checkpoint holds the plan
        # Of the epoch ends the plan does not validate, only those that fit its share checkpoint
        # (clock_plan.checkpoint_interval); a stop always checkpoints.
        if not thinned or self.clock_plan.checkpoints_epoch_end(step):
            self.save(metrics)
        return stop

    def validate(self, graceful: GracefulStop, stop: str | None = None) -> tuple[dict[str, float] | None, str | None]:
        """Every rank decodes its share of the validation subset, rank 0 scores the shares (a
        SIGTERM abandons it on every rank) and decides early stopping by `best_metric`; returns
        the metrics (None if abandoned, and on ranks other than 0) and the stop reason."""
        metrics, ranks = None, self.ranks
        with self.clock_plan.timing_validation():
            if self.val_pairs:
                sources = list(dict.fromkeys(source for source, _ in self.val_pairs))
                try:
                    with graceful.abandoning():
                        share = validation_share(self.raw_model, self.val_ds, sources, self.tok_src, self.tok_tgt,
                                                 self.config, self.device, ranks.rank, ranks.world_size)
                        shares = self.exchange.gather_to_rank0(f"validation/{self.global_step}", share)
                        if ranks.is_main:
                            metrics = validation_metrics(shares, self.val_pairs, self.raw_model, self.tok_src,
                                                         self.tok_tgt, self.config, self.writer, self.global_step)
                except StopRequested:
                    log(f"validation at step {self.global_step} abandoned")
            metrics = self.exchange.from_rank0(metrics)  # the others wait for rank 0's scores
        if metrics is not None:
            metric = self.config["best_metric"]
            if improves(metric, metrics[metric], self.best_value):
                self.best_value, self.stale_validations = metrics[metric], 0
            else:
                self.stale_validations += 1
            patience = self.config["early_stopping_patience"]
            if patience and self.stale_validations >= patience:
                stop = "early_stopping"
        # Rank 0 scored: it decides early stopping. A stop signal seen during validation on any
        # rank stops every rank now, before another step.
        early, signal_seen = self.exchange.on_any_rank(stop == "early_stopping", graceful.requested)
        return metrics, stop or ("early_stopping" if early else "signal" if signal_seen else None)

    def save(self, metrics: dict[str, float] | None = None) -> None:
        """Rank 0 writes a checkpoint (as does a rank of each node with a folder of its own) while the
        others wait; the time it takes is counted apart from the steps' (the clock plan)."""
        with self.clock_plan.timing_checkpoint():
            if self.folder_owner:
                path = save_checkpoint(self.folder, self.state_dict(metrics), self.global_step,
                                       self.config["keep_checkpoints"], metrics, self.config["best_metric"])
                log(f"saved {path}")
            self.saved_step = self.global_step
            self.exchange.from_rank0()

    def state_dict(self, metrics: dict[str, float] | None) -> dict[str, Any]:
        """What a checkpoint holds (resume.RESUME_KEYS and more): the states of the model,
        optimizer, learning rate and scaler, the position, early stopping, the batch settings, the
        config the run trains with and what it decided, the tokenizers, the plan and what it sized,
        the metrics and the data record."""
        return {"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.learning_rate.state_dict(), "scaler": self.scaler.state_dict(),
                "epoch": self.epoch, "global_step": self.global_step, "batches_done": self.batches_done,
                "step_in_epoch": self.step_in_epoch, "best_value": self.best_value,
                "stale_validations": self.stale_validations,
                "batch_settings": batch_settings(self.config, self.ranks.world_size, self.text.meta["key"]["cleaning"]),
                "config": self.config, "decided": self.decided,
                "tokenizers": {"src": self.tok_src.to_str(), "tgt": self.tok_tgt.to_str()},
                "plan": self.clock_plan.state_dict(), "metrics": metrics or {}, "data": self.data_record,
                **{record: self.size_records.get(record) for record in PLANNED_SIZE}}

    # ------------------------------------------------------------------ 4. finishing

    def finish(self, stop: str | None) -> int:
        if self.writer is not None:
            self.writer.close()
        config, main = self.config, self.ranks.is_main
        if main and config["average_checkpoints"] > 1 and stop not in ("signal", "nonfinite"):
            try:
                path = save_average(self.folder, config["average_checkpoints"], config["average_min_gap_steps"])
                sources = read_manifest(self.folder)["checkpoints"][path.name]["averaged_from"]
                log(f"saved {path}, the average of {', '.join(sources)}, which translate.py and evaluate.py will use")
            except CheckpointError as error:
                log(f"warning: no average: {error}")
        if main and stop not in ("signal", "nonfinite"):
            if self.clock_plan.ends_with_fit:
                fit_confidence(self.folder, self.text.pairs("validation"), config, self.device)
            elif config["confidence_sentences"]:
                log(f"no confidence calibrator: the plan left the fit out ({self.clock_plan.plan.fit_seconds:.0f} s, "
                    f"over {FIT_SHARE:.0%} of --max_minutes); evaluate.py --fit_confidence fits one")
        if main:
            log(stop_message(stop, config, self.global_step, self.global_step / self.steps_per_epoch,
                             self.clock_plan.elapsed_minutes(), self.stale_validations, self.nonfinite_run))
            if note := self.clock_plan.shortfall_at_end(self.global_step):
                log(note)
        return 1 if stop == "nonfinite" else 0


def train(resolved: Resolved, started: float | None = None, keep_freed: bool = False,
          plan_to_clock: bool = False) -> int:
    """Run one training job with a resolved config (config.Resolved: the keys given, the preset's and
    its name; `keep_freed`: apply cpu_kernels.keep_freed_memory before the first step;
    `plan_to_clock`: plan the run's length to --max_minutes); the exit code."""
    started = clock() if started is None else started
    config, given = resolved.config, frozenset(resolved.given)
    initial, taken = take_model_from(config, resolved.given | resolved.preset, given)
    ranks = Ranks.from_environment()
    device = pick_device(config["device"], ranks.local_rank)
    if config["deterministic"]:
        # cuBLAS needs a fixed workspace for reproducible products; read when CUDA first runs one.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    watch = join_ranks(ranks, device, config["rank_timeout_s"])
    lock = RunLock(weights_dir({**config, **taken}))
    clean = False
    try:
        owner = lock_run_folder(lock, ranks, RankExchange(ranks, watch, device))
        code = Trainer(config, device, ranks, started, given=given, preset=resolved.preset_name, initial=initial,
                       taken=taken, keep_freed=keep_freed, watch=watch, plan_to_clock=plan_to_clock,
                       folder_owner=owner).run()
        clean = True
        return code
    except BaseException as error:
        # Posted for the other ranks, unless another rank's failure explains it.
        if watch is not None and (blamed := watch.blame(error)) is not None:
            raise blamed from None
        raise
    finally:
        lock.release()
        if watch is not None:
            watch.close(clean)


def argument_parser() -> OneLineParser:
    return build_parser(TRAIN, __doc__.splitlines()[0])


def main(argv: list[str] | None = None, command_line: bool = False) -> int:
    """train.py's entry point. `command_line` is True only when run as a program: then, and only
    then, process-wide settings (`keep_freed_memory` on CPU) are applied."""
    started = clock()
    _, resolved = parse_args(TRAIN, argv, parser=argument_parser())
    config = resolved.config
    try:
        keep_freed = command_line and config["keep_freed_memory"] and pick_device(config["device"]).type == "cpu"
        # A preset's epoch count is the plan's starting point; one given on the command line (or in
        # --config) means what it says.
        plan_to_clock = config["max_minutes"] > 0 and not {"num_epochs", "max_steps"} & resolved.given
        return train(resolved, started, keep_freed, plan_to_clock)
    except (ConfigError, DataError, CheckpointError, RunLockError, TokenizerError, OutOfMemory, RankFailed) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except KeyboardInterrupt:
        print("train.py: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(command_line=True))
