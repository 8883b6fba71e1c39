"""Load-test serve.py on loopback: `python loadtest.py --datasource FOLDER --clients 32 --requests 400`.

For each engine of --engines (pytorch: the experiment's newest checkpoint or --checkpoint PATH;
ctranslate2: --model_dir DIR) it starts serve.py on a free 127.0.0.1 port, passing on the config
options given here (the serve_* limits and batching, --beam_size, ...), sends one warm-up request,
then --requests POST /translate requests from --clients concurrent clients, each request
--sentences_per_request sentences in turn from the --split of --datasource or the lines of
--text_file, and stops the server. Clients stop sending at --time_limit seconds; what is left
is reported as unsent. Requests go to that loopback port only.

It prints a table per engine (requests answered, errors, unsent, p50 and p99 latency, sentences
per second), or JSON with --json, and exits 1 if any request failed or went unsent.
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from config import ConfigError, build_parser, config_or_exit, get_config
from dataset import DataError
from evaluate import load_eval_pairs
from translator import ENGINES

ROOT = Path(__file__).resolve().parent
SERVING = re.compile(r"^serve\.py: serving .* on http://\[?([^\]]+?)\]?:(\d+)/$")


class ServerProcess:
    """serve.py in a subprocess, on a port it picks itself (--port 0), until stop(). Its stderr
    lines are kept in `log`, read all along so that the pipe never fills."""

    def __init__(self, args: Sequence[str], host: str = "127.0.0.1", env: dict[str, str] | None = None,
                 start_timeout: float = 120) -> None:
        self.process = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--host", host, "--port", "0",
                                         *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.port, self.banner = 0, ""  # the port, and the line saying what is served there
        self.ready = threading.Event()
        threading.Thread(target=self.read_log, daemon=True).start()
        deadline = time.monotonic() + start_timeout
        while not self.ready.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"serve.py did not start: {' | '.join(self.log[-5:]) or 'no output'}")

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


@dataclass
class Load:
    """What the clients saw: one latency per answered request, a message per failed one."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sentences: int = 0
    sent: int = 0
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def post_translate(connection: http.client.HTTPConnection, sentences: list[str]) -> str | None:
    """Send one request; None if it was answered with one translation per sentence, else what went wrong."""
    connection.request("POST", "/translate", json.dumps({"text": sentences}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        return f"HTTP {response.status}: {body[:200].decode('utf-8', 'replace')}"
    translations = json.loads(body).get("translations")
    if not isinstance(translations, list) or len(translations) != len(sentences):
        return f"expected {len(sentences)} translations, got {body[:200].decode('utf-8', 'replace')}"
    return None


def client(port: int, requests: list[list[str]], next_index: list[int], load: Load, deadline: float) -> None:
    """One client: a kept-alive connection sending the next unsent request until none is left or time is up."""
    connection = http.client.HTTPConnection("127.0.0.1", port)
    while True:
        with load.lock:
            index = next_index[0]
            if index >= len(requests) or time.monotonic() >= deadline:
                break
            next_index[0] += 1
            load.sent += 1
        connection.timeout = max(0.1, deadline - time.monotonic())
        start = time.monotonic()
        try:
            error = post_translate(connection, requests[index])
        except (OSError, http.client.HTTPException, ValueError) as failure:
            error = f"{type(failure).__name__}: {failure}"
            connection.close()  # the next request opens a new connection
        latency = time.monotonic() - start
        with load.lock:
            if error is None:
                load.latencies.append(latency)
                load.sentences += len(requests[index])
            else:
                load.errors.append(error)
    connection.close()


def run_load(port: int, requests: list[list[str]], clients: int, time_limit: float) -> Load:
    load = Load()
    next_index = [0]
    deadline = time.monotonic() + time_limit
    threads = [threading.Thread(target=client, args=(port, requests, next_index, load, deadline))
               for _ in range(clients)]
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
        "engine": engine, "requests": asked, "answered": answered, "errors": len(load.errors),
        "unsent": asked - load.sent, "sentences": load.sentences, "seconds": round(load.seconds, 3),
        "p50_ms": round(1000 * percentile(load.latencies, 50), 1) if answered else None,
        "p99_ms": round(1000 * percentile(load.latencies, 99), 1) if answered else None,
        "sentences_per_second": round(load.sentences / load.seconds, 1) if load.seconds else 0.0,
    }


def table(rows: list[dict[str, Any]]) -> str:
    columns = [("engine", "engine"), ("requests", "requests"), ("answered", "answered"), ("errors", "errors"),
               ("unsent", "unsent"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
               ("sentences_per_second", "sentences/s"), ("seconds", "seconds")]
    cells = [[title for _, title in columns]] + [["-" if row[key] is None else str(row[key]) for key, _ in columns]
                                                 for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(line, widths))) for line in cells)


