"""Checkpoints that survive crashes, full disks, tampering and concurrent runs.

- Written atomically (atomic_files.py): a temporary file in the same folder, fsync, rename, then
  fsync the folder.
- Self-verifying: every checkpoint carries `content_sha256`, a digest of its content (each tensor's
  path, dtype, shape and bytes, and every plain value, in a fixed order: `content_digest`), so a copy
  anywhere, without its folder, is checked after loading. torch's zip reader checks no CRC: without
  it, a flipped byte inside tensor data loads silently. A checkpoint written before the digest
  existed loads with a warning when no manifest lists it.
- Listed: the sha256 of every checkpoint file is recorded in `checkpoints.json` (the manifest,
  itself replaced atomically and only after the checkpoint's rename); a listed checkpoint is checked
  against it before unpickling (then its digest, which the same bytes always satisfy, is not
  recomputed). Rotation removes only listed checkpoints: a file the user put in the folder stays.
  Listed files the user moved out count for nothing: `reconcile_manifest` drops them before a run
  (choosing the best again from those left), rotation never removes the checkpoint it has just
  written, and `best_checkpoint` falls back to the best of those left, saying so.
- Recovered: a run that dies between a checkpoint's rename and the manifest's update leaves it
  unlisted, and a file it does not list is never replaced. Before a run resumes, `adopt_unlisted`
  lists such a newest checkpoint when it verifies and is the run's own, and `check_unlisted_above`
  refuses any other above the resume step, so that no run stops only when it reaches that step.
- Safe: loaded with `torch.load(weights_only=True)`, which refuses pickles that would run code;
  the config stored inside is plain data and is validated before use.
- `latest` falls back to the newest good checkpoint, warning about each bad one; when none loads,
  it says so in one line naming them, and never pretends the folder is empty.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
import statistics
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from nmt.atomic_files import atomic_write, atomic_write_bytes, sha256_of
from config import ConfigError, get_config, validate_config
from model import build_model
from nmt.inference.scoring import improves
from nmt.corpora.tokenizer import TokenizerError, tokenizer_from_json, tokenizer_paths

MANIFEST = "checkpoints.json"
CHECKPOINT_PATTERN = re.compile(r"^ckpt_(\d{8,})\.pt$")  # what a run resumes from
ANY_CHECKPOINT = re.compile(r"^ckpt_\d{8,}(_avg\d+)?\.pt$")  # averages too
DIGEST_KEY = "content_sha256"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or trusted; the message names the file."""


def checkpoint_name(global_step: int) -> str:
    return f"ckpt_{global_step:08d}.pt"


def read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"latest": None, "best": None, "checkpoints": {}}
    if not isinstance(manifest, dict) or not isinstance(manifest.get("checkpoints"), dict):
        return {"latest": None, "best": None, "checkpoints": {}}
    return manifest


def content_digest(state: dict[str, Any]) -> str:
    """The sha256 of a checkpoint's content, `DIGEST_KEY` aside: each tensor's path in the dict, dtype,
    shape and bytes, and each plain value's path and repr, dict keys in sorted order. Not JSON: the
    optimizer's state has integer keys and tuples, which JSON would change. What torch.load returns
    gives the same digest as what torch.save was given, on any device."""
    digest = hashlib.sha256()

    def walk(value: Any, where: str) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{where}\0tensor {tensor.dtype} {tuple(tensor.shape)}\0".encode())
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # the bytes in place, not a copy
        elif isinstance(value, dict):
            digest.update(f"{where}\0dict {len(value)}\0".encode())
            for key in sorted(value, key=repr):
                walk(value[key], f"{where}/{key!r}")
        elif isinstance(value, (list, tuple)):
            digest.update(f"{where}\0{type(value).__name__} {len(value)}\0".encode())
            for index, item in enumerate(value):
                walk(item, f"{where}/{index}")
        elif isinstance(value, (set, frozenset)):  # its repr's order changes with the process's hash seed
            digest.update(f"{where}\0set {sorted(map(repr, value))}\0".encode())
        else:
            digest.update(f"{where}\0{value!r}\0".encode())

    walk({key: value for key, value in state.items() if key != DIGEST_KEY}, "")
    return digest.hexdigest()


