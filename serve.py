"""Serve translations over HTTP: `python serve.py --datasource FOLDER_OR_HUB_ID --port 8000`.

The model is found like translate.py finds it (the newest good checkpoint of the experiment, or
--checkpoint PATH, or --engine ctranslate2 --model_dir DIR) and loaded once. Endpoints:
- POST /translate {"text": ["...", ...], "beam_size": K} -> {"translations": ["...", ...]};
  beam_size is optional (default: the config's).
- POST /attention {"text": "..."} -> {"source_tokens", "output_tokens", "weights"}: the
  cross-attention of the sentence's greedy translation, weights[i][j] from output token i to source
  token j.
- GET /health: the engine, the model and its checkpoint, the limits, and batching counters.
- GET /: a web page (static/) to translate a sentence and see its attention heatmap.

Requests that arrive together are translated together (serve_batch_sentences, serve_batch_wait_ms);
each request is limited by serve_max_sentences, serve_max_chars, serve_max_body_bytes and
serve_max_beam_size. A refused request gets a 4xx status and {"error": "what is wrong"}.

It listens on 127.0.0.1 unless --host says otherwise (--port 0: any free port; the line on stderr
says which). On any other address it needs an API key, from the TRANSLATE_API_KEY environment
variable or the first line of --api_key_file FILE, and then every API request must send
`Authorization: Bearer KEY`; a key that is set is required on loopback too. Ctrl-C or SIGTERM
stops it after the requests in progress are answered.
"""
from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import signal
import socket
import sys
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from checkpoint import CheckpointError
from config import ConfigError, build_parser, config_or_exit
from translator import DecodingOptions, Translator, TranslatorError, add_translator_arguments, load_translator

STATIC = Path(__file__).resolve().parent / "static"
API_KEY_VARIABLE = "TRANSLATE_API_KEY"


