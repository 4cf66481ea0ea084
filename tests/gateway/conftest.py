import os

import pytest
from asgiref.sync import sync_to_async

from llmgw.gateway.app import Gateway
from tests.gateway.world import World, _tenancy, django_inner


@pytest.fixture(autouse=True)
def _no_counts_from_before():
    """Limit counts left in Redis by an earlier run must not count against this one's keys,
    whose ids a fresh test database hands out again."""
    url = os.environ.get("REDIS_URL")
    if url:
        import redis

        client = redis.Redis.from_url(url)
        for k in client.scan_iter(match="llmgw:rl:*"):
            client.delete(k)
        client.close()
    yield


@pytest.fixture
async def world():
    w = World()
    await sync_to_async(_tenancy)()
    yield w
    await w.close()


@pytest.fixture
async def gateway():
    g = Gateway(django_inner)
    yield g
    if g.runtime is not None:
        await g.runtime.close()
