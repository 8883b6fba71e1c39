"""The ranks of a run: who they are, how they wait on rank 0, and how they fail and stop together.

A plain `python train.py` is rank 0 of 1 and uses only `Ranks` and `GracefulStop`. Under `torchrun`
(or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT), `join_ranks`
joins the process group (NCCL on GPUs, gloo on the CPU) and starts a `RankWatch`. One limit,
`--rank_timeout_s` (60 s), bounds every wait of one rank on another that shows no sign of life:
- Every collective times out after it (PyTorch's defaults are 10 min for NCCL and 30 for gloo).
  The long waits of a run are not collectives: ranks meet in one within a step's time of each
  other, so a collective still waiting after a minute has a dead or hung peer. (Ranks wait
  JOIN_S for each other to start: importing torch on a busy node can take most of a minute.)
- The long waits are on rank 0 (`RankWatch.from_rank0`): while it builds the data stores and
  tokenizers or writes a checkpoint, the others wait for its result in the job's c10d store, with
  no limit but rank 0's heartbeat. Validation is decoded by every rank, each its share, and rank 0
  waits for the others' in the store likewise (`RankWatch.gather_to_rank0`).
- Heartbeats: each rank's watch thread bumps its counter in the store every tenth of the limit
  (every 2 s at most) and reads every rank's counter and the job's failure and stop keys in one
  request. A counter that has not moved for the limit ends every rank with "rank R stopped
  responding"; so does a store that has answered nothing for as long (its requests then hang
  past their own timeout, so only the watch thread makes them, and the main thread watches it).
- A rank that raises posts "rank R failed: ..." on its way out (`RankWatch.blame`), so the others
  stop within a heartbeat, naming it, instead of at a timeout; a rank whose collective broke first
  waits (at most the limit) to learn which rank broke it. The watch thread raises `RankFailed` in
  the main thread through a signal (PEER_SIGNAL), and ends the process itself GRACE_S later if the
  main thread is still held in native code.
- A stop signal on any rank is posted and relayed to every rank's `GracefulStop`: training stops
  at the next step on every rank, with a checkpoint; a SIGTERM also abandons rank 0's validation.
What the heartbeats cannot see is a rank whose process lives while its main thread is stuck (a
hung GPU kernel): the others find it when their next collective times out.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from nmt.diagnostics import first_line, log

PEER_SIGNAL = signal.SIGUSR1  # the watch thread's way to raise RankFailed or relay a stop in the main thread
JOIN_S = 100.0  # the rendezvous's limit, unless --rank_timeout_s is longer
GRACE_S = 10.0  # how long the main thread may take to act on that before the watch thread ends the process
LEFT = "left"  # a rank's heartbeat once it has finished: no longer watched


class RankFailed(RuntimeError):
    """Another rank failed or stopped responding (or the store did); the message names it."""


class StopRequested(Exception):
    """A SIGTERM, here or on another rank, inside `GracefulStop.abandoning`."""


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in a torchrun job; a plain run is rank 0 of 1."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0

    @classmethod
    def from_environment(cls) -> "Ranks":
        return cls(int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0")),
                   int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def join_ranks(ranks: Ranks, device: torch.device, timeout_s: float) -> "RankWatch | None":
    """The process group and this rank's watch; None for a single process."""
    if not ranks.distributed:
        return None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=max(timeout_s, JOIN_S)))
    except (RuntimeError, ValueError) as error:  # a rank that never came, or no MASTER_ADDR/MASTER_PORT
        raise RankFailed(f"rank {ranks.rank} could not join the other {ranks.world_size - 1} ranks: "
                         f"{first_line(error)}") from None
    # The collectives' own limit, shorter than the rendezvous's: torch 2.13 has no public setter
    # (this one covers gloo and NCCL).
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))
    return RankWatch(ranks, dist.distributed_c10d._get_default_store(), timeout_s)


