"""Serve an exported model over HTTP (``deepnmt-serve``), with dynamic batching.

    deepnmt-serve --model OUT_DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY]

* ``POST /v1/translate``: ``{"text": ["...", ...], "beam": 5}`` in, ``{"translations": [...],
  "model": NAME, "elapsed_ms": ...}`` out, one translation per input, in order.  The text pipeline
  and the search are ``deepnmt-translate``'s (:class:`~deepnmt_deploy.translate.DeployedModel`).
* ``GET /health``: 200 once the model is loaded, 503 before (the model loads after the port opens).
* ``GET /metrics``: Prometheus text format (requests by status, latency, batch sizes, queue depth,
  tokens).
* ``GET /``: a page to try it (:mod:`.page`; nothing loaded from elsewhere).

Dynamic batching (:class:`Batcher`): requests wait in one bounded queue; a worker takes the oldest
request and adds the following ones with the same beam until the batch holds ``--max-batch-tokens``
source tokens or ``--max-wait-ms`` has passed since the first was taken, then runs them as one
``translate_tokens`` call (CTranslate2 cuts it into length-sorted batches of ``--batch-size``
sentences, as ``deepnmt-translate`` does).  A request is never split, so a request alone in a batch is
translated exactly as ``deepnmt-translate --batch-size`` translates the same lines.  When the queue
holds ``--max-queue`` sentences a request is refused with 503 and ``Retry-After``; a request not
answered within ``--request-timeout`` seconds gets 504.  Errors are JSON ``{"error": ..., "status":
...}`` naming the field or the limit (docs/deployment.md has the table).

SIGTERM: the port closes, every request already accepted is answered, then the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hmac
import json
import logging
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Deque, List, Optional

from .help_format import HelpFormatter

logger = logging.getLogger("deepnmt_deploy.serve")

API_KEY_ENV = "DEEPNMT_API_KEY"
TRANSLATE_PATH = "/v1/translate"
FIELDS = ("text", "beam")


@dataclass
class ServeConfig:
    """The server's settings (the flags of ``deepnmt-serve``; defaults in :func:`build_parser`)."""

    model_dir: str = ""
    name: str = ""
    beam: int = 5
    max_beam: int = 16
    lenpen: float = 1.0
    max_len: int = 200
    batch_size: int = 32
    max_batch_tokens: int = 1024
    max_wait_ms: float = 5.0
    max_queue: int = 512
    request_timeout: float = 30.0
    max_body_bytes: int = 1 << 20
    max_sentences: int = 64
    api_key: Optional[str] = None
    cors_origins: List[str] = field(default_factory=list)
    device: str = "cpu"
    compute_type: str = "default"
    intra_threads: int = 1
    inter_threads: int = 1
    #: the export's vocabulary shortlist: None = as deepnmt-translate (used when the export has one)
    use_vmap: Optional[bool] = None


class ApiError(Exception):
    """An error answered as JSON: ``{"error": message, "status": status, **extra}``."""

    def __init__(self, status: int, message: str, headers: Optional[dict] = None, **extra):
        super().__init__(message)
        self.status, self.message, self.headers, self.extra = status, message, headers or {}, extra


class QueueFull(Exception):
    pass


