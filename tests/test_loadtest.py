"""benchmarks/loadtest.py: a short closed-loop and a short open-loop run against the tiny model on loopback
answer every request and their reports add up (pinning and server memory included); every kind of
answer of a stand-in server is counted as what it is, and any but 200 and 503 with Retry-After
fails the run; percentiles by nearest rank, the memory slope after the warm-up, seeded arrivals."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from benchmarks import loadtest


def test_report_adds_up(trained_run, capsys: pytest.CaptureFixture) -> None:
    """With a queue that holds one request, the server refuses some while others wait (how many
    depends on timing): refusals are counted apart and are no failure."""
    code = loadtest.main(["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                          "--clients", "4", "--requests", "12", "--sentences_per_request", "3", "--time_limit", "60",
                          "--serve_max_queued_work", "3", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [row] = json.loads(captured.out)
    assert row["engine"] == "pytorch" and row["requests"] == 12
    assert row["answered"] + row["refused"] == 12 and row["errors"] == 0 and row["unsent"] == 0
    assert row["sentences"] == row["answered"] * 3
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= 1000 * row["seconds"]
    assert row["sentences_per_second"] == pytest.approx(row["sentences"] / row["seconds"], rel=0.01)
    assert "serving" in captured.err and "Traceback" not in captured.err


def test_table_lists_each_engine() -> None:
    row = {"engine": "pytorch", "requests": 3, "answered": 2, "refused": 1, "errors": 0, "unsent": 0, "p50_ms": 1.5,
           "p99_ms": 2.0, "sentences_per_second": 10.0, "seconds": 0.9}
    lines = loadtest.table([row, dict(row, engine="ctranslate2", p50_ms=None)]).splitlines()
    assert lines[0].split() == ["engine", "requests", "answered", "refused", "errors", "unsent", "p50", "ms", "p99",
                                "ms", "sentences/s", "seconds"]
    assert lines[1].split() == ["pytorch", "3", "2", "1", "0", "0", "1.5", "2.0", "10.0", "0.9"]
    assert lines[2].split()[0] == "ctranslate2" and lines[2].split()[6] == "-"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_the_serving_banner_is_recognised(scheme: str) -> None:
    for host, url in (("127.0.0.1", f"{scheme}://127.0.0.1:8443/"), ("::1", f"{scheme}://[::1]:8443/")):
        match = loadtest.SERVING.match(f"serve.py: serving weights/ckpt_00000060.pt (pytorch) on {url}")
        assert match is not None and match.groups() == (host, "8443")


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert loadtest.percentile(values, 50) == 50 and loadtest.percentile(values, 99) == 99
    assert loadtest.percentile([3.0, 1.0, 2.0], 50) == 2 and loadtest.percentile([7.0], 99) == 7


# ---------------------------------------------------------------------------- open loop

def test_open_loop_against_the_server(trained_run, capsys: pytest.CaptureFixture) -> None:
    """Capacity measured, then half of it sent open-loop: the report adds up, says where each side
    ran and how the server's memory went, and the server held."""
    cpus = sorted(os.sched_getaffinity(0))
    code = loadtest.main(["--datasource", str(trained_run.datasource), "--model_folder", str(trained_run.model_folder),
                          "--mode", "open", "--clients", "2", "--capacity_seconds", "0.5", "--rate_factor", "0.5",
                          "--duration", "1", "--sentences_per_request", "2", "--deadline_s", "30",
                          "--rss_interval_s", "0.25", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    [row] = json.loads(captured.out)
    assert row["engine"] == "pytorch" and row["mode"] == "open" and row["problems"] == []
    assert row["rate"] == pytest.approx(0.5 * row["capacity"]["requests_per_second"], rel=1e-3)
    assert row["scheduled"] == row["sent"] + row["unsent"] and row["sent"] == sum(row["counts"].values()) > 0
    assert row["counts"]["ok"] == row["answered"]["count"] > 0
    assert row["counts"]["refused"] == row["refused"]["count"]
    assert sum(row["statuses"].values()) == row["sent"] - row["counts"]["connection_error"] - row["counts"]["timeout"]
    assert row["answered"]["p50_ms"] <= row["answered"]["p99_ms"] <= row["answered"]["max_ms"]
    if len(cpus) >= 2:
        assert row["pinning"] == {"generator": str(cpus[0]), "server": ",".join(map(str, cpus[1:])), "note": ""}
    else:
        assert row["pinning"]["note"].startswith("none")
    assert sorted(os.sched_getaffinity(0)) == cpus  # the generator's pinning is undone
    rss = row["rss_mb"]
    assert 0 < rss["after_warm_up"] and 0 < rss["before"] <= rss["peak"] and rss["after"] <= rss["peak"]
    assert rss["growth"] == pytest.approx(rss["after"] - rss["before"], abs=0.11)
    assert len(row["rss_samples"]) >= 2 and row["recovery"]["status"] == 200
    assert "capacity:" in captured.err and "Traceback" not in captured.err


STAND_IN_ANSWERS: dict[str, tuple[int, dict[str, str], Any]] = {  # sentence -> status, headers, JSON body
    "ok": (200, {}, {"translations": ["fine"]}),
    "short": (200, {}, {"translations": []}),
    "busy": (503, {"Retry-After": "1"}, {"error": "busy"}),
    "busy until": (503, {"Retry-After": "Wed, 21 Oct 2026 07:28:00 GMT"}, {"error": "busy"}),
    "busy now": (503, {"Retry-After": "0"}, {"error": "busy"}),
    "busy, no header": (503, {}, {"error": "busy"}),
    "busy, soon": (503, {"Retry-After": "soon"}, {"error": "busy"}),
    "late": (504, {}, {"error": "too late"}),
    "crash": (500, {}, {"error": "crashed"}),
}


class StandIn(BaseHTTPRequestHandler):
    """Answers POST /translate by its first sentence: as STAND_IN_ANSWERS says, or "drop" closes
    the connection unanswered, or "stall" answers nothing for a few seconds."""

    def do_POST(self) -> None:
        sentence = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"][0]
        if sentence == "stall":
            time.sleep(3)
        if sentence in ("drop", "stall"):
            self.close_connection = True
            return
        answer(self, *STAND_IN_ANSWERS[sentence])

    def log_message(self, *args: Any) -> None:
        pass


def answer(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: Any) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    for name, value in {**headers, "Content-Type": "application/json", "Content-Length": str(len(data))}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


@pytest.fixture()
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """loadtest.main() drives a stand-in on 127.0.0.1 instead of serve.py (its memory is this process's)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    class StandInProcess(contextlib.nullcontext):
        def __init__(self, args: list[str], env: dict[str, str] | None = None, cpus: set[int] | None = None) -> None:
            super().__init__(self)
            self.port, self.pid, self.banner = server.server_port, os.getpid(), "a stand-in"

    monkeypatch.setattr(loadtest, "ServerProcess", StandInProcess)
    yield
    server.shutdown()
    server.server_close()


def drive_stand_in(sentences: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, dict, str]:
    """Two requests of each sentence, evenly spaced over half a second."""
    text_file = tmp_path / "sentences.txt"
    text_file.write_text("\n".join(sentences) + "\n")
    code = loadtest.main(["--text_file", str(text_file), "--sentences_per_request", "1", "--requests", "120",
                          "--mode", "open", "--rate", str(4 * len(sentences)), "--duration", "0.5", "--arrivals",
                          "uniform", "--request_timeout_s", "0.5", "--deadline_s", "5", "--no_pin",
                          "--max_rss_growth_mb", "1000", "--json"])
    captured = capsys.readouterr()
    [row] = json.loads(captured.out)
    return code, row, captured.err


def test_every_answer_is_classified(stand_in: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, row, err = drive_stand_in([*STAND_IN_ANSWERS, "drop", "stall"], tmp_path, capsys)
    assert row["counts"] == {"ok": 2, "refused": 6, "bad_refusal": 4, "gateway_timeout": 2, "bad_answer": 2,
                             "other_status": 2, "connection_error": 2, "timeout": 2}
    assert row["statuses"] == {"200": 4, "500": 2, "503": 10, "504": 2}
    assert row["scheduled"] == row["sent"] == 22 and row["unsent"] == 0
    assert row["answered"]["count"] == 2 and row["refused"]["count"] == 6
    assert row["pinning"]["note"] == "off (--no_pin)"
    assert row["problems"] == ["14 answers were neither 200 nor 503 with Retry-After: 4 503 without a valid "
                               "Retry-After or JSON error, 2 504, 2 200 with a wrong body, 2 other status, "
                               "2 connection error, 2 no answer in time"]
    assert code == 1 and "failed request: " in err and "Traceback" not in err

    code, row, err = drive_stand_in(["ok", "busy", "busy until"], tmp_path, capsys)
    assert row["counts"]["ok"] == 2 and row["counts"]["refused"] == 4 and row["problems"] == []
    assert code == 0, err


def test_closed_loop_counts_refusals_apart(stand_in: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Closed loop: a 503 with Retry-After (by the open loop's rule) is a refusal, counted apart,
    and the run passes; any other failure still fails it."""
    text_file = tmp_path / "sentences.txt"
    for sentences, refused, errors, exit_code in ((["ok", "busy now"], 3, 0, 0),
                                                  (["ok", "busy now", "crash"], 2, 2, 1)):
        text_file.write_text("\n".join(sentences) + "\n")
        code = loadtest.main(["--text_file", str(text_file), "--sentences_per_request", "1", "--requests", "6",
                              "--clients", "2", "--json"])
        captured = capsys.readouterr()
        [row] = json.loads(captured.out)
        assert (row["answered"], row["refused"], row["errors"], row["unsent"]) == (6 - refused - errors, refused,
                                                                                   errors, 0)
        assert code == exit_code, captured.err
        assert ("failed request: HTTP 500" in captured.err) == bool(errors) and "503" not in captured.err


class OneAtATime(BaseHTTPRequestHandler):
    """A server that decodes one request at a time (50 ms) while one more may wait: a request that
    finds both places taken is refused with Retry-After, as serve.py refuses past its queue bound."""

    places = threading.BoundedSemaphore(2)
    model = threading.Lock()

    def do_POST(self) -> None:
        sentences = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        if not self.places.acquire(blocking=False):
            return answer(self, 503, {"Retry-After": "0"}, {"error": "busy"})
        try:
            with self.model:
                time.sleep(0.05)
        finally:
            self.places.release()
        answer(self, 200, {}, {"translations": sentences})

    def log_message(self, *args: Any) -> None:
        pass


def test_a_refused_client_leaves_the_capacity_run() -> None:
    """A refusal means the other clients fill the queue, and they keep the server saturated: the
    refused client leaves the capacity run instead of coming back for more refusals, so each
    client is refused at most once and the two that fit stay to the end."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), OneAtATime)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        capacity = loadtest.measure_capacity(server.server_port, [loadtest.Request(["a", "b"])], clients=5, seconds=0.6, timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert capacity["failed"] == 0 and capacity["refused"] <= 5 - 2
    assert capacity["requests_per_second"] * capacity["seconds"] >= 2  # the two that fit were answered


def test_rss_slope_skips_the_warm_up() -> None:
    # 100 MB taken in the first minute, then 0.5 MB a minute, a sample every 5 s for 5 minutes
    samples = [(t, (100.0 if t >= 30 else 0.0) + 0.5 * t / 60) for t in range(0, 300, 5)]
    assert loadtest.rss_slope(samples, 60) == pytest.approx(0.5)
    assert loadtest.rss_slope(samples, 0) > 5
    assert loadtest.rss_slope(samples[:2], 0) is None and loadtest.rss_slope(samples, 290) is None


def test_arrivals_are_seeded_and_at_the_rate() -> None:
    assert loadtest.arrival_times(4, 1, "uniform", 0) == [0, 0.25, 0.5, 0.75]
    poisson = loadtest.arrival_times(100, 60, "poisson", 1)
    assert poisson == loadtest.arrival_times(100, 60, "poisson", 1) != loadtest.arrival_times(100, 60, "poisson", 2)
    assert len(poisson) == pytest.approx(6000, rel=0.05) and poisson == sorted(poisson) and poisson[-1] < 60


def test_the_mixed_workload_is_seeded_and_within_the_servers_limits() -> None:
    """--workload mixed: 1 to 16 sentences (at most serve_max_sentences), beam 1 or 5 (at most
    serve_max_beam_size), about 5% of one sentence to /attention, the same for a seed; an answer
    to /attention is judged as one."""
    sentences = [f"Sentence {i}." for i in range(50)]
    args, config = loadtest.parse_arguments(["--text_file", "unused", "--workload", "mixed", "--requests", "2000"])
    mixed = loadtest.build_requests(sentences, args, config)
    assert mixed == loadtest.build_requests(sentences, args, config)
    translate = [request for request in mixed if request.path == "/translate"]
    sizes, beams = {len(r.sentences) for r in translate}, {r.beam_size for r in translate}
    assert sizes == set(range(1, 17)) and beams == {1, 5}
    attention = [request for request in mixed if request.path == "/attention"]
    assert 50 < len(attention) < 150 and all(len(request.sentences) == 1 for request in attention)
    args, config = loadtest.parse_arguments(["--text_file", "unused", "--workload", "mixed", "--serve_max_sentences",
                                             "4", "--serve_max_beam_size", "3", "--seed", "7"])
    other = loadtest.build_requests(sentences, args, config)
    assert other != mixed[:len(other)] and max(len(r.sentences) for r in other) == 4
    assert {r.beam_size for r in other if r.path == "/translate"} == {1, 3}
    attention_answer = json.dumps({"source_tokens": [], "output_tokens": ["x"], "weights": [[1.0]]}).encode()
    assert loadtest.classify(200, None, attention_answer, 1, "/attention") == ("ok", "")
    assert loadtest.classify(200, None, b'{"translations": ["x"]}', 1, "/attention")[0] == "bad_answer"
