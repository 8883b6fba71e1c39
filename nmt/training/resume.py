"""Where a training run starts: the checkpoint it resumes (and whether it may), the checkpoint it is
fine-tuned from (--init_from), and whether the corpora are still the ones it trained on.

A folder that holds checkpoints of which none can be resumed stops the run with one line, every
file left as it is: a run never starts over unasked. So does a checkpoint above the resume step that
checkpoints.json does not list, unless it is the newest, verifies, and is this run's (its writer
died before recording it): then it is listed and resumed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, NamedTuple

from config import IDENTITY_KEYS, MODEL_KEYS, ConfigError, corpus_entries, get_config, validate_config, weights_dir
from nmt.corpora.cleaning import NOT_CLEANED, cleaning_changes
from nmt.corpora.sources import DataError
from nmt.corpora.store import data_changes, data_identity
from nmt.diagnostics import log
from nmt.training.checkpoint import (CheckpointError, adopt_unlisted, check_unlisted_above, checkpoint_files,
                                     load_checkpoint, load_latest, named, reconcile_manifest)
from nmt.training.planned_size import PLANNED_SIZE

# What a checkpoint holds for resuming (train.Trainer.state_dict writes these keys and the metrics);
# a checkpoint that lacks one cannot be resumed.
RESUME_KEYS = ("model", "optimizer", "scheduler", "scaler", "epoch", "global_step", "batches_done", "step_in_epoch",
               "best_value", "stale_validations", "batch_settings", "config", "tokenizers")
# The identity keys that name data by path: a checkpoint with a data record compares their content instead.
DATA_PATHS = ("datasource", "valid_data", "test_data")
# What a training step's batches are made of: a checkpoint records them. Changing world_size or
# accum_steps regroups the same batches into steps (resumed exactly); the others change the batches.
# "cleaning" is what the text stores were built with (cleaning.cleaning_description: the rules'
# settings, the scoring models' sha256), from the first store's key; cuda_graphs on batches in
# length buckets (run_data.batch_plan).
BATCH_SETTINGS = ("world_size", "accum_steps", "batch_tokens", "seq_len", "filter_duplicates",
                  "filter_max_length_ratio", "cleaning", "cuda_graphs")
# How to start over when a folder's checkpoints cannot be resumed: train.py removes none of them itself.
START_OVER = "they are left as they are; to start over, move them out of the folder or choose another --experiment_name"


class StartPoint(NamedTuple):
    """The checkpoint a run resumes (None, None for a new run), and what its data check decided: the
    text store whose held-out splits the run keeps, and whether the corpora's content changed."""

    path: Path | None
    state: dict[str, Any] | None
    held_out_from: str | None = None
    data_changed: bool = False


def take_model_from(config: dict[str, Any], explicit: set[str], given: frozenset[str]) \
        -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """For --init_from: the checkpoint's state and the model keys (architecture, tokenizers, language
    pair) the run takes from it where they differ from `config`. An `explicit` option (given or a
    preset's) that differs is refused, except a preset's depth or width where the checkpoint's plan
    chose them (`given`: the keys the user gave)."""
    if not config["init_from"]:
        return None, {}
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
    if weights_dir(source).resolve() == path.resolve().parent:
        raise ConfigError(f"--init_from {path} is a checkpoint of this very experiment; give the fine-tuned model a "
                          f"folder of its own with --experiment_name")
    return state, {key: source[key] for key in MODEL_KEYS if source[key] != config[key]}


def data_layout(config: dict[str, Any]) -> tuple:
    """What a run's data is besides the corpora's content: each corpus's weight and tag, and whether
    validation and test pairs are given apart."""
    return [entry[1:] for entry in corpus_entries(config["datasource"])], bool(config["valid_data"]), \
        bool(config["test_data"])


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
    # A checkpoint that records its data by content is checked by content (check_data): the same
    # corpora under other paths resume. Their number, weights and tags are still the run's.
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


