"""The gateway's ASGI app: `/v1/` answered here, everything else passed to Django.

One request: find the key (a dict lookup on its keyed hash), read and check the
body, find the model by name or alias, check the limits, pick a ready replica
(the one holding the prompt's prefix unless it is too busy, else the least in flight
for its weight: `prefixes`), send the body on with the replica's engine
key, and pass the answer back, streamed as it arrives. Usage, load and metrics
are counted in memory. Nothing here touches the database; `Runtime`'s
background task refreshes the tables and writes the batches.

The request path, top down: `requests.serve`, `routing`, `upstream`, `streaming`;
`state` holds what they read of the process and of one request, `answers` the errors
and headers they answer with; `adapters` routes a LoRA adapter to its base's replicas
holding it, asking one to load it when none does (docs/adapters.md).
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings
from django.db import connection

from llmgw.core.outage import Outage
from llmgw.gateway import adapters, metrics
from llmgw.gateway.answers import (
    MAX_BODY_BYTES,
    SHUTTING_DOWN,
    SHUTTING_DOWN_HEADERS,
    Receive,
    Scope,
    Send,
    request_id,
    send_answer,
    with_id,
)
from llmgw.gateway.cors import cors
from llmgw.gateway.journal import Journal
from llmgw.gateway.load import BOARD, publish
from llmgw.gateway.requests import serve
from llmgw.gateway.state import State, in_a_thread
from llmgw.gateway.tables import Loader
from llmgw.gateway.upstream import open_pool
from llmgw.gateway.usage import usage_write

# The tests read MAX_BODY_BYTES here, beside the Gateway they send a body too large.
__all__ = ["MAX_BODY_BYTES", "Gateway", "Runtime"]

log = logging.getLogger("llmgw.gateway")

REFRESH_S = 1.0  # how often the tables' fingerprints are checked
# At most this often, a key the tables do not hold has them read again (State.key_of).
MISS_REFRESH_S = 0.25
FLUSH_S = 2.0  # how often usage is written
READINGS_S = 2.0  # how often the engines' readings are read (agents report every few seconds)


class Runtime(State):
    """The gateway in one process: its `State`, and the background task that refreshes the
    tables and writes usage, started, drained and closed here. Made on the first request,
    on the loop that serves it."""

    def __init__(self, journal: Journal | None = None) -> None:
        super().__init__(journal)
        self.loader = Loader()
        self._task: asyncio.Task | None = None
        self._redis = None
        self.requests: set[asyncio.Task] = set()  # the /v1/ requests being answered (drain)
        self._reading = asyncio.Lock()  # one refresh at a time: the loader is not shared
        self._missed: asyncio.Task | None = None  # the refresh the unknown keys wait for
        self._missed_at = float("-inf")
        self._writing = False  # a batch of usage is being written (`_flush`)
        self.usage.keep_records = settings.LLMGW.requests_keep_hours > 0

    async def start(self) -> None:
        self.session = open_pool()
        await self._refresh()
        self._task = asyncio.get_running_loop().create_task(self._background())

    def flush_now(self) -> None:
        """Write what usage is tallied from a thread of its own, waiting up to 10 s: for a
        server going down, whose loop will not run the background task again. Its journal
        is then removed, unless a request is left in flight (journal.py): the next start
        settles what it holds. While a batch is still being written, whose fate this loop
        will not hear, nothing more is: the journal is kept, and the next start adds what
        the database does not hold, exactly."""
        import threading

        from llmgw.core import clock
        from tenancy.services.usage import usage_journal_forget

        if self._writing and self.usage.journal is not None:
            self.usage.close(written=False)
            return
        tallies, used = self.usage.take()
        records = self.usage.records_take()
        batch, name, now = self.usage.batch, self.usage.journal_name, clock.now()

        def write() -> None:
            try:
                if tallies or used or records:
                    usage_write(
                        tallies=tallies,
                        used=used,
                        now=now,
                        journal=name,
                        batch=batch,
                        records=records,
                    )
                gone = self.usage.close(written=True)
                if gone is not None:
                    usage_journal_forget(name=gone)
            except Exception:  # noqa: BLE001 - the journal keeps it for the next start
                log.warning("could not write the last usage; its journal keeps it", exc_info=True)
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

    async def refreshed(self) -> None:
        """Read the tables again for a key they do not hold: every miss meanwhile waits for
        the same read, and reads come at most every MISS_REFRESH_S, so wrong keys cannot
        make the database work harder than that."""
        if self._missed is None:
            self._missed = asyncio.get_running_loop().create_task(self._refresh_missed())
        await asyncio.shield(self._missed)

    async def _refresh_missed(self) -> None:
        try:
            wait = self._missed_at + MISS_REFRESH_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._missed_at = time.monotonic()
            await self._refresh()
        finally:
            self._missed = None

    async def _refresh(self) -> None:
        async with self._reading:
            await self._read()

    async def _read(self) -> None:
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

    async def _read_readings(self) -> None:
        """What the ready replicas' engines last said, as their agents reported it; none
        read while no model has a ready replica. A failed read keeps the last: it is a
        guide to routing, not a condition of it."""
        if not self.tables.upstreams:
            self.readings_read({})
            return
        from fleet.selectors.routing import replica_readings

        try:
            self.readings_read(await in_a_thread(replica_readings)())
        except Exception:  # noqa: BLE001 - the database being away: route on what we have
            log.warning("could not read the engines' readings; keeping the last", exc_info=True)

    async def _flush(self) -> None:
        tallies, used = self.usage.take()
        records = self.usage.records_take()
        if not tallies and not used and not records:
            return
        from llmgw.core import clock

        batch, name = self.usage.batch, self.usage.journal_name
        self._writing = True
        try:
            await in_a_thread(usage_write)(
                tallies=tallies,
                used=used,
                now=clock.now(),
                journal=name,
                batch=batch,
                records=records,
            )
        except Exception:  # noqa: BLE001
            log.warning("could not write usage; keeping it for the next try", exc_info=True)
            self.usage.give_back(tallies, used, records)
            return
        finally:
            self._writing = False
        self.usage.written(batch)

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
        last_flush = last_readings = time.monotonic()
        # Every second while the database is away: said when it starts and when it ends.
        outage = Outage("the gateway's refresh of its tables and usage", log)
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                self.usage.progress()
                await self._refresh()
                await self._publish()
                if time.monotonic() - last_readings >= READINGS_S:
                    last_readings = time.monotonic()
                    await self._read_readings()
                if time.monotonic() - last_flush >= FLUSH_S:
                    last_flush = time.monotonic()
                    await self._flush()
                now = time.monotonic()
                self.suspect = {r: t for r, t in self.suspect.items() if t > now}
                adapters.forget_gone(self)
                self.session.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001
                outage.failed(exc)
            else:
                outage.worked()


class Gateway:
    """ASGI: `/v1/…` here, everything else to `inner` (Django)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.runtime: Runtime | None = None
        # The process's usage journal, which `llmgw serve` opens (journal.py); none in tests
        # and wherever else the app runs.
        self.journal: Journal | None = None
        self._starting: asyncio.Future | None = None
        from django.conf import settings

        self.cors_origins = settings.LLMGW.cors_origins  # LLMGW_CORS_ORIGINS (cors.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (
            scope["path"].startswith("/v1/") or scope["path"] == "/v1"
        ):
            return await self.inner(scope, receive, send)
        if self.cors_origins:
            return await cors(self.cors_origins, scope, receive, send, self._v1)
        await self._v1(scope, receive, send)

    async def _v1(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt = self.runtime or await self._start()
        if rt.stopping:
            rid = request_id(scope["headers"])
            await send_answer(
                with_id(send, rid), 503, SHUTTING_DOWN.body(rid), SHUTTING_DOWN_HEADERS
            )
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
            rt = Runtime(self.journal)
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
