"""Two train.py processes on one experiment folder: the second refuses; stale locks don't block."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import train
from nmt.training.run_lock import RunLock, RunLockError
from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]
HOLD_LOCK = "import sys, time; from nmt.training.run_lock import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(60)"


def test_second_run_refuses_while_first_holds_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tiny_corpus(tmp_path / "data")
    folder = tmp_path / "weights" / "busy"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code = train.main(["--datasource", str(data), "--preset", "tiny", "--experiment_name", "busy",
                           "--model_folder", str(tmp_path / "weights"), "--runs_folder", str(tmp_path / "runs"),
                           "--store_folder", str(tmp_path / "stores")])
        assert code == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {holder.pid}" in err[0] and "another training run" in err[0]
        assert not list(folder.glob("ckpt_*.pt"))
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_dead_process_does_not_block(tmp_path: Path) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "train.lock").write_text("999999")  # a PID from a run that died
    lock = RunLock(folder)
    lock.acquire()
    try:
        with pytest.raises(RunLockError, match="in use"):
            RunLock(folder).acquire()
    finally:
        lock.release()
    again = RunLock(folder)
    again.acquire()
    again.release()


def test_a_folder_that_cannot_be_locked_is_one_line(tmp_path: Path) -> None:
    """--model_folder under a plain file: a RunLockError (one line from train.py), not a traceback."""
    (tmp_path / "afile").write_text("mine\n")
    with pytest.raises(RunLockError, match=f"cannot lock {tmp_path / 'afile' / 'exp' / 'train.lock'}: Not a "
                                              f"directory"):
        RunLock(tmp_path / "afile" / "exp").acquire()
    assert (tmp_path / "afile").read_text() == "mine\n"
