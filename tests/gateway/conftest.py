import os

import pytest


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
