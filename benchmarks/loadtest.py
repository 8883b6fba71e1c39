"""Load-test serve.py on loopback, closed-loop or open-loop: `python -m benchmarks.loadtest --datasource FOLDER`.

For each engine of --engines (pytorch: the experiment's newest checkpoint or --checkpoint PATH;
ctranslate2: --model_dir DIR) it starts serve.py on a free 127.0.0.1 port, passing on the config
options given here (the serve_* limits and batching, --beam_size, ...), sends a warm-up request
(repeated while the server answers 503, as one that is still loading does), loads it, and stops
it. Requests take sentences in turn from the --split of --datasource or the lines of --text_file:
--workload fixed, --sentences_per_request each at the server's beam size; --workload mixed, drawn
with --seed, 1 to 16 sentences at beam 1 or 5, and 5% of them one sentence to /attention. Requests
go to that loopback port only.

--mode closed (default): --requests POST /translate requests from --clients concurrent clients,
each sending its next request when the last is answered; clients stop at --time_limit seconds and
what is left is reported as unsent. A refusal (503 with a JSON error and a valid Retry-After, as the
open loop classifies answers) is counted apart and is no failure: its client waits as Retry-After
says (0.1 to 1 s) and goes on with its next request. A table per engine (answered, refused, errors,
unsent, p50 and p99 latency, sentences per second); exit 1 if any request failed or went unsent.

--mode open: the server's capacity is measured first by a closed-loop run of --capacity_seconds with
--clients clients (requests answered 200 per second; a refused client leaves the run rather than
pause and come back; its refusals and failures are reported), then requests are sent for --duration
seconds at --rate_factor times that rate (or at --rate requests/s), at seeded Poisson (or evenly
spaced, --arrivals uniform) times, each on its own connection from a pool of threads, whether or not
earlier ones were answered: a request that finds --max_in_flight requests in flight is counted
unsent, never delayed. Refused requests are not retried. Every answer is classified: 200 with one
translation per sentence; 503 with a JSON error and a valid Retry-After (a refusal); and the
failures: any other 503, 504, a 200 with a wrong body, any other status, a connection error, no
answer within --request_timeout_s. Latency runs from the time a request was due, so a late generator
cannot hide a slow server. On two cores or more the generator runs on the first core and the server
on the others (--no_pin: both wherever the kernel puts them). The server's resident memory (VmRSS)
is read after the warm-up, before and after the load and every --rss_interval_s seconds in between;
after the load, one more request must be answered 200 within the deadline. It exits 1 if any answer
was a failure or any request unsent, if the p99 latency of answered requests is above --deadline_s
(default: the server's serve_request_timeout_s), or if the memory grew by more than
--max_rss_growth_mb.

--mode soak: the open-loop load for --soak_minutes, reporting also the memory slope (MB per
minute, least squares over the samples after the first --slope_skip_minutes), bounded by
--max_rss_slope_mb_per_min if given.

--json prints the full report of every engine as JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import email.utils
import http.client
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("loadtest.py: run it from the repository root as: python -m benchmarks.loadtest")

from config import EVALUATE, SERVE, ConfigError, build_parser, get_config, parse_args  # noqa: E402  (after the check above)
from nmt.corpora.sources import DataError  # noqa: E402
from nmt.corpora.store import eval_pairs  # noqa: E402
from nmt.inference.translator import ENGINES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]  # the repository, where serve.py runs from
SERVING = re.compile(r"^serve\.py: serving .* on https?://\[?([^\]]+?)\]?:(\d+)/$")
DEADLINE_KEY = "serve_request_timeout_s"  # the server's own deadline, when its config has one
DEFAULT_DEADLINE_S = 10.0
DEFAULT_RATE_FACTOR = 2.0
MIXED_SENTENCES, MIXED_BEAMS, MIXED_ATTENTION = 16, (1, 5), 0.05  # --workload mixed: its draws


class ServerProcess:
    """serve.py in a subprocess, on a port it picks itself (--port 0), until stop(). Its stderr
    lines are kept in `log`, read all along so that the pipe never fills. With `cpus`, the server
    runs on those CPUs only."""

    def __init__(self, args: Sequence[str], host: str = "127.0.0.1", env: dict[str, str] | None = None,
                 start_timeout: float = 120, cpus: set[int] | None = None) -> None:
        # Affinity is per thread and inherited through fork and exec: this thread takes the server's
        # CPUs for the Popen only, so the child never runs a single thread elsewhere.
        previous = os.sched_getaffinity(0) if cpus else None
        if cpus:
            os.sched_setaffinity(0, cpus)
        try:
            self.process = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--host", host, "--port", "0",
                                             *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        finally:
            if previous:
                os.sched_setaffinity(0, previous)
        self.log: list[str] = []
        self.port, self.banner = 0, ""  # the port, and the line saying what is served there
        self.ready = threading.Event()
        threading.Thread(target=self.read_log, daemon=True).start()
        deadline = time.monotonic() + start_timeout
        while not self.ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve.py did not start: {' | '.join(self.log[-5:]) or 'no output'}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def read_log(self) -> None:
        for line in self.process.stderr:
            self.log.append(line.rstrip("\n"))
            if match := SERVING.match(self.log[-1]):
                self.port, self.banner = int(match.group(2)), self.log[-1]
                self.ready.set()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send `sig` and wait for the exit code (kill it if it does not exit in `timeout` seconds)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def resident_mb(pid: int) -> float:
    """The resident memory of process `pid` in MB (VmRSS of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} has ended") from None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"process {pid} has no resident memory (a zombie?)")


