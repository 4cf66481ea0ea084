"""Prefix-aware routing through the gateway's app, in front of three real sim engines: a
conversation's turns stay on the replica that served its first, other conversations
spread, a busy holder gives way, and a profile routed by load ignores prefixes."""

from __future__ import annotations

import pytest

from llmgw.gateway import metrics
from tests.fleet.builders import model_added
from tests.gateway.test_app import add, client, new_key
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You answer questions about GPU clusters, briefly and exactly. " * 30


def model(routing: str = "") -> dict:
    profile = {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"}
    if routing:
        profile["routing"] = routing
    return {"name": "llama", "source": "hf://acme/llama", "profiles": [profile]}


async def three_replicas(world) -> None:
    for i in (1, 2, 3):
        await add(_replica, f"llama-{i}", "llama", await world.engine(f"llama-{i}", "llama"))


async def conversation(c, topic: str, turns: int) -> list[str]:
    """Each turn repeats the ones before it and their answers, as a chat client does."""
    messages = [{"role": "system", "content": SYSTEM}]
    served = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Tell me about {topic}, part {t}. " * 12})
        r = await c.post(
            "/v1/chat/completions", json={"model": "llama", "messages": messages, "max_tokens": 8}
        )
        assert r.status_code == 200, r.text
        served.append(r.headers["x-llmgw-replica"])
        messages.append(r.json()["choices"][0]["message"])
    return served


def routed(how: str) -> float:
    return metrics.ROUTED.labels("llama", how)._value.get()


async def test_a_conversations_turns_stay_on_the_replica_that_served_it(world, gateway):
    await add(model_added, model("prefix"))
    await three_replicas(world)
    before = routed("prefix")
    async with client(gateway, await new_key()) as c:
        sessions = [await conversation(c, topic, 4) for topic in ("NVLink", "HBM", "PCIe")]
    for turns in sessions:
        assert len(set(turns)) == 1, sessions
    # The later conversations' first turns share the system prompt with the first one,
    # and nothing else was in flight: they went where it was served.
    assert len({turns[0] for turns in sessions}) == 1
    assert routed("prefix") - before == 11  # every request but the very first


async def test_a_holder_busier_than_the_imbalance_allows_gives_way(world, gateway):
    await add(model_added, model("prefix"))
    await three_replicas(world)
    async with client(gateway, await new_key()) as c:
        (first,) = await conversation(c, "NVLink", 1)
        rt = gateway.runtime
        rt.inflight[first] = int(rt.cfg.routing.imbalance) + 1  # as if that many were running
        before = routed("imbalance")
        again = await conversation(c, "NVLink", 1)
        rt.inflight[first] = 0
    assert again[0] != first
    assert routed("imbalance") == before + 1
    # Both have served the system prompt now: a new conversation goes to the less loaded.
    async with client(gateway, await new_key()) as c:
        rt.inflight[again[0]] = 1
        (third,) = await conversation(c, "HBM", 1)
        rt.inflight[again[0]] = 0
    assert third == first


async def test_a_profile_routed_by_load_spreads_a_conversation(world, gateway):
    await add(model_added, model("least_loaded"))
    await three_replicas(world)
    async with client(gateway, await new_key()) as c:
        turns = await conversation(c, "NVLink", 3)
    # One request at a time: each finds all three idle, and ties go round.
    assert len(set(turns)) == 3


async def test_the_sim_engines_default_is_by_load_and_llama_cpps_by_prefix():
    from catalog.domain import parse_profile

    assert parse_profile({"name": "p", "engine": "sim"}, model="m").routes_by == "least_loaded"
    for engine in ("llamacpp", "vllm"):
        assert parse_profile({"name": "p", "engine": engine}, model="m").routes_by == "prefix"
    chosen = parse_profile({"name": "p", "engine": "vllm", "routing": "round_robin"}, model="m")
    assert chosen.routes_by == "round_robin"


def test_cached_tokens_are_said_only_for_a_model_whose_engines_report_some():
    from prometheus_client import generate_latest

    metrics.series("never-cached").prompt.inc(3)
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'kind="prompt",model="never-cached"' in text
    assert 'kind="cached",model="never-cached"' not in text
    metrics.series("never-cached").cached(2)
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'llmgw_gateway_tokens_total{kind="cached",model="never-cached"} 2.0' in text