def _write_checkpoint(path: Path, state: dict[str, Any], manifest: dict[str, Any]) -> str:
    """Write `state` with its content digest, atomically; the sha256 of the file. A file of that
    name that `manifest` does not list is not this run's to replace: CheckpointError."""
    if path.exists() and path.name not in manifest["checkpoints"]:
        raise CheckpointError(f"will not replace {path}: {MANIFEST} does not list it, so it is not this run's; "
                              f"move it out of {path.parent} and resume")
    signed = {**state, DIGEST_KEY: content_digest(state)}
    return atomic_write(path, lambda handle: torch.save(signed, handle))


def save_checkpoint(folder: Path, state: dict[str, Any], global_step: int, keep: int,
                    metrics: dict[str, float] | None = None, best_metric: str = "bleu") -> Path:
    """Write `state` as the checkpoint of `global_step`, record it with its validation `metrics`,
    and keep the last `keep` checkpoints plus the best by `best_metric`, counting and removing only
    those the manifest lists and the folder still holds, never the one just written. Raises
    CheckpointError (the previous ones intact)."""
    folder = Path(folder)
    path = folder / checkpoint_name(global_step)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(folder)
        if gone := _drop_missing(folder, manifest):
            print(f"warning: {named(gone)} left {folder} during the run: no longer listed in {MANIFEST}",
                  file=sys.stderr, flush=True)
        digest = _write_checkpoint(path, state, manifest)
        _record(manifest, path, digest, global_step, state.get("epoch"), metrics or {}, best_metric)
        listed = sorted((folder / name for name in manifest["checkpoints"] if CHECKPOINT_PATTERN.match(name)),
                        key=_step_of)
        # The checkpoint just written is never rotated out, even when listed ones lie above its step.
        stale = [p for p in listed[:-keep] if p.name not in (manifest.get("best"), path.name)] if keep else []
        for old in stale:
            manifest["checkpoints"].pop(old.name)
        atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    except OSError as error:
        raise CheckpointError(f"could not write checkpoint {path}: {error.strerror or error}; "
                              f"the previous checkpoints in {folder} are intact") from None
    for old in stale:
        old.unlink(missing_ok=True)
    return path


def _record(manifest: dict[str, Any], path: Path, digest: str, global_step: int, epoch: Any,
            metrics: dict[str, float], best_metric: str) -> None:
    """List `path` in `manifest` as the latest checkpoint, with its metrics, and choose the best."""
    manifest["checkpoints"][path.name] = {"sha256": digest, "global_step": global_step, "epoch": epoch,
                                          "metrics": metrics}
    manifest["latest"] = path.name
    _choose_best(manifest, best_metric)


def _choose_best(manifest: dict[str, Any], metric: str) -> None:
    """The best listed checkpoint by `metric`, the earliest on a tie. A manifest written before
    metrics were recorded has each checkpoint's BLEU alone."""
    best, value = None, None
    for name, entry in sorted(manifest["checkpoints"].items(), key=lambda item: item[1].get("global_step", 0)):
        recorded = entry.get("metrics") or ({"bleu": entry["bleu"]} if entry.get("bleu") is not None else {})
        if CHECKPOINT_PATTERN.match(name) and metric in recorded and improves(metric, recorded[metric], value):
            best, value = name, recorded[metric]
    manifest["best"], manifest["best_metric"], manifest["best_value"] = best, metric, value


def _drop_missing(folder: Path, manifest: dict[str, Any]) -> list[Path]:
    """Remove from `manifest` the checkpoints whose files are no longer in `folder` (moved out by the
    user), so that they count toward no rotation, and re-point `latest` and `average` at what is
    left; the best is chosen again by `_choose_best`. The paths dropped."""
    gone = [Path(folder) / name for name in manifest["checkpoints"] if not (Path(folder) / name).is_file()]
    for path in gone:
        manifest["checkpoints"].pop(path.name)
    left = sorted((name for name in manifest["checkpoints"] if CHECKPOINT_PATTERN.match(name)), key=lambda name:
                  _step_of(Path(name)))
    if manifest.get("latest") not in manifest["checkpoints"]:
        manifest["latest"] = left[-1] if left else None
    if manifest.get("average") not in manifest["checkpoints"]:
        manifest["average"] = None
    return gone


