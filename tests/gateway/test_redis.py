"""Production mode: limits and the gateway's load shared through a real Redis.

Skipped, saying so, where REDIS_URL is not set; CI sets it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import replace

import pytest
import redis

from llmgw.gateway.limits import Limiter, RedisCounters
from llmgw.gateway.load import BOARD, REDIS_PREFIX, gateway_loads, publish
from llmgw.gateway.tables import Key

URL = os.environ.get("REDIS_URL")
pytestmark = pytest.mark.skipif(not URL, reason="REDIS_URL is not set: no Redis to test against")


@pytest.fixture
def clean_redis():
    client = redis.Redis.from_url(URL)
    yield client
    for k in client.scan_iter(match=REDIS_PREFIX + "*"):
        client.delete(k)
    client.close()


def a_key(rpm=None, tpm=None) -> Key:
    # An id of its own: counts an earlier run left in Redis are not this test's.
    return Key(
        int(uuid.uuid4().int % 10**9), "ci", "llmgw_key_x", 1, ("project:1",), None, rpm, tpm
    )


async def test_two_gateway_processes_share_one_limit():
    checks = Limiter.checks(a_key(rpm=2), {}, tokens=40)
    first, second = Limiter(RedisCounters(URL)), Limiter(RedisCounters(URL))
    now = 3_000_030.0
    assert (await first.admit(checks, now))[0] is None
    assert (await second.admit(checks, now))[0] is None
    refusal, _ = await first.admit(checks, now + 1)
    assert refusal is not None and refusal.retry_after >= 1


async def test_a_burst_through_two_processes_stays_within_the_token_limit():
    # 10 requests at once through each of two gateway processes, each reserving 40 tokens
    # of a key's 100 a minute: each INCRBY answers a count holding the others' reservations.
    key = a_key(tpm=100)
    checks = Limiter.checks(key, {}, tokens=40)
    first, second = Limiter(RedisCounters(URL)), Limiter(RedisCounters(URL))
    now = 3_000_030.0
    answers = await asyncio.gather(
        *(limiter.admit(checks, now) for limiter in (first, second) for _ in range(10))
    )
    assert sum(refusal is None for refusal, _ in answers) == 2
    for limiter in (first, second):
        await _settled(limiter)
    # The refused gave back what they took: the two admitted hold 80.
    assert await first.counters.take([(f"key:{key.id}:tok", 0)], now) == [(0, 80)]


async def test_what_a_request_did_not_use_is_given_back_in_redis():
    key = a_key(tpm=100)
    checks = Limiter.checks(key, {}, tokens=60)
    limiter = Limiter(RedisCounters(URL))
    now = 3_000_030.0
    refusal, held = await limiter.admit(checks, now)
    assert refusal is None
    assert (await limiter.admit(checks, now))[0] is not None
    limiter.settle(held, 15, now)
    await _settled(limiter)
    assert (await limiter.admit(checks, now + 1))[0] is None
    await _settled(limiter)
    assert await limiter.counters.take([(f"key:{key.id}:tok", 0)], now) == [(0, 75)]


async def _settled(limiter: Limiter) -> None:
    """The background adds have reached Redis."""
    pending = list(limiter.counters._pending)
    if pending:
        await asyncio.gather(*pending)


async def test_limits_are_not_enforced_while_redis_is_away():
    key = Key(1, "ci", "llmgw_key_x", 1, ("project:1",), None, 1, 10)
    checks = Limiter.checks(key, {}, tokens=40)
    limiter = Limiter(RedisCounters("redis://127.0.0.1:1/0"))
    assert await limiter.admit(checks, 1000.0) == (None, [])
    assert await limiter.admit(checks, 1001.0) == (None, [])


def test_the_reconciler_sums_what_every_gateway_process_published(settings, clean_redis):
    settings.LLMGW = replace(settings.LLMGW, redis_url=URL)
    publish(clean_redis, {"chat": (2, 1)})
    clean_redis.set(REDIS_PREFIX + "other:1", '{"chat": [3, 0], "code": [0, 4]}', ex=10)
    BOARD.running["chat"] = 99  # this process's own board is not what production reads

    assert gateway_loads() == {"chat": (5, 1), "code": (0, 4)}


def test_unreachable_redis_is_unknown_load_not_none_running(settings):
    settings.LLMGW = replace(settings.LLMGW, redis_url="redis://127.0.0.1:1/0")
    assert gateway_loads() is None


async def test_a_one_request_a_minute_key_waits_at_most_a_minute_through_redis():
    checks = Limiter.checks(a_key(rpm=1), {}, tokens=1)
    first, second = Limiter(RedisCounters(URL)), Limiter(RedisCounters(URL))
    now = 3_000_021.0
    assert (await first.admit(checks, now))[0] is None
    await _settled(first)
    refusal, _ = await second.admit(checks, now + 1)
    assert refusal is not None and 1 <= refusal.retry_after <= 59
    await _settled(second)
    assert (await second.admit(checks, now + 1 + refusal.retry_after))[0] is None
