"""Serve translations over HTTP: `python serve.py --datasource FOLDER_OR_HUB_ID --port 8000`.

The model is found as translate.py finds it (the run's checkpoint by --checkpoint_choice, default
best, or --checkpoint PATH, or --engine ctranslate2 --model_dir DIR) and loaded once, after the socket
opens: the server is live at once, and ready when the model has loaded and translated a warm-up
sentence. Endpoints:
- POST /translate {"text": "one string, with paragraphs", "beam_size": K, "target_lang": "fr"} ->
  {"translation": "...", "sentences": [{"start": S, "end": E, "translation": "..."}, ...],
  "split_for_length": N}: the text translated in its shape (lines, blank lines, indentation and
  the spacing between sentences kept), and per sentence its span in the request's text (offsets
  in Unicode code points, end exclusive) and its translation; N sentences were over the model's
  limit and translated in pieces. The list form {"text": ["...", ...]} answers {"translations":
  ["...", ...]}, one per item. Both are segmented into sentences unless --split_sentences false
  (translator.py decides how, for every program). beam_size is optional (default: the config's),
  and so is target_lang (default: --target_lang), which a model of several target languages needs
  from one or the other.
  `"glossary": [["source term", "target term"], ...]` (optional, at most serve_glossary_max_terms
  pairs, checked as glossary.py checks a file): where a sentence holds a source term, its
  translation holds the target term (constrained beam search; such a sentence's beam is at least
  glossary_beam_size, at most serve_max_beam_size), in the place of what it replaces (docs/glossary.md);
  each sentence of the string form then carries "terms": [{"source", "target", "start", "end"}], the
  offsets of each target term in that sentence's translation (null where it is not there: CTranslate2
  does not guarantee it). A malformed glossary, one over the bound, a target term the model's
  vocabulary cannot spell, or a glossary with the ctranslate2 engine for a model trained without
  term_annotation gets 400 with one line.
  Each sentence of the string form also carries "confidence": the calibrated probability that its
  translation is good (confidence.py), null when the model has no calibrator (GET /health says
  whether it has, "confidence": true/false) or the sentence had nothing to translate; the answer's
  "no_confidence" says in one line why the model gives none (null when it does).
- POST /attention {"text": "...", "target_lang": "fr"} -> {"source_tokens", "output_tokens",
  "weights"}: the cross-attention of the sentence's greedy translation, weights[i][j] from output
  token i to source token j.
- GET /health: the state, the engine, the model and its checkpoint, its target languages and the
  default one, "no_confidence", "warnings" (a side file beside the model that could not be used,
  such as an unreadable confidence.json: served without it), the limits and the queue.
- GET /metrics: counters, gauges and histograms in the Prometheus text format.
- GET /health/live and GET /health/ready, for orchestrators: 200 while the process serves, and 200
  only while it is ready (503 while the model loads, while the server drains, and while a decoding
  call has run longer than serve_request_timeout_s). They need no key and name no model.
- GET /: a web page (static/) to translate a sentence and see its attention heatmap; it marks each
  sentence whose confidence is below confidence_mark_below, the value in its tooltip.
- LibreTranslate's API, for the clients that speak it (nmt/serving/libretranslate.py says what they
  send and get): POST /translate with `q` (a form, or a JSON object with q; the project's own
  request has `text`), POST /detect and GET /languages. `format: html` is read by documents.py (the
  markup kept, inline tags placed by the model's attention: place_inline). Its requests share the
  limits, the queue and the metrics.

Requests that arrive together are translated together (serve_batch_sentences, serve_batch_wait_ms);
each request is limited by serve_max_sentences (sentences after segmentation), serve_max_chars (of
the whole text in the string form, of each item in the list form), serve_max_body_bytes and
serve_max_beam_size. A refused request gets a 4xx status and {"error": "what is wrong"}.

Under overload it sheds load instead of stalling: requests wait in a queue bounded in work
(the pieces the model translates x beam size, serve_max_queued_work), and one that does not fit gets 503 with
Retry-After at once; one not answered within serve_request_timeout_s of its arrival gets 503 with
Retry-After, and its sentences are dropped if they have not reached the model; a body that takes
longer than serve_body_timeout_s gets 408; a client that disconnects has its request dropped.
Idle connections cannot starve it (connection_guard.py): one that sends no whole request head within
serve_header_timeout_s is closed, and at serve_max_connections a new one closes the longest-idle.
Once the model has been idle IDLE_TRIM_S after some calls, the heap's free pages go back to the system.

It listens on 127.0.0.1 unless --host says otherwise (--port 0: any free port; the lines on stderr
say which). On any other address it needs an API key, from the TRANSLATE_API_KEY environment
variable or the first line of --api_key_file FILE, and then every request but the two probes and
GET /languages must send `Authorization: Bearer KEY` (401 without; LibreTranslate's may send the
field api_key instead, 403 without); a key that is set is required on loopback too. Off loopback the
key must travel over TLS (--ssl_certfile, --ssl_keyfile) unless --trusted_network says the network
is private. SIGTERM or Ctrl-C drains the server: it stops being ready, refuses new requests with 503,
answers those it holds within serve_drain_grace_s (503 for what is left then, or at a second
signal), and exits 0.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import math
import os
import queue
import signal
import socket
import sys
import threading
from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nmt.training.checkpoint import CheckpointError
from config import SERVE, ConfigError, OneLineParser, build_parser, choose_run, parse_args
from nmt.serving.connection_guard import ConnectionGuard, connection_limit, raise_file_limit, tls_context
from nmt.serving import libretranslate
from nmt.serving.libretranslate import LanguageDetector, form_fields, is_form, is_libretranslate
from nmt.serving.request_checks import ApiError, check_sentence, check_text, json_type
from nmt.cpu_kernels import release_freed_memory
from nmt.text_files import TextFileError, read_text
from nmt.inference.documents import FORMATS, DocumentError, DocumentPlan
from nmt.inference.glossary import GlossaryError, check_pairs
from nmt.inference.sentences import TextPlan
from nmt.inference.translator import (DecodingOptions, Hypothesis, Translator, TranslatorError, add_translator_arguments,
                        load_translator, split_sentences_on)

STATIC = Path(__file__).resolve().parent / "static"
API_KEY_VARIABLE = "TRANSLATE_API_KEY"
WARM_UP = "Hello."  # translated once after loading: the first call pays for lazy set-up, not a client
API_ENDPOINTS = {"/translate": "translate", "/attention": "attention", "/detect": "detect",
                 "/languages": "languages"}  # path -> the metrics' label
IDLE_TRIM_S = 2.0  # the model idle this long after some calls: its freed memory goes back to the system
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
T = TypeVar("T")


def unavailable(message: str, retry_after: float) -> ApiError:
    """A 503 that tells the client to send the request again after `retry_after` seconds, rounded up
    to whole seconds (the header's form), at least 1."""
    return ApiError(503, message, {"Retry-After": str(max(1, math.ceil(retry_after)))})


class ClientGone(Exception):
    """The client disconnected before its answer. Answered with 499 (nginx's code for it), which
    nobody reads but the metrics count."""


def now() -> float:
    """The event loop's clock, which deadlines and asyncio's timeouts share."""
    return asyncio.get_running_loop().time()


class ModelThread(Executor):
    """One daemon thread that makes every model call in turn (loading, warm-up, decoding, attention),
    so that two calls never use the model at once. ThreadPoolExecutor's threads are joined at exit; a
    daemon is not, so a decode still running when the drain ends cannot keep the process alive
    (a call inside PyTorch or CTranslate2 cannot be interrupted)."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self.work, name="model", daemon=True).start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self.calls.put((future, fn, args, kwargs))
        return future

    def work(self) -> None:
        while True:
            future, fn, args, kwargs = self.calls.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as error:  # handed to the caller, who decides
                    future.set_exception(error)


@dataclass(eq=False)
class Job:
    """One request waiting for the model: its sentences to translate with `options`, or (`call` set)
    another model call on its one sentence, made alone (`what` names it in errors)."""

    sentences: list[str]
    options: DecodingOptions
    deadline: float  # event-loop time after which nobody waits for the answer
    future: asyncio.Future
    call: Callable[[str], Any] | None = None
    what: str = "translation"

    @property
    def work(self) -> int:
        """What the job costs the model: a beam search carries beam_size hypotheses per sentence (with
        a glossary, counted at the wider beam of the sentences holding a term), sampling n_best samples."""
        options = self.options
        return len(self.sentences) * max(options.beam_size, options.n_best, options.constrained_beam_size)


class Batcher:
    """Gathers the sentences of concurrent requests into one decoding call, from a bounded queue.

    One worker task takes the oldest waiting job, then the jobs that wait or arrive within `wait_s`
    and decode with the same options, up to `max_sentences` sentences, and runs `decode` on all of
    them in the model's thread (`executor`). The event loop goes on accepting and refusing requests
    meanwhile: those that arrive during one decode make up the next batch. A job with other options
    (another beam size) waits for a later batch; one with a `call` is made alone. A failing decode
    fails its batch's requests, not the worker.

    The waiting jobs may hold at most `max_work` work (Job.work) between them; a job that would pass
    it is refused with a 503 (an empty queue takes any job, so that no valid request is refused for
    ever). A job that was withdrawn (its client left) or whose deadline has passed is dropped before
    it reaches the model."""

    def __init__(self, decode: Callable[[list[str], DecodingOptions], list[list[Hypothesis]]], executor: Executor,
                 max_sentences: int, wait_s: float, max_work: int, registry: CollectorRegistry) -> None:
        self.decode, self.executor = decode, executor
        self.max_sentences, self.wait_s, self.max_work = max_sentences, wait_s, max_work
        self.waiting: deque[Job] = deque()  # admitted, not yet taken into a batch
        self.queued_work = 0  # the work of `waiting`
        self.arrived = asyncio.Event()
        self.batch: list[Job] = []  # taken off the queue: being gathered, or in the model
        self.started: float | None = None  # when the batch went into the model
        self.calls = 0  # model calls made
        self.rate = 0.0  # work per second of recent decoding calls; 0 until one is measured
        self.worker: asyncio.Task | None = None
        self.sentences = Counter("serve_sentences", "Sentences translated", registry=registry)
        self.batch_sizes = Histogram("serve_batch_sentences", "Sentences per decoding call", buckets=BATCH_BUCKETS,
                                     registry=registry)
        Gauge("serve_queue_work", "Work waiting for the model (sentences x beam size)",
              registry=registry).set_function(lambda: self.queued_work)
        Gauge("serve_queue_requests", "Requests waiting for the model", registry=registry) \
            .set_function(lambda: len(self.waiting))

    def submit(self, sentences: list[str], options: DecodingOptions, deadline: float,
               call: Callable[[str], Any] | None = None, what: str = "translation") -> Job:
        """Queue a job, or raise a 503 with Retry-After if the queue has no room for its work."""
        job = Job(sentences, options, deadline, asyncio.get_running_loop().create_future(), call, what)
        if self.waiting and self.queued_work + job.work > self.max_work:
            raise unavailable(f"the server is busy: {self.queued_work} work queued, {job.work} more would pass "
                              f"the limit of {self.max_work} (serve_max_queued_work; work is sentences x beam size)",
                              self.retry_after())
        # Started by the first job rather than by a lifespan handler: at exit, asyncio cancels a
        # plain task quietly, even when a second Ctrl-C skips the application's shutdown.
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self.run())
        self.waiting.append(job)
        self.queued_work += job.work
        self.arrived.set()
        return job

    def take(self, job: Job) -> None:
        self.waiting.remove(job)
        self.queued_work -= job.work

    def withdraw(self, job: Job) -> None:
        """Nobody waits for `job` any more: off the queue, and skipped by a batch it is already in."""
        if job in self.waiting:
            self.take(job)
        job.future.cancel()

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.batch)

    def running_for(self) -> float:
        """How long the batch in the model has been there; 0 when none is."""
        return 0.0 if self.started is None else now() - self.started

    def retry_after(self) -> float:
        """Seconds until the work held now should have been decoded, at the recent rate (1 until a
        batch has been measured)."""
        work = self.queued_work + sum(job.work for job in self.batch)
        return work / self.rate if self.rate else 1.0

    async def run(self) -> None:
        while True:
            await self.gather()
            await self.decode_batch()

    async def gather(self) -> None:
        while not self.waiting:
            self.arrived.clear()
            await self.arrived.wait()
        first = self.waiting[0]
        self.take(first)
        self.batch = [first]
        if first.call is not None:
            return
        size, closes = len(first.sentences), now() + self.wait_s
        while size < self.max_sentences:
            for job in list(self.waiting):
                if job.call is None and job.options == first.options:
                    if size + len(job.sentences) > self.max_sentences:
                        return  # as full as it gets: that job leads the next batch
                    self.take(job)
                    self.batch.append(job)
                    size += len(job.sentences)
            self.arrived.clear()
            try:
                async with asyncio.timeout_at(closes):
                    await self.arrived.wait()
            except TimeoutError:
                return

    async def decode_batch(self) -> None:
        # A withdrawn job needs no answer, and one past its deadline has had its 503.
        batch = self.batch = [job for job in self.batch if not job.future.done() and job.deadline > now()]
        if not batch:
            return
        sentences = [sentence for job in batch for sentence in job.sentences]
        first, loop = batch[0], asyncio.get_running_loop()
        self.started = now()
        try:
            if first.call is not None:
                results = [await loop.run_in_executor(self.executor, first.call, sentences[0])]
            else:
                results = await loop.run_in_executor(self.executor, self.decode, sentences, first.options)
        except Exception as error:  # whatever it was, the worker must go on
            message = failure(first.what, error)
            print(f"serve.py: error: {message}", file=sys.stderr, flush=True)
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(ApiError(500, message))
            return
        finally:
            seconds, self.batch, self.started = now() - self.started, [], None
            self.calls += 1
        measured = sum(job.work for job in batch) / max(seconds, 1e-3)
        self.rate = measured if not self.rate else 0.7 * self.rate + 0.3 * measured
        if first.call is None:
            self.sentences.inc(len(sentences))
            self.batch_sizes.observe(len(sentences))
        start = 0
        for job in batch:
            if not job.future.done():
                job.future.set_result(results[start:start + len(job.sentences)] if first.call is None else results[0])
            start += len(job.sentences)


def failure(what: str, error: Exception) -> str:
    """One line about an error raised by the model."""
    first_line = next(iter(str(error).splitlines()), "")
    return f"{what} failed: {type(error).__name__}" + (f": {first_line}" if first_line else "")


def check_fields(payload: Any, required: str, optional: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise ApiError(400, f"the request body must be a JSON object with the field {required!r}, "
                            f"got {json_type(payload)}")
    unknown = sorted(set(payload) - {required, *optional})
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r} (fields: {', '.join([required, *optional])})")
    if required not in payload:
        raise ApiError(400, f"missing field {required!r}")
    return payload


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; 413 past `limit` bytes, whether or not Content-Length says so."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {int(length)} bytes; the limit is {limit} (serve_max_body_bytes)")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes (serve_max_body_bytes)")
    except ClientDisconnect:
        raise ClientGone() from None
    return bytes(body)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {str(error).splitlines()[0]}") from None


async def disconnected(request: Request) -> None:
    """Returns when the client of `request` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Service:
    """Everything that outlives one request: the model (loaded and warmed up in the model's thread
    while the server already answers), the batcher, the state that readiness reports, the metrics
    and the drain."""

    def __init__(self, config: dict[str, Any], load: Callable[[], Translator], url: str) -> None:
        self.config, self.load, self.url = config, load, url
        self.timeout = config["serve_request_timeout_s"]
        self.translator: Translator | None = None  # set once loaded and warmed up
        self.detector: asyncio.Future[LanguageDetector] | None = None  # LibreTranslate's detection, once asked for
        self.defaults = DecodingOptions.from_config(config, batch_size=config["serve_batch_sentences"])
        self.registry = CollectorRegistry()  # this app's own: tests run several apps in one process
        self.model_thread = ModelThread()
        self.batcher = Batcher(lambda sentences, options: self.translator.translate(sentences, options),
                               self.model_thread, config["serve_batch_sentences"], config["serve_batch_wait_ms"] / 1000,
                               config["serve_max_queued_work"], self.registry)
        self.requests = Counter("serve_requests", "API requests answered, by endpoint and status code (499: the "
                                "client disconnected first)", ["endpoint", "code"], registry=self.registry)
        self.latency = Histogram("serve_request_duration_seconds", "Time from a request's arrival to its answer",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=self.registry)
        Gauge("serve_ready", "1 while GET /health/ready answers 200", registry=self.registry) \
            .set_function(lambda: self.state() == "ready")
        ProcessCollector(registry=self.registry)  # resident memory, CPU time, open files
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()  # loading and draining: held so that they are not collected
        self.drain_ends: float | None = None  # event-loop time; set by the first stop signal
        self.grace_over = asyncio.Event()  # from then on, whatever still waits is answered 503
        self.stop_server: Callable[[], None] = lambda: None  # set by the server that runs the app
        self.exit_code = 0

    def state(self) -> str:
        """loading, ready, draining, or stuck: the batch in the model has run longer than a request
        may wait, so that every request in it and behind it has had or will have a 503."""
        if self.drain_ends is not None:
            return "draining"
        if self.translator is None:
            return "loading"
        return "stuck" if self.batcher.running_for() > self.timeout else "ready"

    def start(self) -> None:
        """When the event loop runs: load the model in its thread."""
        self.loop = asyncio.get_running_loop()
        print(f"serve.py: listening on {self.url} (loading the model)", file=sys.stderr, flush=True)
        self.background(self.load_model())
        self.background(self.trim_when_idle())

    def background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def load_model(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            translator = await loop.run_in_executor(self.model_thread, self.load)
        except (CheckpointError, TranslatorError, ConfigError) as error:
            self.fail(str(error))
            return
        except Exception as error:  # a model that cannot load ends the server with one line, whatever the cause
            self.fail(failure("loading the model", error))
            return
        # Not timed for Retry-After: a first call pays for lazy set-up, and one sentence is no batch.
        warm_up = self.defaults.replace(target_lang=self.defaults.target_lang or translator.target_languages[0])
        try:
            await loop.run_in_executor(self.model_thread, translator.translate_best, [WARM_UP], warm_up)
        except Exception as error:
            self.fail(failure("the warm-up translation", error))
            return
        self.translator = translator
        if self.drain_ends is None:
            print(f"serve.py: serving {translator.source} ({translator.engine}) on {self.url}", file=sys.stderr,
                  flush=True)

    async def trim_when_idle(self) -> None:
        """Once the model has been idle IDLE_TRIM_S after some calls, hand the heap's free pages back
        to the system (in the model's thread, so never during a call): a burst of large batches
        leaves its high-water mark in the heap, which would stay resident through the quiet hours."""
        trimmed_at = 0
        while True:
            await asyncio.sleep(IDLE_TRIM_S)
            idle_since = self.batcher.calls
            if idle_since == trimmed_at or self.batcher.busy:
                continue
            await asyncio.sleep(IDLE_TRIM_S)
            if self.batcher.calls == idle_since and not self.batcher.busy:
                await asyncio.get_running_loop().run_in_executor(self.model_thread, release_freed_memory)
                trimmed_at = idle_since

    def fail(self, message: str) -> None:
        print(f"serve.py: error: {message}", file=sys.stderr, flush=True)
        self.exit_code = 1
        self.stop_server()

    def check_open(self) -> None:
        """Refuse at once a request that the server cannot take now."""
        state = self.state()
        if state == "loading":
            raise unavailable("the model is still loading", 1)
        if state == "draining":
            raise unavailable("the server is shutting down", self.drain_ends - now())
        if state == "stuck":
            raise unavailable(f"the model has been decoding one batch for {self.batcher.running_for():.0f} s, longer "
                              f"than a request may wait (serve_request_timeout_s {self.timeout:g})", self.timeout)

    async def outcome(self, work: Awaitable[T], timeout: float, request: Request | None = None) -> T:
        """`work`'s result. TimeoutError after `timeout` seconds, ClientGone if the client of `request`
        disconnects first, a 503 if the drain's grace period ends first; `work` is cancelled then."""
        task = asyncio.ensure_future(work)
        watchers = [asyncio.ensure_future(self.grace_over.wait())]
        if request is not None:
            watchers.append(asyncio.ensure_future(disconnected(request)))
        try:
            await asyncio.wait([task, *watchers], timeout=max(timeout, 0), return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()
            if watchers[0].done():
                raise unavailable("the server is shutting down", 1)
            if watchers[-1].done():
                raise ClientGone()
            raise TimeoutError()
        finally:
            for waiting in (task, *watchers):
                waiting.cancel()

    async def read_request_body(self, request: Request) -> bytes:
        """The request body: 408 if it takes longer than serve_body_timeout_s to arrive."""
        limit, timeout = self.config["serve_max_body_bytes"], self.config["serve_body_timeout_s"]
        try:
            return await self.outcome(read_body(request, limit), timeout)
        except TimeoutError:
            # The rest of the body may still come: the connection cannot carry another request.
            raise ApiError(408, f"the request body did not arrive within {timeout:g} s (serve_body_timeout_s)",
                           {"Connection": "close"}) from None

    async def read_json(self, request: Request) -> Any:
        """The request body as JSON."""
        return parse_json(await self.read_request_body(request))

    async def read_payload(self, request: Request) -> tuple[Any, bool]:
        """The request body, and whether it is LibreTranslate's: a form's fields (it is), or JSON (it
        is when an object with 'q', libretranslate.is_libretranslate)."""
        body = await self.read_request_body(request)
        if is_form(request):
            return await form_fields(request, body), True
        payload = parse_json(body)
        return payload, is_libretranslate(payload)

    async def run(self, request: Request, arrived: float, sentences: list[str], options: DecodingOptions,
                  call: Callable[[str], Any] | None = None, what: str = "translation") -> Any:
        """Queue a job and wait for its answer until the deadline, the client's departure or the end of
        the drain; the job is withdrawn in the last three cases."""
        self.check_open()
        job = self.batcher.submit(sentences, options, arrived + self.timeout, call, what)
        try:
            return await self.outcome(job.future, job.deadline - now(), request)
        except TimeoutError:
            raise unavailable(f"not answered within {self.timeout:g} s (serve_request_timeout_s)",
                              self.batcher.retry_after()) from None
        finally:
            self.batcher.withdraw(job)

    async def hypotheses(self, request: Request, arrived: float, sentences: list[str],
                         options: DecodingOptions) -> list[list[Hypothesis]]:
        """The hypotheses of each of `sentences`, best first (options.n_best of them); none to make (a
        text without a letter), no model call."""
        return await self.run(request, arrived, sentences, options) if sentences else []

    async def translate(self, request: Request, arrived: float, sentences: list[str],
                        options: DecodingOptions) -> list[Hypothesis]:
        """The best translation of each of `sentences`."""
        return [found[0] for found in await self.hypotheses(request, arrived, sentences, options)]

    async def language_detector(self) -> LanguageDetector:
        """The detector of the model's languages, loaded in a thread by the first request that needs
        it (most servers never detect, and its model takes about a second to load)."""
        if self.detector is None:
            source, targets = self.translator.model_config["lang_src"], self.translator.target_languages
            self.detector = asyncio.ensure_future(asyncio.to_thread(LanguageDetector, source, targets))
        return await asyncio.shield(self.detector)

    async def attention(self, request: Request, arrived: float, sentence: str, target_lang: str) -> Any:
        translator = self.translator
        return await self.run(request, arrived, [sentence], DecodingOptions(beam_size=1),
                              lambda text: translator.cross_attention(text, target_lang), "attention")

    def target_lang(self, payload: dict[str, Any]) -> str:
        """The language to translate into: the request's target_lang, else the server's --target_lang,
        else a one-target model's only language (so that requests which differ only in saying it
        are batched together). 400 when it is not a string, not one of the model's target
        languages, or missing for a model of several."""
        self.check_open()  # before the translator is read: there is none while the model loads
        target_lang = payload.get("target_lang", self.defaults.target_lang)
        if not isinstance(target_lang, str):
            raise ApiError(400, f"'target_lang' must be a string, got {json_type(target_lang)}")
        try:
            return self.translator.target_language(target_lang)
        except TranslatorError as error:
            raise ApiError(400, str(error)) from None

    def drain(self) -> None:
        """A stop signal, on the event loop. The first starts the drain; another ends its grace period."""
        if self.drain_ends is not None:
            self.grace_over.set()
            return
        grace = self.config["serve_drain_grace_s"]
        self.drain_ends = now() + grace
        print(f"serve.py: stopping: answering the requests it holds within {grace:g} s (serve_drain_grace_s; "
              f"a second signal ends it now)", file=sys.stderr, flush=True)
        self.background(self.finish_drain())

    async def finish_drain(self) -> None:
        while self.batcher.busy and not self.grace_over.is_set() and now() < self.drain_ends:
            await asyncio.sleep(0.05)
        self.grace_over.set()  # whatever still waits (a batch in the model, a slow body) is answered 503
        self.stop_server()

    def describe(self) -> dict[str, Any]:
        """GET /health: the state, the model, the limits and the queue."""
        translator = self.translator
        return {"status": self.state(), "checkpoint": str(translator.path), **translator.describe(),
                "source": translator.source, "beam_size": self.defaults.beam_size,
                "confidence_mark_below": self.config["confidence_mark_below"],
                "target_lang": self.defaults.target_lang,
                "limits": {key: value for key, value in self.config.items() if key.startswith("serve_")},
                "queue": {"work": self.batcher.queued_work, "requests": len(self.batcher.waiting)}}


class Recorder:
    """ASGI middleware: counts the API requests by endpoint and status code, and times them."""

    def __init__(self, app: ASGIApp, service: Service) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = API_ENDPOINTS.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        arrived, status = now(), 500  # what the client sees if no answer is sent

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.service.requests.labels(endpoint, str(status)).inc()
            self.service.latency.labels(endpoint).observe(now() - arrived)


def build_app(service: Service, api_key: str | None) -> FastAPI:
    """The application around the service: the metrics middleware, errors as JSON, the API routes
    (behind the key, when there is one) and the status routes."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield

    app = FastAPI(title="translation server", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(Recorder, service=service)
    add_error_handlers(app)
    key = ApiKey(api_key)
    keyed = [Depends(key.require)]
    add_api_routes(app, service, key, keyed)
    add_libretranslate_routes(app, service, key)
    add_status_routes(app, service, keyed)
    return app


class ApiKey:
    """The server's API key (None: none, and every request passes) and the checks of a request's:
    this project's API sends `Authorization: Bearer KEY` (401 without), LibreTranslate's sends the
    field `api_key` or that header (403 without, as LibreTranslate refuses a key)."""

    def __init__(self, key: str | None) -> None:
        self.key = key

    def matches(self, given: Any) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given.strip().encode(), self.key.encode())

    def bearer(self, request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return self.key is None or (scheme.lower() == "bearer" and self.matches(given))

    async def require(self, request: Request) -> None:
        """The dependency of the routes behind the key."""
        if not self.bearer(request):
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           {"WWW-Authenticate": "Bearer"})

    def require_libretranslate(self, request: Request, fields: dict[str, Any]) -> None:
        if not (self.bearer(request) or self.matches(fields.get("api_key"))):
            raise ApiError(403, "Invalid API key" if "api_key" in fields else
                           "Invalid API key: this server needs one (the field api_key)")


def add_error_handlers(app: FastAPI) -> None:
    """Every refusal as {"error": "..."}: ours (ApiError, with its status and headers), a client that
    left (499), and Starlette's own (an unknown path, a wrong method)."""
    @app.exception_handler(ApiError)
    async def refused(request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse({"error": error.message}, error.status, headers=error.headers)

    @app.exception_handler(ClientGone)
    async def gone(request: Request, error: ClientGone) -> JSONResponse:
        return JSONResponse({"error": "the client disconnected"}, 499)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": f"{request.method} {request.url.path}: {error.detail}"}, error.status_code,
                            headers=error.headers)


def add_api_routes(app: FastAPI, service: Service, key: ApiKey, keyed: list) -> None:
    """POST /translate (this project's request, or LibreTranslate's) and POST /attention."""
    max_chars = service.config["serve_max_chars"]

    @app.post("/translate")
    async def translate(request: Request) -> dict[str, Any]:
        arrived = now()
        payload, libre = await service.read_payload(request)
        if libre:
            key.require_libretranslate(request, payload)
            return await translate_libretranslate(service, request, arrived, payload)
        await key.require(request)
        return await translate_text(service, request, arrived, payload)

    @app.post("/attention", dependencies=keyed)
    async def attention(request: Request) -> dict[str, Any]:
        arrived = now()
        payload = check_fields(await service.read_json(request), "text", ["target_lang"])
        sentence = check_sentence(payload["text"], "'text'", max_chars)
        found = await service.attention(request, arrived, sentence, service.target_lang(payload))
        return {"source_tokens": found.source_tokens, "output_tokens": found.output_tokens, "weights": found.weights}


async def translate_text(service: Service, request: Request, arrived: float, payload: Any) -> dict[str, Any]:
    """POST /translate in this project's shape: a text in its shape with each sentence's span and
    confidence, or a list of sentences."""
    payload = check_fields(payload, "text", ["beam_size", "target_lang", "glossary"])
    text = check_request_text(payload["text"], service.config)
    options = service.defaults
    if "beam_size" in payload:
        options = with_beam_size(options, payload["beam_size"], service.config["serve_max_beam_size"])
    options = options.replace(target_lang=service.target_lang(payload))
    if "glossary" in payload:
        options = with_glossary(options, payload["glossary"], service.translator, service.config)
    split_sentences = split_sentences_on(service.config, auto=True)
    translator = service.translator
    if isinstance(text, str):
        document = document_plan(translator, text, "text", options.target_lang, split_sentences)
        check_sentence_count([document.text], service.config, "'text'")
        found = await service.translate(request, arrived, document.sources, options)
        texts = [h.text for h in found]
        # the same sentences in the same order: their spans in the text, and their confidence
        judged = translator.sentence_results(document.text, [[h] for h in found])
        sentences = [{"start": s.span.start, "end": s.span.end, "translation": s.translation,
                      "confidence": hypotheses[0].confidence}
                     for s, (_, hypotheses) in zip(document.sentences(texts), judged)]
        if options.glossary is not None:  # which words came from the glossary, for the page to mark
            for sentence in sentences:
                sentence["terms"] = options.glossary.placed(text[sentence["start"]:sentence["end"]],
                                                            sentence["translation"])
        return {"translation": document.assemble(texts), "split_for_length": document.text.split_for_length,
                "sentences": sentences, "no_confidence": translator.no_confidence}
    plan, _ = translator.segment_lines(text, options.target_lang, split_sentences)
    check_sentence_count([plan], service.config, "'text'")
    found = await service.translate(request, arrived, plan.sources, options)
    return {"translations": [fragments[0] for fragments in plan.assemble([h.text for h in found])]}


def document_plan(translator: Translator, text: str, fmt: str, target_lang: str,
                  split_sentences: bool) -> DocumentPlan:
    """A request's text as the pieces to translate, read as `fmt` (documents.FORMATS: LibreTranslate's
    text and html)."""
    if fmt not in FORMATS:
        raise ApiError(400, f"{fmt!r} format is not supported (formats: {', '.join(FORMATS)})")
    try:
        return translator.segment_document(text, fmt, target_lang, split_sentences)[0]
    except DocumentError as error:
        raise ApiError(400, f"the text cannot be read as {fmt}: {error}") from None


async def translate_libretranslate(service: Service, request: Request, arrived: float,
                                   fields: dict[str, Any]) -> dict[str, Any]:
    """POST /translate in LibreTranslate's shape (nmt/serving/libretranslate.py): each text of q
    translated in its shape, with its alternatives from the n-best list and an auto source detected."""
    config = service.config
    order = libretranslate.read_request(fields, config["serve_max_sentences"], config["serve_max_chars"],
                                        config["serve_max_beam_size"] - 1)
    service.check_open()  # before the translator is read: there is none while the model loads
    translator = service.translator
    libretranslate.check_languages(order, translator.model_config["lang_src"], translator.target_languages)
    detected = None
    if order.source == libretranslate.AUTO:
        detector = await service.language_detector()
        detected = await asyncio.to_thread(detector.source_detection, "\n".join(order.texts))
    options = with_alternatives(service.defaults.replace(target_lang=order.target), order.alternatives)
    split_sentences = split_sentences_on(config, auto=True)
    plans = [document_plan(translator, text, order.format, order.target, split_sentences) for text in order.texts]
    check_sentence_count([plan.text for plan in plans], config, "'q'")
    found = await service.hypotheses(request, arrived, [piece for plan in plans for piece in plan.sources], options)
    await place_inline(service, request, arrived, plans, found, order.target)
    results, start = [], 0
    for plan in plans:
        results.append(libretranslate.translations(plan, found[start:start + len(plan.sources)], order.alternatives))
        start += len(plan.sources)
    return libretranslate.translation_answer(order, results, detected)


async def place_inline(service: Service, request: Request, arrived: float, plans: Sequence[DocumentPlan],
                       found: Sequence[Sequence[Hypothesis]], target_lang: str) -> None:
    """For the pieces of `plans` that hold inline markup (HTML's <b>, <a href>), the model's alignment
    of each of their hypotheses, stored in their plan (Translator.place_inline): one job on the
    model's thread, after their translation, so that the tags of the translation and of its
    alternatives go around the words the attention says. Nothing to do without inline markup."""
    work, pieces, start = [], [], 0
    for plan in plans:
        marked = plan.text.marked
        if marked:
            hypotheses = found[start:start + len(plan.sources)]
            work.append((plan.text, [[h.text for h in piece] for piece in hypotheses]))
            pieces += [piece.prose for piece in marked.values()]
        start += len(plan.sources)
    if work:
        translator = service.translator
        await service.run(request, arrived, pieces, DecodingOptions(beam_size=1),
                          lambda _: [translator.place_inline(text, translations, target_lang)
                                     for text, translations in work], "placement")


def with_alternatives(options: DecodingOptions, alternatives: int) -> DecodingOptions:
    """`options` giving `alternatives` more hypotheses per sentence: a beam at least that wide plus
    one (sampling draws them)."""
    if not alternatives:
        return options
    beam_size = 1 if options.sampling else max(options.beam_size, alternatives + 1)
    return options.replace(n_best=alternatives + 1, beam_size=beam_size)


def add_libretranslate_routes(app: FastAPI, service: Service, key: ApiKey) -> None:
    """LibreTranslate's POST /detect (behind the key) and GET /languages (open, as LibreTranslate's
    is: clients ask it before they have a key to send)."""
    @app.post("/detect")
    async def detect(request: Request) -> list[dict[str, Any]]:
        payload, _ = await service.read_payload(request)
        if not isinstance(payload, dict):
            raise ApiError(400, f"the request body must be a JSON object with the field 'q', got {json_type(payload)}")
        key.require_libretranslate(request, payload)
        text = libretranslate.detect_text(payload, service.config["serve_max_sentences"],
                                          service.config["serve_max_chars"])
        service.check_open()
        detector = await service.language_detector()
        return await asyncio.to_thread(detector.detect, text)

    @app.get("/languages")
    async def languages() -> list[dict[str, Any]]:
        translator = service.translator
        if translator is None:
            raise unavailable("the model is still loading", 1)
        return libretranslate.languages(translator.model_config["lang_src"], translator.target_languages)


def check_request_text(text: Any, config: dict[str, Any]) -> str | list[str]:
    """A /translate request's 'text': a string as it is (spans index it), or a list's items each
    stripped; or a 400 saying what is wrong."""
    if isinstance(text, str):
        return check_text(text, "'text'", config["serve_max_chars"])
    if not isinstance(text, list):
        raise ApiError(400, f"'text' must be a string or a list of strings, got {json_type(text)}")
    if not text:
        raise ApiError(400, "'text' is an empty list: send at least one sentence")
    if len(text) > config["serve_max_sentences"]:
        raise ApiError(400, f"'text' has {len(text)} sentences; the limit is {config['serve_max_sentences']} "
                            f"(serve_max_sentences)")
    limit = config["serve_max_chars"]
    return [check_sentence(sentence, f"sentence {i} of 'text'", limit) for i, sentence in enumerate(text, start=1)]


def check_sentence_count(plans: Sequence[TextPlan], config: dict[str, Any], name: str) -> None:
    """A 400 when the request's texts (`name`) hold more sentences than serve_max_sentences, once
    segmented."""
    count = sum(len(flow.sentences) for plan in plans for flow in plan.flows)
    if count > config["serve_max_sentences"]:
        raise ApiError(400, f"{name} has {count} sentences; the limit is {config['serve_max_sentences']} "
                            f"(serve_max_sentences)")


def with_beam_size(options: DecodingOptions, beam_size: Any, limit: int) -> DecodingOptions:
    """`options` with a request's beam_size, or a 400 when it is not an integer from 1 to `limit`
    (serve_max_beam_size) or does not go with the other options."""
    if type(beam_size) is not int:
        raise ApiError(400, f"'beam_size' must be an integer, got {json_type(beam_size)}")
    if not 1 <= beam_size <= limit:
        raise ApiError(400, f"'beam_size' must be from 1 to {limit} (serve_max_beam_size), got {beam_size}")
    try:
        return options.replace(beam_size=beam_size)
    except TranslatorError as error:
        raise ApiError(400, f"'beam_size' {beam_size}: {error}") from None


def with_glossary(options: DecodingOptions, pairs: Any, translator: Translator,
                  config: dict[str, Any]) -> DecodingOptions:
    """`options` with a request's glossary (a list of [source term, target term] pairs, at most
    serve_glossary_max_terms), the sentences holding a term searched with glossary_beam_size; or a
    400 saying what is wrong with it, or that the engine or the options take none."""
    if not isinstance(pairs, list):
        raise ApiError(400, f"'glossary' must be a list of [source term, target term] pairs, got {json_type(pairs)}")
    try:
        glossary = translator.build_glossary(check_pairs(pairs, config["serve_glossary_max_terms"]))
        # the constrained sentences' beam widened, but never past what a request may ask for
        return options.with_glossary(glossary, min(config["glossary_beam_size"], config["serve_max_beam_size"]))[0]
    except GlossaryError as error:
        raise ApiError(400, f"'glossary': {error}" + (" (serve_glossary_max_terms)" if len(pairs) >
                                                      config["serve_glossary_max_terms"] else "")) from None
    except TranslatorError as error:
        raise ApiError(400, f"'glossary': {error}") from None


def add_status_routes(app: FastAPI, service: Service, keyed: list) -> None:
    """GET /health and /metrics (behind the key), the probes /health/live and /health/ready (never),
    and the web page."""
    @app.get("/health", dependencies=keyed)
    async def health() -> dict[str, Any]:
        if service.translator is None:
            raise unavailable("the model is still loading", 1)
        return service.describe()

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.get("/health/ready")
    async def ready() -> JSONResponse:
        state = service.state()
        return JSONResponse({"status": state}, 200 if state == "ready" else 503)

    @app.get("/metrics", dependencies=keyed)
    async def metrics() -> Response:
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM and SIGINT handed to the service's drain, which stops the server when it
    is done. (uvicorn's own handling stops at once, and cancels what is still running after
    timeout_graceful_shutdown.)"""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service
        service.stop_server = lambda: setattr(self, "should_exit", True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self.service.loop
        if loop is None or loop.is_closed():  # not serving yet, or no longer: nothing to drain
            self.should_exit = True
        else:
            loop.call_soon_threadsafe(self.service.drain)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_api_key(path: Path | None) -> str | None:
    """The key from --api_key_file (its first line), else from the environment; None if neither.
    A key of other characters than visible ASCII is refused (ConfigError)."""
    if path is None:
        key, origin = os.environ.get(API_KEY_VARIABLE, "").strip(), f"the {API_KEY_VARIABLE} environment variable"
        return check_api_key(key, origin) if key else None
    try:
        lines = read_text(path, f"--api_key_file {path}").splitlines()  # UTF-8, with or without a BOM
    except TextFileError as error:
        raise ConfigError(str(error)) from None
    if not lines or not lines[0].strip():
        raise ConfigError(f"--api_key_file {path}: its first line is empty")
    return check_api_key(lines[0].strip(), f"--api_key_file {path}")


def check_api_key(key: str, origin: str) -> str:
    """`key`, if every character is visible ASCII ('!' to '~'), as in a bearer token: an HTTP header
    carries other characters as latin-1 bytes at best, so a client sending the key in UTF-8 could
    never match it. Else a ConfigError naming the first other character and where the key came from."""
    odd = next((char for char in key if not "!" <= char <= "~"), None)
    if odd is not None:
        raise ConfigError(f"{origin}: the API key holds {odd!r} (U+{ord(odd):04X}); a key must be visible ASCII "
                          f"characters only ('!' to '~'), as a bearer token is")
    return key


def transport_problem(host: str, api_key: str | None, tls: bool, trusted_network: bool) -> str | None:
    """Why the server must not start with these options, or None."""
    if is_loopback(host):
        return None
    if api_key is None:
        return (f"--host {host} is not a loopback address: it needs an API key ({API_KEY_VARIABLE} or "
                f"--api_key_file FILE)")
    if not tls and not trusted_network:
        return (f"--host {host} is not a loopback address: the API key would cross the network in clear text; give "
                f"--ssl_certfile and --ssl_keyfile, or --trusted_network if the network is private")
    return None


def connections(configured: int) -> int:
    """serve_max_connections, lowered (and said so on stderr) where the limit on open files, lifted to
    its hard maximum first, would be reached before it."""
    files = raise_file_limit()
    limit = connection_limit(configured, files)
    if limit < configured:
        print(f"serve.py: at most {limit} connections at once, not {configured} (serve_max_connections): the limit "
              f"on open files (ulimit -n) is {files}", file=sys.stderr, flush=True)
    return limit


def argument_parser() -> OneLineParser:
    parser = build_parser(SERVE, __doc__.splitlines()[0])
    add_translator_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1); any other than loopback needs an API key")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000; 0: any free port)")
    parser.add_argument("--api_key_file", type=Path, default=None,
                        help=f"file whose first line is the API key (default: the {API_KEY_VARIABLE} environment "
                             f"variable); clients send 'Authorization: Bearer KEY'")
    parser.add_argument("--ssl_certfile", type=Path, default=None, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--ssl_keyfile", type=Path, default=None, help="the certificate's private key (PEM)")
    parser.add_argument("--trusted_network", action="store_true",
                        help="allow an API key over plain HTTP off loopback: every network between the clients and "
                             "this server is private")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser()
    args, resolved = parse_args(SERVE, argv, parser=parser)
    config = resolved.config
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl_certfile and --ssl_keyfile go together")
    try:
        api_key = read_api_key(args.api_key_file)
    except ConfigError as error:
        parser.error(str(error))
    tls = args.ssl_certfile is not None
    problem = transport_problem(args.host, api_key, tls, args.trusted_network)
    if problem:
        parser.error(problem)
    if args.engine == "pytorch" and args.checkpoint is None:
        try:
            choose_run(resolved)  # before listening: a run that cannot be found is one line, not a failed start
        except ConfigError as error:
            parser.error(str(error))

    try:
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        listener = socket.create_server((args.host, args.port), family=family)
    except OSError as error:
        print(f"serve.py: error: cannot listen on {args.host} port {args.port}: {error.strerror or error}",
              file=sys.stderr)
        return 1
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"{'https' if tls else 'http'}://{host}:{listener.getsockname()[1]}/"
    service = Service(config, lambda: load_translator(args, resolved), url)
    try:
        tls = tls_context(args.ssl_certfile, args.ssl_keyfile) if args.ssl_certfile is not None else None
    except OSError as error:  # ssl.SSLError is one
        listener.close()
        parser.error(f"--ssl_certfile {args.ssl_certfile} and --ssl_keyfile {args.ssl_keyfile}: cannot use them: "
                     f"{error}")
    guard = ConnectionGuard(config["serve_header_timeout_s"], connections(config["serve_max_connections"]), tls,
                            service.registry)
    # No limit_concurrency: uvicorn's counts idle connections and answers in plain text; the guard
    # bounds connections (connection_guard.py), the batcher's queue bounds work.
    server = DrainingServer(uvicorn.Config(build_app(service, api_key), http=guard.protocol(), lifespan="on",
                                           log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                                           timeout_keep_alive=math.ceil(config["serve_header_timeout_s"])), service)
    # uvicorn installs the same handler while it serves; before (a signal during start-up) it stops
    # the server as soon as it starts, and after it keeps a late signal from ending in a traceback.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, server.handle_exit)
    server.run(sockets=[listener])
    if service.exit_code == 0:
        print("serve.py: stopped", file=sys.stderr)
    return service.exit_code


if __name__ == "__main__":
    sys.exit(main())