def reconcile_manifest(folder: Path, best_metric: str) -> str | None:
    """Make `folder`'s manifest agree with its files before a run uses it: the checkpoints it lists
    that are gone are dropped, and a best among them is chosen again (by `best_metric`) from those
    left. The line to log when something changed, else None."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    gone = _drop_missing(folder, manifest)
    if not gone:
        return None
    before = manifest.get("best")
    _choose_best(manifest, best_metric)
    try:
        atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    except OSError as error:
        raise CheckpointError(f"could not update {folder / MANIFEST}: {error.strerror or error}") from None
    best = "" if manifest["best"] == before else \
        f"; the best is now {manifest['best'] or 'none (no checkpoint left has been validated)'}"
    return f"{MANIFEST} listed {named(gone)}, no longer in {folder}: dropped from it{best}"


def _unlisted(folder: Path, above: int = -1) -> list[Path]:
    """The checkpoints to resume from in `folder` above step `above` that its manifest does not
    list, newest first."""
    listed = read_manifest(folder)["checkpoints"]
    return [p for p in checkpoint_candidates(folder) if p.name not in listed and _step_of(p) > above]


def adopt_unlisted(folder: Path, config: dict[str, Any],
                   check: Callable[[dict[str, Any], Path], None]) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint of `folder`, with its state, when the manifest does not list it: a run
    that died between its rename and the manifest's update leaves it, its newest progress. It is
    listed as the latest if it carries its content digest (verified by `load_checkpoint`), `check`
    (raising CheckpointError or ConfigError) takes it, and it holds the experiment's tokenizers (the
    files beside it, written when the run of `config` started); else CheckpointError naming it.
    None when the newest checkpoint is listed, or there is none."""
    newest = checkpoint_candidates(folder)[:1]
    if not newest or newest != _unlisted(folder)[:1]:
        return None
    path = newest[0]
    try:
        state = load_checkpoint(path)
        if DIGEST_KEY not in state:
            raise CheckpointError(f"checkpoint {path} carries no {DIGEST_KEY}, so nothing vouches for its content")
        check(state, path)
        files, held = tokenizer_paths(folder, config), state["tokenizers"]
        if not isinstance(held, dict) or [_read_text(file) for file in files] != [held.get("src"), held.get("tgt")]:
            raise CheckpointError(f"checkpoint {path} does not hold the tokenizers of {folder} "
                                  f"({', '.join(sorted({file.name for file in files}))}), so it is not this run's")
        manifest = read_manifest(folder)
        _record(manifest, path, sha256_of(path), state["global_step"], state.get("epoch"), state.get("metrics", {}),
                config["best_metric"])
        atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    except (CheckpointError, ConfigError) as error:
        raise CheckpointError(f"{error}; it is the newest checkpoint in {folder} and {MANIFEST} does not list it, so "
                              f"a run resumed from an older one would stop on reaching its step rather than replace "
                              f"it: move it out of the folder and resume") from None
    except OSError as error:
        raise CheckpointError(f"could not list {path} in {MANIFEST}: {error.strerror or error}") from None
    print(f"warning: {path} was written but not recorded in {MANIFEST} (its run stopped in between); it verifies "
          f"and is this run's: listed, and resumed", file=sys.stderr, flush=True)
    return path, state


