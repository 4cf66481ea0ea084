"""The gateway's ASGI app: `/v1/` answered here, everything else passed to Django.

One request: find the key (a dict lookup on its keyed hash), read and check the
body, find the model by name or alias, check the limits, pick a ready replica
(least in flight for its weight), send the body on with the replica's engine
key, and pass the answer back, streamed as it arrives. Usage, load and metrics
are counted in memory. Nothing here touches the database; `Runtime`'s
background task refreshes the tables and writes the batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from channels.db import database_sync_to_async
from django.db import connection

from llmgw.core.outage import Outage
from llmgw.gateway import metrics
from llmgw.gateway.limits import Limiter, LocalCounters, RedisCounters, refusal_sentence
from llmgw.gateway.load import BOARD, publish
from llmgw.gateway.tables import Key, Loader, Tables, Upstream
from llmgw.gateway.usage import UsageBook, usage_write

log = logging.getLogger("llmgw.gateway")

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a whole (not streamed) answer from an engine
MAX_SECRET_CHARS = 256
REFRESH_S = 1.0  # how often the tables' fingerprints are checked
FLUSH_S = 2.0  # how often usage is written
SUSPECT_S = 10.0  # a replica that refused a connection is avoided this long
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/embeddings": "embedding",
}
JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def in_a_thread(fn):
    """`fn` to await, run off the loop in a worker thread, with Django's stale connections
    closed around it as Channels does for consumers."""
    return database_sync_to_async(fn, thread_sensitive=False)


class Refused(Exception):
    """A request answered with an OpenAI-style error and no upstream call."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        *,
        reason: str,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.reason, self.retry_after = reason, retry_after

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.kind, "param": None, "code": self.code}
        return json.dumps({"error": error}).encode()


class ClientGone(Exception):
    """The caller hung up."""


def _no_key() -> Refused:
    return Refused(
        401,
        "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
        "invalid_request_error",
        "invalid_api_key",
        reason="auth",
    )


def _bad_key() -> Refused:
    # The same answer for a wrong, unknown or revoked key: nothing says which keys exist.
    return Refused(
        401,
        "Incorrect API key provided.",
        "invalid_request_error",
        "invalid_api_key",
        reason="auth",
    )


def _bad(message: str, code: str | None = None) -> Refused:
    return Refused(400, message, "invalid_request_error", code, reason="bad_request")


@dataclass
class Request:
    """What is known of one request as it goes through."""

    key: Key
    endpoint: str
    path: str
    body: dict
    raw: bytes
    stream: bool
    wants_usage: bool
    started: float
    model: str = ""  # the catalog name it was served as
    tried: set[str] = field(default_factory=set)
    usage: dict | None = None  # the engine's figures, once they have passed
    done: bool = False  # the answer has reached its end (a stream, its [DONE])
    recorded: bool = False  # its usage is counted: once, whichever way it ended
    events: int = 0  # server-sent events passed on: tokens, about, when no usage came


