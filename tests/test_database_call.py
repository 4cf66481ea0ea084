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


async def test_calls_made_while_a_batch_runs_go_together_as_the_next():
    batches = []
    first_running = asyncio.Event()
    loop = asyncio.get_running_loop()
    gate = asyncio.Event()

    def many(items):
        batches.append(list(items))
        if len(batches) == 1:
            loop.call_soon_threadsafe(first_running.set)
            asyncio.run_coroutine_threadsafe(gate.wait(), loop).result(5)
        return [item * 10 for item in items]

    batched = db.Batched(many, most=3)
    first = asyncio.ensure_future(batched(1))
    await first_running.wait()
    rest = [asyncio.ensure_future(batched(n)) for n in range(2, 7)]
    await asyncio.sleep(0)
    gate.set()

    assert [await first, *[await r for r in rest]] == [10, 20, 30, 40, 50, 60]
    assert batches == [[1], [2, 3, 4], [5, 6]]  # at most 3 a batch


async def test_an_exception_among_a_batchs_answers_is_its_callers_alone():
    def many(items):
        return [ValueError(f"no {i}") if i == 2 else i for i in items]

    batched = db.Batched(many, most=10)
    answers = await asyncio.gather(*(batched(n) for n in (1, 2, 3)), return_exceptions=True)

    assert answers[0] == 1 and answers[2] == 3
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "no 2"


async def test_a_call_no_longer_wanted_when_its_turn_comes_is_not_run():
    ran = []
    wanted = {"gone": False}

    def many(items):
        ran.extend(items)
        return items

    batched = db.Batched(many, most=10)
    kept = batched("kept")
    gone = batched("gone", still_wanted=lambda: not wanted["gone"])
    wanted["gone"] = True  # the caller hung up before the batch was taken
    answers = await asyncio.gather(kept, gone, return_exceptions=True)

    assert answers[0] == "kept" and isinstance(answers[1], db.Abandoned)
    assert ran == ["kept"]