def _read_text(path: Path) -> str | None:
    """The text of `path`, or None if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def check_unlisted_above(folder: Path, step: int) -> None:
    """Refuse to resume at `step` while `folder` holds a checkpoint above it that the manifest does
    not list: `save_checkpoint` would stop the run on reaching that step rather than replace a file
    that is not its own. CheckpointError naming them."""
    if unlisted := _unlisted(folder, above=step):
        raise CheckpointError(f"{named(unlisted)} in {folder}: above step {step}, where this run resumes, and not "
                              f"listed in {MANIFEST}, so the run would stop on reaching that step rather than replace "
                              f"a file that is not its own; move {'it' if len(unlisted) == 1 else 'them'} out of the "
                              f"folder and resume")


def _step_of(path: Path) -> int:
    match = CHECKPOINT_PATTERN.match(path.name)
    return int(match.group(1)) if match else -1


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one checkpoint safely onto the CPU, checked against the sha256 its folder's manifest
    records for it, or else against the digest it carries (a checkpoint with neither: a warning)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    recorded = read_manifest(path.parent)["checkpoints"].get(path.name, {}).get("sha256")
    try:
        if recorded is not None and sha256_of(path) != recorded:
            raise CheckpointError(f"checkpoint {path} is corrupt (its sha256 does not match {MANIFEST})")
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    state = _torch_load(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of this project")
    carried = state.get(DIGEST_KEY)
    if recorded is None and carried is not None and content_digest(state) != carried:
        raise CheckpointError(f"checkpoint {path} is corrupt (its content does not match the {DIGEST_KEY} it "
                              f"carries)")
    if "model" not in state or "config" not in state:
        raise CheckpointError(f"checkpoint {path} is not a checkpoint of this project")
    if recorded is None and carried is None:
        print(f"warning: checkpoint {path} carries no {DIGEST_KEY} (it was written by an older version) and no "
              f"{MANIFEST} beside it lists it: loaded unverified", file=sys.stderr, flush=True)
    return state


def _torch_load(path: Path) -> Any:
    """torch.load onto the CPU, refusing pickles that would run code; each failure a CheckpointError."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except PermissionError as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error.strerror}") from None
    except pickle.UnpicklingError as error:
        detail = str(error).splitlines()[0] if str(error) else ""
        if "weights_only" in str(error) or "Unsupported" in str(error) or "global" in str(error).lower():
            raise CheckpointError(f"checkpoint {path} refused: it holds objects that could run code "
                                  f"when loaded, not plain tensors and data") from None
        raise CheckpointError(f"checkpoint {path} is corrupt or not a checkpoint ({detail})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, KeyError, IndexError) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated ({detail})") from None


def load_weights(model: torch.nn.Module, weights: Any, path: Path) -> None:
    """`model.load_state_dict(weights)`, or a CheckpointError that says in one line how the
    checkpoint's weights differ from the model its config describes."""
    try:
        model.load_state_dict(weights)
        return
    except (RuntimeError, TypeError, AttributeError, KeyError):
        pass
    if not isinstance(weights, dict):
        raise CheckpointError(f"checkpoint {path} holds no weights (its 'model' is a {type(weights).__name__})")
    expected = model.state_dict()
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    reshaped = [f"{name} {tuple(getattr(weights[name], 'shape', ()))} in the checkpoint, {tuple(tensor.shape)} "
                f"in the model" for name, tensor in expected.items()
                if name in weights and tuple(getattr(weights[name], "shape", ())) != tuple(tensor.shape)]
    differences = [f"{what}: {len(found)} (first: {found[0]})" for what, found in
                   (("missing weights", missing), ("unexpected weights", unexpected),
                    ("weights of another shape", reshaped)) if found]
    raise CheckpointError(f"checkpoint {path} is of another architecture than the model its config describes (written "
                          f"by another version of model.py?): {'; '.join(differences) or 'unloadable weights'}")


def checkpoint_candidates(folder: Path) -> list[Path]:
    """Checkpoints in `folder`, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir() if CHECKPOINT_PATTERN.match(p.name)), key=_step_of, reverse=True)


def checkpoint_files(folder: Path) -> list[Path]:
    """Every checkpoint in `folder`, averages included, by name."""
    folder = Path(folder)
    return sorted(p for p in folder.iterdir() if ANY_CHECKPOINT.match(p.name)) if folder.is_dir() else []


def named(paths: list[Path], shown: int = 4) -> str:
    """'a.pt, b.pt and 3 more': file names for a one-line message."""
    names = ", ".join(p.name for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def load_latest(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads and verifies, warning about each newer one that does not;
    None when `folder` holds no checkpoint to resume. Raises CheckpointError, naming them, when it
    holds some and none loads."""
    failed: list[tuple[Path, CheckpointError]] = []
    for path in checkpoint_candidates(folder):
        try:
            state = load_checkpoint(path)
        except CheckpointError as error:
            failed.append((path, error))
            continue
        for _, error in failed:
            print(f"warning: {error}; using an older one", file=sys.stderr, flush=True)
        return path, state
    if failed:
        raise CheckpointError(f"no usable checkpoint in {folder}: {named([p for p, _ in failed])} "
                              f"{'does' if len(failed) == 1 else 'do'} not load (the newest: {failed[0][1]})")
    return None


