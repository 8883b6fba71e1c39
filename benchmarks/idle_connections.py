"""Idle connections against serve.py: `python -m benchmarks.idle_connections --checkpoint PATH`.

It starts serve.py on a free 127.0.0.1 port (the arguments it does not know are passed on: the
model, serve_* options), then for --seconds one client holds --connections connections that send
nothing or (every other one) half a request head (with --reconnect, opening a new one whenever the
server closes one: a flood), while a probe sends GET /health/live, GET /health/ready and POST /translate (one sentence, greedy) in
turn, each on a new connection. With --tls the server has a self-signed certificate (openssl) and the
idle connections never start their handshake. On two cores or more the client runs on the first and
the server on the others (benchmarks.loadtest's pinning). The server's open files and resident
memory are read every half second.

It reports the probes' statuses and latencies, the idle connections opened, held and how long the
server let them live, and the server's peak of open files; and exits 1 if a probe of liveness or
readiness got anything but 200, or a translation anything but 200 or 503 with a JSON error and
Retry-After.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if not __package__:  # run as a file: only benchmarks/ is on sys.path, not the project
    sys.exit("idle_connections.py: run it from the repository root as: python -m benchmarks.idle_connections")

from benchmarks.loadtest import (REFUSED, ServerProcess, classify, latency_stats, pinned, plan_pinning,  # noqa: E402
                                 resident_mb)
from config import SERVE, build_parser  # noqa: E402
from nmt.serving.connection_guard import raise_file_limit  # noqa: E402
from nmt.inference.translator import add_translator_arguments  # noqa: E402

PROBES = [("GET", "/health/live", None), ("GET", "/health/ready", None),
          ("POST", "/translate", {"text": ["Where is the station?"], "beam_size": 1})]
HALF_A_HEAD = b"POST /translate HTTP/1.1\r\nHost: idle\r\n"


def probe(port: int, method: str, path: str, body: dict | None, tls: ssl.SSLContext | None) -> tuple[str, float]:
    """One request on a new connection: the kind of its answer (a status, or `refused` for a 503
    with a JSON error and Retry-After, or the error's name) and its latency."""
    started = time.monotonic()
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=tls) if tls else \
        http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"})
        response = connection.getresponse()
        status, retry_after, payload = response.status, response.getheader("Retry-After"), response.read()
    except (OSError, http.client.HTTPException) as error:
        return type(error).__name__, time.monotonic() - started
    finally:
        connection.close()
    if status == 503 and classify(status, retry_after, payload, 1)[0] == REFUSED:
        return REFUSED, time.monotonic() - started
    return str(status), time.monotonic() - started


def probes(port: int, tls: ssl.SSLContext | None, pid: int, stop: float) -> dict:
    """The probes in turn, every half second until `stop`, in a thread of their own (the idle
    connections' event loop would delay them): their answers, and the server's open files and memory."""
    answers: dict[str, list[tuple[str, float]]] = {path: [] for _, path, _ in PROBES}
    files, memory = [], []
    time.sleep(1)  # the connections are opening
    while time.monotonic() < stop - 1:
        for method, path, body in PROBES:
            answers[path].append(probe(port, method, path, body, tls))
        files.append(len(os.listdir(f"/proc/{pid}/fd")))
        memory.append(resident_mb(pid))
        time.sleep(0.5)
    return {"server_open_files_max": max(files, default=0),
            "server_rss_mb": [round(min(memory, default=0), 1), round(max(memory, default=0), 1)],
            "probes": {path: {"answers": dict(Counter(kind for kind, _ in found)),
                              **latency_stats([seconds for _, seconds in found])} for path, found in answers.items()}}


