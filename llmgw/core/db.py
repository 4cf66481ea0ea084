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

import time
import weakref
from concurrent.futures import ThreadPoolExecutor

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
        # When this connection (the driver's object) was first seen open.
        if getattr(conn, "_llmgw_kept", None) is not conn.connection:
            conn._llmgw_kept, conn._llmgw_since = conn.connection, now
        conn.close_at = conn._llmgw_since + KEEP_S
        conn.close_if_unusable_or_obsolete()


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


def kept_connections_close() -> None:
    """Close the connections `database_call` kept, each on the thread that keeps it; from
    sync code (a test's end: no connection may keep the test database from being dropped)."""
    for executor in (SyncToAsync.single_thread_executor, *_executors):
        executor.submit(connections.close_all).result()
