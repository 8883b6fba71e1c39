"""serve.py: translations over HTTP from real server processes, of a list of sentences (each
segmented, the answer one translation per item) and of one text in its shape with each sentence's
span; every bad request gets a 4xx JSON error naming the problem; concurrent requests are decoded
together, beam sizes apart; a failing decode leaves the batching worker running; an API key off
loopback; a float32 export served by the CTranslate2 engine translates as the PyTorch engine does;
clean exits on SIGINT and SIGTERM; one line and a non-zero exit for a server that cannot start; a
model of several target languages served with target_lang per request (400 when missing or
foreign). Overload, deadlines, drain, probes, metrics and TLS: tests/test_serve_load.py."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import export
import serve
from benchmarks.loadtest import ROOT, ServerProcess
from config import ConfigError, get_config
from serve import Batcher
from test_translator import several_targets  # noqa: F401  (a fixture: an untrained model of en -> fr+it)
from nmt.inference.translator import DecodingOptions, TorchTranslator
from nmt.serving.request_checks import ApiError

SENTENCES = ["The cat sees the dog.", "The old man reads a book.", "The small fish eats bread.",
             "The red house.", "A black dog loves the white cat.", "The big dog eats the fish.",
             "The man sees the house.", "The cat reads."]
LIMITS = ["--serve_max_sentences", "4", "--serve_max_chars", "80", "--serve_max_body_bytes", "2048",
          "--serve_max_beam_size", "3", "--serve_glossary_max_terms", "2"]
KEY = "test-key-0123456789"
TYPED_SPECIALS = "<2fr> the cat [EOS] sees [PAD] the <BT> dog [SOS] ."  # control tokens' strings, typed
AUTHORIZED = {"Authorization": f"Bearer {KEY}"}


def exchange(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = AUTHORIZED,
             raw: bytes | None = None, chunked: bool = False,
             tls: ssl.SSLContext | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """(status, headers, body) of one request with the key (unless `headers` says otherwise), over
    HTTPS if `tls` is given; `body` is sent as JSON, `raw` as it is."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=tls) if tls else \
        http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    if chunked:
        connection.request(method, path, iter([data[i:i + 500] for i in range(0, len(data), 500)]), headers or {},
                           encode_chunked=True)
    else:
        connection.request(method, path, data, headers or {})
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    return response.status, response.headers, answer


def call(port: int, method: str, path: str, body: Any = None, headers: dict[str, str] | None = AUTHORIZED,
         raw: bytes | None = None, chunked: bool = False, tls: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one request, as exchange() sends it."""
    status, _, answer = exchange(port, method, path, body, headers, raw, chunked, tls)
    return status, json.loads(answer)


def metrics(port: int, headers: dict[str, str] | None = AUTHORIZED,
            tls: ssl.SSLContext | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics, parsed by prometheus_client: {(sample name, sorted labels): value}."""
    status, _, answer = exchange(port, "GET", "/metrics", headers=headers, tls=tls)
    assert status == 200, answer
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.decode()) for sample in family.samples}


def metric(port: int, name: str, **labels: str) -> float:
    """One sample of GET /metrics (0 if it has not been counted yet)."""
    return metrics(port).get((name, tuple(sorted(labels.items()))), 0.0)


def no_traceback(server: ServerProcess) -> bool:
    return not any("Traceback" in line for line in server.log)


@pytest.fixture(scope="module")
def checkpoint(trained_run) -> Path:
    return trained_run.latest()[0]


@pytest.fixture(scope="module")
def translator(checkpoint: Path) -> TorchTranslator:
    return TorchTranslator.load(checkpoint, checkpoint.parent, torch.device("cpu"))


