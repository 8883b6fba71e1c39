"""Real torchrun, 2 CPU processes (gloo): ranks that cannot disagree.

1. Two ranks equal one process with the same global batch, on a weighted mix of two corpora (the
   second tagged and drawn at half its size each epoch). Validation is shared: each rank decodes
   half the sources, and rank 0's validation loss equals the single process's.

Each global step holds world_size * accum_steps micro-batches; rank r trains on every
world_size-th one. So 2 ranks x accum 1 and 1 rank x accum 2 see the same micro-batches per step,
and with the loss normalised by the step's token count they must reach the same weights.
(Resuming under DDP is test 2's.)

Adam's eps is raised to 1e-6 for the comparison: the key projection's bias has an exactly zero
true gradient (it shifts every attention score of a query equally), so it only ever sees rounding
noise, which eps 1e-9 would turn into full-size, order-dependent updates.

2. Two nodes (`torchrun --nnodes 2`, one rank each, c10d rendezvous on 127.0.0.1), each in its own
   folder with its own copy of the corpus, no shared disk, dropout on, killed with SIGKILL and
   restarted: each node resumes from its own checkpoints and ends bit for bit where an unbroken run
   ends (its ranks forked by `rank_faults.py --launch`, see 4): each rank's dropout stream is a
   function of (seed, rank, step).
3. A NaN loss on one rank only makes both ranks skip that step (their weights stay identical). In a
   run planned to --max_minutes, rank 1's clock running 20 times as fast, both ranks follow rank 0's
   plan, and a stop by --max_minutes, judged on rank 0's clock, ends both with exit 0 and a checkpoint.
4. Ranks that never hang (ranks.py), while rank 1, its share of validation decoded, waits for rank
   0's scores: rank 0 raising there ends both ranks within seconds, rank 1 naming rank 0 in one
   line; rank 1 stopped with
   SIGSTOP ends rank 0 after --rank_timeout_s, naming rank 1, and rank 1 itself once it runs
   again; a SIGTERM to rank 1 abandons rank 0's validation and stops both with a checkpoint. These
   jobs start their ranks as a launcher without torchrun's agent would (srun, mpirun, a script):
   no agent ends the others when one exits, and rank 0 hosts the job's store. The three run side
   by side, one thread per rank, forked from one interpreter (`rank_faults.py --launch`).

Tests 1 to 3 run with --rank_timeout_s 10: a rank waiting for rank 0 (a checkpoint, a validation)
looks for its result every poll_s (a fortieth of the limit, 0.1 s to 0.5 s), which at the default
60 s added up to seconds per run; what they test does not depend on the limit.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

from synthetic_data import synthetic_pairs, tiny_corpus

ROOT = Path(__file__).resolve().parents[1]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun gives each rank where nothing says otherwise
QUICK_WATCH = ("--rank_timeout_s", "10")  # see the module docstring


def train_args(data: Path, out: Path, *extra: str, dropout: str = "0",
               epochs: tuple[str, ...] = ("--num_epochs", "100")) -> list[str]:
    return ["train.py", "--datasource", str(data), "--preset", "tiny", "--d_model", "64", "--d_ff", "128",
            "--dropout", dropout, "--adam_eps", "1e-6", *epochs, "--val_max_sentences", "4",
            "--model_folder", str(out / "w"), "--runs_folder", str(out / "r"), "--store_folder", str(out / "s"),
            "--clean", "false", *extra]  # the ranks are tested, not cleaning: no language identifier to load


def checkpoint(out: Path, step: int) -> dict:
    return torch.load(next((out / "w").iterdir()) / f"ckpt_{step:08d}.pt", weights_only=True)


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return checkpoint(out, step)["model"]


def test_two_rank_ddp_equals_single_process_with_same_global_batch(tmp_path: Path) -> None:
    # A weighted mix of two corpora, one tagged: both ranks must draw the same rows of each (issue 20).
    corpus = tiny_corpus(tmp_path / "data", train=400)
    data = f"{corpus}:1,{corpus}:0.5:<BT>"
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    # The single process trains while the ranks do: on two cores the three share them.
    with open(tmp_path / "single.log", "w") as log:
        alone = subprocess.Popen([sys.executable, *train_args(data, single, "--max_steps", "6", "--accum_steps", "2")],
                                 cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        try:
            result = subprocess.run([*TORCHRUN, "tests/rank_faults.py",
                                     *train_args(data, ddp, "--max_steps", "6", *QUICK_WATCH)[1:]],
                                    cwd=ROOT, capture_output=True, text=True, timeout=240)
            assert alone.wait(timeout=240) == 0, (tmp_path / "single.log").read_text()[-3000:]
        finally:
            if alone.poll() is None:
                alone.kill()
                alone.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 ranks" in result.stderr

    expected, actual = weights(single, 6), weights(ddp, 6)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    # Validation was shared: each rank decoded half the sources and its half of the loss's batches,
    # and rank 0's loss of the two halves is the single process's. (Its BLEU need not be: a batch
    # of two sentences pads otherwise than one of four, and a 6-step model's outputs hang on ties.)
    for rank in (0, 1):
        assert f"rank_faults: rank {rank} validated 2 of 4 sources" in result.stderr
    alone, shared = (checkpoint(out, 6)["metrics"] for out in (single, ddp))
    assert shared["loss"] == pytest.approx(alone["loss"], rel=1e-4)
    assert 0 <= shared["bleu"] <= 100 and shared["chrf"] > 0


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def two_nodes(folders: list[Path], args: list[str], port: int) -> list[subprocess.Popen]:
    """Two torchrun agents on this machine acting as two nodes of one rank each (c10d rendezvous on
    127.0.0.1), each in its own working folder: train.py `args` with paths relative to it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
    # one thread per rank whatever the caller's OMP_NUM_THREADS, as the unbroken run's forked ranks
    # have: another thread count sums in another order, and the weights would differ in their last bits
    # (no --node_rank: the c10d rendezvous numbers the nodes as they join)
    return [subprocess.Popen([*command, str(ROOT / "train.py"), *args], cwd=folder,
                             stdout=subprocess.DEVNULL, stderr=open(folder / f"node{node}.log", "a"), env=ONE_THREAD)
            for node, folder in enumerate(folders)]