class Runtime:
    """The gateway's state in one process: tables, counters, the upstream pool and the
    background task. Made on the first request, on the loop that serves it."""

    def __init__(self) -> None:
        from django.conf import settings

        self.secret = settings.SECRET_KEY
        self.cfg = settings.LLMGW
        self.loader = Loader()
        self.tables = Tables()
        self.changed = asyncio.Event()  # set, and replaced, whenever the tables change
        counters = RedisCounters(self.cfg.redis_url) if self.cfg.redis_url else LocalCounters()
        self.limiter = Limiter(counters)
        self.usage = UsageBook()
        self.inflight: dict[str, int] = {}
        self.suspect: dict[str, float] = {}
        self.turn = 0
        self.asked: dict[str, float] = {}  # on-demand model -> when the reconciler was last told
        self.session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._digests: dict[str, str] = {}
        self._models_json: dict[object, bytes] = {}
        self._redis = None
        self._tasks: set[asyncio.Task] = set()
        # The /v1/ requests being answered, and whether this server is stopping (drain).
        self.requests: set[asyncio.Task] = set()
        self.stopping = False

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=600),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        await self._refresh()
        self._task = asyncio.get_running_loop().create_task(self._background())

    def flush_now(self) -> None:
        """Write what usage is tallied from a thread of its own, waiting up to 10 s: for a
        server going down, whose loop will not run the background task again."""
        import threading

        from llmgw.core import clock

        tallies, used = self.usage.take()
        if not tallies and not used:
            return
        now = clock.now()

        def write() -> None:
            try:
                usage_write(tallies=tallies, used=used, now=now)
            finally:
                connection.close()  # this thread's own, about to end with it

        done = threading.Thread(target=write)
        done.start()
        done.join(10)

    async def drain(self, grace_s: float) -> tuple[int, int]:
        """Stop taking requests and let those in flight finish for up to `grace_s`; cut the
        rest (a stream ends with an error event; usage is written either way). Returns how
        many were in flight, and how many of them were cut."""
        self.stopping = True
        waiting = set(self.requests)
        if waiting:
            await asyncio.wait(waiting, timeout=grace_s)
        cut = [t for t in waiting if not t.done()]
        for task in cut:
            task.cancel()
        if cut:
            await asyncio.wait(cut, timeout=5)
        return len(waiting), len(cut)

    async def close(self) -> None:
        """Stop the background task and close the upstream pool (tests, and shutdown)."""
        if self._task is not None:
            self._task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self.session is not None:
            await self.session.close()

    # Keys

    def authenticate(self, headers: list[tuple[bytes, bytes]]) -> Key:
        auth = None
        for name, value in headers:
            if name == b"authorization":
                auth = value
                break
        if not auth:
            raise _no_key()
        scheme, _, secret = auth.decode("latin-1").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise _no_key()
        if len(secret) > MAX_SECRET_CHARS:
            raise _bad_key()
        digest = self._digests.get(secret)
        if digest is None:
            from llmgw.core.secrets import keyed_digest

            digest = keyed_digest(self.secret, secret)
            key = self.tables.keys.get(digest)
            if key is None:
                raise _bad_key()  # not remembered: callers must not fill the cache
            if len(self._digests) > 10_000:
                self._digests.clear()
            self._digests[secret] = digest
            return key
        key = self.tables.keys.get(digest)
        if key is None:
            raise _bad_key()
        return key

    # Routing

    def pick(self, model: str, tried: set[str]) -> Upstream | None:
        """The ready replica with the fewest requests in flight for its weight; replicas
        tried already, or recently refusing connections, only when nothing else is left."""
        ups = self.tables.upstreams.get(model)
        if not ups:
            return None
        now = time.monotonic()
        best, best_score, fallback = None, None, None
        n = len(ups)
        self.turn += 1
        start = self.turn % n  # ties go round, so one request at a time spreads too
        for i in range(n):
            u = ups[(start + i) % n]
            if u.replica_id in tried:
                continue
            if self.suspect.get(u.replica_id, 0) > now:
                fallback = fallback or u
                continue
            score = (self.inflight.get(u.replica_id, 0) + 1) / u.weight
            if best_score is None or score < best_score:
                best, best_score = u, score
        return best or fallback

    def chain(self, model: str) -> list[str]:
        """The model, then its fallbacks in order, then theirs: each once."""
        out, queue = [], [model]
        while queue:
            name = queue.pop(0)
            spec = self.tables.resolve(name)
            if spec is None or spec.name in out:
                continue
            out.append(spec.name)
            queue.extend(spec.fallbacks)
        return out

    # Background: tables, usage, load

    async def _refresh(self) -> None:
        try:
            tables = await in_a_thread(self.loader.refresh)()
        except Exception:  # noqa: BLE001 - keep routing on what we have
            log.warning("could not refresh the gateway's tables; keeping the last", exc_info=True)
            return
        if tables is not None:
            if tables.keys is not self.tables.keys:
                self._models_json.clear()
                self._digests.clear()
            self.tables = tables
            self.changed.set()
            self.changed = asyncio.Event()

    async def _flush(self) -> None:
        tallies, used = self.usage.take()
        if not tallies and not used:
            return
        from llmgw.core import clock

        try:
            await in_a_thread(usage_write)(tallies=tallies, used=used, now=clock.now())
        except Exception:  # noqa: BLE001
            log.warning("could not write usage; keeping it for the next try", exc_info=True)
            self.usage.give_back(tallies, used)

    async def _publish(self) -> None:
        counts = BOARD.counts()
        metrics.load_gauges(counts)
        if self.cfg.redis_url is None:
            return
        if self._redis is None:
            import redis

            self._redis = redis.Redis.from_url(self.cfg.redis_url, socket_timeout=2)
        try:
            await asyncio.get_running_loop().run_in_executor(None, publish, self._redis, counts)
        except Exception as exc:  # noqa: BLE001
            log.debug("could not publish the gateway's load: %s", exc)

    async def _background(self) -> None:
        last_flush = time.monotonic()
        # Every second while the database is away: said when it starts and when it ends.
        outage = Outage("the gateway's refresh of its tables and usage", log)
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self._refresh()
                await self._publish()
                if time.monotonic() - last_flush >= FLUSH_S:
                    last_flush = time.monotonic()
                    await self._flush()
                now = time.monotonic()
                self.suspect = {r: t for r, t in self.suspect.items() if t > now}
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                outage.failed(exc)
            else:
                outage.worked()

    # On-demand models

    async def start_model(self, model: str) -> None:
        """Tell the reconciler an on-demand model is wanted, at most every few seconds."""
        now = time.monotonic()
        if now - self.asked.get(model, 0) < 5:
            return
        self.asked[model] = now
        try:
            await in_a_thread(_model_requested)(model)
        except Exception:  # noqa: BLE001
            log.warning("could not ask for %s to be started", model, exc_info=True)

    def report_unreachable(self, replica_id: str, why: str) -> None:
        """Tell every gateway and the reconciler at once that a replica could not be reached
        (fleet/services.py `replica_unhealthy_mark`), without waiting for it."""

        async def report() -> None:
            try:
                await in_a_thread(_replica_unreachable)(replica_id, why)
            except Exception:  # noqa: BLE001 - the database being away: suspect it here only
                log.warning("could not mark replica %s unhealthy", replica_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(report())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def start_soon(self, model: str) -> None:
        """`start_model` without waiting for it."""
        if time.monotonic() - self.asked.get(model, 0) >= 5:
            task = asyncio.get_running_loop().create_task(self.start_model(model))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def models_json(self, key: Key) -> bytes:
        cached = self._models_json.get(key.models)
        if cached is None:
            names = sorted(self.tables.models if key.models is None else key.models)
            data = []
            for n in names:
                spec = self.tables.models.get(n)
                if spec is None:
                    continue
                entry = {"id": n, "object": "model", "owned_by": "llmgw"}
                if spec.aliases:
                    entry["aliases"] = list(spec.aliases)
                data.append(entry)
            cached = json.dumps({"object": "list", "data": data}).encode()
            self._models_json[key.models] = cached
        return cached


def _replica_unreachable(replica_id: str, why: str) -> None:
    from fleet.services import replica_unhealthy_mark
    from fleet.wake import wake
    from llmgw.core import clock

    if replica_unhealthy_mark(
        replica_id=replica_id, reason=f"the gateway could not reach it: {why}", now=clock.now()
    ):
        wake()


def _model_requested(model: str) -> None:
    from fleet.services import model_requested
    from fleet.wake import wake
    from llmgw.core import clock

    model_requested(name=model, now=clock.now())
    wake()


class Gateway:
    """ASGI: `/v1/…` here, everything else to `inner` (Django)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runtime: Runtime | None = None
        self._starting: asyncio.Future | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (
            scope["path"].startswith("/v1/") or scope["path"] == "/v1"
        ):
            return await self.inner(scope, receive, send)
        rt = self.runtime or await self._start()
        if rt.stopping:
            await _answer(send, 503, SHUTTING_DOWN.body(), SHUTTING_DOWN_HEADERS)
            return
        task = asyncio.current_task()
        rt.requests.add(task)
        try:
            await serve(rt, scope, receive, send)
        finally:
            rt.requests.discard(task)

    async def _start(self) -> Runtime:
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_future()
            rt = Runtime()
            try:
                await rt.start()
            except BaseException as exc:
                self._starting.set_exception(exc)
                self._starting = None
                raise
            self.runtime = rt
            self._starting.set_result(rt)
            return rt
        return await asyncio.shield(self._starting)


async def _answer(send: Send, status: int, body: bytes, headers=JSON_HEADERS) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise _bad("Content-Length is not a number.") from None
            if declared > MAX_BODY_BYTES:
                raise _too_large()
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
        if not message.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _too_large() -> Refused:
    return Refused(
        413,
        f"The request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB.",
        "invalid_request_error",
        "request_too_large",
        reason="bad_request",
    )


def _parse(raw: bytes, endpoint: str) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # arrays nested thousands deep
        raise _bad("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise _bad("The body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required: the name of the model to use.", "missing_model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("'stream' must be true or false.")
    if stream and endpoint == "embedding":
        raise _bad("Embeddings cannot be streamed.")
    return body


async def serve(rt: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer one `/v1/` request, whatever happens: an error is always an OpenAI-style body."""
    started = time.perf_counter()
    path, method = scope["path"], scope["method"]
    req: Request | None = None
    model_series = metrics.series("")
    try:
        key = rt.authenticate(scope["headers"])
        if path == "/v1/models":
            if method != "GET":
                raise Refused(405, "Use GET.", "invalid_request_error", reason="bad_request")
            await _answer(send, 200, rt.models_json(key))
            model_series.answered(200)
            return
        endpoint = ENDPOINTS.get(path)
        if endpoint is None:
            raise Refused(
                404,
                f"Unknown request URL: {method} {path}.",
                "invalid_request_error",
                "unknown_url",
                reason="bad_request",
            )
        if method != "POST":
            raise Refused(
                405, f"Use POST for {path}.", "invalid_request_error", reason="bad_request"
            )
        raw = await _read_body(scope, receive)
        body = _parse(raw, endpoint)
        spec = rt.tables.resolve(body["model"])
        if spec is None or (key.models is not None and spec.name not in key.models):
            # A model the key may not use is as unknown to it as one that does not exist.
            raise Refused(
                404,
                f"The model `{body['model']}` does not exist or you do not have access to it.",
                "invalid_request_error",
                "model_not_found",
                reason="unknown_model",
            )
        options = body.get("stream_options")
        req = Request(
            key=key,
            endpoint=endpoint,
            path=path,
            body=body,
            raw=raw,
            stream=body.get("stream") is True,
            wants_usage=isinstance(options, dict) and options.get("include_usage") is True,
            started=started,
            model=spec.name,
        )
        model_series = metrics.series(spec.name)
        await _admit(rt, req)
        status = await _route(rt, req, receive, send)
        model_series = metrics.series(req.model)
        model_series.answered(status)
    except Refused as refused:
        model_series.failed(refused.reason)
        model_series.answered(refused.status)
        headers = JSON_HEADERS
        if refused.retry_after is not None:
            headers = [*JSON_HEADERS, (b"retry-after", str(refused.retry_after).encode())]
        if req is not None and refused.reason not in ("auth",):
            _record(rt, req, None, error=True)
        await _answer(send, refused.status, refused.body(), headers)
    except ClientGone:
        # Hanging up once the whole answer has passed is no failure: only the close was left.
        if req is not None and req.done:
            model_series = metrics.series(req.model)
            model_series.answered(200)
            _record(rt, req, req.usage, error=False)
        else:
            model_series.failed("client_gone")
            if req is not None:
                _record(rt, req, req.usage, error=True)
    except asyncio.CancelledError:
        if not rt.stopping:
            raise
        # Cut by a server that stopped waiting for it (Runtime.drain): said, and counted.
        asyncio.current_task().uncancel()
        model_series.failed("shutdown")
        if req is not None:
            _record(rt, req, req.usage, error=True)
        with contextlib.suppress(Exception):  # the answer may have begun already
            await _answer(send, 503, SHUTTING_DOWN.body(), SHUTTING_DOWN_HEADERS)
    except Exception:
        # A bug of ours, or something no rule foresaw: still an OpenAI-style answer, counted.
        log.exception("gateway request %s %s failed", method, path)
        model_series.failed("internal")
        model_series.answered(500)
        if req is not None:
            _record(rt, req, req.usage, error=True)
        error = Refused(500, "The gateway failed to answer.", "server_error", reason="internal")
        with contextlib.suppress(Exception):  # the answer may have begun already
            await _answer(send, 500, error.body())
    finally:
        model_series.duration.observe(time.perf_counter() - started)


def _record(rt: Runtime, req: Request, usage: dict | None, *, error: bool) -> None:
    """Usage and token counts for one request, from the engine's own `usage` figures; only
    the first call for a request counts."""
    if req.recorded:
        return
    req.recorded = True
    prompt = completion = 0
    if isinstance(usage, dict):
        prompt = _tokens(usage.get("prompt_tokens"))
        completion = _tokens(usage.get("completion_tokens"))
    elif req.events:
        # A stream that ended before its usage (cut, or the caller hung up): each event
        # passed on carried about a token, and they count against the token limits.
        completion = req.events
    now = time.time()
    rt.usage.record(
        key_id=req.key.id,
        project_id=req.key.project_id,
        model=req.model,
        prompt=prompt,
        completion=completion,
        error=error,
        latency_ms=(time.perf_counter() - req.started) * 1000,
        now=now,
    )
    if prompt or completion:
        s = metrics.series(req.model)
        s.prompt.inc(prompt)
        s.completion.inc(completion)
        _, _, tokens = Limiter.checks(req.key, rt.tables.limits)
        rt.limiter.spent(tokens, prompt + completion, now)


MOST_TOKENS = 100_000_000  # more in one answer is an engine's mistake, not a figure


def _tokens(value: object) -> int:
    """A token count as an engine reported it: a whole number from 0 to MOST_TOKENS, else 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MOST_TOKENS)


async def _admit(rt: Runtime, req: Request) -> None:
    checks, requests, _ = Limiter.checks(req.key, rt.tables.limits)
    if not checks:
        return
    refusal = await rt.limiter.admit(checks, requests, time.time())
    if refusal is None:
        return
    raise Refused(
        429,
        refusal_sentence(refusal, req.key, rt.tables.scope_names),
        "rate_limit_error" if refusal.subject.endswith(":req") else "tokens",
        "rate_limit_exceeded",
        reason="limit",
        retry_after=refusal.retry_after,
    )


class Unreachable(Exception):
    """The replica could not be reached, or hung up before answering: try another.
    `broken`: refused or cut (nothing listens, or the engine died), not merely slow."""

    def __init__(self, message: str, *, broken: bool = True) -> None:
        super().__init__(message)
        self.broken = broken


async def _route(rt: Runtime, req: Request, receive: Receive, send: Send) -> int:
    """Find a replica (waiting for an on-demand one), send the request, pass the answer
    back; a replica that cannot be reached is tried once more elsewhere. The HTTP status
    answered."""
    key_models = req.key.models
    chain = [m for m in rt.chain(req.model) if key_models is None or m in key_models]
    main = asyncio.current_task()
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        main.cancel()

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        while True:
            up = None
            for i, model in enumerate(chain):
                up = rt.pick(model, req.tried)
                if up is not None:
                    # Served by a fallback for now; an on-demand model before it is started.
                    for m in chain[:i]:
                        spec = rt.tables.models.get(m)
                        if spec is not None and spec.on_demand:
                            rt.start_soon(m)
                    break
            if up is None:
                if req.tried:
                    raise Refused(
                        502,
                        f"No replica of {req.model} could be reached.",
                        "api_error",
                        "upstream_unreachable",
                        reason="upstream",
                        retry_after=5,
                    )
                await _wait_for_replica(rt, req, chain)
                continue
            req.model = up.model
            try:
                return await _proxy(rt, req, up, send)
            except Unreachable as exc:
                log.warning("replica %s of %s unreachable: %s", up.replica_id, up.model, exc)
                req.tried.add(up.replica_id)
                if exc.broken and rt.suspect.get(up.replica_id, 0) <= time.monotonic():
                    rt.report_unreachable(up.replica_id, str(exc))
                rt.suspect[up.replica_id] = time.monotonic() + SUSPECT_S
                if len(req.tried) >= 2:
                    req.tried.update(
                        u.replica_id for m in chain for u in rt.tables.upstreams.get(m, ())
                    )
    except asyncio.CancelledError:
        if gone.is_set():
            main.uncancel()  # ours, not the server's: nothing else should see it
            raise ClientGone from None
        raise
    finally:
        watcher.cancel()


async def _wait_for_replica(rt: Runtime, req: Request, chain: list[str]) -> None:
    """Nothing in the chain is ready. An on-demand model in it is asked for and waited on,
    up to the bound; otherwise, or past the bound, a 503 that says why."""
    target = next(
        (m for m in chain if (spec := rt.tables.models.get(m)) is not None and spec.on_demand),
        None,
    )
    if target is None:
        starting = sum(rt.tables.starting.get(m, 0) for m in chain)
        trouble = await _trouble(req.model)
        why = (
            f"it is loading ({starting} replica{'s' if starting != 1 else ''} starting)"
            if starting and trouble is None
            else trouble or "it has no replica running"
        )
        raise Refused(
            503,
            f"Model {req.model} has no ready replica: {why}.",
            "server_error",
            "model_not_ready",
            reason="no_replica",
            retry_after=10 if starting else 30,
        )
    bound = rt.cfg.on_demand_wait
    deadline = req.started + bound
    BOARD.waiting[target] = BOARD.waiting.get(target, 0) + 1
    try:
        while True:
            await rt.start_model(target)
            trouble = await _trouble(target)
            if trouble is not None:
                raise Refused(
                    503,
                    f"Model {target} cannot be started now: {trouble}.",
                    "server_error",
                    "model_not_ready",
                    reason="no_replica",
                    retry_after=30,
                )
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise Refused(
                    503,
                    f"Model {target} is loading: no replica was ready within {bound:g} s. "
                    "Try again shortly.",
                    "server_error",
                    "model_loading",
                    reason="loading",
                    retry_after=10,
                )
            changed = rt.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(remaining, 2.0))
            if any(rt.tables.upstreams.get(m) for m in chain):
                return
    finally:
        BOARD.waiting[target] -= 1


_troubles: dict[str, tuple[float, str | None]] = {}


async def _trouble(model: str) -> str | None:
    """The reconciler's reason a model is not coming, read at most every 2 s per model."""
    from fleet.selectors import on_demand_trouble

    now = time.monotonic()
    cached = _troubles.get(model)
    if cached is not None and now - cached[0] < 2:
        return cached[1]
    _troubles[model] = (now, cached[1] if cached else None)  # one query at a time per model
    try:
        found = await asyncio.wait_for(in_a_thread(on_demand_trouble)(model), 2)
    except Exception:  # noqa: BLE001 - the database being away is not a reason to refuse
        found = None
    _troubles[model] = (time.monotonic(), found)
    return found


async def _proxy(rt: Runtime, req: Request, up: Upstream, send: Send) -> int:
    body = req.raw
    if req.body["model"] != up.model or (req.stream and not req.wants_usage):
        changed = dict(req.body, model=up.model)
        if req.stream and not req.wants_usage:
            options = changed.get("stream_options")
            changed["stream_options"] = dict(
                options if isinstance(options, dict) else {}, include_usage=True
            )
        body = json.dumps(changed).encode()
    headers = {"Authorization": up.authorization, "Content-Type": "application/json"}
    rid, model = up.replica_id, up.model
    rt.inflight[rid] = rt.inflight.get(rid, 0) + 1
    BOARD.running[model] = BOARD.running.get(model, 0) + 1
    rt.usage.used.add(rid)
    try:
        try:
            resp = await rt.session.post(up.url + req.path, data=body, headers=headers)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise Unreachable(
                str(exc) or type(exc).__name__, broken=not isinstance(exc, TimeoutError)
            ) from None
        except (aiohttp.ClientError, ValueError) as exc:
            log.error("replica %s of %s answered what is not HTTP: %s", rid, model, exc)
            raise Refused(
                502,
                f"The replica serving {model} gave an answer that is not HTTP.",
                "api_error",
                "upstream_invalid",
                reason="upstream",
            ) from None
        try:
            kind = resp.headers.get("Content-Type", "")
            if req.stream and resp.status == 200 and kind.startswith("text/event-stream"):
                return await _stream(rt, req, resp, send)
            return await _whole(rt, req, resp, kind, send)
        finally:
            resp.close()
    finally:
        rt.inflight[rid] -= 1
        BOARD.running[model] -= 1


_DECODER = json.JSONDecoder()


def _usage_in(data: bytes) -> dict | None:
    """The `usage` object of a JSON answer, found from the end without parsing the rest
    (an embeddings answer can be megabytes of numbers)."""
    at = data.rfind(b'"usage"')
    if at < 0:
        return None
    brace = data.find(b"{", at)
    if brace < 0:
        return None
    try:
        value, _ = _DECODER.raw_decode(data[brace:].decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


async def _whole(rt: Runtime, req: Request, resp, kind: str, send: Send) -> int:
    chunks, size = [], 0
    try:
        async for chunk in resp.content.iter_any():
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise Refused(
                    502,
                    f"The replica serving {req.model} answered more than "
                    f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB.",
                    "api_error",
                    "upstream_too_large",
                    reason="upstream",
                )
            chunks.append(chunk)
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Nothing has reached the caller yet: another replica can still answer.
        raise Unreachable(
            f"cut before answering in full: {exc or type(exc).__name__}",
            broken=not isinstance(exc, TimeoutError),
        ) from None
    data = b"".join(chunks)
    status = resp.status
    if status in (401, 403):
        # The engine refused the gateway's own key: ours to fix, not the caller's.
        log.error("replica of %s refused the engine key (HTTP %d)", req.model, status)
        raise Refused(
            502,
            f"The replica serving {req.model} refused the gateway.",
            "api_error",
            "upstream_refused",
            reason="upstream_status",
        )
    error = status >= 400
    if error:
        metrics.series(req.model).failed("upstream_status")
    _record(rt, req, _usage_in(data) if status == 200 else None, error=error)
    content_type = (kind or "application/json").encode("latin-1", "replace")
    await _answer(send, status, data, [(b"content-type", content_type)])
    return status


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def split_events(data: bytes, drop_usage: bool) -> tuple[bytes, bytes, dict | None]:
    """Complete server-sent events in `data`: the bytes to pass on, the incomplete rest, and
    the engine's usage figures if an event carried them. The usage-only event the gateway
    asked for on the caller's behalf is left out when the caller did not ask for it.
    Events end with a blank line, written with LF, CRLF or CR as the SSE format allows."""
    last = None
    for last in _EVENT_END.finditer(data):  # noqa: B007 - the last one is the one wanted
        pass
    if last is None:
        # No event ends here; a very long one is passed on as it is rather than held.
        return (data, b"", None) if len(data) > 65536 else (b"", data, None)
    whole, rest = data[: last.end()], data[last.end() :]
    if b'"usage"' not in whole:
        return whole, rest, None
    usage = None
    kept = []
    at = 0
    for end in _EVENT_END.finditer(whole):
        event, at = whole[at : end.start()], end.end()
        if b'"usage"' in event and b'"usage":null' not in event and b'"usage": null' not in event:
            payload = event.partition(b"data:")[2].strip()
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                usage = obj["usage"]
                if drop_usage and not obj.get("choices"):
                    continue
        kept.append(event + end.group())
    return b"".join(kept), rest, usage


STREAM_CUT = (
    b'data: {"error": {"message": "The replica serving this stream went away mid-way.", '
    b'"type": "server_error", "param": null, "code": "upstream_cut"}}\n\n'
)
SHUTDOWN_CUT = (
    b'data: {"error": {"message": "This llmgw server stopped before the stream ended '
    b'(LLMGW_SHUTDOWN_GRACE_SECONDS ran out); retry it.", "type": "server_error", '
    b'"param": null, "code": "server_shutdown"}}\n\n'
)
SHUTTING_DOWN = Refused(
    503,
    "This llmgw server is stopping; retry the request (another server takes it).",
    "server_error",
    "server_shutdown",
    reason="shutdown",
    retry_after=1,
)
# Its headers: retry at once, on another connection (so, behind a balancer, another server).
SHUTTING_DOWN_HEADERS = [
    *JSON_HEADERS,
    (b"retry-after", str(SHUTTING_DOWN.retry_after).encode()),
    (b"connection", b"close"),
]


async def _stream(rt: Runtime, req: Request, resp, send: Send) -> int:
    """Pass the events on as they arrive; a stream cut upstream ends with an error event."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    series = metrics.series(req.model)
    drop = not req.wants_usage
    rest, usage, first, cut, stopped = b"", None, True, False, False
    try:
        async for chunk in resp.content.iter_any():
            if first:
                series.first_token.observe(time.perf_counter() - req.started)
                first = False
            out, rest, found = split_events(rest + chunk if rest else chunk, drop)
            if found is not None:
                usage = req.usage = found
            if out:
                if b"data: [DONE]" in out:
                    req.done = True
                req.events += out.count(b"data:")
                await send({"type": "http.response.body", "body": out, "more_body": True})
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("stream from a replica of %s cut: %s", req.model, exc)
        cut = True
    except asyncio.CancelledError:
        if not rt.stopping:
            raise
        # The server stopped waiting for it: ended with an error event, its usage written.
        asyncio.current_task().uncancel()
        cut = stopped = True
    if not req.done and not cut:
        log.warning("stream from a replica of %s ended before [DONE]", req.model)
        cut = True
    # Half an event is not passed on: the error must arrive as an event of its own.
    tail = (SHUTDOWN_CUT if stopped else STREAM_CUT) if cut else rest
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    if cut:
        series.failed("stream_cut")
    _record(rt, req, usage, error=cut)
    return 200
