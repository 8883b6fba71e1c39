"""Train the Transformer: `python train.py [--preset cpu] [--key value ...]`.

The run reads top to bottom, one named phase after another:
1. `train`: the ranks of a torchrun job, the device, the run lock, then a `Trainer`.
2. `Trainer.start_or_resume`: which checkpoint to continue, the data (a text and a token store per
   corpus of `datasource`, store.py, which cleans the training pairs: the counts by reason in
   TensorBoard as data/cleaning/<reason>) and tokenizers, the model, optimizer, schedule and
   counters. A folder that holds checkpoints of which none can be resumed stops the run with one
   line, every file left as it is: a run never starts over unasked. So does a checkpoint above the
   resume step that checkpoints.json does not list, unless it is the newest, verifies, and is this
   run's (its writer died before recording it): then it is listed and resumed.
3. `Trainer.train_epoch`: how many pairs each corpus gives the epoch (its weight x its size: one
   line, and data/pairs/<corpus> in TensorBoard); forward and backward of each micro-batch (AMP,
   gradient accumulation); `Trainer.optimizer_step` after the last micro-batch of each step
   (clipping, skipping a non-finite step, an fp16 overflow included); then `Trainer.stop_decision`
   (max_steps, max_minutes, a signal, too many non-finite steps in a row). precision.py decides
   autocast, the loss scaler and TF32; optimizer.py builds AdamW and its learning-rate schedule.
4. `Trainer.validate`: every `validate_every_steps`, at each epoch's end and when training stops,
   the loss and the decoding of a fixed subset of validation, scored with each distinct source once
   (its references together), then early stopping by `best_metric`, and a checkpoint
   (`Trainer.end_of_epoch` at the epoch's end).
Checkpoints are also written every `save_every_steps`, and on SIGINT/SIGTERM.

Under `torchrun --nproc_per_node N train.py ...` each rank trains on a disjoint share of every
global step (DistributedDataParallel); rank 0 alone writes tokenizers, checkpoints, TensorBoard and
the progress bar; every rank decodes its share of validation, and rank 0 scores them. ranks.py makes
the ranks fail and stop together: a failure or hang on any rank ends every rank within
--rank_timeout_s (plus seconds), with one line naming it; a stop signal on any rank stops all of
them with a checkpoint, and a SIGTERM abandons a validation under way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from nmt.atomic_files import atomic_write_bytes
from nmt.training.attention_plot import attention_figure
from nmt.training.checkpoint import (CheckpointError, adopt_unlisted, check_unlisted_above, checkpoint_files, load_checkpoint,
                        load_latest, load_weights, named, read_manifest, reconcile_manifest, save_average,
                        save_checkpoint)
from nmt.corpora.cleaning import NOT_CLEANED, cleaning_changes, cleaning_scalars
from nmt.inference.confidence import CalibrationError, fit_on_pairs, save_calibrator
from config import (IDENTITY_KEYS, MODEL_KEYS, TRAIN, ConfigError, OneLineParser, build_parser, corpora, corpus_entries,
                    corpus_name, get_config, parse_args, runs_dir, validate_config, weights_dir)
from nmt.cpu_kernels import keep_freed_memory, linear
from dataset import BatchPlan, BilingualDataset, CorpusMix, MicroBatches, padding_waste
from nmt.inference.decoding import REPEAT_SHARE, REPEAT_SIZES, repeat_free_ngram_size
from nmt.diagnostics import log
from nmt.device import pick_device
from nmt.training.loss import loss_sum
from model import Transformer, build_model, set_dropout, train_flops
from nmt.training.optimizer import build_optimizer, decay_start, length_free, length_free_until, lr_factor, warmup_steps
from nmt.training.time_budget import (FIT_SHARE, PLAN_SKIP_STEPS, PLAN_TIMED_STEPS, Plan, decay_retime_step, halfway_retime_step,
                         plan_from_dict, plan_run, planned_batch_tokens, planned_layers, planned_width)
from nmt.precision import allow_tf32, amp_dtype, autocast_context, grad_scaler, load_scaler_state
from nmt.training.ranks import GracefulStop, RankFailed, Ranks, RankWatch, StopRequested, join_ranks
from nmt.training.run_lock import RunLock, RunLockError
from nmt.inference.scoring import corpus_scores, grouped_scores, improves
from nmt.corpora.sources import DataError
from nmt.corpora.store import (DATA_RECORD, TextStore, TokenStore, data_changes, data_identity, data_record, text_stores,
                   token_stores, tokenizer_sample)
from nmt.corpora.tokenizer import (EOS_ID, TokenizerError, encode_texts, load_tokenizers, save_tokenizers, tag_id,
                       tokenizer_from_json, train_tokenizers)
from nmt.inference.translator import DecodingOptions, TorchTranslator, TranslatorError


# ---------------------------------------------------------------------------- the parts of a run

clock = time.monotonic  # the run's clock: its plan and --max_minutes (tests plant another)


def cpu_epoch_estimate(config: dict[str, Any], batches: list[np.ndarray], dataset: BilingualDataset,
                       tgt_vocab: int, dtype: torch.dtype | None) -> float:
    """Roughly how many seconds one epoch takes on this CPU: the epoch's FLOPs over a share of the
    GFLOP/s of the model's own matrix product in the run's precision (`dtype`: autocast's, None for
    fp32), timed here in about a tenth of a second. Whole fp32 steps reach about half of it
    (benchmarks/bench.py); bf16 speeds the products more than the rest of a step, and the cpu
    preset's bf16 epochs on a Zen 4 reached about a third (34 s an epoch against 24 s at half)."""
    flops = sum(train_flops(len(b), int(dataset.src_lens[b].max()), int(dataset.tgt_lens[b].max()), config,
                            tgt_vocab) for b in batches)
    rows, width = 1024, config["d_model"]
    generator = torch.Generator().manual_seed(0)  # not the global RNG: that drives dropout
    x = torch.randn(rows, width, generator=generator).to(dtype or torch.float32)
    weight = torch.randn(config["d_ff"], width, generator=generator).to(dtype or torch.float32)
    product = linear if dtype is None else torch.nn.functional.linear  # autocast skips cpu_kernels' fp32 path
    product(x, weight)  # warm-up
    started, repeats = time.perf_counter(), 0
    while time.perf_counter() - started < 0.1:
        product(x, weight)
        repeats += 1
    flops_per_second = 2 * rows * width * config["d_ff"] * repeats / (time.perf_counter() - started)
    return flops / ((0.5 if dtype is None else 0.35) * flops_per_second)


def take_model_from(config: dict[str, Any], explicit: set[str], given: frozenset[str] = frozenset()) \
        -> dict[str, Any] | None:
    """For --init_from: the checkpoint's state, after copying its model keys (architecture,
    tokenizers, language pair) into `config`; an explicit option that differs is refused, except a
    preset's depth or width where the checkpoint's plan chose them (`given`: the keys the command line
    gave)."""
    if not config["init_from"]:
        return None
    path = Path(config["init_from"])
    state = load_checkpoint(path)
    # A checkpoint from before tags were reserved has none: its tokenizers reserve nothing.
    saved = {"reserved_tags": "", **state["config"]}
    missing = [key for key in MODEL_KEYS if key not in saved]
    if "tokenizers" not in state:
        missing.append("tokenizers")
    if missing:
        raise CheckpointError(f"--init_from {path} lacks {', '.join(missing)}: it was not written by this "
                              f"version's train.py")
    source = {**config, **{key: saved[key] for key in MODEL_KEYS}}
    validate_config(source)
    planned = {key for record, keys in PLANNED_SIZE.items() if state.get(record) for key in keys} - given
    for key in MODEL_KEYS:
        if key in explicit - planned and config[key] != source[key]:
            raise ConfigError(f"--{key} {config[key]!r} conflicts with --init_from {path}, whose model has "
                              f"{source[key]!r}; the architecture, tokenizers and languages come from it")
    config.update(source)
    if weights_dir(config).resolve() == path.resolve().parent:
        raise ConfigError(f"--init_from {path} is a checkpoint of this very experiment; give the fine-tuned model a "
                          f"folder of its own with --experiment_name")
    return state


# What a --max_minutes plan on a CPU may size (Trainer.plan_size): the checkpoint's record of what it
# chose, and the config keys that record covers; a key given on the command line is never planned.
PLANNED_SIZE = {"planned_layers": ("num_layers",), "planned_batch_tokens": ("batch_tokens",),
                "planned_width": ("d_model", "d_ff")}

# What a checkpoint holds for resuming: `Trainer.save` writes these keys (`Trainer.resume_value`) and
# the metrics, `Trainer.restore` reads them back, and a checkpoint that lacks one cannot be resumed.
RESUME_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "global_step", "batches_done", "step_in_epoch",
               "best_value", "stale_validations", "batch_settings", "config", "tokenizers")

# How to start over when a folder's checkpoints cannot be resumed: train.py removes none of them itself.
START_OVER = "they are left as they are; to start over, move them out of the folder or choose another --experiment_name"