def checkpoints_to_average(folder: Path, count: int, newest: Path | None = None, min_gap: int = 0) -> list[Path]:
    """The `count` newest checkpoints of `folder` (ending at `newest` when given), newest first, each
    written at least `min_gap` steps before the one taken after it (0: half the median spacing of
    the folder's checkpoints). A checkpoint a few steps from another (a clock stop just after an
    epoch's end) is nearly its copy: averaging both would weigh one point twice."""
    candidates = checkpoint_candidates(folder)
    if newest is not None:
        candidates = [p for p in candidates if _step_of(p) <= _step_of(Path(newest))]
    steps = [_step_of(p) for p in candidates]
    gap = max(1, min_gap or (statistics.median(a - b for a, b in zip(steps, steps[1:])) // 2 if len(steps) > 1 else 1))
    chosen: list[Path] = []
    for path, step in zip(candidates, steps):
        if len(chosen) < count and (not chosen or _step_of(chosen[-1]) - step >= gap):
            chosen.append(path)
    if len(chosen) < count:
        raise CheckpointError(f"cannot average {count} checkpoints: {folder} holds {len(candidates)}, of which "
                              f"{len(chosen)} are at least {gap} steps apart (raise --keep_checkpoints or "
                              f"--save_every_steps when training, or lower --average_min_gap_steps)")
    return chosen


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The first (newest) checkpoint of `paths` with its model weights replaced by the mean over all
    of them. Floating-point tensors are averaged, others come from the newest; tensors that share
    storage (tied embeddings) are averaged once and stay shared."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    newest = load_checkpoint(paths[0])
    model = newest["model"]
    sums: dict[str, torch.Tensor] = {k: v.double() for k, v in model.items() if v.is_floating_point()}
    for path in paths[1:]:
        weights = load_checkpoint(path)["model"]
        if weights.keys() != model.keys() or any(weights[k].shape != model[k].shape for k in model):
            raise CheckpointError(f"cannot average {path} with {paths[0]}: the models differ")
        for key in sums:
            sums[key] += weights[key].double()
    averaged: dict[str, torch.Tensor] = {}
    shared: dict[tuple, torch.Tensor] = {}
    for key, tensor in model.items():
        if key not in sums:
            averaged[key] = tensor
            continue
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if view not in shared:
            shared[view] = (sums[key] / len(paths)).to(tensor.dtype)
        averaged[key] = shared[view]
    newest["model"] = averaged
    return newest


def save_average(folder: Path, count: int, min_gap: int = 0) -> Path:
    """Average the `count` newest checkpoints of `folder`, `min_gap` steps apart
    (`checkpoints_to_average`), into ckpt_<newest step>_avg<count>.pt:
    weights, config and tokenizers (no optimizer: it is for translating, not resuming; its name is
    not a resume candidate's). The manifest records it as the experiment's `average`, replacing an
    older one, so inference loads it while it belongs to the newest checkpoint."""
    folder = Path(folder)
    paths = checkpoints_to_average(folder, count, min_gap=min_gap)
    state = average_checkpoints(paths)
    averaged = {key: state[key] for key in ("model", "config", "tokenizers", "epoch", "global_step")}
    averaged["averaged_from"] = [p.name for p in paths]
    path = folder / f"ckpt_{state['global_step']:08d}_avg{count}.pt"
    try:
        manifest = read_manifest(folder)
        digest = _write_checkpoint(path, averaged, manifest)
        previous = manifest.get("average")  # the manifest's own record: never a file it does not list
        if previous and previous != path.name:
            manifest["checkpoints"].pop(previous, None)
        manifest["checkpoints"][path.name] = {"sha256": digest, "global_step": state["global_step"],
                                              "averaged_from": averaged["averaged_from"]}
        manifest["average"] = path.name
        atomic_write_bytes(folder / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    except OSError as error:
        raise CheckpointError(f"could not write {path}: {error.strerror or error}") from None
    if previous and previous != path.name:
        (folder / previous).unlink(missing_ok=True)
    return path


def current_average(folder: Path, latest: Path) -> Path | None:
    """The experiment's averaged checkpoint if it was made from `latest` and its predecessors."""
    manifest = read_manifest(folder)
    name = manifest.get("average")
    if not name:
        return None
    entry = manifest["checkpoints"].get(name, {})
    return Path(folder) / name if entry.get("global_step") == _step_of(Path(latest)) and \
        (Path(folder) / name).is_file() else None


def best_checkpoint(folder: Path) -> Path | None:
    """The best checkpoint the manifest records; when its file is gone (moved out by the user), the
    best of those left, by the run's metric, with a line saying so. None when none has been scored."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    recorded = manifest.get("best")
    if not recorded or (folder / recorded).is_file():
        return folder / recorded if recorded else None
    _drop_missing(folder, manifest)
    _choose_best(manifest, manifest.get("best_metric") or "bleu")
    instead = f"using {manifest['best']}, the best of those left" if manifest["best"] else \
        "no checkpoint left has been validated: using the newest"
    print(f"the best checkpoint, {recorded}, is no longer in {folder}: {instead}", file=sys.stderr, flush=True)
    return folder / manifest["best"] if manifest["best"] else None


def load_for_inference(path: Path | None, folder: Path, device: torch.device, average: int = 1,
                       choice: str | None = None, min_gap: int = 0):
    """(model in eval mode on `device`, source tokenizer, target tokenizer, its config, its path) from
    the checkpoint at `path`, or else from `folder` by `choice` (None: the config's default
    `checkpoint_choice`): `latest`, the newest good checkpoint; `best`, the best by the run's
    --best_metric on validation (the newest, with a note, where no validation has scored one);
    `average`, the average training wrote of its last checkpoints while it belongs to the newest
    (else the newest). With
    `average` N > 1, the mean weights of N checkpoints at least `min_gap` steps apart, ending at
    `path` or at the best (`checkpoints_to_average`)."""
    folder = Path(path).parent if path is not None else Path(folder)
    choice = choice or get_config()["checkpoint_choice"]
    scored = bool(read_manifest(folder).get("best"))  # a best once recorded, even if its file is gone
    if path is None and choice == "best":
        path = best_checkpoint(folder)
    if average > 1:
        paths = checkpoints_to_average(folder, average, path, min_gap)
        path, state = paths[0], average_checkpoints(paths)
    elif path is not None:
        state = load_checkpoint(path)
    else:
        found = load_latest(folder)
        if found is None:
            raise CheckpointError(f"no usable checkpoint in {folder}; train one with train.py (same --datasource, "
                                  f"--lang_src, --lang_tgt: all the target languages of a model of several, as in "
                                  f"--lang_tgt fr+it, with --target_lang fr to choose one) or pass --checkpoint PATH")
        path, state = found
        if choice == "best" and not scored:
            print(f"{folder} has no best checkpoint (no validation has scored one yet): using the newest",
                  file=sys.stderr, flush=True)
        averaged = current_average(folder, path) if choice == "average" else None
        if averaged is not None:
            path, state = averaged, load_checkpoint(averaged)
    try:
        # Keys added to the config after the checkpoint was written take their defaults.
        config = {**get_config(), **state["config"]}
        validate_config(config)
        tok_src = tokenizer_from_json(state["tokenizers"]["src"])
        tok_tgt = tokenizer_from_json(state["tokenizers"]["tgt"])
        model = build_model(config, tok_src.get_vocab_size(), tok_tgt.get_vocab_size())
    except (ConfigError, TokenizerError, KeyError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint {path} is not usable: {str(error).splitlines()[0]}") from None
    load_weights(model, state["model"], path)
    return model.to(device).eval(), tok_src, tok_tgt, config, Path(path)