def test_two_nodes_without_a_shared_disk_killed_and_resumed_equal_an_unbroken_run(tmp_path: Path) -> None:
    """Two nodes (torchrun --nnodes 2), each with its own folder and its own copy of the corpus and
    nothing shared but the rendezvous: each node builds its own data stores (checked against rank
    0's by content), takes rank 0's tokenizers, writes its own checkpoints; both killed with SIGKILL
    at a seeded random moment after a first checkpoint and started again, each resumes from its own
    folder and ends bit for bit where an unbroken run ends (its ranks forked by `rank_faults.py
    --launch`, one folder): each rank's dropout stream is a function of (seed, rank, step)."""
    data = tiny_corpus(tmp_path / "data", train=400)
    steps = 12  # 3 steps an epoch: 4 epochs, killed early in the second, resumed for three more
    extra = ("--max_steps", str(steps), "--save_every_steps", "4", "--keep_checkpoints", "50", *QUICK_WATCH)
    unbroken, nodes = tmp_path / "unbroken", [tmp_path / "node0", tmp_path / "node1"]
    for folder in nodes:
        shutil.copytree(data, folder / "data")
    relative = train_args(Path("data"), Path("."), *extra, dropout="0.1")[1:]
    # The unbroken run trains while the nodes are killed and resumed (one thread per rank).
    reference = launch(job_specs(unbroken, train_args(data, unbroken, *extra, dropout="0.1")[1:]),
                       tmp_path / "unbroken.json")
    try:
        kill_and_resume(nodes, relative, steps)
        exits = reference.communicate(timeout=240)[0]
        codes = [int(line.split()[2]) for line in exits.splitlines() if line.startswith("exited ")]
        assert codes == [0, 0], "".join((unbroken / f"rank{rank}.log").read_text()[-3000:] for rank in (0, 1))
    finally:
        if reference.poll() is None:  # a failure above: end the unbroken run's ranks too
            for pid in process_tree(reference.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        reference.wait()
    expected = weights(unbroken, steps)
    for folder in nodes:  # each node's own stores, tokenizers and checkpoints, the last one the unbroken run's
        assert list((folder / "s").glob("*_tokens_*")) and list((folder / "w").glob("*/tokenizer_*.json"))
        actual = weights(folder, steps)
        assert expected.keys() == actual.keys()
        for name in expected:
            assert torch.equal(expected[name], actual[name]), (folder.name, name)


def kill_and_resume(nodes: list[Path], args: list[str], steps: int) -> None:
    """Run the two nodes, SIGKILL both agents and their ranks at a seeded random moment after the
    first checkpoint, then run them again to the end."""
    port = free_port()
    victims = two_nodes(nodes, args, port)
    deadline = time.monotonic() + 120
    while not any(list((folder / "w").glob("*/ckpt_*.pt")) for folder in nodes):
        assert all(victim.poll() is None for victim in victims) and time.monotonic() < deadline, \
            "".join((folder / f"node{n}.log").read_text()[-3000:] for n, folder in enumerate(nodes))
        time.sleep(0.01)
    delay = random.Random(9).uniform(0.0, 0.3)
    print(f"killing the nodes {delay:.2f} s after the first checkpoint")
    time.sleep(delay)
    trees = [process_tree(victim.pid) for victim in victims]
    assert all(len(tree) >= 2 for tree in trees), "torchrun and its rank, on each node"
    for pid in (pid for tree in trees for pid in tree):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for victim in victims:
        victim.wait(timeout=30)
    saved = sorted(int(p.stem.split("_")[1]) for folder in nodes for p in (folder / "w").glob("*/ckpt_*.pt"))
    assert saved and saved[-1] < steps, "the run finished before it could be killed"
    resumed = two_nodes(nodes, args, port)
    codes = [node.wait(timeout=240) for node in resumed]
    logs = [(folder / f"node{n}.log").read_text() for n, folder in enumerate(nodes)]
    assert codes == [0, 0], "".join(log[-3000:] for log in logs)
    assert all("resuming from w/" in log for log in logs), logs


def test_nan_on_one_rank_skips_on_both_and_rank_0s_plan_and_clock_rule_both(tmp_path: Path) -> None:
    """Planned to --max_minutes 0.5 with a cosine schedule, whose every step's learning rate depends
    on the run's length: had rank 1 (its clock 20 times as fast) followed a plan of its own, the
    ranks would part, in their weights or where they end; had it judged the stop, it would have come
    within 1.5 s. Rank 0's clock leaps past the budget after step 24: both stop at step 25."""
    data = tiny_corpus(tmp_path / "data", train=400)
    out = tmp_path / "run"
    command = [*TORCHRUN, "tests/rank_faults.py", "--nan_rank", "1", "--nan_steps", "3",
               "--weights_out", str(tmp_path / "final"), "--fast_clock_rank", "1", "--leap_after_step", "24",
               *train_args(data, out, "--max_minutes", "0.5", "--lr_schedule", "cosine", *QUICK_WATCH,
                           dropout="0.1", epochs=())[1:]]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert "Traceback" not in result.stderr
    assert result.stderr.count("step 3: non-finite loss or gradient, step skipped (1 in a row)") == 2  # both ranks
    assert "reached --max_minutes 0.5 (25 steps)" in result.stderr, result.stderr[-3000:]
    final = torch.load(next((out / "w").iterdir()) / "ckpt_00000025.pt", weights_only=True)
    assert final["global_step"] == 25 and final["metrics"], "validated and saved at the stop"
    assert final["plan"]["total_steps"] > 25
    rank0, rank1 = (torch.load(f"{tmp_path / 'final'}.rank{r}.pt", weights_only=True) for r in (0, 1))
    for name in rank0:
        assert torch.equal(rank0[name], rank1[name]), name
        assert torch.equal(rank0[name], final["model"][name]), name


class Faulted(NamedTuple):
    """A two-rank job after its fault: each rank's exit code (None: still running at the deadline)
    and stderr, and the seconds from the fault to each rank's exit."""

    codes: list[int | None]
    stderr: list[str]
    seconds: list[float]
    out: Path


SCENARIOS = {  # fault in rank 0's validation, --rank_timeout_s, what the test does to the ranks (pids) then
    "raise": ("raise", 10, lambda pids: None),
    "stop": ("sleep", 4, lambda pids: os.kill(pids[1], signal.SIGSTOP)),
    "sigterm": ("sleep", 10, lambda pids: os.kill(pids[1], signal.SIGTERM)),
}


def rank_specs(data: Path, out: Path, fault: str, limit: float) -> list[dict]:
    """Rank 0 and rank 1 of one job, from the environment variables alone (rank 0 hosts the store)."""
    return job_specs(out, ["--validation_fault", fault, *train_args(data, out, "--rank_timeout_s", str(limit))[1:]])


def free_port() -> int:
    """A port free now, below the range the system hands out to sockets bound to port 0 and to
    outgoing connections: one probed in that range was taken by another test's socket before rank 0
    listened on it (EADDRINUSE)."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    for port in random.SystemRandom().sample(range(20000, low), 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between 20000 and {low}")


def job_specs(out: Path, argv: list[str]) -> list[dict]:
    """`rank_faults.py --launch`'s specs of a two-rank job running tests/rank_faults.py `argv`, its
    ranks' stderr in out/rank0.log and out/rank1.log."""
    out.mkdir(parents=True)
    port = free_port()
    return [{"env": {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(rank),
                     "LOCAL_RANK": str(rank)},
             "argv": argv, "log": str(out / f"rank{rank}.log")} for rank in (0, 1)]


def launch(specs: list[dict], spec_file: Path) -> subprocess.Popen:
    """`rank_faults.py --launch` on `specs`: one interpreter imports torch and train.py and forks
    the ranks, one thread each as torchrun gives them; it prints "started PID" per rank, then
    "exited PID CODE" as each one ends."""
    spec_file.write_text(json.dumps(specs))
    return subprocess.Popen([sys.executable, "tests/rank_faults.py", "--launch", str(spec_file)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env=ONE_THREAD)


def fault_and_wait(pids: list[int], out: Path, act: Callable[[list[int]], None],
                   exits: dict[int, tuple[int, float]]) -> Faulted:
    """Once rank 0 starts validating (rank 1 waits for it), `act` on the ranks; then wait, a minute
    at most, for rank 0 to exit, run rank 1 again if it is stopped, and wait for it likewise."""
    deadline = time.monotonic() + 120
    while "rank_faults: validating" not in (out / "rank0.log").read_text():
        assert pids[0] not in exits and time.monotonic() < deadline, (out / "rank0.log").read_text()[-3000:]
        time.sleep(0.05)
    act(pids)
    faulted, seconds = time.monotonic(), [0.0, 0.0]
    for rank, pid in enumerate(pids):
        deadline = time.monotonic() + 60
        while pid not in exits and time.monotonic() < deadline:
            time.sleep(0.05)
        seconds[rank] = (exits[pid][1] if pid in exits else time.monotonic()) - faulted
        if rank == 0 and pids[1] not in exits:
            os.kill(pids[1], signal.SIGCONT)  # a stopped rank 1 runs again once rank 0 has ended
            faulted = time.monotonic()
    return Faulted([exits[pid][0] if pid in exits else None for pid in pids],
                   [(out / f"rank{rank}.log").read_text() for rank in (0, 1)], seconds, out)


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Faulted]:
    """The three jobs side by side, their six ranks forked by one launcher (tests/rank_faults.py)."""
    root = tmp_path_factory.mktemp("faulted")
    data = root / "data"  # plain files: opening them needs no `datasets` import
    data.mkdir()
    for split, pairs in (("train", synthetic_pairs(400, 1)), ("validation", synthetic_pairs(8, 2))):
        (data / f"{split}.tsv").write_text("".join(f"{source}\t{target}\n" for source, target in pairs))
    specs = [spec for name, (fault, limit, _) in SCENARIOS.items() for spec in rank_specs(data, root / name, fault, limit)]
    launcher = launch(specs, root / "ranks.json")
    pids = [int(launcher.stdout.readline().split()[1]) for _ in specs]
    exits: dict[int, tuple[int, float]] = {}  # pid: (exit code, when)

    def read_exits() -> None:
        for line in launcher.stdout:
            _, pid, code = line.split()
            exits[int(pid)] = (int(code), time.monotonic())

    threading.Thread(target=read_exits, daemon=True).start()
    results: dict[str, Faulted] = {}
    drivers = [threading.Thread(target=lambda name=name, job=job: results.update(
        {name: fault_and_wait(pids[2 * job:2 * job + 2], root / name, SCENARIOS[name][2], exits)}))
        for job, name in enumerate(SCENARIOS)]
    try:
        for driver in drivers:
            driver.start()
        for driver in drivers:
            driver.join(timeout=300)
    finally:
        for pid in pids:
            if pid not in exits:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=60)
    return results