def check_resumable(state: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint that cannot be resumed (an average has no optimizer state), or whose
    model, vocabulary or data split differs from the config."""
    if "optimizer" not in state:
        what = "an averaged checkpoint" if "averaged_from" in state else "a checkpoint without optimizer state"
        raise ConfigError(f"{path} is {what}, for translating, not for resuming: use it with translate.py or "
                          f"evaluate.py --checkpoint, or fine-tune from it with --init_from and a new "
                          f"--experiment_name")
    if "best_bleu" in state and "best_value" not in state:  # written before --best_metric, when the best was BLEU's
        state["best_value"] = state.pop("best_bleu") if state["best_bleu"] >= 0 else None
    missing = [key for key in RESUME_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint {path} cannot be resumed: it lacks {', '.join(missing)} (written by another "
                              f"version of train.py?)")
    saved = {**get_config(), **state["config"]}  # keys added since the checkpoint was written take their defaults
    validate_config(saved)
    # A checkpoint that records its data by content is checked by content (Trainer.check_data): the
    # same corpora under other paths resume. Their number, weights and tags are still the run's.
    by_content = "data" in state
    for key in IDENTITY_KEYS:
        if saved[key] != config[key] and not (by_content and key in DATA_PATHS):
            raise ConfigError(f"checkpoint {path} was trained with --{key} {saved[key]!r} but this run "
                              f"has {config[key]!r}; use the same options to resume, or a new --experiment_name")
    if by_content and data_layout(saved) != data_layout(config):
        raise ConfigError(f"checkpoint {path} was trained with --datasource {saved['datasource']!r}"
                          f"{''.join(f' --{key} {saved[key]!r}' for key in DATA_PATHS[1:] if saved[key])} but this "
                          f"run has other corpora, weights, tags or held-out files; use the same to resume, or a new "
                          f"--experiment_name")


# The identity keys that name data by path: a checkpoint with a data record compares their content instead.
DATA_PATHS = ("datasource", "valid_data", "test_data")
REPEAT_SAMPLE = 100_000  # training targets read to pick no_repeat_ngram_size: enough for a share


def data_layout(config: dict[str, Any]) -> tuple:
    """What a run's data is besides the corpora's content: each corpus's weight and tag, and whether
    validation and test pairs are given apart."""
    return [entry[1:] for entry in corpus_entries(config["datasource"])], bool(config["valid_data"]), \
        bool(config["test_data"])


def corpus_labels(config: dict[str, Any]) -> list[str]:
    """One name per corpus for the log and TensorBoard: its short name, numbered by its place in
    `datasource` when an earlier corpus has the same name (tatoeba, tatoeba.2)."""
    labels: list[str] = []
    for place, corpus in enumerate(corpora(config), start=1):
        name = corpus_name(corpus.source)
        labels.append(f"{name}.{place}" if name in labels else name)
    return labels


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the dropout stream of optimizer step `step` on `rank`: a function of those three
    alone, so a resumed run, on any rank, draws exactly what the unbroken run drew."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1, dtype=np.uint64)[0])


# What a training step's batches are made of: a checkpoint records them. Changing world_size or
# accum_steps regroups the same batches into steps (resumed exactly); the others change the batches.
# "cleaning" is what the text stores were built with (cleaning.cleaning_description: the rules'
# settings, the scoring models' sha256), from the first store's key.
BATCH_SETTINGS = ("world_size", "accum_steps", "batch_tokens", "seq_len", "filter_duplicates",
                  "filter_max_length_ratio", "cleaning")
OPTIMIZER_SETTINGS = ("lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps")


def compile_for_training(model: torch.nn.Module, backend: str | Any = "inductor") -> torch.nn.Module:
    """torch.compile for token-budget batches, whose every batch has its own sentence count and
    lengths: dynamic shapes from the first batch (`dynamic=True`). torch's default compiles a static
    graph first and recompiles on the next shapes, and past its recompile limit (8) runs the rest
    uncompiled. What stays specialised is whether the batch has a source mask and a batch of one
    sentence: at most four dynamo graphs per run, whatever the first batch (tests/test_compile.py);
    inductor's own guards can add compilations (docs/gpu.md)."""
    return DynamicBatches(torch.compile(model, dynamic=True, backend=backend))


class DynamicBatches(torch.nn.Module):
    """A compiled model that gives every size of its batches a symbol of its own. By default dynamo
    ties sizes that are equal in the batch it compiles for (duck sizing: a source as wide as its
    target, as many sentences as positions), and compiles again at the first batch where they
    differ. The setting is read when a graph is compiled, inside the call."""

    def __init__(self, compiled: torch.nn.Module) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return self.compiled(src, tgt, src_mask)


class OutOfMemory(RuntimeError):
    """The device ran out of memory in a step; the message names the batch and what to change."""


@contextlib.contextmanager
def out_of_memory_names(batch: dict[str, torch.Tensor], step: int, config: dict[str, Any]):
    """Turn an out-of-memory error in a step's forward or backward into one line naming the batch.
    The run stops (the last checkpoint intact) rather than skipping the batch, as fairseq can: a
    skipped batch changes what the run trains on, and an exact resume could not repeat it."""
    try:
        yield
    except torch.OutOfMemoryError:
        sentences, source = batch["encoder_input"].shape
        raise OutOfMemory(f"out of device memory at step {step}, on a batch of {sentences} sentences x {source} "
                          f"source and {batch['label'].size(1)} target positions (--batch_tokens "
                          f"{config['batch_tokens']}): lower --batch_tokens, raising --accum_steps to keep the step's "
                          f"size, and resume; the last checkpoint is intact") from None


def validation_subset(pairs: list[tuple[str, str]], cap: int, seed: int) -> list[tuple[str, str]]:
    """The validation pairs that are decoded: those of at most `cap` distinct sources (all when 0),
    drawn once with the seed, in the split's order. A source that the split repeats with several
    references comes with all of them: it is decoded once and scored against them all."""
    sources = list(dict.fromkeys(source for source, _ in pairs))
    if not cap or len(sources) <= cap:
        return list(pairs)
    chosen = {sources[i] for i in np.random.default_rng(seed).choice(len(sources), cap, replace=False)}
    return [pair for pair in pairs if pair[0] in chosen]


@torch.no_grad()
def validation_loss(model: Transformer, val_ds: BilingualDataset, config: dict[str, Any], device: torch.device,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, int]:
    """Teacher-forced cross-entropy (no smoothing) summed over every `world_size`-th batch of the
    split from `rank`'s, as a tensor on `device`, and those batches' target tokens: the count comes
    from the lengths on the host, so no batch waits on a device read."""
    total, tokens = torch.zeros((), device=device), 0
    plan = BatchPlan(val_ds, config["batch_tokens"], config["seed"])
    for indices in plan.epoch_batches(0)[rank::world_size]:
        batch = {k: v.to(device) for k, v in val_ds.collate(indices).items()}
        logits = model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
        total += loss_sum(logits, batch["label"], 0.0)
        tokens += int(val_ds.tgt_lens[indices].sum())
    return total, tokens


class UnendingModel(torch.nn.Module):
    """The model as decoding calls it (encode, decode, project), except that no sentence ends: [EOS]
    is never chosen, so a decode runs to the length it is given whatever the model writes. The plan
    times a young model's decoding with it: one that ends every sentence at its first step decodes
    in a moment what validations later decode to the references' length (scaled by the steps it
    ran, such a sample made a 15-minute plan count 74 s a validation where they took 4.3)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model.encode(src, src_mask)

    def decode(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model.decode(*args, **kwargs)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.model.project(x)
        logits[..., EOS_ID] = float("-inf")
        return logits

    def new_cache(self) -> Any:
        return self.model.new_cache()


def validation_options(config: dict[str, Any]) -> DecodingOptions:
    """How validation decodes: `val_beam_size`, never sampling, the config's penalties. The held-out
    splits are the first corpus's: in a model of several target languages, into its language."""
    return DecodingOptions.from_config(config, beam_size=config["val_beam_size"], sampling_topk=0, sampling_topp=0.0,
                                       target_lang=corpora(config)[0].lang_tgt)


@torch.no_grad()
def validation_share(model: Transformer, val_ds: BilingualDataset, sources: list[str], tok_src, tok_tgt,
                     config: dict[str, Any], device: torch.device, rank: int = 0, world_size: int = 1) -> dict[str, Any]:
    """One rank's share of a validation, as plain data for rank 0: its share of the loss, and its
    translations of every `world_size`-th of the distinct `sources`, decoded as inference decodes
    (`val_beam_size`, with the length and brevity penalties of the config)."""
    model.eval()
    total, tokens = validation_loss(model, val_ds, config, device, rank, world_size)
    translator = TorchTranslator(model, tok_src, tok_tgt, config)
    hypotheses = translator.translate_best(sources[rank::world_size], validation_options(config))
    model.train()
    return {"loss_sum": float(total), "tokens": tokens, "hypotheses": hypotheses}


def validation_metrics(shares: list[dict[str, Any]], pairs: list[tuple[str, str]], model: Transformer, tok_src,
                       tok_tgt, config: dict[str, Any], writer, global_step: int) -> dict[str, float]:
    """Rank 0's scores of the ranks' shares, logged to TensorBoard at the step and printed. BLEU and
    chrF score each distinct source once against all its references (`scoring.grouped_scores`):
    what `best_metric` and early stopping follow. Beside them, the line-by-line scores (nrefs:1),
    CER and WER, each line of a repeated source carrying that source's one translation."""
    distinct = list(dict.fromkeys(source for source, _ in pairs))
    translation = {source: shares[i % len(shares)]["hypotheses"][i // len(shares)] for i, source in enumerate(distinct)}
    sources, references = [p[0] for p in pairs], [p[1] for p in pairs]
    hypotheses = [translation[source] for source in sources]
    lines, grouped = corpus_scores(hypotheses, references), grouped_scores(sources, hypotheses, references)
    metrics = {"loss": sum(s["loss_sum"] for s in shares) / max(1, sum(s["tokens"] for s in shares)),
               "bleu": grouped["bleu"], "chrf": grouped["chrf"], "bleu_nrefs1": lines["bleu"],
               "chrf_nrefs1": lines["chrf"], "cer": lines["cer"], "wer": lines["wer"]}
    for name, value in metrics.items():
        writer.add_scalar(f"val/{name}", value, global_step)
    examples = []
    for source, reference, hypothesis in list(zip(sources, references, hypotheses))[:config["num_examples"]]:
        examples.append(f"SOURCE: {source}\nTARGET: {reference}\nOUTPUT: {hypothesis}")
    if examples:
        writer.add_text("val/examples", "\n\n".join(e.replace("\n", "  \n") for e in examples), global_step)
        attention = TorchTranslator(model, tok_src, tok_tgt, config).cross_attention(sources[0],
                                                                                     corpora(config)[0].lang_tgt)
        writer.add_figure("val/attention", attention_figure(attention), global_step)
    print(f"step {global_step}: val loss {metrics['loss']:.3f} | BLEU {metrics['bleu']:.2f} | chrF {metrics['chrf']:.2f} "
          f"on {len(distinct)} distinct sources with {len(pairs)} references | line by line: BLEU "
          f"{metrics['bleu_nrefs1']:.2f}, chrF {metrics['chrf_nrefs1']:.2f}, CER {metrics['cer']:.3f}, WER "
          f"{metrics['wer']:.3f} ({lines['bleu_signature']})", flush=True)
    for example in examples:
        print(example, flush=True)
    return metrics


def run_validation(model: Transformer, val_ds: BilingualDataset, pairs: list[tuple[str, str]], tok_src, tok_tgt,
                   config: dict[str, Any], device: torch.device, writer, global_step: int) -> dict[str, float]:
    """A whole validation in one process: `pairs` decoded (each distinct source once) and scored."""
    sources = list(dict.fromkeys(source for source, _ in pairs))
    share = validation_share(model, val_ds, sources, tok_src, tok_tgt, config, device)
    return validation_metrics([share], pairs, model, tok_src, tok_tgt, config, writer, global_step)


# ---------------------------------------------------------------------------- the run

class PlanMark(NamedTuple):
    """Where a plan's timing starts (time_budget.py): the step, the clock, and the validations' and
    checkpoints' seconds and counts so far, which the steps' time leaves out."""

    step: int
    clock: float
    validation_seconds: float
    validations: int
    checkpoint_seconds: float
    checkpoints: int


class Trainer:
    """One training run, phase by phase (see the module docstring)."""

    def __init__(self, config: dict[str, Any], device: torch.device, ranks: Ranks, started: float,
                 initial: dict[str, Any] | None = None, keep_freed: bool = False,
                 watch: RankWatch | None = None, plan_to_clock: bool = False,
                 given: frozenset[str] = frozenset()) -> None:
        self.config, self.device, self.ranks, self.started = config, device, ranks, started
        # --max_minutes without --num_epochs or --max_steps: the run's length is planned to the clock
        # after its first steps (time_budget.py), unless the checkpoint it resumes holds a plan.
        self.planning, self.run_plan = plan_to_clock, None
        # `given`: the keys the command line gave, which a plan keeps as they are.
        # A plan scales the config's dropout to the run's length, unless --dropout was given; not when
        # compiling either (a new value would compile every graph again), but a resumed run follows it.
        # On a CPU too slow for num_epochs (a preset's) it trains one layer fewer on smaller batches,
        # and far too slow a narrower model, unless --num_layers, --batch_tokens, --d_model or --d_ff
        # was given (time_budget.planned_layers, planned_batch_tokens, planned_width); a resumed run
        # keeps what it started with.
        self.given = given
        self.planned_layers: int | None = None  # the depth the plan chose; None: the config's
        self.planned_batch_tokens: int | None = None  # the batch the plan chose; None: the config's
        self.planned_width: dict[str, int] | None = None  # the d_model and d_ff the plan chose; None: the config's
        self.step_times: list[tuple[int, float, float]] = []  # (step, clock, validation seconds so far)
        self.plan_mark: PlanMark | None = None  # where the plan's (or first re-time's) timing starts
        self.retimed = False  # re-timed since planning: later re-times measure from the first
        self.halfway_retime: int | None = None  # a re-time between epoch ends (time_budget.halfway_retime_step)
        self.last_mark: PlanMark | None = None  # where the last plan or re-time was made: a decay re-time times from it
        self.decay_retime: int | None = None  # a re-time halfway through wsd's decay (time_budget.decay_retime_step)
        self.validations = 0  # in this invocation
        self.validation_seconds = 0.0
        self.checkpoints = 0  # written (or waited for) in this invocation
        self.checkpoint_seconds = 0.0
        self.watch = watch  # under torchrun: how the ranks wait on rank 0 and stop together (ranks.py)
        self.keep_freed = keep_freed  # apply cpu_kernels.keep_freed_memory once the data is ready
        self.initial = initial  # the --init_from checkpoint, if any
        self.folder = weights_dir(config)
        # Where training is: the epoch, how many of its batches (all ranks) and steps are done.
        self.epoch = self.batches_done = self.step_in_epoch = self.global_step = 0
        self.best_value, self.stale_validations = None, 0  # of --best_metric
        self.nonfinite_run, self.last_validation_seconds = 0, 0.0
        self.saved_step = -1  # the step of this process's last checkpoint
        self.log_skipped = 0  # steps skipped since the last logged step
        self.cleaning_reports: list[dict[str, Any]] = []  # rank 0's: what cleaning removed from each corpus
        self.writer = None
        self.data_record: dict[str, Any] | None = None  # what the run trains on (store.data_record): rank 0's
        self.data_changed = False  # resumed on corpora whose content changed (--data_changed keep_held_out)
        self.held_out_from: str | None = None  # the text store whose held-out splits the run keeps: rank 0's

    # ------------------------------------------------------------------ 1. start or resume

    def start_or_resume(self) -> None:
        config, ranks = self.config, self.ranks
        torch.manual_seed(config["seed"])  # the initial weights
        resume_path, resume = self.checkpoint_to_resume()
        self.data_changed = self.from_rank0(self.data_changed)  # every rank resumes at the same batch

        if resume is None and self.initial is not None:
            log(f"starting from {config['init_from']}: its weights, tokenizers and architecture, with a new "
                f"optimizer, schedule and step count")
        self.text, self.tokens, self.tok_src, self.tok_tgt = self.prepare_data(
            resume or self.initial, str(resume_path if resume is not None else config["init_from"]), self.held_out_from)
        self.train_ds = CorpusMix([store.dataset("train") for store in self.tokens])
        if not config["length_ratio"] and len(self.train_ds):
            # Both sides counting [EOS]: src_lens also count [SOS], tgt_lens count one of [SOS]/[EOS].
            config["length_ratio"] = round(float(self.train_ds.tgt_lens.sum() / (self.train_ds.src_lens - 1).sum()), 4)
            log(f"length_ratio {config['length_ratio']}: target over source tokens in the training data, what "
                f"the brevity penalty expects")
        if config["no_repeat_ngram_size"] < 0:
            config["no_repeat_ngram_size"] = self.repeat_limit()
        self.val_ds = self.tokens[0].dataset("validation") if "validation" in self.text.splits() else None
        self.val_pairs = validation_subset(self.text.pairs("validation"), config["val_max_sentences"], config["seed"])
        self.val_sources = list(dict.fromkeys(source for source, _ in self.val_pairs))
        if len(self.train_ds) == 0:
            raise DataError(f"no training pairs fit in --seq_len {config['seq_len']}")
        self.plan = self.batch_plan()
        given = self.given
        plannable = not ("num_layers" in given or config["num_layers"] == 1) or "batch_tokens" not in given or \
            not {"d_model", "d_ff"} & given
        if self.planning and resume is None and self.initial is None and plannable:
            self.plan_size()
        if ranks.is_main:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.folder / "config.json", json.dumps(config, indent=1).encode("utf-8"))
            atomic_write_bytes(self.folder / DATA_RECORD, json.dumps(self.data_record, indent=1).encode("utf-8"))

        self.model = build_model(config, self.tok_src.get_vocab_size(), self.tok_tgt.get_vocab_size()).to(self.device)
        self.raw_model = self.model
        self.optimizer = build_optimizer(self.model, config)
        steps_per_epoch = self.plan.steps_per_epoch(0)
        if steps_per_epoch == 0:
            raise DataError(f"too little training data for one step of {ranks.world_size * config['accum_steps']} "
                            f"batches")
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = config["max_steps"] or config["num_epochs"] * steps_per_epoch
        self.warmup = warmup_steps(config, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_factor(step, config, self.total_steps, self.warmup, self.decay_anchor))
        self.autocast_dtype = amp_dtype(config, self.device)
        self.tf32 = allow_tf32(self.device)
        self.scaler = grad_scaler(self.device, self.autocast_dtype)
        if resume is not None:
            self.restore(resume, resume_path)
        elif self.initial is not None:
            load_weights(self.model, self.initial["model"], Path(config["init_from"]))
        del resume, self.initial  # free the CPU copies of the weights

        if config["compile"]:
            self.model = compile_for_training(self.model)
        if ranks.distributed:
            self.model = DistributedDataParallel(self.model, device_ids=[self.device.index]
                                                 if self.device.type == "cuda" else None)
        if ranks.is_main and self.finished_already() is None:  # no TensorBoard run for one that trains nothing
            self.start_logging(steps_per_epoch)

    def batch_plan(self) -> BatchPlan:
        """This rank's batches of every epoch, from the config's batch settings."""
        config, ranks = self.config, self.ranks
        return BatchPlan(self.train_ds, config["batch_tokens"], config["seed"], ranks.world_size, ranks.rank,
                         config["accum_steps"], [corpus.weight for corpus in corpora(config)])

    def plan_size(self) -> None:
        """Before the model is built, on a CPU, from rank 0's rough estimate of an epoch
        (cpu_epoch_estimate) against num_epochs (a preset's, set for its size and batch): a narrower
        model when under a quarter of them fit the budget, then, from the estimate of the model that
        trains, one layer fewer and smaller batches when fewer than all of them fit
        (time_budget.planned_width, planned_layers, planned_batch_tokens); what was given is kept."""
        config = self.config
        size = None
        if self.ranks.is_main and self.device.type == "cpu":
            width = config["d_model"], config["d_ff"]
            epochs, epoch_seconds = self.estimated_epochs(config)
            if not {"d_model", "d_ff"} & self.given:
                width = planned_width(*width, config["num_heads"], epochs, config["num_epochs"])
            changes = []
            if width != (config["d_model"], config["d_ff"]):
                changes.append(f"d_model {width[0]} and d_ff {width[1]} instead of {config['d_model']} and "
                               f"{config['d_ff']} (about {epochs:.1f} epochs at {epoch_seconds:.0f} s an epoch)")
                epochs, epoch_seconds = self.estimated_epochs({**config, "d_model": width[0], "d_ff": width[1]})
            layers, batch = config["num_layers"], config["batch_tokens"]
            if "num_layers" not in self.given:
                layers = planned_layers(layers, epochs, config["num_epochs"])
            if "batch_tokens" not in self.given:
                batch = planned_batch_tokens(batch, epochs, config["num_epochs"])
            if layers != config["num_layers"]:
                changes.append(f"{layers} + {layers} layers instead of {config['num_layers']} + {config['num_layers']}")
            if batch != config["batch_tokens"]:
                changes.append(f"batches of {batch} tokens instead of {config['batch_tokens']}")
            if changes:
                log(f"plan: about {epochs:.1f} epochs fit --max_minutes {config['max_minutes']:g} at "
                    f"{epoch_seconds:.0f} s an epoch, of num_epochs {config['num_epochs']}: {' and '.join(changes)} "
                    f"(--num_layers, --batch_tokens, --d_model, --d_ff keep theirs)")
            size = layers, batch, *width
        size = self.from_rank0(size)
        if size is not None and size[0] != config["num_layers"]:
            config["num_layers"] = self.planned_layers = size[0]
        if size is not None and size[1] != config["batch_tokens"]:
            config["batch_tokens"] = self.planned_batch_tokens = size[1]
            self.plan = self.batch_plan()
        if size is not None and tuple(size[2:]) != (config["d_model"], config["d_ff"]):
            self.planned_width = {"d_model": size[2], "d_ff": size[3]}
            config.update(self.planned_width)

    def estimated_epochs(self, config: dict[str, Any]) -> tuple[float, float]:
        """How many epochs of the model `config` describes fit the rest of --max_minutes, and an
        epoch's seconds (cpu_epoch_estimate; it counts the epoch's batches of every rank, and each
        rank trains its share)."""
        epoch_seconds = cpu_epoch_estimate(config, self.plan.epoch_batches(0), self.train_ds,
                                           self.tok_tgt.get_vocab_size(), amp_dtype(config, self.device)) / \
            self.ranks.world_size
        return (60 * config["max_minutes"] - (clock() - self.started)) / max(epoch_seconds, 1e-9), epoch_seconds

    def adopt_planned_size(self, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint of a run whose plan chose its size or batch resumes with them, but for what
        the command line gives (a different size is then refused like any other model change, a
        different batch starts the next epoch; the same keeps the record, so a later resume without
        it still resumes)."""
        for attribute, keys in PLANNED_SIZE.items():
            if planned := state.get(attribute):
                values = planned if isinstance(planned, dict) else {keys[0]: planned}
                self.config.update({name: value for name, value in values.items() if name not in self.given})
                if all(self.config[name] == value for name, value in values.items()):
                    setattr(self, attribute, planned)
        return state

    def repeat_limit(self) -> int:
        """The n-gram size the model's decoders never repeat (no_repeat_ngram_size -1), picked from
        the training targets, a seeded sample of REPEAT_SAMPLE where there are more; the same on every
        rank, and stored with the config in every checkpoint."""
        indices = np.arange(len(self.train_ds))
        if len(indices) > REPEAT_SAMPLE:
            indices = np.random.default_rng(self.config["seed"]).choice(indices, REPEAT_SAMPLE, replace=False)
        limit = repeat_free_ngram_size([self.train_ds[int(i)][1].tolist() for i in indices])
        log(f"no_repeat_ngram_size {limit}: " + (
            f"the smallest n-gram size from 3 that under {REPEAT_SHARE:.0%} of the training targets repeat, which "
            f"decoding will not" if limit else f"every n-gram size up to {REPEAT_SIZES[-1]} repeats in "
            f"{REPEAT_SHARE:.0%} of the training targets or more: decoding bans no repeat"))
        return limit

    def checkpoint_to_resume(self) -> tuple[Path | None, dict[str, Any] | None]:
        """The checkpoint `preload` names (latest: the newest good one, first listed if the run died
        before recording it: `adopt_unlisted`), checked against the config. A new run starts only in
        a folder without checkpoints: one whose checkpoints are all unusable stops the run,
        everything in it left as it is; so does an unlisted checkpoint above the resume step, which
        the run could not replace on reaching it. Once the run goes on, checkpoints.json forgets the
        checkpoints moved out of the folder (as the advice for damaged ones says): they count for
        nothing. A run that stops here changes no file."""
        config = self.config
        path, state = None, None
        if config["preload"] == "latest":
            found = adopt_unlisted(self.folder, config,
                                   lambda unlisted, where: check_resumable(self.adopt_planned_size(unlisted),
                                                                           config, where))
            try:
                found = found or load_latest(self.folder)
            except CheckpointError as error:
                raise CheckpointError(f"{error}; {START_OVER}") from None
            if found:
                path, state = found
            elif averages := checkpoint_files(self.folder):
                raise CheckpointError(f"{self.folder} holds {named(averages)} but no checkpoint to resume (an average "
                                      f"has no optimizer state); {START_OVER}")
        elif config["preload"] == "new":
            if checkpoint_files(self.folder):
                raise ConfigError(f"{self.folder} already holds checkpoints; resume them with --preload latest, or "
                                  f"start a new run with another --experiment_name")
        else:
            path = Path(config["preload"])
            state = load_checkpoint(path)
        if state is not None:
            check_resumable(self.adopt_planned_size(state), config, path)
            check_unlisted_above(self.folder, state["global_step"])
            if self.ranks.is_main:
                self.held_out_from = self.check_data(state, path)
            log(f"resuming from {path} (epoch {state['epoch']}, step {state['global_step']})")
        if self.ranks.is_main and (note := reconcile_manifest(self.folder, config["best_metric"])):
            log(note)
        return path, state

    def check_data(self, state: dict[str, Any], path: Path) -> str | None:
        """Rank 0, before resuming: the corpora, by content, against what the checkpoint records. A
        corpus whose content changed stops the run with one line, unless --data_changed keep_held_out:
        then it goes on on the new content with the run's validation and test splits as they were.
        Returns the name of the text store that holds those (also when an earlier resume kept them).
        A corpus that only moved resumes, with a line."""
        saved = state.get("data")
        if saved is None:
            log(f"{path} records no identity of its data (written before checkpoints did): its corpora are not "
                f"checked")
            return None
        current = data_identity(self.config)
        moved = [f"{was['source']} -> {now['source']}" for was, now in zip(saved["corpora"], current["corpora"])
                 if was["source"] != now["source"]]
        if not (changes := data_changes(saved, current)):
            if moved:
                log(f"the corpora moved ({', '.join(moved)}) with the same content: resuming")
            return saved.get("held_out_from")
        if self.config["data_changed"] != "keep_held_out":
            raise DataError(f"{changes[0]} when {path} was written: resuming would train on pairs it was not told "
                            f"about and carve its validation and test anew, from pairs it has trained on; start a new "
                            f"run (--experiment_name NAME, or also --init_from {path} to start from this model), or go "
                            f"on with --data_changed keep_held_out, which keeps the run's validation and test splits")
        kept = saved.get("held_out_from") or saved["stores"][0]
        self.data_changed = True
        log(f"{'; '.join(changes)}: going on with it (--data_changed keep_held_out), validating and testing on the "
            f"run's held-out splits as they were, from the data store {kept}")
        return kept

    def prepare_data(self, checkpoint: dict[str, Any] | None, origin: str,
                     held_out_from: str | None = None) -> tuple[TextStore, list[TokenStore], Any, Any]:
        """The held-out (first corpus's) text store, every corpus's token store, and the tokenizers.
        Rank 0 opens or builds the stores (store.py; the held-out splits of the store `held_out_from`
        when given) and, for a new run, trains the tokenizers on a sample of all the corpora's training
        pairs, reserving the run's tags, and saves them; the other ranks wait, then map the same files.
        A resumed or fine-tuned run's tokenizers come from its checkpoint (`origin`), which must hold
        every corpus's tag. Rank 0 also records what the run trains on (`data_record`)."""
        config, ranks = self.config, self.ranks
        if checkpoint is not None:
            tok_src = tokenizer_from_json(checkpoint["tokenizers"]["src"])
            tok_tgt = tokenizer_from_json(checkpoint["tokenizers"]["tgt"])
            for corpus in corpora(config):
                if corpus.tag:
                    tag_id(tok_src, corpus.tag, origin)
        folders: list[str | None] = [None] * (1 + len(corpora(config)))
        if ranks.is_main:
            texts = text_stores(config, held_out_from)
            self.data_record = data_record(config, texts, held_out_from)
            if checkpoint is None:
                tok_src, tok_tgt = train_tokenizers(config, lambda: tokenizer_sample(config, texts))
                save_tokenizers(self.folder, config, tok_src, tok_tgt)
                sample = min(sum(text.size("train") for text in texts), config["tokenizer_max_sentences"])
                log(f"trained {config['tokenizer_type']} tokenizers on {sample} training pairs: "
                    f"{tok_src.get_vocab_size()} source and {tok_tgt.get_vocab_size()} target entries")
            tokens = token_stores(config, texts, tok_src, tok_tgt)
            held_out = texts[0]
            self.cleaning_reports = [report for text in texts if (report := text.cleaning()) is not None]
            folders = [str(held_out.folder), *(str(store.folder) for store in tokens)]
        folders = self.from_rank0(folders)  # the other ranks wait here while rank 0 builds
        if not ranks.is_main:
            held_out = TextStore.open(folders[0], verify=False)
            tokens = [TokenStore.open(folder, verify=False) for folder in folders[1:]]
            if checkpoint is None:
                tok_src, tok_tgt = load_tokenizers(self.folder, config)
        return held_out, tokens, tok_src, tok_tgt

    def restore(self, state: dict[str, Any], path: Path) -> None:
        """Weights, optimizer, schedule and position from a checkpoint. Optimizer settings changed
        since then are applied, and a changed batch setting is never silent: world_size and
        accum_steps regroup the same batches, so training resumes at the very next batch; other
        changes (the corpora's content too, with --data_changed keep_held_out) make other batches,
        so it resumes at the start of the next epoch."""
        load_weights(self.model, state["model"], path)
        if (plan := plan_from_dict(state.get("plan"))) is not None:
            self.follow(plan)
            log(f"following the run's plan: {plan.total_steps} steps ({plan.epochs:.1f} epochs); --max_minutes "
                f"{self.config['max_minutes']:g} bounds this invocation's own clock")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if note := load_scaler_state(self.scaler, state["scaler"]):
            log(note)
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.batches_done, self.step_in_epoch = state["batches_done"], state["step_in_epoch"]
        self.best_value, self.stale_validations = state["best_value"], state["stale_validations"]
        saved_metric = state["config"].get("best_metric", "bleu")
        if saved_metric != self.config["best_metric"]:
            log(f"--best_metric {saved_metric} -> {self.config['best_metric']}: early stopping counts from here")
            self.best_value, self.stale_validations = None, 0
        self.apply_optimizer_settings(state["config"])
        saved, current = {"cleaning": NOT_CLEANED, **state["batch_settings"]}, self.batch_settings()
        changed = [key for key in BATCH_SETTINGS if saved[key] != current[key]]
        described = ", ".join([f"cleaning: {cleaning_changes(saved[key], current[key])}" if key == "cleaning"
                               else f"--{key} {saved[key]} -> {current[key]}" for key in changed]
                              + ["the corpora's content"] * self.data_changed)
        changed += ["data"] * self.data_changed  # other pairs make other batches, like a changed batch setting
        if not changed or not self.batches_done:
            if changed:
                log(f"resuming at the start of epoch {self.epoch} with changed batch settings ({described})")
        elif set(changed) <= {"world_size", "accum_steps"}:
            log(f"resuming at batch {self.batches_done} of epoch {self.epoch}, now "
                f"{current['world_size'] * current['accum_steps']} batches per step ({described}): "
                f"no batch is skipped or repeated")
        else:
            log(f"warning: {described} since the checkpoint changes this epoch's batches; the rest of epoch "
                f"{self.epoch} is skipped and training resumes at the start of epoch {self.epoch + 1}")
            self.epoch, self.batches_done, self.step_in_epoch = self.epoch + 1, 0, 0

    def batch_settings(self) -> dict[str, Any]:
        """BATCH_SETTINGS' values: the config's, the world size, and the text stores' cleaning."""
        special = {"world_size": self.ranks.world_size, "cleaning": self.text.meta["key"]["cleaning"]}
        return {key: special[key] if key in special else self.config[key] for key in BATCH_SETTINGS}

    def apply_optimizer_settings(self, saved: dict[str, Any]) -> None:
        """The optimizer state brings back the learning rate, weight decay and Adam's betas and eps it
        was saved with; the config's values replace them here, so that what runs is what the config
        (stored in the next checkpoint) says."""
        config = self.config
        for group, decay in zip(self.optimizer.param_groups, (config["weight_decay"], 0.0)):
            group.update(betas=(config["adam_beta1"], config["adam_beta2"]), eps=config["adam_eps"],
                         weight_decay=decay, initial_lr=config["lr"])
            group["lr"] = config["lr"] * lr_factor(self.scheduler.last_epoch, config, self.total_steps, self.warmup,
                                                   self.decay_anchor)
        self.scheduler.base_lrs = [config["lr"]] * len(self.optimizer.param_groups)
        changed = [f"--{key} {saved[key]} -> {config[key]}" for key in OPTIMIZER_SETTINGS if saved[key] != config[key]]
        if changed:
            log(f"resuming with changed optimizer settings, applied from here on: {', '.join(changed)}")

    def start_logging(self, steps_per_epoch: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow to import; rank 0 only
        config, ranks = self.config, self.ranks
        # purge_step drops events a killed run logged after its last checkpoint, so no step is logged twice.
        self.writer = SummaryWriter(str(runs_dir(config)),
                                    purge_step=self.global_step + 1 if self.global_step else None)
        if self.cleaning_reports:  # at the step the run starts from: a resumed run writes its own
            for name, count in cleaning_scalars(self.cleaning_reports).items():
                self.writer.add_scalar(f"data/cleaning/{name}", count, self.global_step)
        batches = self.plan.epoch_batches(self.epoch)
        waste = padding_waste(batches, self.train_ds.src_lens, self.train_ds.tgt_lens)
        log(f"{len(self.train_ds)} training pairs, {steps_per_epoch} steps per epoch, {waste:.1%} padding, "
            f"{sum(p.numel() for p in self.raw_model.parameters()):,} parameters, device {self.device}"
            + (f", {ranks.world_size} ranks" if ranks.distributed else "")
            + (f", autocast {str(self.autocast_dtype).replace('torch.', '')}" if self.autocast_dtype else "")
            + (", TF32 matrix products" if self.tf32 else ""))
        if self.device.type == "cpu":
            minutes = cpu_epoch_estimate(config, batches, self.train_ds, self.tok_tgt.get_vocab_size(),
                                         self.autocast_dtype) / 60
            hint = ("; --preset cpu trains a small model in minutes" if minutes > 10 else "")
            log(f"no GPU: one epoch will take roughly {minutes:.0f} min on this CPU{hint}"
                if minutes >= 1 else f"no GPU: one epoch will take roughly {minutes * 60:.0f} s on this CPU")

    # ------------------------------------------------------------------ 2. training

    def run(self) -> int:
        with GracefulStop(self.watch) as graceful:
            with graceful.at_once():  # before the first step there is nothing to save
                self.start_or_resume()
                finished = self.finished_already()
                if finished is not None:
                    log(finished)
                    return 0
            if self.keep_freed:
                # After data preparation, whose freed heap is handed back first: kept, it would stay in
                # the process's memory for the whole run (at 1M pairs, tiny preset: RSS 0.82 GB after the
                # text store with the setting from start-up, 0.67 GB without).
                keep_freed_memory()
            config = self.config
            self.model.train()
            stop = None
            # A planned run ends at its planned step, however many epochs that is.
            while (self.planning or self.run_plan is not None or self.epoch < config["num_epochs"]) and stop is None:
                stop = self.train_epoch(graceful)
                stop = self.end_of_epoch(stop, graceful)
        return self.finish(stop)

    def finished_already(self) -> str | None:
        """Why a resumed run has nothing left to train (None: it has)."""
        config = self.config
        if config["max_steps"] and self.global_step >= config["max_steps"]:
            return (f"already trained {self.global_step} steps (--max_steps {config['max_steps']}); raise "
                    f"--max_steps to go on")
        if self.run_plan is not None and self.global_step >= self.run_plan.total_steps:
            return (f"already trained the {self.run_plan.total_steps} steps of the run's plan; start a new run "
                    f"(--experiment_name) for another")
        if self.run_plan is None and not self.planning and self.epoch >= config["num_epochs"]:
            return f"already trained {self.epoch} epochs; raise --num_epochs to go on"
        return None

    def train_epoch(self, graceful: GracefulStop) -> str | None:
        """Train from the current position to the end of the epoch, or until a stop; returns the
        reason for stopping (None at the epoch's end)."""
        config, device, ranks = self.config, self.device, self.ranks
        epoch_steps = self.step_in_epoch + self.plan.steps_per_epoch(self.epoch, self.batches_done)
        workers = config["num_workers"] if config["num_workers"] >= 0 else (2 if device.type == "cuda" else 0)
        # Its own generator: a loader draws worker seeds from the global RNG otherwise, which
        # would shift the dropout stream of a run resumed mid-epoch.
        micro_batches = MicroBatches(self.train_ds, self.plan.micro_batches(self.epoch, self.batches_done))
        loader = DataLoader(micro_batches,
                            batch_size=None, shuffle=False, num_workers=workers, pin_memory=device.type == "cuda",
                            generator=torch.Generator().manual_seed(config["seed"] + self.epoch))
        autocast = autocast_context(device, self.autocast_dtype)
        epoch_started = time.monotonic()
        progress = tqdm(total=epoch_steps, initial=self.step_in_epoch, desc=f"epoch {self.epoch}",
                        disable=not ranks.is_main, file=sys.stderr, dynamic_ncols=True)
        step_loss = torch.zeros((), device=device)
        self.log_loss, self.log_tokens, self.log_started = torch.zeros((), device=device), 0, time.monotonic()
        stop = None
        if self.planning:
            self.step_times.append((self.global_step, clock(), self.validation_seconds))
        if ranks.is_main:
            self.log_corpus_pairs()
        # Closed also on an error: the bar's line ends before the error's one-line message.
        try:
            for index, batch in enumerate(loader):
                if index % config["accum_steps"] == 0:
                    torch.manual_seed(step_seed(config["seed"], ranks.rank, self.global_step))
                # Token counts stay on the host: reading them back from the device would sync.
                step_tokens, num_tokens = int(batch.pop("step_tokens")), int(batch.pop("num_tokens"))
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                last_micro = index % config["accum_steps"] == config["accum_steps"] - 1
                # DDP all-reduces gradients only on the last micro-batch of a step.
                sync = self.model.no_sync() if ranks.distributed and not last_micro else contextlib.nullcontext()
                with sync, out_of_memory_names(batch, self.global_step + 1, config):
                    with autocast:
                        logits = self.model(batch["encoder_input"], batch["decoder_input"], batch.get("src_mask"))
                    summed = loss_sum(logits, batch["label"], config["label_smoothing"])
                    del logits  # backward needs only the gradient the loss stored: free the logits
                    # Normalised by the whole global step's target tokens; DDP averages over ranks.
                    self.scaler.scale(summed * (ranks.world_size / step_tokens)).backward()
                step_loss += summed.detach()
                self.log_tokens += num_tokens
                if not last_micro:
                    continue
                signal_seen, out_of_time = self.optimizer_step(step_loss, graceful)
                step_loss = torch.zeros((), device=device)
                progress.update(1)
                if self.planning:
                    self.time_step(epoch_steps)
                stop = self.stop_decision(signal_seen, out_of_time)
                if stop:
                    break
                if self.step_in_epoch >= epoch_steps:
                    continue  # the epoch's end validates and saves
                halfway = self.global_step == self.halfway_retime
                in_decay = self.global_step == self.decay_retime
                if halfway:
                    progress.clear()
                    self.retime(epoch_end=False)  # the checkpoint below holds the plan
                elif in_decay:
                    progress.clear()
                    self.retime_decay()  # ... and this one's (at an epoch end: end_of_epoch)
                if config["validate_every_steps"] and self.global_step % config["validate_every_steps"] == 0:
                    progress.clear()  # validation's and the checkpoint's lines start on a line of their own
                    metrics, stop = self.validate(graceful)
                    self.save(metrics)
                    if stop:
                        break
                elif halfway or in_decay or \
                        config["save_every_steps"] and self.global_step % config["save_every_steps"] == 0:
                    self.save()
        finally:
            progress.close()
        if self.step_in_epoch >= epoch_steps:
            if ranks.is_main:
                log(f"epoch {self.epoch} trained in {time.monotonic() - epoch_started:.1f} s")
            self.epoch, self.batches_done, self.step_in_epoch = self.epoch + 1, 0, 0
        return stop

    def log_corpus_pairs(self) -> None:
        """How many pairs each corpus gives this epoch: one line, and the TensorBoard scalars
        data/pairs/<corpus> at the epoch (written when the epoch starts, not again on a resume within it)."""
        counts = list(zip(corpus_labels(self.config), self.plan.corpus_pairs()))
        log(f"epoch {self.epoch}: " + ", ".join(f"corpus {name} gave {count} pairs" for name, count in counts))
        if self.batches_done == 0:
            for name, count in counts:
                self.writer.add_scalar(f"data/pairs/{name}", count, self.epoch)

    def optimizer_step(self, step_loss: torch.Tensor, graceful: GracefulStop) -> tuple[bool, bool]:
        """Clip, then apply the step, or skip it (weights, optimizer and schedule untouched) when its
        loss or gradient is not finite on any rank, an fp16 overflow included; log every `log_every`
        steps. Returns whether any rank has seen a stop signal, and whether rank 0's clock says the
        time is up: every rank learns both here, in the one exchange of the step, so all ranks
        decide alike."""
        config = self.config
        self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), config["clip_grad"] or float("inf"))
        # The one device->host read of a step (in on_any_rank): whether the step is usable decides
        # whether to apply it. A non-finite gradient norm is exactly the fp16 scaler's overflow (its
        # found_inf), so the step is applied with optimizer.step(): scaler.step() would read found_inf
        # back a second time.
        nonfinite = ~(torch.isfinite(step_loss) & torch.isfinite(grad_norm))
        out_of_time = self.ranks.is_main and bool(config["max_minutes"]) and \
            clock() - self.started + self.stop_reserve() >= 60 * config["max_minutes"]
        nonfinite, signal_seen, out_of_time = self.on_any_rank(nonfinite, graceful.requested, out_of_time)
        if not nonfinite:
            self.optimizer.step()
            self.scheduler.step()
            self.nonfinite_run = 0
            self.log_loss += step_loss
        else:
            self.nonfinite_run += 1
            self.log_skipped += 1
            log(f"step {self.global_step + 1}: non-finite loss or gradient, step skipped "
                f"({self.nonfinite_run} in a row)" + ("; the fp16 loss scale is halved" if self.scaler.is_enabled()
                                                       else ""))
        self.scaler.update()  # on the device: halves the scale after an overflow
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        self.step_in_epoch += 1
        self.batches_done += self.plan.per_step
        if self.ranks.is_main and self.global_step % config["log_every"] == 0:
            elapsed = time.monotonic() - self.log_started
            tokens_per_second = self.log_tokens * self.ranks.world_size / max(elapsed, 1e-9)
            mean_loss = float(self.log_loss) / max(1, self.log_tokens)
            lr = self.optimizer.param_groups[0]["lr"]
            self.writer.add_scalar("train/loss", mean_loss, self.global_step)
            self.writer.add_scalar("train/lr", lr, self.global_step)
            self.writer.add_scalar("train/tokens_per_second", tokens_per_second, self.global_step)
            self.writer.add_scalar("train/skipped_steps", self.log_skipped, self.global_step)
            if self.scaler.is_enabled():
                self.writer.add_scalar("train/loss_scale", self.scaler.get_scale(), self.global_step)
            self.log_loss, self.log_tokens, self.log_started = torch.zeros((), device=self.device), 0, time.monotonic()
            self.log_skipped = 0
        return signal_seen, out_of_time

    def gather_to_rank0(self, name: str, value: Any) -> list[Any] | None:
        """Every rank's `value` on rank 0, in rank order (ranks.RankWatch.gather_to_rank0); None on
        the others; `[value]` in a single process."""
        return self.watch.gather_to_rank0(name, value) if self.watch is not None else [value]

    def from_rank0(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank once rank 0 gets here, the others waiting on its heartbeat
        (ranks.RankWatch.from_rank0): the waits for rank 0's long work; `value` in a single process."""
        return self.watch.from_rank0(value) if self.watch is not None else value

    def on_any_rank(self, *flags: bool | torch.Tensor) -> list[bool]:
        """Each flag (a bool, or a one-element tensor on the device) OR-ed over all ranks in one
        all-reduce, and read back to the host once; a single process's own flags."""
        if not self.ranks.distributed:
            return [bool(flag) for flag in flags]
        shared = torch.stack([torch.as_tensor(flag, device=self.device).reshape(()) for flag in flags]).int()
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)
        return [bool(value) for value in shared.tolist()]

    def stop_decision(self, signal_seen: bool, out_of_time: bool) -> str | None:
        """Why training stops after this step, if it does: from values every rank shares."""
        config = self.config
        if self.nonfinite_run >= config["max_nonfinite_steps"]:
            return "nonfinite"
        if config["max_steps"] and self.global_step >= config["max_steps"]:
            return "max_steps"
        if self.run_plan is not None and self.global_step >= self.run_plan.total_steps:
            return "planned_end"
        if out_of_time:
            return "max_minutes"
        if signal_seen:
            return "signal"
        return None

    # ------------------------------------------------------------------ 2b. the plan

    def time_step(self, epoch_steps: int) -> None:
        """Record the clock after a step; once enough steps are timed (or the first epoch ends
        before), make the plan: rank 0's, which every rank follows."""
        self.step_times.append((self.global_step, clock(), self.validation_seconds))
        timed = len(self.step_times) - 1
        if timed < PLAN_SKIP_STEPS + PLAN_TIMED_STEPS and self.step_in_epoch < epoch_steps:
            return
        plan = self.make_plan() if self.ranks.is_main else None
        self.follow_rank0(plan)
        self.plan_mark = self.last_mark = self.mark()
        self.schedule_halfway_retime()
        self.schedule_decay_retime()

    def make_plan(self) -> Plan:
        """The plan from the timed steps (the first PLAN_SKIP_STEPS left out where there are more),
        a validation's and a checkpoint's estimated cost, and the clock."""
        skip = min(PLAN_SKIP_STEPS, len(self.step_times) - 2)
        (first, started, validated), (last, ended, validated_end) = self.step_times[skip], self.step_times[-1]
        step_seconds = max(ended - started - (validated_end - validated), 0.0) / max(last - first, 1)
        validation_seconds, fit_seconds = self.estimated_validation_seconds()
        return self.planned(step_seconds, validation_seconds, validation_seconds, self.estimated_checkpoint_seconds(),
                            fit_seconds, "")

    def retime(self, epoch_end: bool = True) -> None:
        """At an epoch end, by the invocation that planned: the plan again from the steps and
        validations measured, the checkpoint's and the fit's estimates kept. Where the learning rate
        does not depend on the run's length (inverse square root; wsd until its decay), at every
        epoch end, from the first epoch's end on: a first epoch pays once for each new batch shape
        (on an H200 with cuDNN's attention, off since, a paper-base epoch of tatoeba took 17.5 s and
        the next ones 1.9 and 1.6; planned from it, a 2-minute run ended at 1.2). Cosine, whose every
        step depends on the length: once, at the last epoch end before warmup's end. On a shared
        machine a dozen steps and a young model's decoding misjudge a run too (a 15-minute plan came
        out 5.5% too long and the clock cut its schedule). Where the plan's length is fixed before
        the next epoch end, once more halfway there (`epoch_end` False;
        time_budget.halfway_retime_step). Made before a checkpoint, which holds it: a run resumed
        from there follows it bit for bit and keeps it (only the invocation that planned re-times).
        A wsd plan's last re-time comes halfway through its decay (`retime_decay`), or where its new
        plan's decay has begun (`planned`)."""
        plan, mark, config = self.run_plan, self.plan_mark, self.config
        if plan is None or mark is None or self.global_step - mark.step < PLAN_TIMED_STEPS or \
                self.global_step >= plan.total_steps:
            return
        again = length_free(config, self.global_step, plan.total_steps, plan.warmup_steps)
        if not again and (self.retimed or self.global_step + self.steps_per_epoch <=
                          decay_start(config, plan.total_steps, plan.warmup_steps)):
            return
        retimed = self.measured_plan(mark, "re-timed ")
        if not again:
            self.plan_mark = None
        elif not self.retimed:
            self.plan_mark = self.mark()
        self.retimed = True
        self.follow_rank0(retimed)
        self.halfway_retime = None
        if self.decay_anchor is not None:  # its decay has begun (`planned`): the last re-time, as retime_decay's
            self.end_retiming()
            return
        if epoch_end:
            self.schedule_halfway_retime()
        self.schedule_decay_retime()

    def measured_plan(self, mark: PlanMark, label: str, decaying: bool = False) -> Plan | None:
        """Rank 0's plan from the steps, validations and checkpoints measured since `mark`, the
        first plan's estimates where none was measured; None on the other ranks. Every rank marks
        here where a decay re-time's measurement starts (`last_mark`)."""
        self.last_mark = self.mark()
        if not self.ranks.is_main:
            return None
        plan = self.run_plan
        validated, saved = self.validation_seconds - mark.validation_seconds, \
            self.checkpoint_seconds - mark.checkpoint_seconds
        step_seconds = max(self.last_mark.clock - mark.clock - validated - saved, 0.0) / (self.global_step - mark.step)
        validations, checkpoints = self.validations - mark.validations, self.checkpoints - mark.checkpoints
        # The checkpoints measured replace the estimate, a serialisation in memory: writing and
        # fsyncing depend on the disk.
        return self.planned(step_seconds, validated / validations if validations else plan.validation_seconds,
                            plan.first_validation_seconds,
                            saved / checkpoints if checkpoints else plan.checkpoint_seconds, plan.final_seconds, label,
                            decaying)

    def retime_decay(self) -> None:
        """Halfway through a wsd plan's decay (time_budget.decay_retime_step), by the invocation that
        planned: the plan once more from the steps since its last re-time (a shared machine's steps
        slow or speed up), its decay going on from the learning rate it stands at to the new last
        step. The last re-time: made before a checkpoint, which holds it."""
        self.follow_rank0(self.measured_plan(self.last_mark, "re-timed in the decay: ", decaying=True))
        self.end_retiming()

    def end_retiming(self) -> None:
        """After a re-time whose decay starts anew from where it stands: no re-time follows it."""
        self.plan_mark = self.last_mark = self.decay_retime = None

    def schedule_decay_retime(self) -> None:
        """After the plan or a re-time: the step halfway through a wsd plan's decay to re-time at, if any."""
        plan, config = self.run_plan, self.config
        self.decay_retime = None if config["lr_schedule"] != "wsd" or self.last_mark is None else decay_retime_step(
            decay_start(config, plan.total_steps, plan.warmup_steps), plan.total_steps, self.last_mark.step)

    def last_retime_measures_a_validation(self) -> bool:
        """Whether this epoch end validates though the plan thins it: the last epoch end to re-time
        before the plan's length is fixed, where no validation has been measured since the plan (or
        its first re-time) and the plan counts the estimate more than one validation's worth after
        it (a validated epoch end besides the last step, or a fit that costs more than one). Without
        it the estimate stands to the end: a 5-minute plan here counted 8.4 s a validation (they
        took 2.6-4.6) and ended at 4.5 minutes; a 15-minute one, validating its last step only,
        counted 45.7 s and 70.1 s for the fit and ended at 12.8. A 2-minute plan that validates its
        last step only and leaves the fit out keeps its steps. The re-time after it plans the rest."""
        plan, mark = self.run_plan, self.plan_mark
        if mark is None or self.validations > mark.validations:
            return False
        if not plan.validated_epoch_ends and not (plan.confidence_fit and plan.fit_seconds > plan.validation_seconds):
            return False
        free_until = length_free_until(self.config, plan.total_steps, plan.warmup_steps)
        return free_until is not None and self.global_step < free_until <= self.global_step + self.steps_per_epoch

    def mark(self) -> PlanMark:
        return PlanMark(self.global_step, clock(), self.validation_seconds, self.validations, self.checkpoint_seconds,
                        self.checkpoints)

    def schedule_halfway_retime(self) -> None:
        """After the plan or an epoch end's re-time: the step between epoch ends to re-time at, if any."""
        plan = self.run_plan
        free_until = length_free_until(self.config, plan.total_steps, plan.warmup_steps)
        self.halfway_retime = halfway_retime_step(self.global_step, free_until, self.steps_per_epoch)

    def planned(self, step_seconds: float, validation_seconds: float, first_validation_seconds: float,
                checkpoint_seconds: float, fit_seconds: float, label: str, decaying: bool = False) -> Plan:
        """The plan for what is left of the clock from here, logged and recorded in TensorBoard;
        `first_validation_seconds` and `fit_seconds` are the first plan's estimates (plan_run). A
        re-timed wsd plan that is `decaying`, or whose decay would have begun by now, decays from the
        learning rate it stands at (Plan.decay_anchor): a plan shortened at the last epoch end before
        its decay would otherwise drop the learning rate from the peak into the middle of its decay.
        The anchor counts the schedule's steps, which skipped steps (train_epoch) do not advance."""
        config = self.config
        plan = plan_run(self.global_step, clock() - self.started, 60 * config["max_minutes"], step_seconds,
                        validation_seconds, checkpoint_seconds, self.steps_per_epoch,
                        config["validate_every_steps"], config["save_every_steps"], config["warmup_steps"],
                        config["warmup_fraction"], fit_seconds,
                        None if "dropout" in self.given or config["compile"] else config["dropout"],
                        config["num_epochs"], first_validation_seconds)
        at = self.scheduler.last_epoch
        if self.run_plan is not None and config["lr_schedule"] == "wsd" and \
                (decaying or decay_start(config, plan.total_steps, plan.warmup_steps) <= at):
            plan = dataclasses.replace(plan, decay_from=at, decay_from_lr=lr_factor(
                at, config, self.total_steps, self.warmup, self.decay_anchor))
        log(label + plan.describe())
        self.writer.add_text("plan", label + plan.describe(), self.global_step)
        for name in ("total_steps", "warmup_steps", "step_seconds", "validation_seconds", "expected_end_s"):
            self.writer.add_scalar(f"plan/{name}", getattr(plan, name), self.global_step)
        if plan.dropout is not None:
            self.writer.add_scalar("plan/dropout", plan.dropout, self.global_step)
        self.writer.add_scalar("plan/epochs", plan.epochs, self.global_step)
        return plan

    def estimated_validation_seconds(self) -> tuple[float, float]:
        """A validation's cost: the loss over this rank's share of the split, timed, and the decoding
        of a sample of the sources, timed and scaled to the subset decoded; and the same for the
        confidence fit after the last checkpoint (rank 0, the fit's sources with the decoding
        options, 0 without a fit). The sample is decoded to the length of its longest reference and
        never ends sooner (UnendingModel): a model this young writes anything from nothing to
        endless repeats, and a validation costs what it costs once the model writes sentences of
        the references' lengths."""
        if not self.val_pairs:
            return 0.0, 0.0
        config, started = self.config, clock()
        model = self.raw_model
        model.eval()
        validation_loss(model, self.val_ds, config, self.device, self.ranks.rank, self.ranks.world_size)
        loss_seconds = clock() - started
        sample = self.val_pairs[:32]
        lang_tgt = corpora(config)[0].lang_tgt
        translator = TorchTranslator(UnendingModel(model), self.tok_src, self.tok_tgt, config)
        sources = translator.encode([source for source, _ in sample], translator.source_tag(lang_tgt))
        longest = max(len(e.ids) for e in encode_texts(self.tok_tgt, [target for _, target in sample], ids_only=True))

        def per_sentence(options: DecodingOptions) -> float:
            # Timed the second time: the first pays once for its new shapes (on an H200 with cuDNN's
            # attention, off since, a plan that timed it counted 54.8 s a validation, where one took 12 s).
            translator.translate_batch(sources, options, longest + 1)  # the words and their [EOS]
            decode_started = clock()
            translator.translate_batch(sources, options, longest + 1)
            return (clock() - decode_started) / len(sample)

        validation = loss_seconds + per_sentence(validation_options(config)) * len(self.val_sources) / \
            self.ranks.world_size
        fit = 0.0
        if config["confidence_sentences"] and self.ranks.is_main:
            fit = per_sentence(DecodingOptions.from_config(config, target_lang=lang_tgt)) * \
                min(config["confidence_sentences"], len(self.val_sources))
        model.train()
        return validation, fit

    def estimated_checkpoint_seconds(self) -> float:
        """A checkpoint's cost: the model's and optimizer's state serialised once in memory, doubled
        for hashing and writing it."""
        started = clock()
        torch.save({"model": self.raw_model.state_dict(), "optimizer": self.optimizer.state_dict()}, io.BytesIO())
        return 2 * (clock() - started)

    @property
    def decay_anchor(self) -> tuple[int, float] | None:
        """Where the plan's decay starts anew (Plan.decay_anchor); None without a plan."""
        return self.run_plan.decay_anchor if self.run_plan is not None else None

    def follow_rank0(self, plan: Plan | None) -> None:
        """`follow` rank 0's plan (`plan` on rank 0, None on the others), on every rank."""
        self.follow(plan_from_dict(self.from_rank0(plan.as_dict() if plan is not None else None)))

    def follow(self, plan: Plan) -> None:
        """From here on the run's length, learning-rate schedule and dropout (unless given) are the plan's."""
        self.run_plan, self.planning = plan, False
        self.total_steps, self.warmup = plan.total_steps, plan.warmup_steps
        if plan.dropout is not None and "dropout" not in self.given:
            set_dropout(self.raw_model, plan.dropout)

    # ------------------------------------------------------------------ 3. end of an epoch

    def end_of_epoch(self, stop: str | None, graceful: GracefulStop) -> str | None:
        """Validation (unless a signal or non-finite steps stopped the run: a SIGTERM abandons it, or
        the plan validates only later ones) and a checkpoint, unless the step schedule has just
        done both; returns the stop reason, which early stopping or a stop signal during validation
        may set."""
        if self.saved_step == self.global_step:
            return stop
        metrics = None
        # A planned run validates only its last epoch ends (time_budget.first_validated_step) and
        # those on a validate_every_steps step, which the step loop leaves to this one.
        thinned = stop is None and self.run_plan is not None and \
            not self.run_plan.validates_epoch_end(self.global_step, self.config["validate_every_steps"]) and \
            not self.last_retime_measures_a_validation()
        if stop not in ("signal", "nonfinite") and not thinned:
            metrics, stop = self.validate(graceful, stop)
        if stop is None:
            self.retime()
            if self.global_step == self.decay_retime:
                self.retime_decay()
                thinned = False  # its checkpoint holds the plan
        # ... and of the epoch ends it does not validate, only those that fit the plan's share
        # (time_budget.checkpoint_interval); a stop always checkpoints.
        if not thinned or self.run_plan.checkpoints_epoch_end(self.global_step, self.config["validate_every_steps"]):
            self.save(metrics)
        return stop

    def validate(self, graceful: GracefulStop, stop: str | None = None) -> tuple[dict[str, float] | None, str | None]:
        """Every rank decodes its share of the validation subset, rank 0 scores the shares (a
        SIGTERM abandons it on every rank) and decides early stopping by `best_metric`; returns
        the metrics (None if abandoned, and on ranks other than 0) and the stop reason."""
        metrics, ranks = None, self.ranks
        validation_started = clock()
        if self.val_pairs:
            try:
                with graceful.abandoning():
                    share = validation_share(self.raw_model, self.val_ds, self.val_sources, self.tok_src, self.tok_tgt,
                                             self.config, self.device, ranks.rank, ranks.world_size)
                    shares = self.gather_to_rank0(f"validation/{self.global_step}", share)
                    if ranks.is_main:
                        metrics = validation_metrics(shares, self.val_pairs, self.raw_model, self.tok_src,
                                                     self.tok_tgt, self.config, self.writer, self.global_step)
            except StopRequested:
                log(f"validation at step {self.global_step} abandoned")
        self.from_rank0()  # the others wait for rank 0's scores
        self.last_validation_seconds = clock() - validation_started
        self.validation_seconds += self.last_validation_seconds
        self.validations += 1
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
        early, signal_seen = self.on_any_rank(stop == "early_stopping", graceful.requested)
        return metrics, stop or ("early_stopping" if early else "signal" if signal_seen else None)

    def save(self, metrics: dict[str, float] | None = None) -> None:
        """Rank 0 writes a checkpoint while the others wait; the time it takes is counted apart
        from the steps' (`retime`)."""
        started = clock()
        if self.ranks.is_main:
            state = {key: self.resume_value(key) for key in (*RESUME_KEYS, "plan")} | {
                "metrics": metrics or {}, "data": self.data_record} | {
                record: getattr(self, record) for record in PLANNED_SIZE}
            path = save_checkpoint(self.folder, state, self.global_step, self.config["keep_checkpoints"], metrics,
                                   self.config["best_metric"])
            log(f"saved {path}")
        self.saved_step = self.global_step
        self.from_rank0()
        self.checkpoints += 1
        self.checkpoint_seconds += clock() - started

    def resume_value(self, key: str) -> Any:
        """What a checkpoint holds under `key`, one of RESUME_KEYS: the state of the model, optimizer,
        scheduler or scaler, the batch settings, the tokenizers, or the attribute of that name."""
        if key in ("model", "optimizer", "scheduler", "scaler"):
            return (self.raw_model if key == "model" else getattr(self, key)).state_dict()
        if key == "batch_settings":
            return self.batch_settings()
        if key == "tokenizers":
            return {"src": self.tok_src.to_str(), "tgt": self.tok_tgt.to_str()}
        if key == "plan":
            return self.run_plan.as_dict() if self.run_plan is not None else None
        return getattr(self, key)

    def stop_reserve(self) -> float:
        """The seconds a clock stop still spends after its step, kept inside --max_minutes: its
        validation (the last one's time, or before any the plan's estimate: a planned run may
        validate only at its end), its checkpoint (this invocation's mean, or the plan's estimate),
        and the confidence fit a plan keeps. Without the fit's time, a 12-minute plan here whose
        steps slowed a tenth after its last re-time (a shared machine) ended 4 s over."""
        plan = self.run_plan
        validation = self.last_validation_seconds or (plan.validation_seconds if plan is not None else 0.0)
        checkpoint = self.checkpoint_seconds / self.checkpoints if self.checkpoints else \
            (plan.checkpoint_seconds if plan is not None else 0.0)
        fit = plan.fit_seconds if plan is not None and self.ends_with_fit() else 0.0
        return validation + checkpoint + fit

    def ends_with_fit(self) -> bool:
        """Whether training ends with the confidence fit: with --confidence_sentences, unless the
        plan left it out (time_budget.FIT_SHARE)."""
        return bool(self.config["confidence_sentences"]) and (self.run_plan is None or self.run_plan.confidence_fit)

    def finish(self, stop: str | None) -> int:
        if self.writer is not None:
            self.writer.close()
        config = self.config
        if self.ranks.is_main and config["average_checkpoints"] > 1 and stop not in ("signal", "nonfinite"):
            try:
                path = save_average(self.folder, config["average_checkpoints"], config["average_min_gap_steps"])
                sources = read_manifest(self.folder)["checkpoints"][path.name]["averaged_from"]
                log(f"saved {path}, the average of {', '.join(sources)}, which translate.py and evaluate.py will use")
            except CheckpointError as error:
                log(f"warning: no average: {error}")
        if self.ranks.is_main and stop not in ("signal", "nonfinite"):
            if self.ends_with_fit():
                self.fit_confidence()
            elif config["confidence_sentences"]:
                log(f"no confidence calibrator: the plan left the fit out ({self.run_plan.fit_seconds:.0f} s, over "
                    f"{FIT_SHARE:.0%} of --max_minutes); evaluate.py --fit_confidence fits one")
        if self.ranks.is_main:
            command = " ".join(["python", "train.py", *sys.argv[1:]])
            messages = {
                None: f"finished {config['num_epochs']} epochs ({self.global_step} steps)",
                "max_steps": f"reached --max_steps {config['max_steps']}",
                "planned_end": f"finished the plan: {self.global_step} steps "
                               f"({self.global_step / self.steps_per_epoch:.1f} epochs) in "
                               f"{(clock() - self.started) / 60:.1f} min",
                "max_minutes": f"reached --max_minutes {config['max_minutes']} ({self.global_step} steps)",
                "early_stopping": f"stopped early: no better validation "
                                  f"{dict(bleu='BLEU', chrf='chrF', loss='loss')[config['best_metric']]} in "
                                  f"{self.stale_validations} validations",
                "signal": f"stopped at step {self.global_step}; resume with: {command}",
                "nonfinite": f"stopped after {self.nonfinite_run} non-finite steps in a row at step "
                             f"{self.global_step}; the checkpoint holds the last good weights (try a lower --lr or "
                             f"--amp off)",
            }
            log(messages[stop])
        return 1 if stop == "nonfinite" else 0


    def fit_confidence(self) -> None:
        """After the last checkpoint: the confidence calibrator (confidence.py) of the checkpoint that
        translators will use (checkpoint_choice), fitted on the validation split with the decoding
        options and stored beside the checkpoints. One that cannot be fitted (too few sentences, all
        good or all bad) is a warning line: the model is trained, and evaluate.py --fit_confidence
        can fit one later."""
        config = self.config
        try:
            translator = TorchTranslator.load(None, self.folder, self.device, choice=config["checkpoint_choice"],
                                              min_gap=config["average_min_gap_steps"])
            options = DecodingOptions.from_config(config)
            calibrator = fit_on_pairs(self.text.pairs("validation"),
                                      lambda sources: [h[0] for h in translator.translate(sources, options)],
                                      config["confidence_chrf_threshold"], config["confidence_sentences"])
            path = save_calibrator(self.folder, calibrator, translator.source)
        except (CalibrationError, CheckpointError, TranslatorError, OSError) as error:
            log(f"warning: no confidence calibrator: {error}")
            return
        log(f"saved {path}: the confidence calibrator of {translator.source}, fitted on {calibrator.sentences} "
            f"validation sentences")


def train(config: dict[str, Any], started: float | None = None, explicit: set[str] = frozenset(),
          keep_freed: bool = False, plan_to_clock: bool = False, given: frozenset[str] = frozenset()) -> int:
    """Run one training job with this config (`explicit`: the keys the command line set; `keep_freed`:
    apply cpu_kernels.keep_freed_memory before the first step; `plan_to_clock`: plan the run's length
    to --max_minutes; `given`: the keys the command line gave, which the plan keeps: dropout,
    num_layers, batch_tokens, d_model and d_ff); the exit code."""
    started = clock() if started is None else started
    initial = take_model_from(config, explicit, given)
    ranks = Ranks.from_environment()
    device = pick_device(config["device"], ranks.local_rank)
    if config["deterministic"]:
        # cuBLAS needs a fixed workspace for reproducible products; read when CUDA first runs one.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    watch = join_ranks(ranks, device, config["rank_timeout_s"])
    lock = RunLock(weights_dir(config))
    clean = False
    try:
        if ranks.is_main:
            lock.acquire()
        code = Trainer(config, device, ranks, started, initial, keep_freed, watch, plan_to_clock, given).run()
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
        return train(config, started, resolved.given | resolved.preset, keep_freed, plan_to_clock,
                     frozenset(resolved.given))
    except (ConfigError, DataError, CheckpointError, RunLockError, TokenizerError, OutOfMemory, RankFailed) as error:
        print(f"train.py: error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except KeyboardInterrupt:
        print("train.py: interrupted; the last checkpoint is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(command_line=True))
