"""SIGINT/SIGTERM finish the current step, checkpoint, and exit 0 with a resume hint; a second
Ctrl-C quits at once without a traceback.

The three runs (stopped by SIGINT, by SIGTERM, and by Ctrl-C twice) train side by side, one thread
each (OMP_NUM_THREADS=1), so that on two cores they share the cores instead of running one after
the other; each is signalled as its own test says."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from nmt.training.ranks import GracefulStop, StopRequested
from synthetic_data import tiny_corpus

ROOT = Path(__file__).resolve().parents[1]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TWICE = "Ctrl-C twice"


class Stopped(NamedTuple):
    returncode: int
    stderr: str
    weights: Path


def launch(folder: Path, *options: str, validation: int = 30) -> subprocess.Popen:
    data = tiny_corpus(folder / "data", train=400, validation=validation)
    return subprocess.Popen(
        [sys.executable, "train.py", "--datasource", str(data), "--preset", "tiny", *options,
         "--model_folder", str(folder / "weights"), "--runs_folder", str(folder / "runs"),
         "--store_folder", str(folder / "stores")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})


def stop_once_training(process: subprocess.Popen, weights: Path, sig: signal.Signals) -> None:
    """Send `sig` once the run has written a checkpoint."""
    deadline = time.monotonic() + 120
    while not list(weights.glob("*/ckpt_*.pt")):  # training is under way
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1]
        time.sleep(0.05)
    process.send_signal(sig)


def ctrl_c_twice(process: subprocess.Popen) -> str:
    """The first Ctrl-C as validation starts, the second once the first is handled; its stderr."""
    seen = []
    for line in process.stderr:  # validating 600 sentences takes seconds: a wide window
        seen.append(line)
        if line.startswith("epoch 0 trained in"):
            process.send_signal(signal.SIGINT)
        elif line.startswith("received SIGINT"):
            process.send_signal(signal.SIGINT)
            break
    return "".join(seen) + process.communicate(timeout=30)[1]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[object, Stopped]:
    """The runs, each stopped by its signals: by SIGINT, by SIGTERM, and by Ctrl-C twice."""
    root = tmp_path_factory.mktemp("graceful")
    folders = {sig: root / sig.name for sig in STOP_SIGNALS} | {TWICE: root / "twice"}
    processes = {sig: launch(folders[sig], "--d_model", "64", "--d_ff", "256", "--num_epochs", "1000",
                             "--save_every_steps", "2") for sig in STOP_SIGNALS}
    processes[TWICE] = launch(folders[TWICE], "--num_epochs", "100", validation=600)
    stderr: dict[object, str] = {}
    driver = threading.Thread(target=lambda: stderr.update({TWICE: ctrl_c_twice(processes[TWICE])}))
    driver.start()
    try:
        for sig in STOP_SIGNALS:  # each signalled as soon as it trains, then both waited for
            stop_once_training(processes[sig], folders[sig] / "weights", sig)
        for sig in STOP_SIGNALS:
            stderr[sig] = processes[sig].communicate(timeout=60)[1]
        driver.join(timeout=180)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
        driver.join()
    return {key: Stopped(process.wait(), stderr.get(key, ""), folders[key] / "weights")
            for key, process in processes.items()}


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_signal_checkpoints_and_exits_zero(stopped: dict[object, Stopped], sig: signal.Signals) -> None:
    run = stopped[sig]
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    last_line = run.stderr.strip().splitlines()[-1]
    assert last_line.startswith("stopped at step ") and "resume with: python train.py" in last_line
    stopped_at = int(last_line.split()[3].rstrip(";"))
    newest = max(run.weights.glob("*/ckpt_*.pt"))
    assert newest.name == f"ckpt_{stopped_at:08d}.pt"
    assert torch.load(newest, weights_only=True)["global_step"] == stopped_at


def test_second_ctrl_c_quits_at_once(stopped: dict[object, Stopped]) -> None:
    """The first Ctrl-C arrives as validation starts (the first signal's log line proves it was
    handled), so the run is still validating, or in the step after it, when the second arrives:
    that one must quit at once with 130, not finish and save."""
    run = stopped[TWICE]
    assert run.returncode == 130, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == "train.py: interrupted; the last checkpoint is intact"
    assert not list(run.weights.glob("*/ckpt_*.pt")), "quit at once: no checkpoint of this epoch"


@pytest.mark.parametrize("sig, within, stops_with", [
    (signal.SIGTERM, "abandoning", StopRequested),  # validation abandoned
    (signal.SIGINT, "at_once", KeyboardInterrupt)])  # before the first step: quit at once
def test_signal_handled_inside_a_weakref_callback_still_stops(capfd: pytest.CaptureFixture[str], sig: signal.Signals,
                                                              within: str, stops_with: type[BaseException]) -> None:
    """A signal handler's exception raised inside a callback that Python runs for itself is
    printed as a traceback and dropped (the flake this guards: one SIGTERM run in about six printed
    one and validated on). The signal is sent again, and the work stops in ordinary code."""
    class Held:
        pass

    def signal_inside_the_callback(_: weakref.ref) -> None:
        signal.raise_signal(sig)  # handled at the callback's next line, inside it

    with GracefulStop() as graceful, pytest.raises(stops_with):
        with getattr(graceful, within)():
            held = Held()
            reference = weakref.ref(held, signal_inside_the_callback)
            del held
            time.sleep(5)  # the work, which the dropped exception would let go on
    assert reference() is None and graceful.terminated == (sig == signal.SIGTERM)
    # Python's report of the dropped exception (stderr is read at the descriptor, which a thread
    # another test left behind in this worker may also write to: the names, not any traceback).
    err = capfd.readouterr().err
    assert "Exception ignored" not in err and stops_with.__name__ not in err, err