@dataclass
class Job:
    sources: List[List[str]]
    beam: int
    future: asyncio.Future
    tokens: int


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("deepnmt_requests", "Translate requests answered, by HTTP status", ["status"],
                                registry=r)
        self.latency = Histogram("deepnmt_request_latency_seconds", "Translate request latency (all statuses)",
                                 buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30), registry=r)
        self.batches = Counter("deepnmt_batches", "Model calls (coalesced batches)", registry=r)
        self.batch_sentences = Histogram("deepnmt_batch_sentences", "Sentences per model call",
                                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.batch_requests = Histogram("deepnmt_batch_requests", "Requests per model call",
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.model_seconds = Counter("deepnmt_model_seconds", "Wall time spent in model calls (translation + decoding)",
                                     registry=r)
        self.queue_depth = Gauge("deepnmt_queue_depth", "Sentences waiting for a batch", registry=r)
        self.source_tokens = Counter("deepnmt_source_tokens", "Source subword tokens translated", registry=r)
        self.target_tokens = Counter("deepnmt_target_tokens",
                                     "Target subword tokens produced (</s> counted, as deepnmt-translate counts)",
                                     registry=r)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class Batcher:
    """Coalesces queued requests into model calls (see the module's docstring)."""

    def __init__(self, translate: Callable[[List[List[str]], int], List[str]], cfg: ServeConfig,
                 metrics: Metrics, workers: int = 1):
        self.translate, self.cfg, self.metrics = translate, cfg, metrics
        self.queue: Deque[Job] = collections.deque()
        self.queued_sentences = 0
        self.calls = 0
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deepnmt-batch")
        self.workers = workers
        self._arrived: Optional[asyncio.Event] = None
        self._tasks: List[asyncio.Task] = []

    def start(self):
        self._arrived = asyncio.Event()
        self._tasks = [asyncio.get_running_loop().create_task(self._work()) for _ in range(self.workers)]

    async def stop(self):
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.executor.shutdown(wait=False)

    def submit(self, sources: List[List[str]], beam: int) -> asyncio.Future:
        if self.queued_sentences + len(sources) > self.cfg.max_queue:
            raise QueueFull()
        fut = asyncio.get_running_loop().create_future()
        self.queue.append(Job(sources, beam, fut, sum(len(s) + 1 for s in sources if s)))
        self._moved(len(sources))
        self._arrived.set()
        return fut

    def _moved(self, n: int):
        self.queued_sentences += n
        self.metrics.queue_depth.set(self.queued_sentences)

    def _pop_live(self) -> Optional[Job]:
        while self.queue:
            job = self.queue.popleft()
            self._moved(-len(job.sources))
            if not job.future.done():  # a timed-out request costs no model time
                return job
        return None

    def _take_more(self, batch: List[Job], tokens: int) -> int:
        """Move queued jobs with the batch's beam into it while the token budget allows."""
        kept: Deque[Job] = collections.deque()
        while self.queue:
            job = self.queue.popleft()
            if job.future.done():
                self._moved(-len(job.sources))
            elif job.beam == batch[0].beam and tokens + job.tokens <= self.cfg.max_batch_tokens:
                self._moved(-len(job.sources))
                batch.append(job)
                tokens += job.tokens
            else:
                kept.append(job)
        self.queue = kept
        return tokens

    async def _work(self):
        loop = asyncio.get_running_loop()
        while True:
            job = self._pop_live()
            if job is None:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            batch, tokens = [job], job.tokens
            deadline = loop.time() + self.cfg.max_wait_ms / 1000
            while True:
                tokens = self._take_more(batch, tokens)
                left = deadline - loop.time()
                if tokens >= self.cfg.max_batch_tokens or left <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    tokens = self._take_more(batch, tokens)
                    break
            if len(self.queue):  # more waits: let another worker see it
                self._arrived.set()
            await self._run(batch, tokens)

    async def _run(self, batch: List[Job], tokens: int):
        sources = [s for job in batch for s in job.sources]
        self.calls += 1
        self.metrics.batches.inc()
        self.metrics.batch_sentences.observe(len(sources))
        self.metrics.batch_requests.observe(len(batch))
        t0 = time.perf_counter()
        try:
            outputs, target_tokens = await asyncio.get_running_loop().run_in_executor(
                self.executor, self.translate, sources, batch[0].beam)
        except Exception as e:  # noqa: BLE001 - answered as 500 to the batch's requests only
            self.metrics.model_seconds.inc(time.perf_counter() - t0)
            logger.exception("model call failed")
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        self.metrics.model_seconds.inc(time.perf_counter() - t0)
        self.metrics.source_tokens.inc(tokens)
        self.metrics.target_tokens.inc(target_tokens)
        k = 0
        for job in batch:
            n = len(job.sources)
            if not job.future.done():
                job.future.set_result(outputs[k:k + n])
            k += n


def _error_response(e: ApiError):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": e.message, "status": e.status, **e.extra}, status_code=e.status, headers=e.headers)


def _model_translate(model, cfg: ServeConfig):
    """(subword sources, beam) -> (raw translations, target tokens): deepnmt-translate's search and
    decoding, for one coalesced batch (runs in the batcher's thread)."""

    def translate(sources, beam):
        hyps = model.translate_tokens(sources, beam=beam, lenpen=cfg.lenpen, max_len=cfg.max_len,
                                      batch_size=cfg.batch_size)
        return [model._decode(h, i + 1) for i, h in enumerate(hyps)], sum(len(h) + 1 for h in hyps if h)

    return translate


class App:
    """The ASGI application and its state.  ``load`` makes the model (default: the exported
    directory of ``cfg.model_dir``); it runs in a thread after the server starts listening."""

    def __init__(self, cfg: ServeConfig, load: Optional[Callable[[], object]] = None):
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.middleware import Middleware
        from starlette.routing import Route

        self.cfg = cfg
        self.name = cfg.name or Path(cfg.model_dir).name or "model"
        self.metrics = Metrics()
        self.model = None
        self.load_error: Optional[str] = None
        self.batcher: Optional[Batcher] = None
        #: translate requests that reached the app, and those answered (any status): equal after a shutdown
        self.accepted = self.answered = 0
        self._load = load or (lambda: _load_model(cfg))
        middleware = []
        if cfg.cors_origins:
            from starlette.middleware.cors import CORSMiddleware

            middleware.append(Middleware(CORSMiddleware, allow_origins=list(cfg.cors_origins),
                                         allow_methods=["GET", "POST"],
                                         allow_headers=["Content-Type", "Authorization", "X-API-Key"]))

        async def http_error(request, exc: HTTPException):
            return _error_response(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                            headers=dict(exc.headers or {})))

        self.starlette = Starlette(
            routes=[Route(TRANSLATE_PATH, self.translate, methods=["POST"]),
                    Route("/health", self.health, methods=["GET"]),
                    Route("/metrics", self.prometheus, methods=["GET"]),
                    Route("/", self.page, methods=["GET"]),
                    Route("/page.js", self.page_js, methods=["GET"])],
            middleware=middleware, exception_handlers={HTTPException: http_error}, lifespan=self.lifespan)

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != TRANSLATE_PATH:
            return await self.starlette(scope, receive, send)
        t0 = time.perf_counter()
        status = [500]
        self.accepted += 1

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.answered += 1

        try:
            await self.starlette(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(str(status[0])).inc()
            self.metrics.latency.observe(time.perf_counter() - t0)

    @contextlib.asynccontextmanager
    async def lifespan(self, _app):
        loop = asyncio.get_running_loop()
        loader = loop.create_task(self._load_in_thread())
        try:
            yield
        finally:
            loader.cancel()
            logger.warning("shutdown: %d translate requests accepted, %d answered", self.accepted, self.answered)
            if self.batcher is not None:
                await self.batcher.stop()

    async def _load_in_thread(self):
        t0 = time.perf_counter()
        try:
            model = await asyncio.get_running_loop().run_in_executor(None, self._load)
        except Exception as e:  # noqa: BLE001 - reported by /health
            self.load_error = f"{type(e).__name__}: {e}"
            logger.error("loading the model failed: %s", self.load_error)
            return
        self.batcher = Batcher(_model_translate(model, self.cfg), self.cfg, self.metrics,
                               workers=max(1, self.cfg.inter_threads))
        self.batcher.start()
        self.model = model
        logger.info("model %s loaded in %.1f s; ready", self.name, time.perf_counter() - t0)

    # ------------------------------------------------------------------ routes
    def _check_key(self, request):
        if not self.cfg.api_key:
            return
        given = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if given is None and auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if given is None:
            raise ApiError(401, "an API key is required: header 'Authorization: Bearer KEY' or 'X-API-Key: KEY'",
                           headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.cfg.api_key.encode("utf-8")):
            raise ApiError(401, "the API key is wrong", headers={"WWW-Authenticate": "Bearer"})

    async def _body(self, request) -> bytes:
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise ApiError(400, f"header Content-Length is not a number: {declared!r}", field="Content-Length")
            if size > limit:
                raise ApiError(413, f"body of {size} bytes is over the limit of {limit} bytes (--max-body-bytes)",
                               limit="max_body_bytes", max_body_bytes=limit)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"body over the limit of {limit} bytes (--max-body-bytes)",
                               limit="max_body_bytes", max_body_bytes=limit)
            chunks.append(chunk)
        return b"".join(chunks)

    def _parse(self, body: bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, f"body is not valid UTF-8: byte {body[e.start:e.start + 1]!r} at byte offset {e.start}",
                           offset=e.start)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ApiError(400, f"body is not JSON: {e.msg} at line {e.lineno} column {e.colno}")
        if not isinstance(data, dict):
            raise ApiError(400, f"body must be a JSON object with the field 'text', not {type(data).__name__}",
                           field="text")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r} (the fields are {', '.join(FIELDS)})", field=unknown[0])
        if "text" not in data:
            raise ApiError(400, "field 'text' is missing: a list of strings", field="text")
        lines = data["text"]
        if not isinstance(lines, list):
            raise ApiError(400, f"field 'text' must be a list of strings, not {type(lines).__name__}", field="text")
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise ApiError(400, f"field 'text[{i}]' must be a string, not {type(line).__name__}",
                               field=f"text[{i}]")
        beam = data.get("beam", self.cfg.beam)
        if isinstance(beam, bool) or not isinstance(beam, int):
            raise ApiError(400, f"field 'beam' must be an integer, not {type(beam).__name__}", field="beam")
        if not 1 <= beam <= self.cfg.max_beam:
            raise ApiError(422, f"field 'beam' is {beam}: the limit is 1 to {self.cfg.max_beam} (--max-beam)",
                           field="beam", limit="max_beam", max_beam=self.cfg.max_beam)
        if len(lines) > self.cfg.max_sentences:
            raise ApiError(422, f"{len(lines)} sentences: the limit is {self.cfg.max_sentences} per request "
                                f"(--max-sentences)", field="text", limit="max_sentences",
                           max_sentences=self.cfg.max_sentences)
        return lines, beam

    def _encode(self, lines: List[str]) -> List[List[str]]:
        model, limit = self.model, self.model.max_source_tokens
        sources = []
        for i, line in enumerate(lines):
            try:
                tokens = model.pipeline.encode(line)
            except Exception as e:  # noqa: BLE001 - as deepnmt-translate: an empty translation
                logger.warning("text[%d]: tokenization failed (%s: %s); empty translation", i, type(e).__name__, e)
                tokens = []
            if len(tokens) > limit:
                raise ApiError(422, f"field 'text[{i}]' has {len(tokens)} subword tokens: the model's limit is "
                                    f"{limit} (max_source_positions {limit + 1}, </s> included)",
                               field=f"text[{i}]", limit="max_source_tokens", max_source_tokens=limit)
            sources.append(tokens)
        return sources

    async def translate(self, request):
        t0 = time.perf_counter()
        try:
            self._check_key(request)
            ctype = request.headers.get("content-type", "")
            if ctype.split(";")[0].strip().lower() != "application/json":
                raise ApiError(415, f"Content-Type must be application/json, not {ctype or 'missing'!r}",
                               field="Content-Type")
            lines, beam = self._parse(await self._body(request))
            if self.model is None or self.batcher is None:
                raise ApiError(503, "the model is not loaded yet" if self.load_error is None
                               else f"the model failed to load: {self.load_error}", headers={"Retry-After": "5"})
            if lines:
                sources = self._encode(lines)
                try:
                    fut = self.batcher.submit(sources, beam)
                except QueueFull:
                    raise ApiError(503, f"the queue is full ({self.cfg.max_queue} sentences, --max-queue); retry later",
                                   headers={"Retry-After": "1"}, limit="max_queue")
                try:
                    out = await asyncio.wait_for(asyncio.shield(fut), self.cfg.request_timeout)
                except asyncio.TimeoutError:
                    fut.cancel()
                    raise ApiError(504, f"not answered within {self.cfg.request_timeout:g} s (--request-timeout)",
                                   limit="request_timeout")
                except asyncio.CancelledError:
                    fut.cancel()
                    raise
            else:
                out = []
        except ApiError as e:
            return _error_response(e)
        except Exception as e:  # noqa: BLE001
            logger.exception("translate failed")
            return _error_response(ApiError(500, f"internal error: {type(e).__name__}"))
        from starlette.responses import JSONResponse

        return JSONResponse({"translations": out, "model": self.name,
                             "elapsed_ms": round((time.perf_counter() - t0) * 1000, 3)})

    async def health(self, request):
        from starlette.responses import JSONResponse

        if self.model is not None:
            return JSONResponse({"status": "ready", "model": self.name})
        if self.load_error is not None:
            return JSONResponse({"status": "failed", "error": self.load_error, "model": self.name}, status_code=503)
        return JSONResponse({"status": "loading", "model": self.name}, status_code=503,
                            headers={"Retry-After": "1"})

    async def prometheus(self, request):
        from starlette.responses import Response

        try:
            self._check_key(request)
        except ApiError as e:
            return _error_response(e)
        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(self, request):
        from starlette.responses import HTMLResponse

        from .page import CSP, render

        return HTMLResponse(render(self.name, bool(self.cfg.api_key)), headers={"Content-Security-Policy": CSP})

    async def page_js(self, request):
        from starlette.responses import Response

        from .page import SCRIPT

        return Response(SCRIPT, media_type="text/javascript; charset=utf-8")


