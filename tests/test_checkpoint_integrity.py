"""Checkpoints that lie: truncated, bit-flipped (in their folder or in a copy anywhere), written to a
full disk, crafted to run code, of another architecture; the run that must not start over when
its checkpoints are all unusable; and the checkpoint a run died before recording (adopted when it is
the run's own, else the run stops before it trains)."""
from __future__ import annotations

import builtins
import errno
import io
import json
import pickle
import struct
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nmt import atomic_files
import train
from nmt.training.resume import RESUME_KEYS
import translate as translate_py
from nmt.training.checkpoint import (DIGEST_KEY, MANIFEST, CheckpointError, content_digest, load_checkpoint, load_for_inference,
                        load_latest, save_average, save_checkpoint)
from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An experiment folder whose newest checkpoint is at step 12 (every 4 steps and each epoch end)."""
    tmp = tmp_path_factory.mktemp("integrity")
    data = tiny_corpus(tmp / "data")
    assert train.main(["--datasource", str(data), "--preset", "tiny", "--max_steps", "12", "--num_epochs", "100",
                       "--save_every_steps", "4", "--model_folder", str(tmp / "weights"),
                       "--runs_folder", str(tmp / "runs"), "--store_folder", str(tmp / "stores"),
                       "--val_max_sentences", "4"]) == 0
    return next((tmp / "weights").iterdir())


def copy_experiment(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def flip_a_bit_inside_tensor_data(path: Path) -> None:
    """Flip one bit in the middle of the checkpoint's largest tensor: torch's zip reader checks no
    CRC, so torch.load alone notices nothing."""
    with zipfile.ZipFile(path) as archive:
        record = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack_from("<HH", data, record.header_offset + 26)  # the local header's
    data[record.header_offset + 30 + name_length + extra_length + record.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


def train_main(trained: Path, model_folder: Path, *extra: str) -> int:
    """train.py on the `trained` run's data and stores, its experiment in `model_folder`."""
    config = torch.load(trained / "ckpt_00000012.pt", weights_only=True)["config"]
    return train.main(["--datasource", config["datasource"], "--preset", "tiny", "--max_steps", "16",
                       "--num_epochs", "100", "--model_folder", str(model_folder), "--runs_folder",
                       str(model_folder.parent / "runs"), "--store_folder", config["store_folder"],
                       "--val_max_sentences", "4", *extra])


def translate_main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str]]:
    """translate.py's main in this process: the exit code and the lines on stderr."""
    code = translate_py.main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


def translate(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "translate.py", *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=120)


DAMAGES = ["truncate", "flip"]
WRITERS = ["torch.save", "pickle.dump"]