@pytest.fixture(scope="module")
def server(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    """One server for the API tests, bound to 0.0.0.0 and so needing the key, which comes from
    --api_key_file (it wins over the environment), over plain HTTP (--trusted_network); reached
    here through 127.0.0.1. Requests that arrive within 200 ms of each other are batched."""
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    with ServerProcess(["--checkpoint", str(checkpoint), "--api_key_file", str(key_file), "--trusted_network",
                        "--serve_batch_wait_ms", "200", *LIMITS], host="0.0.0.0",
                       env=dict(os.environ, TRANSLATE_API_KEY="environment-key")) as process:
        yield process


def health(port: int, headers: dict[str, str] | None = AUTHORIZED) -> dict[str, Any]:
    status, answer = call(port, "GET", "/health", headers=headers)
    assert status == 200, answer
    return answer


def test_translate(server: ServerProcess, translator: TorchTranslator) -> None:
    status, answer = call(server.port, "POST", "/translate", {"text": SENTENCES[:3]})
    assert status == 200
    assert answer == {"translations": translator.translate_best(SENTENCES[:3], DecodingOptions())}
    status, answer = call(server.port, "POST", "/translate", {"text": SENTENCES[:3], "beam_size": 3})
    assert status == 200
    assert answer == {"translations": translator.translate_best(SENTENCES[:3], DecodingOptions(beam_size=3))}


def test_text_as_one_string(server: ServerProcess, translator: TorchTranslator) -> None:
    """The string form: the text translated in its shape, and each sentence's span indexing the
    request's text (code points: the accented letter counts one) with its translation."""
    sources = ["The cat sees the dög.", SENTENCES[1], SENTENCES[2]]
    text = f"{sources[0]}  {sources[1]}\n\n  {sources[2]}"
    status, answer = call(server.port, "POST", "/translate", {"text": text, "beam_size": 2})
    expected = translator.translate_best(sources, DecodingOptions(beam_size=2))
    assert status == 200 and answer["translation"] == f"{expected[0]}  {expected[1]}\n\n  {expected[2]}"
    assert [text[s["start"]:s["end"]] for s in answer["sentences"]] == sources
    assert [s["translation"] for s in answer["sentences"]] == expected and answer["split_for_length"] == 0
    assert call(server.port, "POST", "/translate", {"text": ["The cat sees the dog. The red house."]}) == \
        (200, {"translations": [" ".join(translator.translate_best([SENTENCES[0], SENTENCES[3]],
                                                                   DecodingOptions()))]})


def test_a_request_glossary(server: ServerProcess, translator: TorchTranslator) -> None:
    """A request's terms are in the sentences that hold their source terms; a sentence without one
    comes out as without the glossary; greedy search widens (to glossary_beam_size, at most
    serve_max_beam_size); a glossary over serve_glossary_max_terms, malformed, or with a term the
    vocabulary cannot spell gets 400 with one line. The model has no calibrator: confidence null.
    Each sentence says where its terms are in its translation."""
    text = "The cat sees the dog. The red house."
    for beam_size in (1, 3):
        status, answer = call(server.port, "POST", "/translate",
                              {"text": text, "beam_size": beam_size, "glossary": [["dog", "pesce"]]})
        assert status == 200, answer
        first, second = answer["sentences"]
        assert "pesce" in first["translation"].rstrip(".").split()
        [term] = first["terms"]  # where the page marks the glossary's word
        assert (term["source"], term["target"]) == ("dog", "pesce") and second["terms"] == []
        assert first["translation"][term["start"]:term["end"]] == "pesce"
        assert second["translation"] == translator.translate_best(["The red house."], DecodingOptions(beam_size=3))[0]
        assert first["confidence"] is None and second["confidence"] is None
    for glossary, message in [
        ([["a", "b"]] * 3, "'glossary': the glossary has 3 terms, more than the 2 allowed (serve_glossary_max_terms)"),
        ("dog=pesce", "'glossary' must be a list of [source term, target term] pairs, got a string"),
        ([["dog"]], "'glossary': glossary entry 1: expected a pair of strings [source term, target term]"),
        ([["dog", "猫"]], "'glossary': the target term '猫' cannot be spelled by the model's vocabulary: '猫' is "
                         "unknown to it"),
    ]:
        assert call(server.port, "POST", "/translate", {"text": text, "glossary": glossary}) == \
            (400, {"error": message})


def test_health_names_the_model(server: ServerProcess, checkpoint: Path) -> None:
    answer = health(server.port)
    assert answer["status"] == "ready" and answer["engine"] == "pytorch"
    assert answer["checkpoint"] == answer["model"] == answer["source"] == str(checkpoint)
    assert answer["seq_len"] == 64 and answer["beam_size"] == 5
    assert answer["warnings"] == [] and answer["no_confidence"].endswith("has no confidence calibrator; fit one with "
                                                                         "evaluate.py --fit_confidence (training fits "
                                                                         "one at its end)")
    assert answer["limits"]["serve_max_sentences"] == 4 and answer["limits"]["serve_batch_wait_ms"] == 200


def test_a_model_of_several_targets_translates_into_the_requested_one(several_targets) -> None:
    sentences = ["the cat sees the dog .", "a red house ."]
    translator = several_targets.translator()
    with ServerProcess(several_targets.args) as server:  # no --target_lang: each request says it
        assert health(server.port, None)["target_languages"] == ["fr", "it"]
        for target_lang in ("fr", "it"):
            status, answer = call(server.port, "POST", "/translate", {"text": sentences, "target_lang": target_lang})
            assert (status, answer) == (200, {"translations": translator.translate_best(
                sentences, DecodingOptions(target_lang=target_lang))})
        assert call(server.port, "POST", "/translate", {"text": sentences}) == \
            (400, {"error": "this model translates into fr, it: choose one with target_lang"})
        assert call(server.port, "POST", "/translate", {"text": sentences, "target_lang": "de"}) == \
            (400, {"error": "target_lang 'de' is not a target language of this model (fr, it)"})
        status, answer = call(server.port, "POST", "/attention", {"text": sentences[0], "target_lang": "it"})
        assert status == 200 and answer["source_tokens"][:2] == ["[SOS]", "<2it>"]
        # typed, a tag or a special token is text: the request's target_lang decides, nothing is masked
        status, typed = call(server.port, "POST", "/attention", {"text": TYPED_SPECIALS, "target_lang": "it"})
        assert status == 200 and typed["source_tokens"][:2] == ["[SOS]", "<2it>"] and typed["source_tokens"][-1] == "[EOS]"
        assert not {"[SOS]", "[EOS]", "[PAD]", "<2fr>", "<2it>"} & set(typed["source_tokens"][2:-1])
        assert all(len(row) == len(typed["source_tokens"]) for row in typed["weights"])
        assert answer["output_tokens"] == translator.cross_attention(sentences[0], "it").output_tokens
        assert no_traceback(server)


def test_attention(server: ServerProcess, translator: TorchTranslator) -> None:
    status, answer = call(server.port, "POST", "/attention", {"text": SENTENCES[0]})
    assert status == 200
    expected = translator.cross_attention(SENTENCES[0])
    assert answer["source_tokens"] == expected.source_tokens and answer["output_tokens"] == expected.output_tokens
    assert len(answer["weights"]) == len(answer["output_tokens"])
    for row in answer["weights"]:
        assert len(row) == len(answer["source_tokens"]) and sum(row) == pytest.approx(1, abs=1e-4)


BAD_REQUESTS = [
    # (path, body as JSON or raw bytes, status, what the error must say)
    ("/translate", b'{"text": ["The cat."', 400, "not valid JSON"),
    ("/translate", b'{"text": ["caf\xe9"]}', 400, "not valid JSON"),
    ("/translate", b"[" * 1500, 400, "not valid JSON"),
    ("/translate", [SENTENCES[0]], 400, "must be a JSON object with the field 'text', got a list"),
    ("/translate", {}, 400, "missing field 'text'"),
    ("/translate", {"text": 7}, 400, "'text' must be a string or a list of strings, got a number"),
    ("/translate", {"text": " \n\t "}, 400, "'text' is empty"),
    ("/translate", {"text": "a" * 81}, 400, "'text' is 81 characters long; the limit is 80 (serve_max_chars)"),
    ("/translate", {"text": "One. Two.\n\nThree. Four. Five."}, 400, "'text' has 5 sentences; the limit is 4"),
    ("/translate", {"text": ["One. Two.", "Three. Four. Five."]}, 400, "'text' has 5 sentences; the limit is 4"),
    ("/translate", {"text": []}, 400, "'text' is an empty list"),
    ("/translate", {"text": [SENTENCES[0], 7]}, 400, "sentence 2 of 'text' must be a string, got a number"),
    ("/translate", {"text": [SENTENCES[0], " \t "]}, 400, "sentence 2 of 'text' is empty"),
    ("/translate", {"text": SENTENCES[:5]}, 400, "'text' has 5 sentences; the limit is 4"),
    ("/translate", {"text": ["a" * 81]}, 400, "sentence 1 of 'text' is 81 characters long; the limit is 80"),
    ("/translate", b'{"text": ["\\ud800"]}', 400, "sentence 1 of 'text' is not valid Unicode"),
    ("/translate", {"text": [SENTENCES[0]], "beam_size": "2"}, 400, "'beam_size' must be an integer, got a string"),
    ("/translate", {"text": [SENTENCES[0]], "beam_size": 2.0}, 400, "'beam_size' must be an integer, got a number"),
    ("/translate", {"text": [SENTENCES[0]], "beam_size": True}, 400, "'beam_size' must be an integer, got a boolean"),
    ("/translate", {"text": [SENTENCES[0]], "beam_size": 0}, 400, "'beam_size' must be from 1 to 3"),
    ("/translate", {"text": [SENTENCES[0]], "beam_size": 4}, 400, "'beam_size' must be from 1 to 3"),
    ("/translate", {"text": [SENTENCES[0]], "beam": 2}, 400, "unknown field 'beam'"),
    ("/translate", {"text": ["x" * 60] * 40}, 413, "the request body is 2570 bytes; the limit is 2048"),
    ("/attention", {"text": [SENTENCES[0]]}, 400, "'text' must be a string, got a list"),
    ("/attention", {"text": ""}, 400, "'text' is empty"),
    ("/attention", {"text": SENTENCES[0], "beam_size": 2}, 400, "unknown field 'beam_size'"),
    ("/translate", {"text": [SENTENCES[0]], "target_lang": "fr"}, 400,
     "target_lang 'fr' is not a target language of this model (it)"),
    ("/translate", {"text": [SENTENCES[0]], "target_lang": 7}, 400, "'target_lang' must be a string, got a number"),
    ("/attention", {"text": SENTENCES[0], "target_lang": "fr"}, 400, "target_lang 'fr' is not a target language"),
]


@pytest.mark.parametrize("path, body, status, message", BAD_REQUESTS,
                         ids=[f"{path}-{message[:30]}" for path, _, _, message in BAD_REQUESTS])
def test_bad_request_gets_a_json_error(server: ServerProcess, path: str, body: Any, status: int,
                                       message: str) -> None:
    raw = body if isinstance(body, bytes) else None
    got, answer = call(server.port, "POST", path, None if raw else body, raw=raw)
    assert (got, list(answer)) == (status, ["error"])
    assert message in answer["error"]
    assert no_traceback(server)


def test_body_over_the_limit_without_a_length(server: ServerProcess) -> None:
    """A chunked body has no Content-Length to check first: it is cut off as it arrives."""
    status, answer = call(server.port, "POST", "/translate", {"text": ["x" * 60] * 40}, chunked=True)
    assert status == 413 and "over the limit of 2048 bytes" in answer["error"]


def test_unknown_path_and_method(server: ServerProcess) -> None:
    assert call(server.port, "GET", "/translate") == (405, {"error": "GET /translate: Method Not Allowed"})
    assert call(server.port, "GET", "/nowhere") == (404, {"error": "GET /nowhere: Not Found"})


def batching(port: int) -> dict[str, float]:
    """The batching counters of GET /metrics (a labelled counter appears with its first count: this
    test module's server may not have answered a translation yet, as under xdist)."""
    samples = metrics(port)
    return {"answered": samples.get(("serve_requests_total", (("code", "200"), ("endpoint", "translate"))), 0.0),
            "sentences": samples[("serve_sentences_total", ())],
            "decoding_calls": samples[("serve_batch_sentences_count", ())]}


def burst(port: int, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Send all `bodies` to POST /translate at once, one thread each."""
    answers: list[Any] = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def send(index: int) -> None:
        start.wait()
        answers[index] = call(port, "POST", "/translate", bodies[index])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_concurrent_requests_are_decoded_together(server: ServerProcess, translator: TorchTranslator) -> None:
    before = batching(server.port)
    requests = [[SENTENCES[i], SENTENCES[(i + 3) % 8]] for i in range(8)]
    answers = burst(server.port, [{"text": sentences} for sentences in requests])
    expected = dict(zip(SENTENCES, translator.translate_best(SENTENCES, DecodingOptions())))
    assert answers == [(200, {"translations": [expected[s] for s in sentences]}) for sentences in requests]
    after = batching(server.port)
    assert after["answered"] - before["answered"] == 8 and after["sentences"] - before["sentences"] == 16
    # One decoding call for the burst; two if the machine was too busy to deliver all within 200 ms
    # (then one of them held at least 8 sentences).
    assert after["decoding_calls"] - before["decoding_calls"] <= 2


def test_beam_sizes_decode_apart(server: ServerProcess, translator: TorchTranslator) -> None:
    before = batching(server.port)
    bodies = [{"text": [SENTENCES[i]], "beam_size": 1 + i % 2} for i in range(6)]
    answers = burst(server.port, bodies)
    for body, answer in zip(bodies, answers):
        options = DecodingOptions(beam_size=body["beam_size"])
        assert answer == (200, {"translations": translator.translate_best(body["text"], options)})
    calls = batching(server.port)["decoding_calls"] - before["decoding_calls"]
    assert 2 <= calls <= 3


def test_a_failing_decode_does_not_stop_the_worker() -> None:
    """The decode call raises once (as a model error would): that batch's requests get a 500 JSON
    error and the next request is translated."""
    calls = []

    def decode(sentences: list[str], options: DecodingOptions) -> list[str]:
        calls.append(sentences)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return [s.upper() for s in sentences]

    async def scenario() -> None:
        with ThreadPoolExecutor(1) as executor:
            batcher = Batcher(decode, executor, max_sentences=8, wait_s=0.0, max_work=8, registry=CollectorRegistry())
            deadline = asyncio.get_running_loop().time() + 60
            with pytest.raises(ApiError) as failed:  # and not a request that waits for ever
                await asyncio.wait_for(batcher.submit(["one"], DecodingOptions(), deadline).future, 10)
            assert failed.value.status == 500
            assert failed.value.message == "translation failed: RuntimeError: out of memory"
            translated = await asyncio.wait_for(batcher.submit(["two", "three"], DecodingOptions(), deadline).future,
                                                10)
            assert translated == ["TWO", "THREE"]
            assert not batcher.worker.done()
            batcher.worker.cancel()

    asyncio.run(scenario())
    assert calls == [["one"], ["two", "three"]]


def test_api_key(server: ServerProcess) -> None:
    for headers in (None, {"Authorization": "Bearer environment-key"}, {"Authorization": KEY},
                    {"Authorization": f"Bearer {KEY}x"}):
        for method, path, body in (("POST", "/translate", {"text": [SENTENCES[0]]}),
                                   ("POST", "/attention", {"text": SENTENCES[0]}), ("GET", "/health", None)):
            status, answer = call(server.port, method, path, body, headers=headers)
            assert status == 401 and "missing or wrong API key" in answer["error"], (headers, path)


def stops_cleanly(server: ServerProcess, sig: int) -> None:
    start = time.monotonic()
    assert server.stop(sig) == 0
    assert time.monotonic() - start < 5
    assert server.log[-1] == "serve.py: stopped" and no_traceback(server)


def test_key_from_the_environment_on_loopback_and_sigint(checkpoint: Path) -> None:
    """A key that is set is asked for on loopback too; Ctrl-C stops the server promptly, with exit
    code 0 and no traceback."""
    server = ServerProcess(["--checkpoint", str(checkpoint)], env=dict(os.environ, TRANSLATE_API_KEY=KEY))
    try:
        assert call(server.port, "GET", "/health", headers=None)[0] == 401
        assert health(server.port)["checkpoint"] == str(checkpoint)
        assert call(server.port, "POST", "/translate", {"text": [SENTENCES[0]]})[0] == 200
        stops_cleanly(server, signal.SIGINT)
    finally:
        server.stop()


def test_ctranslate2_engine_and_sigterm(checkpoint: Path, translator: TorchTranslator, tmp_path: Path) -> None:
    """A float32 export served with --engine ctranslate2 translates greedily as the PyTorch engine
    does; SIGTERM stops it promptly, with exit code 0 and no traceback. (Beam search is not
    compared: CTranslate2 stops a sentence once beam_size hypotheses have ended, decoding.py only
    when no open one can beat them, so the two may pick different translations; the request asks for
    beam 1, as the model's default is 5.)"""
    model_dir = tmp_path / "ct2"
    assert export.main(["--checkpoint", str(checkpoint), "--quantization", "float32", "--output", str(model_dir)]) == 0
    server = ServerProcess(["--engine", "ctranslate2", "--model_dir", str(model_dir)],
                           env={name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"})
    try:
        answer = health(server.port)
        assert (answer["engine"], answer["model"], answer["checkpoint"]) == ("ctranslate2", str(model_dir),
                                                                             str(checkpoint))
        status, answer = call(server.port, "POST", "/translate", {"text": SENTENCES, "beam_size": 1})
        assert (status, answer) == (200, {"translations": translator.translate_best(SENTENCES,
                                                                                    DecodingOptions(beam_size=1))})
        assert call(server.port, "POST", "/translate", {"text": SENTENCES[:1], "glossary": [["dog", "pesce"]]}) == \
            (400, {"error": "'glossary': the ctranslate2 engine has no constrained search, and this model was not "
                            "trained with --term_annotation, so it cannot use a glossary: translate with the "
                            "checkpoint (--engine pytorch)"})
        status, answer = call(server.port, "POST", "/attention", {"text": SENTENCES[0]})
        assert status == 200 and len(answer["weights"]) == len(answer["output_tokens"]) > 0
        assert all(len(row) == len(answer["source_tokens"]) for row in answer["weights"])
        stops_cleanly(server, signal.SIGTERM)
    finally:
        server.stop()


def test_a_server_that_cannot_start_says_why_in_one_line(checkpoint: Path, tmp_path: Path) -> None:
    """Off loopback with no key; a damaged checkpoint; a model directory that export.py did not
    write. The last two are found once the socket listens (the line that says so comes first). The
    three start at once."""
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(checkpoint.read_bytes()[:5000])
    env = {name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"}
    cases = [(["--checkpoint", str(checkpoint), "--host", "0.0.0.0"], 2,
              "--host 0.0.0.0 is not a loopback address: it needs an API key (TRANSLATE_API_KEY"),
             (["--checkpoint", str(damaged), "--port", "0"], 1, f"serve.py: error: checkpoint {damaged}"),
             (["--engine", "ctranslate2", "--model_dir", str(tmp_path), "--port", "0"], 1,
              f"serve.py: error: {tmp_path} is not a model directory written by export.py")]
    processes = [subprocess.Popen([sys.executable, "serve.py", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for args, _, _ in cases]
    try:
        for process, (args, code, message) in zip(processes, cases):
            out, err = process.communicate(timeout=60)
            assert process.returncode == code and out == "", args
            *listening, line = err.splitlines()
            assert message in line
            assert all(earlier.startswith("serve.py: listening on http://127.0.0.1:") for earlier in listening)
            assert len(listening) == (code == 1)
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_a_key_off_loopback_needs_tls_or_a_trusted_network(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Refused in one line before the model is loaded (in-process: the same main() as the command;
    with the guard gone, the missing checkpoint ends the server instead)."""
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    missing = tmp_path / "none.pem"
    cases = [(["--host", "0.0.0.0", "--api_key_file", str(key_file)],
              "--host 0.0.0.0 is not a loopback address: the API key would cross the network in clear text; give "
              "--ssl_certfile and --ssl_keyfile, or --trusted_network if the network is private"),
             (["--ssl_certfile", str(missing), "--ssl_keyfile", str(key_file)],
              f"--ssl_certfile {missing} and --ssl_keyfile {key_file}: cannot use them: "),
             (["--ssl_certfile", str(missing)], "--ssl_certfile and --ssl_keyfile go together")]
    for args, message in cases:
        with pytest.raises(SystemExit) as stopped:
            serve.main(["--checkpoint", str(tmp_path / "missing.pt"), "--port", "0", *args])
        [line] = capsys.readouterr().err.splitlines()
        assert stopped.value.code == 2 and message in line, args


def test_a_key_that_is_not_visible_ascii_is_refused_at_start(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A client sends a header's key as UTF-8 or latin-1 bytes: a key like 'clé-secrète' could never
    match one of them, nor a key with a space or a control character pass every proxy; such a key
    ends the start in one line (from a file or from the environment)."""
    key_file = tmp_path / "key"
    for key, shown in (("clé-secrète", "'é' (U+00E9)"), ("two words", "' ' (U+0020)"), ("tab\there", "'\\t' (U+0009)")):
        key_file.write_text(key + "\n", encoding="utf-8")
        monkeypatch.setenv("TRANSLATE_API_KEY", key)
        for args, origin in ((["--api_key_file", str(key_file)], f"--api_key_file {key_file}"),
                             ([], "the TRANSLATE_API_KEY environment variable")):
            with pytest.raises(SystemExit) as stopped:
                serve.main(["--checkpoint", str(tmp_path / "missing.pt"), "--port", "0", *args])
            [line] = capsys.readouterr().err.splitlines()
            assert stopped.value.code == 2 and f"{origin}: the API key holds {shown}; a key must be visible ASCII" in line


def test_a_key_file_saved_with_a_bom_gives_the_key_and_one_not_utf8_is_one_line(tmp_path: Path) -> None:
    """Notepad writes a byte-order mark first: the key is what follows it. A file that is not UTF-8
    is refused naming the file (ConfigError: serve.py's one line, exit 2)."""
    key_file = tmp_path / "key"
    key_file.write_bytes("\ufeffs3cret-key\r\n".encode("utf-8"))
    assert serve.read_api_key(key_file) == "s3cret-key"
    key_file.write_bytes(b"\xffkey\n")
    with pytest.raises(ConfigError, match=rf"^--api_key_file {re.escape(str(key_file))} is not UTF-8 text \(byte 0\)$"):
        serve.read_api_key(key_file)


def test_serving_keys_are_validated() -> None:
    from config import ConfigError, validate_config
    for key, value in (("serve_max_sentences", 0), ("serve_max_body_bytes", -1), ("serve_batch_wait_ms", -5),
                       ("serve_max_queued_work", 0), ("serve_request_timeout_s", 0.0),
                       ("serve_body_timeout_s", float("inf")), ("serve_drain_grace_s", float("nan"))):
        with pytest.raises(ConfigError, match=f"--{key}"):
            validate_config(dict(get_config(), **{key: value}))


def test_a_calibrator_that_cannot_be_used_is_served_without_confidence(bad_calibrator_run: tuple[Path, str],
                                                                      translator: TorchTranslator) -> None:
    """A truncated or hand-edited confidence.json: the server starts and translates, one warning on
    stderr; /health's "warnings" and "no_confidence", and each answer's "no_confidence", say why
    confidence is null."""
    folder, problem = bad_calibrator_run
    with ServerProcess(["--model_folder", str(folder.parent)], env=without_key()) as server:
        answer = health(server.port, headers=None)
        status, translated = call(server.port, "POST", "/translate", {"text": SENTENCES[0]}, headers=None)
        log = list(server.log)
    assert answer["confidence"] is False and len(answer["warnings"]) == 1 and answer["warnings"][0].startswith(problem)
    assert answer["no_confidence"].startswith(problem)
    assert status == 200 and translated["translation"] == translator.translate_best(SENTENCES[:1], DecodingOptions())[0]
    assert translated["sentences"][0]["confidence"] is None and translated["no_confidence"] == answer["no_confidence"]
    assert [line for line in log if "confidence" in line] == [f"warning: {answer['warnings'][0]}"]


def without_key() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != "TRANSLATE_API_KEY"}