async def hold(port: int, index: int, stop: float, lifetimes: list[float], counts: Counter, again: bool) -> None:
    """One idle connection until the server closes it or `stop`; opened again each time with `again`."""
    while time.monotonic() < stop:
        opened = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["open_failed"] += 1
            await asyncio.sleep(0.1)
            continue
        counts["opened"] += 1
        if index % 2:
            writer.write(HALF_A_HEAD)
        try:
            async with asyncio.timeout(max(0.0, stop - time.monotonic())):
                while await reader.read(4096):
                    pass
            lifetimes.append(time.monotonic() - opened)
        except (OSError, TimeoutError):
            pass
        writer.close()
        if not again:
            return


async def attack(port: int, args: argparse.Namespace, tls: ssl.SSLContext | None, pid: int) -> dict:
    stop = time.monotonic() + args.seconds
    lifetimes: list[float] = []
    counts: Counter = Counter()
    probing = asyncio.get_running_loop().run_in_executor(None, probes, port, tls, pid, stop)
    await asyncio.gather(*(hold(port, i, stop, lifetimes, counts, args.reconnect) for i in range(args.connections)))
    return {"connections": args.connections, "seconds": args.seconds, "tls": args.tls, "reconnect": args.reconnect,
            "idle_opened": counts["opened"], "idle_open_failed": counts["open_failed"],
            "idle_closed_by_server": latency_stats(lifetimes), **await probing}


def certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def problems(report: dict) -> list[str]:
    found = []
    for path in ("/health/live", "/health/ready"):
        wrong = {kind: n for kind, n in report["probes"][path]["answers"].items() if kind != "200"}
        if wrong:
            found.append(f"{path} answered {wrong} besides 200")
    wrong = {kind: n for kind, n in report["probes"]["/translate"]["answers"].items() if kind not in ("200", REFUSED)}
    if wrong:
        found.append(f"/translate answered {wrong} besides 200 and 503 with Retry-After")
    return found


OWN_VALUED, OWN_SWITCHES = ("--connections", "--seconds"), ("--tls", "--reconnect")


def serve_arguments(argv: list[str]) -> list[str]:
    """The words of `argv` that are serve.py's: all but this benchmark's own options and their values."""
    kept, words = [], iter(argv)
    for word in words:
        name = word.split("=")[0]
        if name in OWN_VALUED and "=" not in word:
            next(words, None)
        elif name not in OWN_VALUED and word not in OWN_SWITCHES:
            kept.append(word)
    return kept


def argument_parser() -> argparse.ArgumentParser:
    """This benchmark's own options; the rest of the command line is serve.py's (its options are
    added here too, so that the docs' commands are checked against both)."""
    parser = build_parser(SERVE, __doc__.splitlines()[0])
    add_translator_arguments(parser)
    parser.add_argument("--connections", type=int, default=5000, help="idle connections held (default: 5000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long (default: 20)")
    parser.add_argument("--tls", action="store_true", help="serve HTTPS with a self-signed certificate")
    parser.add_argument("--reconnect", action="store_true",
                        help="open a new idle connection whenever the server closes one (a flood; default: each once)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    argv = list(argv if argv is not None else sys.argv[1:])
    args = parser.parse_args(argv)  # serve.py's flags checked here too: a bad one is one line before any start
    server_args = serve_arguments(argv)
    if args.connections < 1 or not args.seconds > 2:
        parser.error("--connections must be at least 1 and --seconds above 2")
    raise_file_limit()  # the client holds as many files as it has connections
    pinning = plan_pinning(True)
    env = {name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"}
    with tempfile.TemporaryDirectory() as folder:
        tls = None
        if args.tls:
            cert, key = certificate(Path(folder))
            server_args += ["--ssl_certfile", str(cert), "--ssl_keyfile", str(key)]
            tls = ssl.create_default_context(cafile=str(cert))
        try:
            with ServerProcess(server_args, env=env, cpus=pinning.server) as server, pinned(pinning.generator):
                report = asyncio.run(attack(server.port, args, tls, server.pid))
        except (RuntimeError, OSError) as error:
            print(f"idle_connections.py: error: {error}", file=sys.stderr)
            return 1
    report["problems"] = problems(report)
    print(json.dumps(report, indent=1))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