def damaged_copy(trained: Path, target: Path, damage: str) -> Path:
    """A copy of the `trained` experiment whose newest checkpoint (step 12) is cut in half or has 16
    bytes inverted; the copy's folder."""
    folder = copy_experiment(trained, target)
    newest = folder / "ckpt_00000012.pt"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        for offset in range(len(data) // 3, len(data) // 3 + 16):
            data[offset] ^= 0xFF
    newest.write_bytes(bytes(data))
    return folder


def crafted_checkpoint(folder: Path, writer: str) -> tuple[Path, Path]:
    """A checkpoint file in `folder` whose unpickling would create a marker file: (the file, the marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "pwned"
    evil = folder / "ckpt_00000001.pt"
    payload = {"model": RunsCode(marker), "config": {}}
    if writer == "torch.save":
        torch.save(payload, evil)
    else:
        evil.write_bytes(pickle.dumps(payload))
    return evil, marker


@pytest.fixture(scope="module")
def refused(trained: Path,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """`python translate.py --checkpoint` on each damaged newest checkpoint and each crafted one
    below, run at once (each pays torch's import, mostly on one core): by damage or writer, its
    result and the file it was given."""
    root = tmp_path_factory.mktemp("refused")
    given = {damage: (damaged_copy(trained, root / damage, damage) / "ckpt_00000012.pt", "The cat sees the dog.")
             for damage in DAMAGES}
    given |= {writer: (crafted_checkpoint(root / writer, writer)[0], "Hello.") for writer in WRITERS}
    with ThreadPoolExecutor(max_workers=len(given)) as pool:
        futures = {key: pool.submit(translate, "--checkpoint", str(path), sentence)
                   for key, (path, sentence) in given.items()}
        return {key: (future.result(), given[key][0]) for key, future in futures.items()}


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_newest_checkpoint_falls_back(trained: Path, tmp_path: Path, damage: str,
                                              refused: dict, capsys: pytest.CaptureFixture) -> None:
    folder = damaged_copy(trained, tmp_path / "exp", damage)
    newest = folder / "ckpt_00000012.pt"

    second_newest = sorted(folder.glob("ckpt_*.pt"))[-2]
    path, state = load_latest(folder)
    assert path == second_newest and state["global_step"] == int(second_newest.stem.split("_")[1])
    assert "ckpt_00000012.pt" in capsys.readouterr().err

    with pytest.raises(CheckpointError, match="ckpt_00000012.pt"):
        load_checkpoint(newest)
    result, given = refused[damage]  # translate.py on a copy damaged alike
    assert given.read_bytes() == newest.read_bytes()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "ckpt_00000012.pt" in result.stderr


def test_truncation_detected_without_manifest(trained: Path, tmp_path: Path) -> None:
    folder = copy_experiment(trained, tmp_path / "exp")
    (folder / MANIFEST).unlink()
    newest = folder / "ckpt_00000012.pt"
    newest.write_bytes(newest.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(newest)
    assert load_latest(folder)[0] == sorted(folder.glob("ckpt_*.pt"))[-2]


def test_full_disk_keeps_previous_checkpoint(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    before = {p.name: p.read_bytes() for p in folder.glob("ckpt_*.pt")}

    class FullDisk(io.FileIO):
        """A real file on a disk that fills up after 64 KB: torch.save's own writes hit the wall."""

        def write(self, data) -> int:
            if self.tell() + len(data) > 64 * 1024:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    written = []

    def open_on_full_disk(path, mode="r", *args, **kwargs):
        if "w" not in mode:
            return builtins.open(path, mode, *args, **kwargs)
        written.append(path)
        return FullDisk(path, "w")

    monkeypatch.setattr(atomic_files, "open", open_on_full_disk, raising=False)
    config = dict(torch.load(folder / "ckpt_00000012.pt", weights_only=True)["config"])
    code = train.main(["--datasource", config["datasource"], "--preset", "tiny", "--max_steps", "14",
                       "--num_epochs", "100", "--model_folder", str(tmp_path / "weights"),
                       "--runs_folder", str(tmp_path / "runs"), "--store_folder", str(tmp_path / "stores"),
                       "--val_max_sentences", "4"])
    assert code == 1
    error_lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train.py: error")]
    assert len(error_lines) == 1 and "No space left on device" in error_lines[0]
    assert "intact" in error_lines[0]
    assert {p.name: p.read_bytes() for p in folder.glob("ckpt_*.pt")} == before
    assert not [p for p in folder.iterdir() if ".tmp" in p.name], "temporary file left behind"
    assert any("ckpt_" in str(path) for path in written), "the checkpoint was written through the full disk"
    monkeypatch.undo()
    assert load_latest(folder)[1]["global_step"] == 12


class RunsCode:
    """Unpickling this would create a marker file: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("writer", WRITERS)
def test_crafted_pickle_is_refused_and_runs_nothing(tmp_path: Path, writer: str, refused: dict) -> None:
    evil, marker = crafted_checkpoint(tmp_path, writer)
    with pytest.raises(CheckpointError, match="refused|corrupt"):
        load_checkpoint(evil)
    assert not marker.exists(), "loading the checkpoint ran code"
    result, given = refused[writer]  # translate.py on a checkpoint crafted alike
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert given.is_file() and not (given.parent / "pwned").exists(), "loading the checkpoint ran code"


def test_config_inside_checkpoint_is_validated(trained: Path, tmp_path: Path) -> None:
    state = torch.load(trained / "ckpt_00000012.pt", weights_only=True)
    for key, value, message in (("d_model", "64", "must be int"), ("surprise", 1, "unknown config key"),
                                ("num_heads", 5, "not divisible")):
        bad = dict(state, config=dict(state["config"], **{key: value}))
        bad[DIGEST_KEY] = content_digest(bad)  # a digest that vouches for the bad config: only validation stops it
        path = tmp_path / f"bad_{key}" / "ckpt_00000012.pt"
        path.parent.mkdir()
        torch.save(bad, path)
        with pytest.raises(CheckpointError, match=message):
            load_for_inference(path, path.parent, torch.device("cpu"))


@pytest.mark.parametrize("kind", ["checkpoint", "average"])
def test_a_damaged_copy_outside_its_folder_is_refused(trained: Path, tmp_path: Path, kind: str,
                                                      capsys: pytest.CaptureFixture) -> None:
    """Copied where no manifest lists it, as users share a model, a checkpoint still vouches for
    itself: an intact copy loads, a copy with one flipped bit in its tensor data is refused."""
    folder = copy_experiment(trained, tmp_path / "exp")
    original = folder / "ckpt_00000012.pt" if kind == "checkpoint" else save_average(folder, 2)
    intact, damaged = tmp_path / "shared" / "intact.pt", tmp_path / "shared" / "damaged.pt"
    intact.parent.mkdir()
    intact.write_bytes(original.read_bytes())
    damaged.write_bytes(original.read_bytes())
    flip_a_bit_inside_tensor_data(damaged)
    # the premise: torch.load alone reads the damaged copy without a word, with other weights
    read, altered = torch.load(intact, weights_only=True), torch.load(damaged, weights_only=True)
    assert any(not torch.equal(read["model"][name], altered["model"][name]) for name in read["model"])

    assert load_checkpoint(intact)["global_step"] == 12
    with pytest.raises(CheckpointError, match="damaged.pt is corrupt"):
        load_checkpoint(damaged)
    capsys.readouterr()
    assert translate_main(capsys, "--checkpoint", str(intact), "The cat.")[0] == 0
    code, errors = translate_main(capsys, "--checkpoint", str(damaged), "The cat.")
    assert code == 1 and len(errors) == 1 and "damaged.pt is corrupt" in errors[0], errors


def folder_contents(folder: Path) -> dict[str, bytes]:
    """Every file's bytes but the run lock's (train.lock is rewritten with the owner's pid at each start)."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "train.lock"}


@pytest.mark.parametrize("left, why", [("a corrupt checkpoint", "ckpt_00000012.pt is corrupt"),
                                       ("an average", "no checkpoint to resume (an average has no optimizer state)")])
def test_a_run_whose_checkpoints_are_unusable_stops_and_changes_nothing(trained: Path, tmp_path: Path, left: str,
                                                                        why: str,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """Never start over unasked: a new run would retrain the tokenizers over those beside the
    checkpoints, and overwrite checkpoints a long run had saved."""
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    if left == "an average":
        save_average(folder, 2)
    for path in folder.glob("ckpt_*.pt"):
        if path.name != ("ckpt_00000012.pt" if left == "a corrupt checkpoint" else "ckpt_00000012_avg2.pt"):
            path.unlink()
    if left == "a corrupt checkpoint":
        flip_a_bit_inside_tensor_data(folder / "ckpt_00000012.pt")
    before = folder_contents(folder)
    assert {"tokenizer_en.json", "tokenizer_it.json"} <= set(before)
    capsys.readouterr()
    assert train_main(trained, tmp_path / "weights") == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("train.py: error: "), errors
    assert why in errors[0] and "to start over" in errors[0] and "--experiment_name" in errors[0]
    assert folder_contents(folder) == before
    assert not (tmp_path / "runs").exists()


def test_following_the_advice_to_move_checkpoints_out_loses_nothing(trained: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """The advice above, followed: every checkpoint moved out while checkpoints.json still lists them
    (and names one best). The next run starts over, drops them from the manifest with one line, keeps
    the checkpoint it writes, and translate.py loads it."""
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    assert json.loads((folder / MANIFEST).read_text())["best"]
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in folder.glob("ckpt_*.pt"):
        path.rename(moved / path.name)
    capsys.readouterr()
    assert train_main(trained, tmp_path / "weights", "--max_steps", "3") == 0
    assert "no longer in" in capsys.readouterr().err
    assert [p.name for p in folder.glob("ckpt_*.pt")] == ["ckpt_00000003.pt"]
    manifest = json.loads((folder / MANIFEST).read_text())
    assert list(manifest["checkpoints"]) == ["ckpt_00000003.pt"] and manifest["best"] == "ckpt_00000003.pt"
    code, errors = translate_main(capsys, "--model_folder", str(tmp_path / "weights"), "The cat sees the dog.")
    assert code == 0 and "ckpt_00000003.pt" in errors[-1], errors


def test_an_average_given_to_preload_is_one_line(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    averaged = save_average(copy_experiment(trained, tmp_path / "exp"), 2)
    capsys.readouterr()
    assert train_main(trained, tmp_path / "weights", "--preload", str(averaged)) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "is an averaged checkpoint" in errors[0] and "--init_from" in errors[0], errors


def test_another_architecture_is_one_line(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Weights that do not fit the model their own config describes (as from another version of
    model.py): translate.py and a resume with --preload say which weights differ."""
    state = load_checkpoint(trained / "ckpt_00000012.pt")
    renamed = {name.replace("encoder.", "encoder_v0.", 1): tensor for name, tensor in state["model"].items()}
    other = save_checkpoint(tmp_path / "other", dict(state, model=renamed), 12, keep=1)
    capsys.readouterr()
    code, errors = translate_main(capsys, "--checkpoint", str(other), "The cat.")
    assert code == 1 and len(errors) == 1 and "another architecture" in errors[0], errors
    assert "missing weights" in errors[0] and "unexpected weights: " in errors[0] and "encoder_v0." in errors[0]
    assert train_main(trained, tmp_path / "weights", "--preload", str(other)) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line or "Traceback" in line]
    assert len(errors) == 1 and "another architecture" in errors[0], errors


def unrecord_newest(folder: Path) -> str:
    """Take ckpt_00000012.pt out of checkpoints.json, as a run that died between its rename and the
    manifest's update leaves it; the bytes of the manifest."""
    manifest = json.loads((folder / MANIFEST).read_text())
    del manifest["checkpoints"]["ckpt_00000012.pt"]
    manifest["latest"] = max(manifest["checkpoints"])
    if manifest["best"] == "ckpt_00000012.pt":
        manifest["best"] = manifest["best_value"] = None
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return (folder / MANIFEST).read_text()


def test_a_checkpoint_whose_run_died_before_recording_it_is_adopted(trained: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """The same command again finds ckpt_00000012.pt unlisted: it verifies by its digest and holds
    this run's tokenizers, so it is listed (rotation counts it, a later run may replace it) and
    resumed."""
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    unrecord_newest(folder)
    capsys.readouterr()
    assert train_main(trained, tmp_path / "weights", "--max_steps", "12") == 0
    err = capsys.readouterr().err
    assert "ckpt_00000012.pt was written but not recorded" in err and "resuming from" in err and "step 12)" in err
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["latest"] == "ckpt_00000012.pt" and "ckpt_00000012.pt" in manifest["checkpoints"]
    assert load_checkpoint(folder / "ckpt_00000012.pt")["global_step"] == 12


def resign(state: dict) -> dict:
    return {**state, DIGEST_KEY: content_digest(state)}


@pytest.mark.parametrize("case", ["damaged", "another run's", "above an older --preload"])
def test_an_unlisted_checkpoint_above_the_resume_step_stops_the_run_at_once(trained: Path, tmp_path: Path, case: str,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """An unlisted ckpt_00000012.pt that cannot be taken as the run's newest (damaged; with other
    tokenizers, though its digest and config fit; or above the checkpoint --preload names) stops the
    run before it trains, in one line that names it, every file left as it was: else the run, saving
    every 4 steps, would train up to step 12 and only then stop."""
    folder = copy_experiment(trained, tmp_path / "weights" / trained.name)
    unrecord_newest(folder)
    newest, extra = folder / "ckpt_00000012.pt", ["--save_every_steps", "4"]
    if case == "damaged":
        flip_a_bit_inside_tensor_data(newest)
    elif case == "another run's":
        state = torch.load(newest, weights_only=True)
        torch.save(resign(dict(state, tokenizers={"src": state["tokenizers"]["tgt"],
                                                  "tgt": state["tokenizers"]["src"]})), newest)
    else:
        extra += ["--preload", str(folder / "ckpt_00000008.pt")]
    before = folder_contents(folder)
    capsys.readouterr()
    assert train_main(trained, tmp_path / "weights", *extra) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("train.py: error: "), errors
    assert "ckpt_00000012.pt" in errors[0] and "move it out of the folder and resume" in errors[0]
    assert {"damaged": "is corrupt", "another run's": "not this run's",
            "above an older --preload": "above step 8, where this run resumes"}[case] in errors[0]
    assert folder_contents(folder) == before
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_holds_what_resuming_needs(trained: Path) -> None:
    """What Trainer.save writes is what check_resumable asks of a checkpoint: RESUME_KEYS, with the
    metrics, the digest, the run's plan (None unless it was planned to its clock; a checkpoint written
    before plans lacks it and still resumes), the depth, batch and width its plan chose (None unless it
    chose them), the record of its data (store.data_record; one written before it lacks it and
    resumes unchecked) and what the run decided beside its config (train.Trainer.decide)."""
    assert set(load_checkpoint(trained / "ckpt_00000012.pt")) == {
        *RESUME_KEYS, "plan", "planned_layers", "planned_batch_tokens", "planned_width", "data", "metrics", "decided",
        DIGEST_KEY}
