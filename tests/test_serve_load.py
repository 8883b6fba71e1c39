"""serve.py under load and faults, on real server processes whose model calls are held at gates (a
start-up hook in the server, GATE_HOOK: the model load waits for a file, and so does every decoding
call after the warm-up), so that overload, a queue and requests in flight exist for as long as a
test needs them, on a machine of any speed:
- overload: a request whose work (sentences x beam size) does not fit in the queue gets 503 with
  Retry-After at once, counted in work and not in sentences;
- a client that disconnects, queued or in the middle of its body, is never translated, and no
  traceback is printed; a body that arrives too slowly gets 408;
- /health/live and /health/ready before and after the model loads, over TLS, without the key;
- SIGTERM with requests in flight: readiness turns false, new requests get 503 with Retry-After,
  those held are answered, exit 0; /metrics parses.
The deadline, a stuck decode and the drain's grace period are driven in-process through the same
Service, with a decode that blocks on an Event."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from starlette.requests import Request

import serve
from benchmarks.loadtest import ROOT, ServerProcess
from config import get_config
from serve import WARM_UP, Service
from test_serve import AUTHORIZED, KEY, SENTENCES, exchange, metrics
from test_serve import checkpoint, translator  # noqa: F401  (fixtures, shared with test_serve.py)
from nmt.inference.translator import DecodingOptions, Hypothesis, TorchTranslator
from nmt.serving.request_checks import ApiError

GATE_HOOK = '''"""sitecustomize of the servers of tests/test_serve_load.py: the model load waits until the file
$SERVE_GATES/load exists; every translation after the first (the warm-up) says on stderr which
sentences it starts, then waits until $SERVE_GATES/decode exists."""
import json
import os
import sys
import time
from pathlib import Path

from nmt.inference import translator
GATES = Path(os.environ["SERVE_GATES"])
load_translator = translator.load_translator


def wait_for(gate):
    while not (GATES / gate).exists():
        time.sleep(0.01)


def gated_load(args, resolved):
    wait_for("load")
    loaded = load_translator(args, resolved)
    translate, calls = loaded.translate, []

    def gated_translate(sentences, options):
        if calls:
            print("test: decoding " + json.dumps(list(sentences)), file=sys.stderr, flush=True)
            wait_for("decode")
        calls.append(sentences)
        return translate(sentences, options)

    loaded.translate = gated_translate
    return loaded


translator.load_translator = gated_load
'''


class Gates:
    """The gate files of a server started with env(): open() lets that kind of call through."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "hook").mkdir(parents=True)
        (folder / "hook" / "sitecustomize.py").write_text(GATE_HOOK)

    def env(self) -> dict[str, str]:
        paths = [str(self.folder / "hook"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        return dict({name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"},
                    PYTHONPATH=os.pathsep.join(paths), SERVE_GATES=str(self.folder))

    def open(self, gate: str) -> None:
        (self.folder / gate).touch()

    def close(self, gate: str) -> None:
        (self.folder / gate).unlink(missing_ok=True)


@dataclass
class Server:
    """How a test reaches one server: its port, its stderr lines so far, TLS and the key."""

    port: int
    log: list[str]
    tls: ssl.SSLContext | None = None
    headers: dict[str, str] | None = None
    pid: int = 0

    def send(self, method: str, path: str, body: Any = None) -> tuple[int, http.client.HTTPMessage, bytes]:
        return exchange(self.port, method, path, body, self.headers, tls=self.tls)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, _, answer = self.send(method, path, body)
        return status, json.loads(answer)

    def translate(self, sentences: list[str], beam_size: int = 1) -> tuple[int, http.client.HTTPMessage, bytes]:
        return self.send("POST", "/translate", {"text": sentences, "beam_size": beam_size})

    def metric(self, name: str, **labels: str) -> float:
        """One sample of GET /metrics (0 if it has not been counted yet)."""
        return metrics(self.port, self.headers, self.tls).get((name, tuple(sorted(labels.items()))), 0.0)


def until(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll `condition` until it is true, and return it; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Start `work` in a thread; the function returned waits for it and returns its result."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    thread.start()
    return lambda: (thread.join(60), result[0])[1]


def decoding_calls(log: list[str]) -> list[list[str]]:
    """The sentences of each decoding call that started after the warm-up (GATE_HOOK's lines)."""
    return [json.loads(line.removeprefix("test: decoding ")) for line in log if line.startswith("test: decoding ")]


def no_traceback(log: list[str]) -> bool:
    return not any("Traceback" in line for line in log)


def refused_as_overload(answer: tuple[int, http.client.HTTPMessage, bytes], message: str) -> bool:
    """A 503 whose JSON error says `message`, with a Retry-After of whole seconds, at least 1."""
    status, headers, body = answer
    retry_after = headers.get("Retry-After", "")
    return status == 503 and message in json.loads(body)["error"] and retry_after.isdigit() and int(retry_after) >= 1


def in_the_model(server: Server, gates: Gates, sentences: list[str]) -> Callable[[], Any]:
    """A request for `sentences`, sent with the decode gate closed and waited for until its batch is
    in the model, where it stays until the gate opens; returns its answer's join()."""
    gates.close("decode")
    started = len(decoding_calls(server.log))
    answer = in_thread(lambda: server.call("POST", "/translate", {"text": sentences}))
    until(lambda: decoding_calls(server.log)[started:] == [sentences], "the batch to reach the model")
    return answer


def queued(server: Server, sentences: list[str], beam_size: int, requests: int) -> Callable[[], Any]:
    """A request sent in a thread and waited for until the queue holds `requests` requests."""
    answer = in_thread(lambda: server.call("POST", "/translate", {"text": sentences, "beam_size": beam_size}))
    until(lambda: server.metric("serve_queue_requests") == requests, f"{requests} requests in the queue")
    return answer


def expected(translator: TorchTranslator, sentences: list[str], beam_size: int = 1) -> tuple[int, dict[str, Any]]:
    return 200, {"translations": translator.translate_best(sentences, DecodingOptions(beam_size=beam_size))}


# ---------------------------------------------------------------------------- a queue held full

@pytest.fixture(scope="module")
def held(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Server, Gates]:
    """A server whose decoding calls wait at their gate, greedy unless a request says otherwise. Its
    queue holds 12 work (one request of 4 sentences at beam 3); a batch goes to the model as soon as
    its first request arrives; a body has 1 s to arrive; a request head 2 s; 500 connections at most."""
    gates = Gates(tmp_path_factory.mktemp("gates"))
    gates.open("load")
    with ServerProcess(["--checkpoint", str(checkpoint), "--serve_max_sentences", "4", "--serve_max_beam_size", "3",
                        "--serve_max_queued_work", "12", "--serve_batch_wait_ms", "0", "--serve_body_timeout_s", "1",
                        "--serve_header_timeout_s", "2", "--serve_max_connections", "500", "--beam_size", "1"],
                       env=gates.env()) as process:
        yield Server(process.port, process.log, pid=process.pid), gates


def test_overload_gets_503_with_retry_after(held: tuple[Server, Gates], translator: TorchTranslator) -> None:
    """With one batch held in the model, 4 sentences at beam 1 (work 4) are queued; 3 sentences at
    beam 3 (work 9) do not fit in the 12 left, 4 at beam 2 (8) do; then a burst of one-sentence
    requests, one of them LibreTranslate's, is refused at once. When the model goes on, those
    admitted are answered."""
    server, gates = held
    before = server.metric("serve_requests_total", code="503", endpoint="translate")
    first = in_the_model(server, gates, SENTENCES[:4])
    second = queued(server, SENTENCES[4:8], 1, requests=1)
    assert refused_as_overload(server.translate(SENTENCES[:3], beam_size=3), "4 work queued, 9 more would pass the "
                               "limit of 12 (serve_max_queued_work; work is sentences x beam size)")
    third = queued(server, SENTENCES[:4], 2, requests=2)
    assert server.metric("serve_queue_work") == 12
    burst = [in_thread(lambda: server.translate([SENTENCES[0]])) for _ in range(8)]
    # LibreTranslate's requests share the queue: shed alike
    burst.append(in_thread(lambda: server.send("POST", "/translate", {"q": SENTENCES[0], "source": "en",
                                                                      "target": "it"})))
    assert all(refused_as_overload(answer(), "serve_max_queued_work") for answer in burst)
    gates.open("decode")
    assert first() == expected(translator, SENTENCES[:4])
    assert second() == expected(translator, SENTENCES[4:8])
    assert third() == expected(translator, SENTENCES[:4], beam_size=2)
    assert server.metric("serve_requests_total", code="503", endpoint="translate") - before == 10
    assert no_traceback(server.log)


def test_a_disconnected_client_is_not_translated(held: tuple[Server, Gates], translator: TorchTranslator) -> None:
    """A client that leaves while its request is queued, and one that leaves in the middle of its
    body: the first's sentence never reaches the model, and neither prints a traceback."""
    server, gates = held
    left = server.metric("serve_requests_total", code="499", endpoint="translate")
    first = in_the_model(server, gates, SENTENCES[:2])
    lost = "The cat reads the book of the dog."
    body = json.dumps({"text": [lost]}).encode()
    client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    client.sendall(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    until(lambda: server.metric("serve_queue_requests") == 1, "the request to be queued")
    client.close()
    until(lambda: server.metric("serve_requests_total", code="499", endpoint="translate") == left + 1,
          "the departure to be noticed")
    assert server.metric("serve_queue_requests") == 0
    client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    client.sendall(b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Length: 100\r\n\r\n" + body[:20])
    client.close()
    until(lambda: server.metric("serve_requests_total", code="499", endpoint="translate") == left + 2,
          "the departure in the middle of the body to be noticed")
    gates.open("decode")
    assert first() == expected(translator, SENTENCES[:2])
    assert server.call("POST", "/translate", {"text": [SENTENCES[2]]}) == expected(translator, [SENTENCES[2]])
    assert [lost] not in decoding_calls(server.log)
    assert no_traceback(server.log)


def test_a_slow_body_gets_408(held: tuple[Server, Gates]) -> None:
    server, _ = held
    client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    client.sendall(b'POST /translate HTTP/1.1\r\nHost: test\r\nContent-Length: 50\r\n\r\n{"text": ')
    response = http.client.HTTPResponse(client)
    response.begin()
    assert response.status == 408 and response.headers["Connection"] == "close"
    assert "did not arrive within 1 s (serve_body_timeout_s)" in json.loads(response.read())["error"]
    client.close()


def test_thousands_of_idle_connections_leave_the_probes_and_the_api_answering(held: tuple[Server, Gates],
                                                                             translator: TorchTranslator) -> None:
    """3,000 connections from one client that send nothing, against serve_max_connections 500:
    liveness, readiness and a translation answer 200 meanwhile (uvicorn's own limit answered them a
    plain-text 503), the server holds at most 500 of them (its open files stay bounded), and each
    is closed once serve_header_timeout_s (2 s) has passed without a request head."""
    server, gates = held
    gates.open("decode")
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3000)]
    opened = time.monotonic()
    try:
        assert server.call("GET", "/health/live") == (200, {"status": "live"})
        assert server.call("GET", "/health/ready") == (200, {"status": "ready"})
        assert server.call("POST", "/translate", {"text": [SENTENCES[0]], "beam_size": 1}) == \
            expected(translator, [SENTENCES[0]])
        assert len(os.listdir(f"/proc/{server.pid}/fd")) < 500 + 128
        assert server.metric("serve_connections_closed_total", reason="evicted") >= 2500
        time.sleep(max(0.0, opened + 3 - time.monotonic()))
        assert all(closed(connection) for connection in idle)
    finally:
        for connection in idle:
            connection.close()
    assert no_traceback(server.log)


def closed(connection: socket.socket) -> bool:
    """Whether the other end has closed `connection` (without waiting)."""
    try:
        return connection.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_metrics_parse(held: tuple[Server, Gates]) -> None:
    server, gates = held
    gates.open("decode")  # one answer of its own: under xdist no other test may have used this server
    assert server.translate([SENTENCES[0]])[0] == 200
    samples = metrics(server.port, headers=None)
    assert {"serve_queue_work", "serve_queue_requests", "serve_sentences_total", "serve_batch_sentences_count",
            "serve_request_duration_seconds_count", "serve_ready", "process_resident_memory_bytes"} \
        <= {name for name, _ in samples}
    assert samples[("serve_ready", ())] == 1
    answered = samples[("serve_requests_total", (("code", "200"), ("endpoint", "translate")))]
    assert samples[("serve_request_duration_seconds_count", (("endpoint", "translate"),))] >= answered > 0


# ---------------------------------------------------------------------------- start and stop, over TLS

LISTENING = re.compile(r"^serve\.py: listening on https://0\.0\.0\.0:(\d+)/ \(loading the model\)$")


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, made by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate to serve TLS with")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    """serve.py in a subprocess, and its stderr lines as they come (ServerProcess waits for the
    model; this does not)."""
    process = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--port", "0", *args], cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []

    def read() -> None:
        for line in process.stderr:
            log.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return process, log


def test_probes_tls_and_a_drain_with_requests_in_flight(checkpoint: Path, translator: TorchTranslator,
                                                       tmp_path: Path) -> None:
    """Off loopback with a key over TLS (no --trusted_network needed). Before the model has loaded:
    live 200, ready 503, a translation 503 with Retry-After; after: ready 200. The probes need no
    key, /metrics does. Then SIGTERM with one batch in the model and two requests queued: ready 503,
    a new request 503 with Retry-After; when the model goes on the three are answered, exit 0."""
    cert, key = certificate(tmp_path)
    gates = Gates(tmp_path / "gates")
    (tmp_path / "api_key").write_text(KEY)
    process, log = start(["--checkpoint", str(checkpoint), "--host", "0.0.0.0", "--api_key_file",
                          str(tmp_path / "api_key"), "--ssl_certfile", str(cert), "--ssl_keyfile", str(key),
                          "--serve_batch_wait_ms", "0", "--beam_size", "1"], gates.env())
    try:
        listening = until(lambda: next(filter(None, map(LISTENING.match, log)), None), "the socket to open")
        tls = ssl.create_default_context(cafile=str(cert))
        server, anonymous = (Server(int(listening.group(1)), log, tls, headers) for headers in (AUTHORIZED, None))
        assert anonymous.call("GET", "/health/live") == (200, {"status": "live"})
        assert anonymous.call("GET", "/health/ready") == (503, {"status": "loading"})
        assert refused_as_overload(server.translate([SENTENCES[0]]), "the model is still loading")
        gates.open("load")
        until(lambda: any(line.startswith("serve.py: serving ") for line in log), "the model to load")
        assert anonymous.call("GET", "/health/ready") == (200, {"status": "ready"})
        assert anonymous.send("GET", "/metrics")[0] == 401

        first = in_the_model(server, gates, SENTENCES[:2])
        second = queued(server, SENTENCES[2:4], 1, requests=1)
        third = queued(server, SENTENCES[4:6], 1, requests=2)
        process.send_signal(signal.SIGTERM)
        until(lambda: anonymous.call("GET", "/health/ready") == (503, {"status": "draining"}), "the drain")
        assert refused_as_overload(server.translate([SENTENCES[0]]), "the server is shutting down")
        gates.open("decode")
        assert first() == expected(translator, SENTENCES[:2])
        assert second() == expected(translator, SENTENCES[2:4])
        assert third() == expected(translator, SENTENCES[4:6])
        assert process.wait(30) == 0
        assert log[-1] == "serve.py: stopped" and no_traceback(log)
    finally:
        process.kill()
        process.wait()


# ---------------------------------------------------------------------------- deadline and grace, in-process

def never_disconnects() -> Request:
    """A request whose client stays."""
    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    return Request({"type": "http", "method": "POST", "path": "/translate", "headers": []}, receive)


@pytest.fixture
def held_decode(translator: TorchTranslator,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[list[list[str]], threading.Event]]:
    """The translator's decoding calls (their sentences), each after the first (the warm-up) held
    until the Event is set."""
    calls: list[list[str]] = []
    release = threading.Event()
    translate = translator.translate

    def held(sentences: list[str], options: DecodingOptions) -> list[list[Hypothesis]]:
        calls.append(list(sentences))
        if len(calls) > 1:
            release.wait(60)
        return translate(sentences, options)

    monkeypatch.setattr(translator, "translate", held)
    yield calls, release
    release.set()


async def loaded(translator: TorchTranslator, **config: Any) -> Service:
    service = Service(dict(get_config(), serve_batch_wait_ms=0, **config), lambda: translator, "http://test/")
    await service.load_model()
    assert service.state() == "ready"
    return service


async def first_in_the_model(service: Service, calls: list[list[str]]) -> tuple[asyncio.Task, asyncio.Task]:
    """A request whose batch is in the (held) model, and one queued behind it."""
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(service.translate(never_disconnects(), loop.time(), ["The cat."], service.defaults))
    while len(calls) < 2:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(service.translate(never_disconnects(), loop.time(), ["The dog."], service.defaults))
    while not service.batcher.waiting:
        await asyncio.sleep(0.01)
    return first, second


async def refused(task: asyncio.Task, message: str) -> None:
    with pytest.raises(ApiError) as error:
        await asyncio.wait_for(task, 30)
    assert error.value.status == 503 and message in error.value.message
    assert int(error.value.headers["Retry-After"]) >= 1


def test_the_deadline_and_a_stuck_decode(translator: TorchTranslator,
                                         held_decode: tuple[list[list[str]], threading.Event]) -> None:
    """serve_request_timeout_s 0.5: a request in the model and one queued behind it both get 503 with
    Retry-After at their deadline, and the queued one never reaches the model. While the decode goes
    on past the timeout the server is stuck: not ready, and it refuses a new request."""
    calls, release = held_decode

    async def scenario() -> None:
        service = await loaded(translator, serve_request_timeout_s=0.5)
        first, second = await first_in_the_model(service, calls)
        for task in (first, second):
            await refused(task, "not answered within 0.5 s (serve_request_timeout_s)")
        while service.state() != "stuck":
            await asyncio.sleep(0.01)
        with pytest.raises(ApiError, match="longer than a request may wait"):
            service.check_open()
        release.set()
        while service.state() != "ready" or service.batcher.busy:
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(scenario(), 60))  # a broken guard fails, not hangs
    assert calls == [[WARM_UP], ["The cat."]]


def test_freed_memory_goes_back_once_the_model_is_idle(translator: TorchTranslator,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """After a translation and IDLE_TRIM_S without another model call, the heap's free pages are
    handed back (malloc_trim), once, in the model's thread; not before any call, not again until
    the next call."""
    monkeypatch.setattr(serve, "IDLE_TRIM_S", 0.05)
    trims: list[str] = []
    monkeypatch.setattr(serve, "release_freed_memory", lambda: trims.append(threading.current_thread().name))

    async def scenario() -> None:
        service = await loaded(translator)
        service.background(service.trim_when_idle())
        await asyncio.sleep(0.3)
        assert trims == []
        await service.translate(never_disconnects(), asyncio.get_running_loop().time(), ["The cat."],
                                service.defaults)
        await asyncio.sleep(0.3)
        assert trims == ["model"]
        await asyncio.sleep(0.3)
        assert trims == ["model"]

    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.mark.parametrize("grace, signals", [(0.3, 1), (60.0, 2)], ids=["grace-period-ends", "second-signal"])
def test_the_drain_ends_with_its_grace_period(translator: TorchTranslator,
                                              held_decode: tuple[list[list[str]], threading.Event], grace: float,
                                              signals: int) -> None:
    """A decode that does not end and a request queued behind it: when the drain's grace period ends
    (or at a second stop signal) both get 503 with Retry-After and the server is told to stop; the
    queued one never reaches the model. Meanwhile the server is not ready and refuses new requests."""
    calls, _ = held_decode

    async def scenario() -> None:
        service = await loaded(translator, serve_drain_grace_s=grace)
        stopped = asyncio.Event()
        service.stop_server = stopped.set
        first, second = await first_in_the_model(service, calls)
        for _ in range(signals):
            service.drain()
        assert service.state() == "draining"
        with pytest.raises(ApiError, match="the server is shutting down"):
            service.check_open()
        for task in (first, second):
            await refused(task, "the server is shutting down")
        await asyncio.wait_for(stopped.wait(), 10)

    asyncio.run(asyncio.wait_for(scenario(), 60))  # a broken guard fails, not hangs
    assert calls == [[WARM_UP], ["The cat."]]