class ApiError(Exception):
    """A refused request: the HTTP status and the one line the client is shown."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(eq=False)
class Job:
    sentences: list[str]
    options: DecodingOptions
    future: asyncio.Future


class Batcher:
    """Gathers the sentences of concurrent requests into one decoding call.

    One worker task takes the oldest waiting request, then collects requests that arrive within
    `wait_s` and decode with the same options, up to `max_sentences` sentences, and runs `decode`
    on all of them in the model's thread (`executor`). The event loop goes on accepting requests
    meanwhile: those that arrive during one decode make up the next batch. A request with other
    options (another beam size) waits for a later batch. A failing decode fails its batch's
    requests, not the worker."""

    def __init__(self, decode: Callable[[list[str], DecodingOptions], list[str]], executor: Executor,
                 max_sentences: int, wait_s: float) -> None:
        self.decode, self.executor = decode, executor
        self.max_sentences, self.wait_s = max_sentences, wait_s
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.held: deque[Job] = deque()  # taken off the queue for a batch they did not fit
        self.calls = self.requests = self.sentences = self.largest = 0  # reported by GET /health
        self.worker: asyncio.Task | None = None

    async def translate(self, sentences: list[str], options: DecodingOptions) -> list[str]:
        # Started by the first request rather than by a lifespan handler: at exit, asyncio cancels a
        # plain task quietly, even when a second Ctrl-C skips the application's shutdown.
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self.run())
        job = Job(sentences, options, asyncio.get_running_loop().create_future())
        self.queue.put_nowait(job)
        return await job.future

    async def run(self) -> None:
        while True:
            await self.decode_batch(await self.gather())

    async def gather(self) -> list[Job]:
        first = self.held.popleft() if self.held else await self.queue.get()
        batch, size = [first], len(first.sentences)
        for job in list(self.held):
            if job.options == first.options and size + len(job.sentences) <= self.max_sentences:
                self.held.remove(job)
                batch.append(job)
                size += len(job.sentences)
        loop = asyncio.get_running_loop()
        try:
            # A timeout (not wait_for) cancels queue.get() without losing an item it was handed.
            async with asyncio.timeout_at(loop.time() + self.wait_s):
                while size < self.max_sentences:
                    job = await self.queue.get()
                    if job.options != first.options:
                        self.held.append(job)
                    elif size + len(job.sentences) > self.max_sentences:
                        self.held.append(job)
                        break
                    else:
                        batch.append(job)
                        size += len(job.sentences)
        except TimeoutError:
            pass
        return batch

    async def decode_batch(self, batch: list[Job]) -> None:
        batch = [job for job in batch if not job.future.done()]  # a cancelled request needs no answer
        if not batch:
            return
        sentences = [sentence for job in batch for sentence in job.sentences]
        loop = asyncio.get_running_loop()
        try:
            translations = await loop.run_in_executor(self.executor, self.decode, sentences, batch[0].options)
        except Exception as error:  # whatever it was, the worker must go on
            message = failure("translation", error)
            print(f"serve.py: error: {message}", file=sys.stderr, flush=True)
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(ApiError(500, message))
            return
        self.calls += 1
        self.requests += len(batch)
        self.sentences += len(sentences)
        self.largest = max(self.largest, len(sentences))
        start = 0
        for job in batch:
            if not job.future.done():
                job.future.set_result(translations[start:start + len(job.sentences)])
            start += len(job.sentences)

    def stats(self) -> dict[str, int]:
        return {"decoding_calls": self.calls, "requests": self.requests, "sentences": self.sentences,
                "largest_batch": self.largest}


def failure(what: str, error: Exception) -> str:
    """One line about an error raised by the model."""
    first_line = next(iter(str(error).splitlines()), "")
    return f"{what} failed: {type(error).__name__}" + (f": {first_line}" if first_line else "")


def json_type(value: Any) -> str:
    """How a JSON value is called in an error message."""
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


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


def check_sentence(text: Any, name: str, max_chars: int) -> str:
    """The sentence stripped, or an ApiError naming it (`name`) and what is wrong with it."""
    if not isinstance(text, str):
        raise ApiError(400, f"{name} must be a string, got {json_type(text)}")
    if not text.strip():
        raise ApiError(400, f"{name} is empty")
    if len(text) > max_chars:
        raise ApiError(400, f"{name} is {len(text)} characters long; the limit is {max_chars} (serve_max_chars)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, sent as a \ud800 escape
        raise ApiError(400, f"{name} is not valid Unicode (a lone surrogate)") from None
    return text.strip()


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON; 413 past `limit` bytes, whether or not Content-Length says so."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {int(length)} bytes; the limit is {limit} (serve_max_body_bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes (serve_max_body_bytes)")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {str(error).splitlines()[0]}") from None


def build_app(translator: Translator, config: dict[str, Any], api_key: str | None) -> FastAPI:
    """The application around a loaded translator. All model calls run in one thread, so batches
    and attention requests never use the model at the same time."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
    defaults = DecodingOptions.from_config(config, batch_size=config["serve_batch_sentences"])
    batcher = Batcher(translator.translate_best, executor, config["serve_batch_sentences"],
                      config["serve_batch_wait_ms"] / 1000)
    max_chars = config["serve_max_chars"]

    async def require_key(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'")

    app = FastAPI(title="translation server", docs_url=None, redoc_url=None, openapi_url=None)
    api = [Depends(require_key)]

    @app.exception_handler(ApiError)
    async def refused(request: Request, error: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse({"error": error.message}, error.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": f"{request.method} {request.url.path}: {error.detail}"}, error.status_code,
                            headers=error.headers)

    @app.post("/translate", dependencies=api)
    async def translate(request: Request) -> dict[str, list[str]]:
        payload = check_fields(await read_json(request, config["serve_max_body_bytes"]), "text", ["beam_size"])
        text = payload["text"]
        if not isinstance(text, list):
            raise ApiError(400, f"'text' must be a list of strings, got {json_type(text)}")
        if not text:
            raise ApiError(400, "'text' is an empty list: send at least one sentence")
        if len(text) > config["serve_max_sentences"]:
            raise ApiError(400, f"'text' has {len(text)} sentences; the limit is {config['serve_max_sentences']} "
                                f"(serve_max_sentences)")
        sentences = [check_sentence(s, f"sentence {i} of 'text'", max_chars) for i, s in enumerate(text, start=1)]
        options = defaults
        if "beam_size" in payload:
            beam_size = payload["beam_size"]
            if type(beam_size) is not int:
                raise ApiError(400, f"'beam_size' must be an integer, got {json_type(beam_size)}")
            if not 1 <= beam_size <= config["serve_max_beam_size"]:
                raise ApiError(400, f"'beam_size' must be from 1 to {config['serve_max_beam_size']} "
                                    f"(serve_max_beam_size), got {beam_size}")
            try:
                options = defaults.replace(beam_size=beam_size)
            except TranslatorError as error:
                raise ApiError(400, f"'beam_size' {beam_size}: {error}") from None
        return {"translations": await batcher.translate(sentences, options)}

    @app.post("/attention", dependencies=api)
    async def attention(request: Request) -> dict[str, Any]:
        payload = check_fields(await read_json(request, config["serve_max_body_bytes"]), "text")
        sentence = check_sentence(payload["text"], "'text'", max_chars)
        try:
            found = await asyncio.get_running_loop().run_in_executor(executor, translator.cross_attention, sentence)
        except Exception as error:  # answered as a server error, never a traceback
            raise ApiError(500, failure("attention", error)) from None
        return {"source_tokens": found.source_tokens, "output_tokens": found.output_tokens, "weights": found.weights}

    @app.get("/health", dependencies=api)
    async def health() -> dict[str, Any]:
        limits = {key: config[key] for key in ("serve_max_sentences", "serve_max_chars", "serve_max_body_bytes",
                                               "serve_max_beam_size", "serve_batch_sentences", "serve_batch_wait_ms")}
        return {"status": "ok", "checkpoint": str(translator.path), **translator.describe(),
                "source": translator.source, "beam_size": defaults.beam_size, "limits": limits,
                "batching": batcher.stats()}

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def read_api_key(path: Path | None) -> str | None:
    """The key from --api_key_file (its first line), else from the environment; None if neither."""
    if path is None:
        return os.environ.get(API_KEY_VARIABLE, "").strip() or None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--api_key_file {path}: cannot read it: {getattr(error, 'strerror', None) or error}") \
            from None
    if not lines or not lines[0].strip():
        raise ConfigError(f"--api_key_file {path}: its first line is empty")
    return lines[0].strip()


class Stopped(Exception):
    """Ctrl-C or SIGTERM before the server runs."""


def stop_before_serving(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    add_translator_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1); any other than loopback needs an API key")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000; 0: any free port)")
    parser.add_argument("--api_key_file", type=Path, default=None,
                        help=f"file whose first line is the API key (default: the {API_KEY_VARIABLE} environment "
                             f"variable); clients send 'Authorization: Bearer KEY'")
    args = parser.parse_args(argv)
    config = config_or_exit(args, parser)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be from 0 to 65535, got {args.port}")
    try:
        api_key = read_api_key(args.api_key_file)
    except ConfigError as error:
        parser.error(str(error))
    if api_key is None and not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address: it needs an API key ({API_KEY_VARIABLE} or "
                     f"--api_key_file FILE)")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_before_serving)
    try:
        translator = load_translator(args, config)
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        listener = socket.create_server((args.host, args.port), family=family)
    except ConfigError as error:
        parser.error(str(error))
    except (CheckpointError, TranslatorError) as error:
        print(f"serve.py: error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"serve.py: error: cannot listen on {args.host} port {args.port}: {error.strerror or error}",
              file=sys.stderr)
        return 1
    except Stopped as stop:
        print(f"serve.py: stopped by {stop} before serving", file=sys.stderr)
        return 0

    server = uvicorn.Server(uvicorn.Config(build_app(translator, config, api_key), lifespan="off",
                                           log_level="warning", access_log=False, timeout_graceful_shutdown=10))
    # uvicorn handles SIGINT and SIGTERM while it serves, then sends the signal again to the handler
    # it found. That handler only asks it to stop: the default ones would end with a
    # KeyboardInterrupt traceback or a death by SIGTERM after a clean shutdown.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: setattr(server, "should_exit", True))
    port = listener.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    # The socket already listens: a client that connects from now on is answered once the loop runs.
    print(f"serve.py: serving {translator.source} ({translator.engine}) on http://{host}:{port}/",
          file=sys.stderr, flush=True)
    server.run(sockets=[listener])
    print("serve.py: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