def _load_model(cfg: ServeConfig):
    from .translate import DeployedModel

    return DeployedModel(cfg.model_dir, cfg.device, cfg.compute_type, cfg.intra_threads, cfg.inter_threads,
                         use_vmap=cfg.use_vmap)


def make_server(app: App, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"):
    """A uvicorn server for ``app`` whose SIGTERM ends in exit status 0 after the graceful shutdown
    (uvicorn re-raises the signal once it has shut down, which would end the process by it)."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM and sig in self._captured_signals:
                self._captured_signals.remove(sig)

    # no uvicorn access log: /metrics counts the requests; h11 (pure Python) as the HTTP parser
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, http="h11",
                            lifespan="on", timeout_graceful_shutdown=None, server_header=False)
    return Server(config)


HELP = """\
Serve a model exported by deepnmt-export-ct2 over HTTP: POST /v1/translate (JSON), GET /health,
GET /metrics (Prometheus), GET / (a page to try it).  Concurrent requests are batched dynamically.

  deepnmt-serve --model OUT_DIR                       # http://127.0.0.1:8080/
  curl -s localhost:8080/v1/translate -H 'Content-Type: application/json' -d '{"text": ["Hello."]}'
"""


def build_parser() -> argparse.ArgumentParser:
    d = ServeConfig()
    p = argparse.ArgumentParser(prog="deepnmt-serve", description=HELP, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="directory written by deepnmt-export-ct2")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on")
    p.add_argument("--name", default="", help="the model's name in answers and on the page (default: the directory's)")
    p.add_argument("--api-key", default=None,
                   help=f"require this key (header 'Authorization: Bearer KEY' or 'X-API-Key'); default: ${API_KEY_ENV} "
                        "if set, else none")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow cross-origin requests from ORIGIN (repeatable; default: none)")
    g = p.add_argument_group("search (as deepnmt-translate's)")
    g.add_argument("--beam", type=int, default=d.beam, help="beam size when a request gives none")
    g.add_argument("--max-beam", type=int, default=d.max_beam, help="largest beam a request may ask for")
    g.add_argument("--lenpen", type=float, default=d.lenpen, help="length penalty, as fairseq-generate's --lenpen")
    g.add_argument("--max-len", type=int, default=d.max_len, help="longest hypothesis in subword tokens")
    g.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="sentences per CTranslate2 batch (a model call is cut into such batches)")
    g = p.add_argument_group("batching and limits")
    g.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens,
                   help="source subword tokens one model call collects from queued requests")
    g.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms,
                   help="how long a batch waits for more requests once its first is taken")
    g.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="sentences that may wait; beyond it requests get 503 with Retry-After")
    g.add_argument("--request-timeout", type=float, default=d.request_timeout,
                   help="seconds before an unanswered request gets 504")
    g.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="largest request body (413 above)")
    g.add_argument("--max-sentences", type=int, default=d.max_sentences, help="sentences per request (422 above)")
    g = p.add_argument_group("engine")
    g.add_argument("--device", default=d.device, help="cpu, cuda or auto")
    g.add_argument("--compute-type", default=d.compute_type,
                   help="CTranslate2 compute type (default: the exported weights' type)")
    g.add_argument("--intra-threads", type=int, default=d.intra_threads, help="threads per batch")
    g.add_argument("--inter-threads", type=int, default=d.inter_threads,
                   help="model calls run in parallel (and CTranslate2 batches in parallel)")
    g.add_argument("--no-vmap", action="store_true",
                   help="the whole target vocabulary even where the export has a vocabulary shortlist (as "
                        "deepnmt-translate --no-vmap; the shortlist is used by default when present)")
    p.add_argument("--log-level", default="info", help="uvicorn's log level (debug, info, warning, error)")
    return p


def config_from_args(a) -> ServeConfig:
    key = a.api_key if a.api_key is not None else os.environ.get(API_KEY_ENV) or None
    return ServeConfig(model_dir=a.model, name=a.name, beam=a.beam, max_beam=a.max_beam, lenpen=a.lenpen,
                       max_len=a.max_len, batch_size=a.batch_size, max_batch_tokens=a.max_batch_tokens,
                       max_wait_ms=a.max_wait_ms, max_queue=a.max_queue, request_timeout=a.request_timeout,
                       max_body_bytes=a.max_body_bytes, max_sentences=a.max_sentences, api_key=key,
                       cors_origins=a.cors_origin, device=a.device, compute_type=a.compute_type,
                       intra_threads=a.intra_threads, inter_threads=a.inter_threads,
                       use_vmap=False if a.no_vmap else None)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .translate import read_metadata

    try:
        read_metadata(a.model)  # fail at once on a wrong directory; the model itself loads after listening
    except (FileNotFoundError, ValueError) as e:
        print(f"deepnmt-serve: error: {e}", file=sys.stderr)
        return 2
    for name, value in (("--max-batch-tokens", a.max_batch_tokens), ("--max-queue", a.max_queue),
                        ("--max-body-bytes", a.max_body_bytes), ("--max-sentences", a.max_sentences),
                        ("--batch-size", a.batch_size), ("--max-beam", a.max_beam), ("--beam", a.beam)):
        if value < 1:
            print(f"deepnmt-serve: error: {name} must be at least 1, not {value}", file=sys.stderr)
            return 2
    cfg = config_from_args(a)
    if a.host not in ("127.0.0.1", "localhost", "::1") and not cfg.api_key:
        logger.warning("listening on %s without an API key (--api-key or $%s)", a.host, API_KEY_ENV)
    server = make_server(App(cfg), a.host, a.port, a.log_level.lower())
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