def load_sentences(args: argparse.Namespace, config: dict[str, Any]) -> list[str]:
    """Source sentences that the server will accept (at most serve_max_chars characters)."""
    if args.text_file is not None:
        try:
            lines = args.text_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise DataError(f"cannot read --text_file {args.text_file}: {getattr(error, 'strerror', None) or error}") \
                from None
    else:
        pairs = load_eval_pairs(config["datasource"], args.split, config, config["store_folder"])
        lines = [source for source, _ in pairs]
    sentences = [line.strip() for line in lines if line.strip() and len(line.strip()) <= config["serve_max_chars"]]
    if not sentences:
        raise DataError(f"no sentences of at most {config['serve_max_chars']} characters to send")
    return sentences


def server_arguments(args: argparse.Namespace, engine: str) -> list[str]:
    """serve.py's options for `engine`: the model, and every config option given to loadtest.py."""
    forwarded = ["--preset", args.preset] if args.preset else []
    for key in get_config():
        if getattr(args, key) is not None:
            forwarded += [f"--{key}", str(getattr(args, key))]
    if engine == "ctranslate2":
        return forwarded + ["--engine", "ctranslate2", "--model_dir", str(args.model_dir)]
    return forwarded + (["--checkpoint", str(args.checkpoint)] if args.checkpoint is not None else [])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["pytorch"],
                        help="engines to serve and load in turn (default: pytorch)")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="checkpoint for the pytorch engine (default: the newest good one of the experiment)")
    parser.add_argument("--model_dir", type=Path, default=None, help="model directory for the ctranslate2 engine")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default: 32)")
    parser.add_argument("--requests", type=int, default=400, help="requests per engine (default: 400)")
    parser.add_argument("--sentences_per_request", type=int, default=4, help="default: 4")
    parser.add_argument("--split", default="test", help="split of --datasource to take sentences from (default: test)")
    parser.add_argument("--text_file", type=Path, default=None, help="take sentences from this file, one a line")
    parser.add_argument("--time_limit", type=float, default=120.0,
                        help="seconds per engine after which clients stop sending (default: 120)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    args = parser.parse_args(argv)
    config = config_or_exit(args, parser)
    if min(args.clients, args.requests, args.sentences_per_request) < 1 or not args.time_limit > 0:
        parser.error("--clients, --requests and --sentences_per_request must be at least 1, --time_limit positive")
    if args.sentences_per_request > config["serve_max_sentences"]:
        parser.error(f"--sentences_per_request {args.sentences_per_request} is above --serve_max_sentences "
                     f"{config['serve_max_sentences']}")
    if "ctranslate2" in args.engines and args.model_dir is None:
        parser.error("--engines ctranslate2 needs --model_dir DIR (a model written by export.py)")
    try:
        sentences = load_sentences(args, config)
    except (DataError, ConfigError) as error:
        print(f"loadtest.py: error: {error}", file=sys.stderr)
        return 1
    size = args.sentences_per_request
    requests = [[sentences[(i * size + j) % len(sentences)] for j in range(size)] for i in range(args.requests)]
    # On loopback with no key needed: a key in the environment would make the server ask for it.
    env = {name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"}

    rows = []
    for engine in args.engines:
        try:
            with ServerProcess(server_arguments(args, engine), env=env) as server:
                print(f"loadtest.py: {engine}: {server.banner}", file=sys.stderr)
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=args.time_limit)
                warm_up_error = post_translate(connection, requests[0])
                connection.close()
                if warm_up_error is not None:
                    print(f"loadtest.py: error: {engine}: the warm-up request failed: {warm_up_error}",
                          file=sys.stderr)
                    return 1
                load = run_load(server.port, requests, args.clients, args.time_limit)
        except (RuntimeError, OSError, http.client.HTTPException) as error:
            print(f"loadtest.py: error: {engine}: {error}", file=sys.stderr)
            return 1
        for message in load.errors[:3]:
            print(f"loadtest.py: {engine}: failed request: {message}", file=sys.stderr)
        rows.append(report(engine, args.requests, load))
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0 if all(row["errors"] == 0 and row["unsent"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