def checkpoint_to_resume(folder: Path, config: dict[str, Any], adopt: Callable[[dict[str, Any]], None],
                         is_main: bool) -> StartPoint:
    """The checkpoint `preload` names (latest: the newest good one, first listed if the run died
    before recording it: `adopt_unlisted`), checked against `config` once `adopt` has taken what
    its plan sized (config is the caller's, which `adopt` updates). A new run starts only in a
    folder without checkpoints: one whose checkpoints are all unusable stops the run, everything in
    it left as it is; so does an unlisted checkpoint above the resume step, which the run could not
    replace on reaching it. Once the run goes on, checkpoints.json forgets the checkpoints moved out
    of the folder (as the advice for damaged ones says): they count for nothing. A run that stops
    here changes no file. Rank 0 (`is_main`) also checks the data (`check_data`)."""
    path, state = None, None
    if config["preload"] == "latest":
        def adopted(unlisted: dict[str, Any], where: Path) -> None:
            adopt(unlisted)
            check_resumable(unlisted, config, where)

        found = adopt_unlisted(folder, config, adopted)
        try:
            found = found or load_latest(folder)
        except CheckpointError as error:
            raise CheckpointError(f"{error}; {START_OVER}") from None
        if found:
            path, state = found
        elif averages := checkpoint_files(folder):
            raise CheckpointError(f"{folder} holds {named(averages)} but no checkpoint to resume (an average "
                                  f"has no optimizer state); {START_OVER}")
    elif config["preload"] == "new":
        if checkpoint_files(folder):
            raise ConfigError(f"{folder} already holds checkpoints; resume them with --preload latest, or "
                              f"start a new run with another --experiment_name")
    else:
        path = Path(config["preload"])
        state = load_checkpoint(path)
    start = StartPoint(path, state)
    if state is not None:
        adopt(state)
        check_resumable(state, config, path)
        check_unlisted_above(folder, state["global_step"])
        if is_main:
            start = StartPoint(path, state, *check_data(state, path, config))
        log(f"resuming from {path} (epoch {state['epoch']}, step {state['global_step']})")
    if is_main and (note := reconcile_manifest(folder, config["best_metric"])):
        log(note)
    return start


def check_data(state: dict[str, Any], path: Path, config: dict[str, Any]) -> tuple[str | None, bool]:
    """Rank 0, before resuming: the corpora, by content, against what the checkpoint records. A
    corpus whose content changed stops the run with one line, unless --data_changed keep_held_out:
    then it goes on on the new content with the run's validation and test splits as they were.
    Returns the name of the text store that holds those (also when an earlier resume kept them),
    and whether the content changed. A corpus that only moved resumes, with a line."""
    saved = state.get("data")
    if saved is None:
        log(f"{path} records no identity of its data (written before checkpoints did): its corpora are not checked")
        return None, False
    current = data_identity(config)
    moved = [f"{was['source']} -> {now['source']}" for was, now in zip(saved["corpora"], current["corpora"])
             if was["source"] != now["source"]]
    if not (changes := data_changes(saved, current)):
        if moved:
            log(f"the corpora moved ({', '.join(moved)}) with the same content: resuming")
        return saved.get("held_out_from"), False
    if config["data_changed"] != "keep_held_out":
        raise DataError(f"{changes[0]} when {path} was written: resuming would train on pairs it was not told "
                        f"about and carve its validation and test anew, from pairs it has trained on; start a new "
                        f"run (--experiment_name NAME, or also --init_from {path} to start from this model), or go "
                        f"on with --data_changed keep_held_out, which keeps the run's validation and test splits")
    kept = saved.get("held_out_from") or saved["stores"][0]
    log(f"{'; '.join(changes)}: going on with it (--data_changed keep_held_out), validating and testing on the "
        f"run's held-out splits as they were, from the data store {kept}")
    return kept, True


def batch_settings(config: dict[str, Any], world_size: int, cleaning: dict[str, Any]) -> dict[str, Any]:
    """BATCH_SETTINGS' values: the config's, the world size, and the text stores' `cleaning`."""
    special = {"world_size": world_size, "cleaning": cleaning}
    return {key: special[key] if key in special else config[key] for key in BATCH_SETTINGS}


def resumed_position(saved: dict[str, Any], current: dict[str, Any], data_changed: bool, epoch: int,
                     batches_done: int, step_in_epoch: int) -> tuple[int, int, int]:
    """Where a resumed run goes on (epoch, batches done in it, steps in it) from the checkpoint's
    position and batch settings (`saved`) against the run's (`current`): a changed batch setting is
    never silent. world_size and accum_steps regroup the same batches, so training resumes at the
    very next batch; other changes (the corpora's content too, `data_changed`) make other batches,
    so it resumes at the start of the next epoch."""
    saved = {"cleaning": NOT_CLEANED, "cuda_graphs": "auto", **saved}  # what checkpoints before them batched by
    changed = [key for key in BATCH_SETTINGS if saved[key] != current[key]]
    described = ", ".join([f"cleaning: {cleaning_changes(saved[key], current[key])}" if key == "cleaning"
                           else f"--{key} {saved[key]} -> {current[key]}" for key in changed]
                          + ["the corpora's content"] * data_changed)
    changed += ["data"] * data_changed  # other pairs make other batches, like a changed batch setting
    if not changed or not batches_done:
        if changed:
            log(f"resuming at the start of epoch {epoch} with changed batch settings ({described})")
        return epoch, batches_done, step_in_epoch
    if set(changed) <= {"world_size", "accum_steps"}:
        log(f"resuming at batch {batches_done} of epoch {epoch}, now {current['world_size'] * current['accum_steps']} "
            f"batches per step ({described}): no batch is skipped or repeated")
        return epoch, batches_done, step_in_epoch
    log(f"warning: {described} since the checkpoint changes this epoch's batches; the rest of epoch {epoch} is "
        f"skipped and training resumes at the start of epoch {epoch + 1}")
    return epoch + 1, 0, 0
