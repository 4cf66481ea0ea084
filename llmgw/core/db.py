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

import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import SyncToAsync
from django.db import connections

KEEP_S = 60.0
# The threads of their own some calls run on (`database_call(..., executor=)`).
_executors: weakref.WeakSet[ThreadPoolExecutor] = weakref.WeakSet()
# (thread, alias) -> (the connection object's id, when this thread first saw it open).
_opened: dict[tuple[int, str], tuple[int, float]] = {}


def _close_if_done() -> None:
    now = time.monotonic()
    thread = threading.get_ident()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        key = (thread, conn.alias)
        seen = _opened.get(key)
        if seen is None or seen[0] != id(conn.connection):
            seen = _opened[key] = (id(conn.connection), now)
        conn.close_at = seen[1] + KEEP_S
        conn.close_if_unusable_or_obsolete()
        if conn.connection is None:
            del _opened[key]


class _KeptConnection(SyncToAsync):
    def thread_handler(self, loop, *args, **kwargs):
        _close_if_done()
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            _close_if_done()


def database_call(fn, *, executor: ThreadPoolExecutor | None = None):
    """`fn` made awaitable, run on the thread-sensitive thread with its connection kept; or
    on `executor`'s one thread, for work that must not wait behind that thread's queue."""
    if executor is None:
        return _KeptConnection(fn, thread_sensitive=True)
    _executors.add(executor)
    return _KeptConnection(fn, thread_sensitive=False, executor=executor)


def _close_all() -> None:
    connections.close_all()
    thread = threading.get_ident()
    for key in [k for k in _opened if k[0] == thread]:
        del _opened[key]


async def database_close() -> None:
    """Close the connections `database_call` kept (a server stopping, a test's end)."""
    await SyncToAsync(_close_all, thread_sensitive=True)()
    for executor in list(_executors):
        await SyncToAsync(_close_all, thread_sensitive=False, executor=executor)()
