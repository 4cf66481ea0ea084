"""Production mode: limits and the gateway's load shared through a real Redis.

Skipped, saying so, where REDIS_URL is not set; CI sets it.
"""

from __future__ import annotations

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


async def test_two_gateway_processes_share_one_limit():
    key = Key(int(uuid.uuid4().int % 10**9), "ci", "llmgw_key_x", 1, ("project:1",), None, 2, None)
    checks, requests, _ = Limiter.checks(key, {})
    first, second = Limiter(RedisCounters(URL)), Limiter(RedisCounters(URL))
    now = 3_000_030.0
    assert await first.admit(checks, requests, now) is None
    await _settled(first)
    assert await second.admit(checks, requests, now) is None
    await _settled(second)
    refusal = await first.admit(checks, requests, now + 1)
    assert refusal is not None and refusal.retry_after >= 1


async def _settled(limiter: Limiter) -> None:
    """The background adds have reached Redis."""
    import asyncio

    pending = list(limiter.counters._pending)
    if pending:
        await asyncio.gather(*pending)


async def test_limits_are_not_enforced_while_redis_is_away():
    key = Key(1, "ci", "llmgw_key_x", 1, ("project:1",), None, 1, None)
    checks, requests, _ = Limiter.checks(key, {})
    limiter = Limiter(RedisCounters("redis://127.0.0.1:1/0"))
    assert await limiter.admit(checks, requests, 1000.0) is None
    assert await limiter.admit(checks, requests, 1001.0) is None


def test_the_reconciler_sums_what_every_gateway_process_published(settings, clean_redis):
    settings.LLMGW = replace(settings.LLMGW, redis_url=URL)
    publish(clean_redis, {"chat": (2, 1)})
    clean_redis.set(REDIS_PREFIX + "other:1", '{"chat": [3, 0], "code": [0, 4]}', ex=10)
    BOARD.running["chat"] = 99  # this process's own board is not what production reads

    assert gateway_loads() == {"chat": (5, 1), "code": (0, 4)}


def test_unreachable_redis_is_unknown_load_not_none_running(settings):
    settings.LLMGW = replace(settings.LLMGW, redis_url="redis://127.0.0.1:1/0")
    assert gateway_loads() is None