def test_a_rank_that_raises_during_validation_ends_both_at_once_naming_it(faulted: dict[str, Faulted]) -> None:
    job = faulted["raise"]
    assert job.codes[0] not in (0, None) and job.codes[1] not in (0, None), job.stderr
    assert "RuntimeError: planted fault in validation" in job.stderr[0]  # rank 0's own traceback
    assert [line for line in job.stderr[1].splitlines() if "error" in line] == [
        "train.py: error: rank 0 failed: RuntimeError: planted fault in validation"], job.stderr[1]
    assert "Traceback" not in job.stderr[1]
    assert max(job.seconds) < 10, f"{job.seconds}: ended by a timeout, not by rank 0's posted failure"


def test_a_rank_that_stops_responding_ends_every_rank(faulted: dict[str, Faulted]) -> None:
    """Rank 1 is stopped (SIGSTOP) while it waits: rank 0, still validating, ends after the limit
    (4 s) with one line naming rank 1; rank 1, run again, ends too."""
    job = faulted["stop"]
    assert job.codes[0] == 1, job.stderr[0]
    assert job.stderr[0].strip().splitlines()[-1] == "train.py: error: rank 1 stopped responding (no heartbeat for 4 s)"
    assert 3 <= job.seconds[0] < 20  # the limit, less the heartbeat that may have passed before the stop
    assert job.codes[1] not in (0, None) and job.seconds[1] < 20, job.stderr[1]
    assert "Traceback" not in job.stderr[0] + job.stderr[1]


def test_sigterm_to_a_waiting_rank_stops_both_with_a_checkpoint(faulted: dict[str, Faulted]) -> None:
    """Rank 1 gets SIGTERM while it waits for rank 0's (two-minute) validation: rank 0 abandons it,
    and both stop with exit 0 and a checkpoint within seconds."""
    job = faulted["sigterm"]
    assert job.codes == [0, 0], job.stderr
    assert max(job.seconds) < 20
    assert "rank 1 received SIGTERM: stopping after this step" in job.stderr[0]
    last = job.stderr[0].strip().splitlines()[-1]
    assert last.startswith("stopped at step "), job.stderr[0]
    step = int(last.split()[3].rstrip(";"))
    checkpoint = torch.load(next((job.out / "w").iterdir()) / f"ckpt_{step:08d}.pt", weights_only=True)
    assert checkpoint["global_step"] == step
    assert "Traceback" not in job.stderr[0] + job.stderr[1]