# ---------------------------------------------------------------------------- CPU pinning

@dataclass
class Pinning:
    """Where the load generator and the server run: CPU sets, or None for wherever the kernel puts them."""

    generator: set[int] | None
    server: set[int] | None
    note: str


def plan_pinning(enabled: bool) -> Pinning:
    """On two cores or more, the generator on the first and the server on the others, so that
    neither takes the other's CPU time."""
    if not enabled:
        return Pinning(None, None, "off (--no_pin)")
    if not hasattr(os, "sched_setaffinity"):
        return Pinning(None, None, "none: this system cannot pin processes to CPUs")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Pinning(None, None, f"none: only one CPU ({cpus[0]}) to run on")
    return Pinning({cpus[0]}, set(cpus[1:]), "")


def cpu_list(cpus: set[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Every thread of this process on `cpus` (threads started meanwhile inherit it), then back as
    before: the tests call main() in pytest's own process."""
    if not cpus:
        yield
        return
    before = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
    try:
        yield
    finally:
        for tid, mask in before.items():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, mask)


# ---------------------------------------------------------------------------- one request

OK, REFUSED = "ok", "refused"
FAILURES = {  # kind: how the report calls it
    "bad_refusal": "503 without a valid Retry-After or JSON error",
    "gateway_timeout": "504",
    "bad_answer": "200 with a wrong body",
    "other_status": "other status",
    "connection_error": "connection error",
    "timeout": "no answer in time",
}
KINDS = (OK, REFUSED, *FAILURES)


def valid_retry_after(value: str | None) -> bool:
    """Retry-After as RFC 9110 has it: a number of seconds, or an HTTP date."""
    if value is None:
        return False
    if re.fullmatch(r"\d+", value.strip(), re.ASCII):
        return True
    try:
        email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return False
    return True


def json_field(body: bytes, name: str) -> Any:
    """Field `name` of a JSON object body; None if the body is not one or has no such field."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer.get(name) if isinstance(answer, dict) else None


@dataclass(frozen=True)
class Request:
    """One request of the load: its sentences, the beam size it asks for (None: the server's) and
    the endpoint (/attention takes one sentence)."""

    sentences: list[str]
    beam_size: int | None = None
    path: str = "/translate"

    def body(self) -> str:
        if self.path == "/attention":
            return json.dumps({"text": self.sentences[0]})
        return json.dumps({"text": self.sentences, **({} if self.beam_size is None else {"beam_size": self.beam_size})})


def classify(status: int, retry_after: str | None, body: bytes, sentences: int,
             path: str = "/translate") -> tuple[str, str]:
    """The kind of an answer (one of KINDS) to a request of `sentences` to `path`, and unless it is
    OK one line about it."""
    text = body[:200].decode("utf-8", "replace")
    if status == 200 and path == "/attention":
        if isinstance(json_field(body, "output_tokens"), list) and isinstance(json_field(body, "weights"), list):
            return OK, ""
        return "bad_answer", f"expected output_tokens and weights, got {text}"
    if status == 200:
        translations = json_field(body, "translations")
        if isinstance(translations, list) and len(translations) == sentences and \
                all(isinstance(t, str) for t in translations):
            return OK, ""
        return "bad_answer", f"expected {sentences} translations, got {text}"
    if status == 503:
        if valid_retry_after(retry_after) and isinstance(json_field(body, "error"), str):
            return REFUSED, f"HTTP 503 with Retry-After {retry_after}: {text}"
        return "bad_refusal", f"HTTP 503 with Retry-After {retry_after!r}: {text}"
    if status == 504:
        return "gateway_timeout", f"HTTP 504: {text}"
    return "other_status", f"HTTP {status}: {text}"


def exchange(connection: http.client.HTTPConnection, request: Request) -> tuple[int, str | None, bytes]:
    """POST `request`: the status, the Retry-After header and the body of the answer."""
    connection.request("POST", request.path, request.body(), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.getheader("Retry-After"), response.read()


def retry_pause(retry_after: str) -> float:
    """Seconds to wait after a refusal: as its Retry-After says, from 0.1 to 1."""
    return max(0.1, min(1.0, float(retry_after))) if retry_after.strip().isdigit() else 1.0


def send_one(port: int, request: Request, timeout: float) -> tuple[str, int | None, str, str | None]:
    """One request on a connection of its own: its kind, status (None if unanswered), failure
    line and Retry-After."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        status, retry_after, body = exchange(connection, request)
    except TimeoutError:
        return "timeout", None, f"no answer within {timeout:g} s", None
    except (OSError, http.client.HTTPException) as error:
        return "connection_error", None, f"{type(error).__name__}: {error}", None
    finally:
        connection.close()
    kind, message = classify(status, retry_after, body, len(request.sentences), request.path)
    return kind, status, message, retry_after


def warm_up(port: int, request: Request, timeout: float) -> str | None:
    """Send `request` until it is answered 200 (None), waiting as Retry-After says (at most
    a second) while the server refuses; else what went wrong."""
    give_up = time.monotonic() + timeout
    while True:
        kind, status, message, retry_after = send_one(port, request, max(1.0, give_up - time.monotonic()))
        if kind == OK:
            return None
        if kind != REFUSED or time.monotonic() > give_up:
            return message
        time.sleep(retry_pause(retry_after))


# ---------------------------------------------------------------------------- closed loop

@dataclass
class Load:
    """What the clients saw: one latency per answered request, the refusals (503 with Retry-After,
    by `classify`), a message per failed request."""

    latencies: list[float] = field(default_factory=list)
    refused: int = 0
    errors: list[str] = field(default_factory=list)
    sentences: int = 0
    sent: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def client(port: int, requests: list[Request], total: int, next_index: list[int], load: Load,
           deadline: float, timeout: float | None, leave_on_refusal: bool = False) -> None:
    """One client: a kept-alive connection sending the next unsent request (of `total`, taken from
    `requests` in turn) until none is left or time is up; an answer is awaited `timeout` seconds,
    or (None) until time is up. A refused request is not sent again: the client waits as its
    Retry-After says, or with `leave_on_refusal` stops."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    while True:
        with load.lock:
            index = next_index[0]
            if index >= total or time.monotonic() >= deadline:
                break
            next_index[0] += 1
            load.sent += 1
        request = requests[index % len(requests)]
        connection.timeout = timeout or max(0.1, deadline - time.monotonic())
        start = time.monotonic()
        try:
            status, retry_after, body = exchange(connection, request)
            kind, error = classify(status, retry_after, body, len(request.sentences), request.path)
        except (OSError, http.client.HTTPException) as failure:
            kind, error = "connection_error", f"{type(failure).__name__}: {failure}"
            connection.close()  # the next request opens a new connection
        latency = time.monotonic() - start
        with load.lock:
            if kind == OK:
                load.latencies.append(latency)
                load.sentences += len(request.sentences)
            elif kind == REFUSED:
                load.refused += 1
            else:
                load.errors.append(error)
        if kind == REFUSED:
            if leave_on_refusal:
                break
            # As a polite client does; refusals sent back to back would take the server's CPU
            # from decoding.
            time.sleep(min(retry_pause(retry_after), max(0.0, deadline - time.monotonic())))
    connection.close()


def run_load(port: int, requests: list[Request], clients: int, time_limit: float, total: int | None = None,
             timeout: float | None = None, leave_on_refusal: bool = False) -> Load:
    """`total` requests (default: each of `requests` once) from `clients` closed-loop clients, sent
    for `time_limit` seconds; each answer awaited `timeout` seconds (None: until the time limit)."""
    load = Load()
    next_index = [0]
    deadline = time.monotonic() + time_limit
    threads = [threading.Thread(target=client, args=(port, requests, total or len(requests), next_index, load,
                                                     deadline, timeout, leave_on_refusal)) for _ in range(clients)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    load.seconds = time.monotonic() - start
    return load


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile: the smallest value with at least p% of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def report(engine: str, asked: int, load: Load) -> dict[str, Any]:
    answered = len(load.latencies)
    return {
        "engine": engine, "requests": asked, "answered": answered, "refused": load.refused, "errors": len(load.errors),
        "unsent": asked - load.sent, "sentences": load.sentences, "seconds": round(load.seconds, 3),
        "p50_ms": round(1000 * percentile(load.latencies, 50), 1) if answered else None,
        "p99_ms": round(1000 * percentile(load.latencies, 99), 1) if answered else None,
        "sentences_per_second": round(load.sentences / load.seconds, 1) if load.seconds else 0.0,
    }


def table(rows: list[dict[str, Any]]) -> str:
    columns = [("engine", "engine"), ("requests", "requests"), ("answered", "answered"), ("refused", "refused"),
               ("errors", "errors"), ("unsent", "unsent"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
               ("sentences_per_second", "sentences/s"), ("seconds", "seconds")]
    cells = [[title for _, title in columns]] + [["-" if row[key] is None else str(row[key]) for key, _ in columns]
                                                 for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(line, widths))) for line in cells)


def measure_capacity(port: int, requests: list[Request], clients: int, seconds: float,
                     timeout: float) -> dict[str, Any]:
    """Requests and sentences answered 200 per second by closed-loop clients sending for `seconds`
    at saturation (the answers to the last requests are awaited and counted). A refused client
    leaves the run rather than pause and come back: the server refused it because its queue was
    full of the other clients' work, and those clients, each sending again as soon as it is
    answered, keep it saturated without this one; refusals coming back would only take its CPU
    from decoding, and a client away in a pause is load the measurement cannot count on."""
    load = run_load(port, requests, clients, seconds, total=sys.maxsize, timeout=timeout, leave_on_refusal=True)
    return {"clients": clients, "seconds": round(load.seconds, 3), "refused": load.refused,
            "failed": len(load.errors),
            "requests_per_second": len(load.latencies) / load.seconds,
            "sentences_per_second": load.sentences / load.seconds}


# ---------------------------------------------------------------------------- open loop

def arrival_times(rate: float, duration: float, arrivals: str, seed: int) -> list[float]:
    """Seconds from the start at which requests are due: a seeded Poisson process of `rate` per
    second, or one every 1/rate seconds (`arrivals` "uniform"), until `duration`."""
    rng = random.Random(seed)
    times, count = [], 0
    due = 0.0 if arrivals == "uniform" else rng.expovariate(rate)
    while due < duration:
        times.append(due)
        count += 1
        due = count / rate if arrivals == "uniform" else due + rng.expovariate(rate)
    return times


@dataclass
class OpenLoad:
    """What an open-loop run saw: requests by kind of answer, and latencies from when each was due."""

    scheduled: int
    unsent: int = 0
    counts: Counter = field(default_factory=Counter)  # kind -> requests
    statuses: Counter = field(default_factory=Counter)  # HTTP status -> requests
    latencies: dict[str, list[float]] = field(default_factory=dict)  # kind -> seconds
    lags: list[float] = field(default_factory=list)  # how late each request left
    failures: list[str] = field(default_factory=list)  # the first few failure lines
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int | None, message: str, latency: float, lag: float) -> None:
        with self.lock:
            self.counts[kind] += 1
            if status is not None:
                self.statuses[status] += 1
            self.latencies.setdefault(kind, []).append(latency)
            self.lags.append(lag)
            if kind in FAILURES and len(self.failures) < 5:
                self.failures.append(message)


def run_open_loop(port: int, requests: list[Request], times: list[float], timeout: float,
                  max_in_flight: int) -> OpenLoad:
    """Send request i (of `requests` in turn) at `times[i]` seconds from now, each from a thread of
    its own, whatever the server does meanwhile; wait for the last answer (or timeout)."""
    load = OpenLoad(len(times))
    slots = threading.BoundedSemaphore(max_in_flight)

    def send(index: int, due: float) -> None:
        try:
            lag = time.monotonic() - due
            kind, status, message, _ = send_one(port, requests[index % len(requests)], timeout)
            load.record(kind, status, message, time.monotonic() - due, lag)
        finally:
            slots.release()

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="client") as pool:
        for index, offset in enumerate(times):
            due = start + offset
            time.sleep(max(0.0, due - time.monotonic()))
            if slots.acquire(blocking=False):  # a free thread: the request leaves now, never later
                pool.submit(send, index, due)
            else:
                with load.lock:
                    load.unsent += 1
    load.seconds = time.monotonic() - start
    return load


class RssSampler:
    """The resident memory of process `pid`, read every `interval` seconds in a thread while in
    the `with` block: `samples` of (seconds since the start, MB)."""

    def __init__(self, pid: int, interval: float) -> None:
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        start = time.monotonic()
        while True:
            try:
                self.samples.append((time.monotonic() - start, resident_mb(self.pid)))
            except OSError:  # the server is gone: the run reports it
                return
            if self.stopped.wait(self.interval):
                return

    def __enter__(self) -> "RssSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def rss_slope(samples: list[tuple[float, float]], skip_s: float) -> float | None:
    """Least-squares slope of resident memory in MB per minute over the samples taken at
    `skip_s` seconds or later; None with fewer than three of them."""
    kept = [(t, mb) for t, mb in samples if t >= skip_s]
    if len(kept) < 3:
        return None
    return 60 * statistics.linear_regression([t for t, _ in kept], [mb for _, mb in kept]).slope


def latency_stats(seconds: list[float]) -> dict[str, Any]:
    """Count, p50, p99 and maximum of `seconds`, in milliseconds (None when there are none)."""
    if not seconds:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    return {"count": len(seconds), "p50_ms": round(1000 * percentile(seconds, 50), 1),
            "p99_ms": round(1000 * percentile(seconds, 99), 1), "max_ms": round(1000 * max(seconds), 1)}


def deadline(args: argparse.Namespace, config: dict[str, Any]) -> tuple[float, str]:
    """The bound on p99 latency of answered requests, and where it comes from."""
    if args.deadline_s is not None:
        return args.deadline_s, "--deadline_s"
    if config.get(DEADLINE_KEY):
        return float(config[DEADLINE_KEY]), DEADLINE_KEY
    return DEFAULT_DEADLINE_S, f"--deadline_s default; the server has no {DEADLINE_KEY}"


def drive_open_loop(port: int, pid: int, requests: list[Request], args: argparse.Namespace, config: dict[str, Any],
                    pinning: Pinning) -> dict[str, Any]:
    """Measure the capacity (unless --rate), drive the server at port `port` (process `pid`)
    open-loop, and report what it answered and how its memory went."""
    deadline_s, deadline_source = deadline(args, config)
    rate_factor = args.rate_factor or DEFAULT_RATE_FACTOR
    duration = 60 * args.soak_minutes if args.mode == "soak" else args.duration
    timeout = args.request_timeout_s or 3 * deadline_s
    rss_after_warm_up = resident_mb(pid)
    with pinned(pinning.generator):
        capacity = None
        if args.rate is None:
            capacity = measure_capacity(port, requests, args.clients, args.capacity_seconds, timeout)
            print(f"loadtest.py: capacity: {capacity['requests_per_second']:.2f} requests/s "
                  f"({capacity['sentences_per_second']:.1f} sentences/s) from {args.clients} closed-loop clients "
                  f"in {capacity['seconds']:.1f} s ({capacity['refused']} refused and left)", file=sys.stderr)
            if not capacity["requests_per_second"]:
                raise RuntimeError("no request was answered 200 while measuring the capacity")
        rate = args.rate or rate_factor * capacity["requests_per_second"]
        print(f"loadtest.py: sending {rate:.2f} requests/s ({args.arrivals}) for {duration:g} s", file=sys.stderr)
        times = arrival_times(rate, duration, args.arrivals, config["seed"])
        rss_before = resident_mb(pid)
        with RssSampler(pid, args.rss_interval_s) as sampler:
            load = run_open_loop(port, requests, times, timeout, args.max_in_flight)
        rss_after = resident_mb(pid)
        start = time.monotonic()
        recovery, status, message, _ = send_one(port, requests[0], timeout)
        recovery_s = time.monotonic() - start
    slope_from_s = 60 * args.slope_skip_minutes if duration >= 60 * args.slope_skip_minutes + 60 else 0.0
    return {
        "engine": None, "mode": args.mode, "capacity": capacity,
        "rate_factor": None if capacity is None else rate_factor, "rate": round(rate, 3),
        "arrivals": args.arrivals, "duration_s": duration, "seconds": round(load.seconds, 3),
        "scheduled": load.scheduled, "sent": sum(load.counts.values()), "unsent": load.unsent,
        "counts": {kind: load.counts[kind] for kind in KINDS},
        "statuses": {str(code): count for code, count in sorted(load.statuses.items())},
        "answered": latency_stats(load.latencies.get(OK, [])),
        "refused": latency_stats(load.latencies.get(REFUSED, [])),
        "generator_lag_p99_ms": round(1000 * percentile(load.lags, 99), 1) if load.lags else None,
        "deadline_s": deadline_s, "deadline_source": deadline_source, "request_timeout_s": timeout,
        "pinning": {"generator": cpu_list(pinning.generator) if pinning.generator else None,
                    "server": cpu_list(os.sched_getaffinity(pid)) if pinning.server else None, "note": pinning.note},
        "rss_mb": {"after_warm_up": round(rss_after_warm_up, 1), "before": round(rss_before, 1),
                   "after": round(rss_after, 1), "growth": round(rss_after - rss_before, 1),
                   "peak": round(max([rss_before, rss_after, *(mb for _, mb in sampler.samples)]), 1),
                   "bound": args.max_rss_growth_mb,
                   "slope_per_minute": None if (slope := rss_slope(sampler.samples, slope_from_s)) is None
                   else round(slope, 2), "slope_from_s": slope_from_s, "slope_bound": args.max_rss_slope_mb_per_min},
        "rss_samples": [[round(t, 1), round(mb, 1)] for t, mb in sampler.samples],
        "recovery": {"kind": recovery, "status": status, "latency_ms": round(1000 * recovery_s, 1),
                     "message": message},
        "failures": load.failures,
    }


def verdict(row: dict[str, Any]) -> list[str]:
    """What an open-loop report shows to be wrong (nothing: the server held)."""
    problems = []
    failed = {kind: row["counts"][kind] for kind in FAILURES if row["counts"][kind]}
    if failed:
        problems.append(f"{sum(failed.values())} answers were neither 200 nor 503 with Retry-After: "
                        + ", ".join(f"{count} {FAILURES[kind]}" for kind, count in failed.items()))
    if row["unsent"]:
        problems.append(f"{row['unsent']} requests unsent: they were due while --max_in_flight requests "
                        f"were unanswered")
    deadline_ms = 1000 * row["deadline_s"]
    if not row["answered"]["count"]:
        problems.append("no request was answered 200")
    elif row["answered"]["p99_ms"] > deadline_ms:
        problems.append(f"p99 latency of answered requests {row['answered']['p99_ms']:g} ms is above the deadline "
                        f"of {row['deadline_s']:g} s ({row['deadline_source']})")
    rss = row["rss_mb"]
    if rss["growth"] > rss["bound"]:
        problems.append(f"the server's resident memory grew by {rss['growth']:g} MB ({rss['before']:g} -> "
                        f"{rss['after']:g} MB), above --max_rss_growth_mb {rss['bound']:g}")
    if rss["slope_bound"] is not None and rss["slope_per_minute"] is not None and \
            rss["slope_per_minute"] > rss["slope_bound"]:
        problems.append(f"the server's resident memory grew by {rss['slope_per_minute']:g} MB per minute, above "
                        f"--max_rss_slope_mb_per_min {rss['slope_bound']:g}")
    recovery = row["recovery"]
    if recovery["kind"] != OK or recovery["latency_ms"] > deadline_ms:
        problems.append(f"after the load, a request got {recovery['status'] or recovery['message']} in "
                        f"{recovery['latency_ms']:g} ms instead of 200 within the deadline")
    return problems


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms"


def summary(row: dict[str, Any]) -> str:
    """An open-loop report for people."""
    capacity = row["capacity"]
    if capacity is None:
        rate = f"{row['rate']:g} requests/s (--rate)"
    else:
        rate = (f"{row['rate_factor']:g} x capacity {capacity['requests_per_second']:.2f} requests/s "
                f"({capacity['sentences_per_second']:.1f} sentences/s, {capacity['clients']} closed-loop clients, "
                f"{capacity['refused']} refused and left, {capacity['seconds']:g} s) = {row['rate']:g} requests/s")
    counts, answered, refused, rss = row["counts"], row["answered"], row["refused"], row["rss_mb"]
    pinning = row["pinning"]
    lines = [
        f"{row['engine']}, {row['mode']} loop: {rate}, {row['arrivals']} arrivals for {row['duration_s']:g} s",
        f"  requests: {row['scheduled']} due, {row['sent']} sent, {row['unsent']} unsent",
        f"  answers: answered (200) {counts[OK]}, refused (503 with Retry-After) {counts[REFUSED]}, failures: "
        + (", ".join(f"{what} {counts[kind]}" for kind, what in FAILURES.items() if counts[kind]) or "none"),
        "  statuses: " + (", ".join(f"{code}: {count}" for code, count in row["statuses"].items()) or "none"),
        f"  answered (200): p50 {ms(answered['p50_ms'])}, p99 {ms(answered['p99_ms'])}, max {ms(answered['max_ms'])}; "
        f"deadline {row['deadline_s']:g} s ({row['deadline_source']})",
        f"  refused (503): p50 {ms(refused['p50_ms'])}, p99 {ms(refused['p99_ms'])}; generator lag p99 "
        f"{ms(row['generator_lag_p99_ms'])}",
        "  pinning: " + (pinning["note"] or
                         f"generator on CPU {pinning['generator']}, server on CPU {pinning['server']}"),
        f"  server RSS: {rss['after_warm_up']:g} MB after warm-up, {rss['before']:g} MB before the load, "
        f"{rss['after']:g} MB after (growth {rss['growth']:g} MB, bound {rss['bound']:g}), peak {rss['peak']:g} MB, "
        "slope " + ("-" if rss["slope_per_minute"] is None else f"{rss['slope_per_minute']:g} MB/min")
        + f" (samples from {rss['slope_from_s']:g} s)",
        f"  after the load: {row['recovery']['status'] or row['recovery']['message']} in "
        f"{row['recovery']['latency_ms']:g} ms",
        "  " + ("; ".join(row["problems"]) if row["problems"] else
                "held: every answer 200 or 503 with Retry-After, p99 within the deadline, memory within the bound"),
    ]
    return "\n".join(lines)


def load_sentences(args: argparse.Namespace, config: dict[str, Any]) -> list[str]:
    """Source sentences that the server will accept (at most serve_max_chars characters)."""
    if args.text_file is not None:
        try:
            lines = args.text_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"cannot read --text_file {args.text_file}: {getattr(error, 'strerror', None) or error}") \
                from None
    else:
        pairs = eval_pairs(config, args.split, config)
        lines = [source for source, _ in pairs]
    sentences = [line.strip() for line in lines if line.strip() and len(line.strip()) <= config["serve_max_chars"]]
    if not sentences:
        raise DataError(f"no sentences of at most {config['serve_max_chars']} characters to send")
    return sentences


def server_arguments(args: argparse.Namespace, engine: str) -> list[str]:
    """serve.py's options for `engine`: the model, and every config option given to loadtest.py."""
    forwarded = ["--preset", args.preset] if getattr(args, "preset", None) else []  # train.py's alone now
    for key in get_config():
        if getattr(args, key, None) is not None:  # a key of the programs loadtest.py takes options of, given
            forwarded += [f"--{key}", str(getattr(args, key))]
    if engine == "ctranslate2":
        return forwarded + ["--engine", "ctranslate2", "--model_dir", str(args.model_dir)]
    return forwarded + (["--checkpoint", str(args.checkpoint)] if args.checkpoint is not None else [])


# The load test's seconds, minutes and rates: each positive where given (parse_arguments checks).
POSITIVE_OPTIONS: tuple[tuple[str, float | None, str], ...] = (
    ("slope_skip_minutes", 1.0, "soak: the memory slope is fitted to the samples after this many minutes "
                                "(default: 1)"),
    ("time_limit", 120.0, "seconds per engine after which closed-loop clients stop sending, and for the warm-up "
                          "(default: 120)"),
    ("rate", None, "open loop: requests per second (default: --rate_factor times the measured capacity)"),
    ("rate_factor", None, f"open loop: times the capacity (default: {DEFAULT_RATE_FACTOR:g})"),
    ("capacity_seconds", 20.0, "open loop: length of the closed-loop run that measures the capacity "
                               "(default: 20)"),
    ("duration", 60.0, "open loop: seconds of load (default: 60)"),
    ("soak_minutes", 10.0, "soak: minutes of load (default: 10)"),
    ("deadline_s", None, f"bound on the p99 latency of answered requests (default: the server's {DEADLINE_KEY}, "
                         f"else {DEFAULT_DEADLINE_S:g})"),
    ("request_timeout_s", None, "open loop: a request unanswered this long is a failure (default: 3 x the deadline)"),
    ("rss_interval_s", 2.0, "open loop: seconds between readings of the server's memory (default: 2)"),
)


def argument_parser() -> argparse.ArgumentParser:
    """The load test's options, beside serve.py's and evaluate.py's config keys."""
    parser = build_parser((SERVE, EVALUATE), __doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["pytorch"],
                        help="engines to serve and load in turn (default: pytorch)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint for the pytorch engine (default: the newest good one of the experiment)")
    parser.add_argument("--model_dir", type=Path, default=None, help="model directory for the ctranslate2 engine")
    parser.add_argument("--mode", choices=["closed", "open", "soak"], default="closed",
                        help="closed: each client waits for its answer; open: requests at a fixed rate for --duration; "
                             "soak: open for --soak_minutes, with the memory slope (default: closed)")
    parser.add_argument("--clients", type=int, default=32,
                        help="concurrent clients of the closed loop and of the capacity run (default: 32)")
    parser.add_argument("--requests", type=int, default=400, help="requests per engine, closed loop (default: 400)")
    parser.add_argument("--sentences_per_request", type=int, default=4, help="--workload fixed (default: 4)")
    parser.add_argument("--workload", choices=["fixed", "mixed"], default="fixed",
                        help="fixed: --sentences_per_request sentences at the server's beam size; mixed: 1 to 16 "
                             "sentences, beam 1 or 5, 5%% of requests to /attention, drawn with --seed "
                             "(default: fixed)")
    parser.add_argument("--split", default="test", help="split of --datasource to take sentences from (default: test)")
    parser.add_argument("--text_file", type=Path, default=None, help="take sentences from this file, one a line")
    parser.add_argument("--arrivals", choices=["poisson", "uniform"], default="poisson",
                        help="open loop: request times, a Poisson process seeded by --seed or evenly spaced "
                             "(default: poisson)")
    parser.add_argument("--max_in_flight", type=int, default=1024,
                        help="open loop: unanswered requests at most; one due beyond is counted unsent (default: 1024)")
    parser.add_argument("--max_rss_growth_mb", type=float, default=64.0,
                        help="open loop: bound on the server's resident memory growth over the load (default: 64)")
    parser.add_argument("--max_rss_slope_mb_per_min", type=float, default=None,
                        help="open loop: bound on the memory slope (default: reported, not bounded)")
    for name, default, text in POSITIVE_OPTIONS:
        parser.add_argument(f"--{name}", type=float, default=default, help=text)
    parser.add_argument("--no_pin", action="store_true",
                        help="open loop: do not pin the generator and the server to different CPUs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    return parser


def parse_arguments(argv: list[str] | None) -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argument_parser()
    args, resolved = parse_args((SERVE, EVALUATE), argv, parser=parser)
    config = resolved.config
    if min(args.clients, args.requests, args.sentences_per_request, args.max_in_flight) < 1:
        parser.error("--clients, --requests, --sentences_per_request and --max_in_flight must be at least 1")
    for name, _, _ in POSITIVE_OPTIONS:
        if getattr(args, name) is not None and not getattr(args, name) > 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.max_rss_growth_mb < 0:
        parser.error(f"--max_rss_growth_mb must not be negative, got {args.max_rss_growth_mb}")
    if args.rate is not None and args.rate_factor is not None:
        parser.error("give --rate or --rate_factor, not both")
    if args.workload == "fixed" and args.sentences_per_request > config["serve_max_sentences"]:
        parser.error(f"--sentences_per_request {args.sentences_per_request} is above --serve_max_sentences "
                     f"{config['serve_max_sentences']}")
    if "ctranslate2" in args.engines and args.model_dir is None:
        parser.error("--engines ctranslate2 needs --model_dir DIR (a model written by export.py)")
    return args, config


def build_requests(sentences: list[str], args: argparse.Namespace, config: dict[str, Any]) -> list[Request]:
    """--requests requests taking `sentences` in turn. --workload fixed: --sentences_per_request each,
    at the server's beam size. mixed, drawn with the config's seed: 1 to 16 sentences (at most
    serve_max_sentences), beam 1 or 5 (at most serve_max_beam_size) with even odds, and one request
    in MIXED_ATTENTION (of one sentence) to /attention."""
    rng, taken, requests = random.Random(config["seed"]), 0, []
    for _ in range(args.requests):
        if args.workload == "fixed":
            size, beam_size, path = args.sentences_per_request, None, "/translate"
        elif rng.random() < MIXED_ATTENTION:
            size, beam_size, path = 1, None, "/attention"
        else:
            size = rng.randint(1, min(MIXED_SENTENCES, config["serve_max_sentences"]))
            beam_size, path = min(rng.choice(MIXED_BEAMS), config["serve_max_beam_size"]), "/translate"
        requests.append(Request([sentences[(taken + j) % len(sentences)] for j in range(size)], beam_size, path))
        taken += size
    return requests


def main(argv: list[str] | None = None) -> int:
    args, config = parse_arguments(argv)
    try:
        sentences = load_sentences(args, config)
    except (DataError, ConfigError) as error:
        print(f"loadtest.py: error: {error}", file=sys.stderr)
        return 1
    requests = build_requests(sentences, args, config)
    # On loopback with no key needed: a key in the environment would make the server ask for it.
    env = {name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"}
    closed = args.mode == "closed"
    pinning = Pinning(None, None, "off (closed loop)") if closed else plan_pinning(not args.no_pin)

    rows = []
    for engine in args.engines:
        try:
            with ServerProcess(server_arguments(args, engine), env=env, cpus=pinning.server) as server:
                print(f"loadtest.py: {engine}: {server.banner}", file=sys.stderr)
                warm_up_error = warm_up(server.port, requests[0], args.time_limit)
                if warm_up_error is not None:
                    print(f"loadtest.py: error: {engine}: the warm-up request failed: {warm_up_error}",
                          file=sys.stderr)
                    return 1
                if closed:
                    load = run_load(server.port, requests, args.clients, args.time_limit)
                else:
                    row = drive_open_loop(server.port, server.pid, requests, args, config, pinning)
        except (RuntimeError, OSError, http.client.HTTPException) as error:
            print(f"loadtest.py: error: {engine}: {error}", file=sys.stderr)
            return 1
        if closed:
            for message in load.errors[:3]:
                print(f"loadtest.py: {engine}: failed request: {message}", file=sys.stderr)
            rows.append(report(engine, args.requests, load))
        else:
            row["engine"], row["problems"] = engine, verdict(row)
            for message in row["failures"][:3]:
                print(f"loadtest.py: {engine}: failed request: {message}", file=sys.stderr)
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows) if closed else "\n".join(map(summary, rows)))
    if closed:
        return 0 if all(row["errors"] == 0 and row["unsent"] == 0 for row in rows) else 1
    for row in rows:
        for problem in row["problems"]:
            print(f"loadtest.py: {row['engine']}: {problem}", file=sys.stderr)
    return 1 if any(row["problems"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
