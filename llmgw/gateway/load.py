"""Requests running and waiting at the gateway, per model: the autoscaler's view of demand.

Each gateway process counts its own on the event loop (`Board`). Embedded, the
reconciler runs in the same process and reads that board. In production each
process publishes its counts to Redis about once a second, under a key of its
own that expires when the process does, and the reconciler (a Celery worker)
sums them (`gateway_loads`).
"""

from __future__ import annotations

import json
import logging
import os
import socket

log = logging.getLogger("llmgw.gateway")

REDIS_PREFIX = "llmgw:gateway:load:"
REDIS_TTL_S = 10


class Board:
    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.waiting: dict[str, int] = {}

    def counts(self) -> dict[str, tuple[int, int]]:
        """model -> (running, waiting), for every model the gateway has served."""
        models = self.running.keys() | self.waiting.keys()
        return {m: (self.running.get(m, 0), self.waiting.get(m, 0)) for m in models}


BOARD = Board()  # this process's; the embedded reconciler reads it
INSTANCE = f"{socket.gethostname()}:{os.getpid()}"


def publish(client, counts: dict[str, tuple[int, int]]) -> None:
    """Write this process's counts to Redis (a sync client; called from a worker thread)."""
    client.set(REDIS_PREFIX + INSTANCE, json.dumps(counts), ex=REDIS_TTL_S)


def gateway_loads() -> dict[str, tuple[int, int]] | None:
    """model -> (running, waiting) summed over every gateway process; None when unknown
    (Redis unreachable), which the autoscaler must not read as quiet."""
    from django.conf import settings

    url = settings.LLMGW.redis_url
    if url is None:
        return BOARD.counts()
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=2)
        keys = list(client.scan_iter(match=REDIS_PREFIX + "*", count=1000))
        values = client.mget(keys) if keys else []
    except redis.RedisError as exc:
        log.warning("could not read the gateway's load from Redis: %s", exc)
        return None
    total: dict[str, tuple[int, int]] = {}
    for raw in values:
        try:
            counts = json.loads(raw) if raw else {}
        except ValueError:
            continue
        for model, pair in counts.items():
            r, w = total.get(model, (0, 0))
            total[model] = (r + int(pair[0]), w + int(pair[1]))
    return total
