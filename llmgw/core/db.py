"""The database from async code: on one thread, its connection kept between calls.

channels' `database_sync_to_async` closes the thread's connections before and after every
call (CONN_MAX_AGE is 0, as Django asks under ASGI), so every agent frame that touched the
database opened a connection of its own: on SQLite, opening and closing it was 1.5 ms of a
registration's 4.5; on PostgreSQL it is a TCP handshake and a login. The calls made with
`database_call` all run on asgiref's one thread-sensitive thread, so one connection serves
them: kept `KEEP_S`, closed at once when an error left it unusable or a call left its
autocommit changed, as `close_old_connections` would have. Work that must not wait in
that thread's queue (the heartbeats' writes, behind a whole fleet's registrations) has a
thread of its own (`executor=`), with its own kept connection.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from django.db import connections

KEEP_S = 60.0
# The threads of their own some calls run on (`database_call(..., executor=)`).
_executors: weakref.WeakSet[ThreadPoolExecutor] = weakref.WeakSet()


def _close_if_done() -> None:
    """This thread's connections closed when `close_old_connections` would (an error left
    one unusable, autocommit left changed), or once open for KEEP_S."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        # When this connection (the driver's object) was first seen open, kept on Django's
        # wrapper under names of our own (Any: its class does not declare them).
        marked: Any = conn
        if getattr(marked, "_llmgw_kept", None) is not conn.connection:
            marked._llmgw_kept, marked._llmgw_since = conn.connection, now
        conn.close_at = marked._llmgw_since + KEEP_S
        conn.close_if_unusable_or_obsolete()


class _KeptConnection(SyncToAsync):
    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        _close_if_done()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            _close_if_done()


def database_call(
    fn: Callable[..., Any], *, executor: ThreadPoolExecutor | None = None
) -> SyncToAsync:
    """`fn` made awaitable, run on the thread-sensitive thread with its connection kept; or
    on `executor`'s one thread, for work that must not wait behind that thread's queue."""
    if executor is None:
        return _KeptConnection(fn, thread_sensitive=True)
    _executors.add(executor)
    return _KeptConnection(fn, thread_sensitive=False, executor=executor)


def kept_connections_close() -> None:
    """Close the connections `database_call` kept, each on the thread that keeps it; from
    sync code (a test's end: no connection may keep the test database from being dropped)."""
    for executor in (SyncToAsync.single_thread_executor, *_executors):
        executor.submit(connections.close_all).result()


class Abandoned(Exception):
    """A batched call's caller went away before its turn came: it was never run."""


class Batched:
    """Calls of one function gathered into batches: while one batch runs on the database
    thread, the calls that come meanwhile wait, and go together as the next. Each caller
    awaits its own answer. A fleet registering at once (a restart) then pays the thread's
    hand-off, the transaction and the reads it shares once a batch instead of once a node.

    `many(items)` runs on the thread `database_call` gives it and returns one answer per
    item, in order; an exception among them is raised to that item's caller only. A call
    whose `still_wanted()` says no when its turn comes (its agent hung up while it
    waited) is not run: its caller gets Abandoned, and no work is done for nobody."""

    def __init__(
        self, many: Callable[[list], list], *, most: int, executor: ThreadPoolExecutor | None = None
    ) -> None:
        self._call = database_call(many, executor=executor)
        self._most = most
        self._waiting: deque[tuple[object, asyncio.Future, Callable[[], bool]]] = deque()
        self._draining: asyncio.Task | None = None

    async def __call__(
        self, item: object, *, still_wanted: Callable[[], bool] = lambda: True
    ) -> Any:
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append((item, answer, still_wanted))
        draining = self._draining
        if draining is None or draining.done() or draining.get_loop() is not answer.get_loop():
            self._draining = asyncio.create_task(self._drain())
        return await answer

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch = self._take()
                if not batch:
                    continue
                try:
                    answers = await self._call([item for item, _, _ in batch])
                except asyncio.CancelledError:
                    for _, answer, _ in batch:
                        answer.cancel()
                    raise
                except Exception as exc:
                    answers = [exc] * len(batch)
                for (_, answer, _), given in zip(batch, answers, strict=True):
                    if answer.done():
                        continue
                    if isinstance(given, BaseException):
                        answer.set_exception(given)
                    else:
                        answer.set_result(given)
        finally:
            if self._draining is asyncio.current_task():
                self._draining = None

    def _take(self) -> list:
        batch: list = []
        while self._waiting and len(batch) < self._most:
            entry = self._waiting.popleft()
            answer, still_wanted = entry[1], entry[2]
            if answer.done() or answer.get_loop() is not asyncio.get_running_loop():
                continue  # its caller was cancelled, or its loop ended (a test's)
            if not still_wanted():
                answer.set_exception(Abandoned())
                continue
            batch.append(entry)
        return batch
