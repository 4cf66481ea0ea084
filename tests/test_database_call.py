"""`database_call`: the agents' database calls share one kept connection, closed when it
is old or a call left it in a state it cannot be trusted in."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction

from llmgw.core import db
from llmgw.core.db import database_call, kept_connections_close

pytestmark = pytest.mark.django_db(transaction=True)


def _which() -> object:
    """The connection this call ran on (the driver's object), after one query."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return connection.connection


def _leave_autocommit_off() -> None:
    transaction.set_autocommit(False)


def _is_open() -> bool:
    return connection.connection is not None


async def test_calls_share_one_connection_and_a_close_ends_it():
    first = await database_call(_which)()
    assert await database_call(_which)() is first
    await asyncio.to_thread(kept_connections_close)
    assert not await database_call(_is_open)()


async def test_a_call_that_leaves_autocommit_off_has_its_connection_closed():
    await database_call(_which)()
    await database_call(_leave_autocommit_off)()
    # Closed after that call, as close_old_connections would: the next opens a new one.
    assert not await database_call(_is_open)()
    await asyncio.to_thread(kept_connections_close)


async def test_a_connection_older_than_it_may_be_kept_is_closed(monkeypatch):
    await database_call(_which)()
    monkeypatch.setattr(db, "KEEP_S", 0.0)
    assert not await database_call(_is_open)()
    await asyncio.to_thread(kept_connections_close)


async def test_a_call_on_a_thread_of_its_own_keeps_that_threads_connection():
    own = ThreadPoolExecutor(max_workers=1)
    first = await database_call(_which, executor=own)()
    assert await database_call(_which, executor=own)() is first
    assert await database_call(_which)() is not first  # the other thread's own
    await asyncio.to_thread(kept_connections_close)
    assert not await database_call(_is_open, executor=own)()