class RankWatch:
    """This rank's heartbeat, its view of the others', and its requests to the job's store (see the
    module docstring). Made in the main thread, right after the process group."""

    def __init__(self, ranks: Ranks, store: dist.Store, limit_s: float) -> None:
        self.ranks, self.limit_s = ranks, limit_s
        # torchrun's agent hosts the job's store; without it rank 0 does (torch's env:// rendezvous).
        self.store_host = "torchrun's agent" if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" else "rank 0"
        self.beat_s = min(limit_s / 10, 2.0)
        self.poll_s = max(0.1, self.beat_s / 4)  # the longest pause of a wait for rank 0
        # Its own connection: a request that hangs blocks only the watch thread.
        self.store = dist.PrefixStore("ranks/", store).clone()
        self.keys = [f"beat/{rank}" for rank in range(ranks.world_size)] + ["failure", "stop"]
        for key in ("failure", "stop"):
            self.store.compare_set(key, "", "")  # created empty, unless a rank has already posted
        self.store.set(self.keys[ranks.rank], "0")
        self.store.wait(self.keys[:ranks.world_size])  # each key exists before one request reads them all
        self.outbox: collections.deque[tuple[str, str]] = collections.deque()  # posts for the next round
        self.awaited: str | None = None  # the key of another rank's result the main thread waits for
        self.arrived: dict[str, str] = {}
        self.waits = 0  # from_rank0 calls so far, which name their keys
        self.failure: str | None = None  # why this rank must stop: another rank's failure, or silence
        self.own_failure: str | None = None
        self.stop_asked: tuple[int, str] | None = None  # another rank's stop signal: (rank, name)
        self.graceful: GracefulStop | None = None
        self.closing = self.leaving = False
        self.seen, self.moved, self.moves = [""] * ranks.world_size, [time.monotonic()] * ranks.world_size, \
            [0] * ranks.world_size
        self.left: set[int] = set()
        self.stale: set[int] = set()
        self.rounds, self.last_round = 0, time.monotonic()
        self.wake, self.done, self.arrival = threading.Event(), threading.Event(), threading.Event()
        self.previous_handler = signal.signal(PEER_SIGNAL, self.on_signal)
        self.thread = threading.Thread(target=self.watch, name="rank-watch", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the watch thread

    def watch(self) -> None:
        """A round every heartbeat, and at once when woken (`wake`); while the main thread waits for
        rank 0, a look for its result in between, every 10 ms at first, then less often up to poll_s
        (a checkpoint's wait is short, a validation's long)."""
        next_beat, polls, woken = 0.0, 0, True
        while not self.done.is_set():
            try:
                if woken or time.monotonic() >= next_beat:
                    self.round()
                    next_beat = time.monotonic() + self.beat_s
                awaited = self.awaited
                if awaited and self.store.check([awaited]):
                    self.arrived[awaited] = self.store.get(awaited).decode()
                    self.arrival.set()
                self.last_round = time.monotonic()
            except Exception:  # noqa: BLE001  (the store is gone: the main thread sees last_round age)
                pass
            self.rounds += 1
            polls = polls + 1 if self.awaited else 0
            pause = min(self.poll_s, 0.01 * 1.5 ** polls) if self.awaited else next_beat - time.monotonic()
            woken = self.wake.wait(max(0.0, pause))
            self.wake.clear()

    def round(self) -> None:
        """One heartbeat: post ours and what waits in the outbox, read everyone's, act on them."""
        store, me = self.store, self.ranks.rank
        store.set(self.keys[me], LEFT if self.leaving else str(self.rounds))
        while self.outbox:
            key, value = self.outbox.popleft()
            if key in ("failure", "stop"):
                store.compare_set(key, "", value)  # the first rank to post wins
            else:
                store.set(key, value)
        *beats, failure, stop = (value.decode() for value in store.multi_get(self.keys))
        now = time.monotonic()
        for rank, value in enumerate(beats):
            if value == LEFT:
                self.left.add(rank)
            elif value != self.seen[rank]:
                self.seen[rank], self.moved[rank] = value, now
                self.moves[rank] += 1
            elif rank != me and now - self.moved[rank] > self.limit_s:
                self.stale.add(rank)
        if failure and failure != self.own_failure:
            self.found(failure)
        elif self.stale:
            message = f"rank {min(self.stale)} stopped responding (no heartbeat for {self.limit_s:g} s)"
            self.outbox.append(("failure", message))  # the other ranks learn it at once
            self.found(message)
        if stop and self.stop_asked is None and not stop.startswith(f"{me} "):
            rank, name = stop.split()
            self.stop_asked = (int(rank), name)
            self.interrupt_main()

    def found(self, message: str) -> None:
        """This rank must stop: raise RankFailed in the main thread, and end the process if that
        does not happen within GRACE_S (the main thread is held in native code)."""
        if self.failure is not None:
            return
        self.failure = message
        if not self.closing:
            self.interrupt_main()
            timer = threading.Timer(GRACE_S, self.give_up)
            timer.daemon = True
            timer.start()

    def give_up(self) -> None:
        if not self.closing:
            print(f"train.py: error: {self.failure} (this rank ended without finishing its current operation)",
                  file=sys.stderr, flush=True)
            os._exit(1)

    def interrupt_main(self) -> None:
        signal.pthread_kill(threading.main_thread().ident, PEER_SIGNAL)

    # ------------------------------------------------------------------ the main thread

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.closing:
            return
        if self.failure is not None:
            raise RankFailed(self.failure)
        if self.stop_asked is not None and self.graceful is not None:
            self.graceful.relay(*self.stop_asked)

    def attach(self, graceful: "GracefulStop | None") -> None:
        """The GracefulStop that receives stops asked on other ranks (None: none now)."""
        self.graceful = graceful
        if graceful is not None and self.stop_asked is not None:
            graceful.relay(*self.stop_asked)

    def post_stop(self, name: str) -> None:
        """This rank received stop signal `name`: every rank will learn it within a heartbeat."""
        self.outbox.append(("stop", f"{self.ranks.rank} {name}"))
        self.wake.set()

    def check(self) -> None:
        """RankFailed if another rank failed or stopped responding, or the store fell silent."""
        if self.failure is not None:
            raise RankFailed(self.failure)
        if time.monotonic() - self.last_round > self.limit_s + self.beat_s:
            raise RankFailed(self.silence())

    def silence(self) -> str:
        return (f"{self.store_host} stopped responding (the job's store at {os.environ.get('MASTER_ADDR')}:"
                f"{os.environ.get('MASTER_PORT')} answered nothing for {self.limit_s:g} s)")

    def from_rank0(self, value: Any = None) -> Any:
        """Rank 0's `value` (JSON) on every rank: rank 0 posts it and goes on; the others wait for it
        for as long as rank 0's heartbeat beats. Every rank makes the same calls in the same order."""
        key = f"rank0/{self.waits}"
        self.waits += 1
        if self.ranks.is_main:
            self.post(key, value)
            return value
        return self.wait_for(key)

    def gather_to_rank0(self, name: str, value: Any) -> list[Any] | None:
        """Every rank's `value` (JSON), in rank order, on rank 0, which waits for each as long as its
        rank's heartbeat beats; None on the others, which post theirs and go on. `name` is unique to
        the exchange (validation: its step), so a rank that abandoned one cannot shift the next."""
        if not self.ranks.is_main:
            self.post(f"gather/{name}/{self.ranks.rank}", value)
            return None
        return [value] + [self.wait_for(f"gather/{name}/{rank}") for rank in range(1, self.ranks.world_size)]

    def post(self, key: str, value: Any) -> None:
        self.outbox.append((key, json.dumps(value)))
        self.wake.set()

    def wait_for(self, key: str) -> Any:
        """The value another rank posts under `key`, looked for by the watch thread between its rounds."""
        self.arrival.clear()
        self.awaited = key
        self.wake.set()
        try:
            while key not in self.arrived:
                self.check()
                self.arrival.wait(0.1)
        finally:  # also when a stop abandons the wait
            self.awaited = None
        return json.loads(self.arrived.pop(key))

    def blame(self, error: BaseException) -> RankFailed | None:
        """On this rank's way out with `error`: the RankFailed of another rank that explains it (a
        collective broken by a rank that failed or died), or None when it is this rank's own, which
        is then posted for the others. A rank whose peers all beat twice more is not waiting on them."""
        self.closing = True
        if isinstance(error, RankFailed):
            return None
        if not isinstance(error, KeyboardInterrupt):
            moves, deadline = list(self.moves), time.monotonic() + self.limit_s + 2 * self.beat_s
            others = [rank for rank in range(self.ranks.world_size) if rank != self.ranks.rank]
            while self.failure is None and time.monotonic() < deadline and not all(
                    rank in self.left or self.moves[rank] >= moves[rank] + 2 for rank in others):
                self.wake.set()  # a round every poll, not every heartbeat
                time.sleep(self.poll_s)
            if self.failure is not None:
                return RankFailed(self.failure)
        me = f"rank {self.ranks.rank}"
        self.own_failure = (f"{me} was interrupted ({str(error) or 'Ctrl-C'})" if isinstance(error, KeyboardInterrupt)
                            else f"{me} failed: {type(error).__name__}: {first_line(error)}")
        self.outbox.append(("failure", self.own_failure))
        self.next_round()
        return None

    def next_round(self) -> None:
        """Wait (at most the limit) for a round of the watch thread to start and end after now."""
        target, deadline = self.rounds + 2, time.monotonic() + self.limit_s
        while self.rounds < target and time.monotonic() < deadline and \
                time.monotonic() - self.last_round < self.limit_s:  # not when the store has fallen silent
            self.wake.set()
            time.sleep(0.01)

    def close(self, clean: bool) -> None:
        """Leave: post it, and on the rank that hosts the store wait, at most the limit, for the
        others to leave or be found dead, so that they can read what it posted (under torchrun, the
        rank that failed first exits first, and the agent names it). The process group is destroyed
        after a clean run only: NCCL's teardown can hang on a dead peer."""
        self.closing = self.leaving = True
        self.next_round()
        others = set(range(self.ranks.world_size)) - {self.ranks.rank}
        hosting = self.ranks.is_main and self.store_host == "rank 0"
        deadline = time.monotonic() + self.limit_s
        while hosting and time.monotonic() < deadline and not others <= self.left | self.stale and \
                time.monotonic() - self.last_round < self.limit_s:
            self.wake.set()
            time.sleep(self.poll_s)
        self.done.set()
        self.wake.set()
        signal.signal(PEER_SIGNAL, self.previous_handler)
        if clean:
            dist.destroy_process_group()


class RankExchange:
    """What the ranks of a run hand each other, through the watch (RankWatch) and one all-reduce; in a
    single process (no watch), each value stays where it is."""

    def __init__(self, ranks: Ranks, watch: RankWatch | None, device: torch.device) -> None:
        self.ranks, self.watch, self.device = ranks, watch, device

    def from_rank0(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank once rank 0 gets here, the others waiting on its heartbeat
        (RankWatch.from_rank0): the waits for rank 0's long work; `value` in a single process."""
        return self.watch.from_rank0(value) if self.watch is not None else value

    def gather_to_rank0(self, name: str, value: Any) -> list[Any] | None:
        """Every rank's `value` on rank 0, in rank order (RankWatch.gather_to_rank0); None on the
        others; `[value]` in a single process."""
        return self.watch.gather_to_rank0(name, value) if self.watch is not None else [value]

    def on_any_rank(self, *flags: bool | torch.Tensor) -> list[bool]:
        """Each flag (a bool, or a one-element tensor on the device) OR-ed over all ranks in one
        all-reduce, and read back to the host once; a single process's own flags."""
        if not self.ranks.distributed:
            return [bool(flag) for flag in flags]
        shared = torch.stack([torch.as_tensor(flag, device=self.device).reshape(()) for flag in flags]).int()
        dist.all_reduce(shared, op=dist.ReduceOp.MAX)
        return [bool(value) for value in shared.tolist()]


class GracefulStop:
    """The first SIGINT or SIGTERM asks the run to stop after the current step and save a checkpoint;
    a second SIGINT quits at once (KeyboardInterrupt), and so does any of them inside `at_once()`
    (before the first step: nothing to save). A SIGTERM also abandons the work inside `abandoning()`
    (validation): a scheduler's SIGKILL follows it within a grace period, and the checkpoint matters
    more. Under torchrun the RankWatch posts a stop asked here and relays one asked on another rank."""

    def __init__(self, watch: RankWatch | None = None) -> None:
        self.watch = watch
        self.requested = self.terminated = False
        self.quit_at_once = self.abandonable = False

    def __enter__(self) -> "GracefulStop":
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.previous_hook, sys.unraisablehook = sys.unraisablehook, self.signal_again
        if self.watch is not None:
            self.watch.attach(self)
        return self

    def signal_again(self, unraisable: Any) -> None:
        """sys.unraisablehook while this is entered. A signal handled inside a callback that Python
        runs for itself (a weakref's, a finalizer's) has the handler's exception printed as a
        traceback and dropped: the work would go on. The signal is sent again 10 ms from now, to be
        handled once this hook and the callback have returned (sent at once, it would be handled in
        here, and dropped again): SIGTERM for an abandoned work, SIGINT for a quit at once."""
        if isinstance(unraisable.exc_value, StopRequested):
            self.abandonable, again = True, signal.SIGTERM  # still inside abandoning(): it resets this
        elif isinstance(unraisable.exc_value, KeyboardInterrupt):
            again = signal.SIGINT
        else:
            self.previous_hook(unraisable)
            return
        timer = threading.Timer(0.01, signal.pthread_kill, (threading.main_thread().ident, again))
        timer.daemon = True
        timer.start()

    def handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.quit_at_once or (self.requested and signum == signal.SIGINT):
            raise KeyboardInterrupt(name)
        if self.watch is not None and not self.requested:
            self.watch.post_stop(name)
        self.ask(name, f"received {name}", " (press Ctrl-C again to quit at once)")

    def relay(self, rank: int, name: str) -> None:
        """Another rank received stop signal `name`."""
        if self.quit_at_once:
            raise KeyboardInterrupt(f"{name} on rank {rank}")
        self.ask(name, f"rank {rank} received {name}")

    def ask(self, name: str, why: str, hint: str = "") -> None:
        first, self.requested = not self.requested, True  # before the log line: a second signal may follow it
        self.terminated = self.terminated or name == "SIGTERM"
        if first:
            log(f"{why}: stopping after this step and saving a checkpoint{hint}")
        if self.terminated and self.abandonable:
            self.abandonable = False
            raise StopRequested(why)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        self.quit_at_once = True
        try:
            yield
        finally:
            self.quit_at_once = False

    @contextlib.contextmanager
    def abandoning(self) -> Iterator[None]:
        """Work that a SIGTERM abandons with StopRequested (at once if one came before)."""
        if self.terminated:
            raise StopRequested("SIGTERM")
        self.abandonable = True
        try:
            yield
        finally:
            self.abandonable = False

    def __exit__(self, *exc: Any) -> None:
        if self.watch is not None:
            self.watch.attach(None)
        sys.unraisablehook = self.previous_hook
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
