"""A replica the gateway cannot reach leaves every gateway's routing at once, and the
reconciler hears of it (fleet/services.py `replica_unhealthy_mark`)."""

from __future__ import annotations

import asyncio

import pytest

from fleet.models import Replica
from llmgw.gateway.tables import Loader
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.test_app import add, chat, client, new_key
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_replica_refusing_connections_is_marked_for_every_gateway_and_the_reconciler(
    world,  # noqa: F811
    gateway,
):
    await add(model_added, gpu_model("llama", scaling={"min": 2, "max": 2}))
    await add(_replica, "llama-1", "llama", "http://127.0.0.1:9")  # nothing listens there
    await add(_replica, "llama-2", "llama", await world.engine("llama-2", "llama"))
    secret = await new_key()
    # Another server's gateway, routing to both.
    other = Loader()
    await add(other.refresh)
    assert [u.replica_id for u in other.tables.upstreams["llama"]] == ["llama-1", "llama-2"]

    ids = []
    async with client(gateway, secret) as c:
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=chat("llama"))
            assert r.status_code == 200, r.text
            ids.append(r.headers["x-request-id"])
    await asyncio.gather(*list(gateway.runtime._tasks), return_exceptions=True)

    marked = await add(Replica.objects.get, pk="llama-1")
    assert marked.state == "ready"
    assert marked.unhealthy_since is not None
    assert marked.unhealthy_reason.startswith("the gateway could not reach it: ")
    # The event names the request that found it so, which its caller can quote.
    assert any(marked.unhealthy_reason.endswith(f"(request {rid})") for rid in ids)
    assert (await add(Replica.objects.get, pk="llama-2")).unhealthy_since is None
    await add(other.refresh)
    assert [u.replica_id for u in other.tables.upstreams["llama"]] == ["llama-2"]
