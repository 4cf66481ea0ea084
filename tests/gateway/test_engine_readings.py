"""Routing by what the engines say, through the gateway's app in front of three real sim
engines: a replica another gateway has filled is not least loaded for having few requests
in flight from this one, and the trace says why the one chosen was."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from fleet.domain.readings import Reading
from fleet.models import Node
from tests.fleet.builders import model_added
from tests.gateway.test_app import add, client, new_key
from tests.gateway.test_prefix_routing import model, three_replicas

pytestmark = pytest.mark.django_db(transaction=True)


def _engines_said(figures: dict[str, dict]) -> None:
    Node.objects.filter(pk="gpu-a").update(
        load={"engines": {f"{replica}-0": said for replica, said in figures.items()}}
    )


async def ask(c) -> str:
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = await c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.headers["x-llmgw-replica"]


async def test_replicas_whose_engines_queue_or_are_full_are_passed_over(world, gateway):
    await add(model_added, model("least_loaded"))
    await three_replicas(world)
    async with client(gateway, await new_key()) as c:
        await ask(c)  # the runtime starts
        rt = gateway.runtime
        # Another gateway has 6 queued on llama-1 and llama-3's KV cache is nearly full;
        # this one has nothing in flight to any of them.
        await sync_to_async(_engines_said)(
            {
                "llama-1": {"running": 4, "waiting": 6, "kv_cache": 0.7},
                "llama-2": {"running": 4, "waiting": 0, "kv_cache": 0.6},
                "llama-3": {"running": 4, "waiting": 0, "kv_cache": 0.95},
            }
        )
        await rt._read_readings()
        assert rt.readings["llama-1"] == Reading(4, 6, 0.7, None)
        served = [await ask(c) for _ in range(6)]
        picked = rt.pick("llama", set())
    assert set(served) == {"llama-2"}, served
    assert picked.reading == Reading(4, 0, 0.6, None)


async def test_replicas_no_engine_said_anything_of_are_routed_by_in_flight_counts(world, gateway):
    await add(model_added, model("least_loaded"))
    await three_replicas(world)
    async with client(gateway, await new_key()) as c:
        await ask(c)
        rt = gateway.runtime
        await rt._read_readings()
        assert rt.readings == {}
        served = [await ask(c) for _ in range(3)]
    # One at a time, all idle: ties go round, as before.
    assert len(set(served)) == 3
