"""Prefix-aware routing through the gateway's app, in front of three real sim engines: a
conversation's turns stay on the first replica in its prefix's order, whichever of two
gateways answers each, a busy one spills to the next in that order, and a profile routed
by load ignores prefixes."""

from __future__ import annotations

import pytest

from llmgw.gateway import metrics
from llmgw.gateway.app import Gateway
from llmgw.gateway.prefixes import order, prefix_for
from tests.fleet.builders import model_added
from tests.gateway.test_app import add, client, new_key
from tests.gateway.world import _replica, django_inner

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


def asked(topic: str, t: int) -> dict:
    return {"role": "user", "content": f"Tell me about {topic}, part {t}. " * 12}


async def conversation(c, topic: str, turns: int, *others) -> list[str]:
    """Each turn repeats the ones before it and their answers, as a chat client does; turn
    t goes through `(c, *others)[t % n]`."""
    clients = (c, *others)
    messages = [{"role": "system", "content": SYSTEM}]
    served = []
    for t in range(turns):
        messages.append(asked(topic, t))
        r = await clients[t % len(clients)].post(
            "/v1/chat/completions", json={"model": "llama", "messages": messages, "max_tokens": 8}
        )
        assert r.status_code == 200, r.text
        served.append(r.headers["x-llmgw-replica"])
        messages.append(r.json()["choices"][0]["message"])
    return served


def home(topic: str, replicas: list[str]) -> str:
    """The first replica in the order of a conversation on `topic`'s prefix."""
    body = {"messages": [{"role": "system", "content": SYSTEM}, asked(topic, 0)]}
    p = prefix_for("chat", body)
    return replicas[order(p.key, [(r, 1) for r in replicas])[0]]


def routed(how: str) -> float:
    return metrics.ROUTED.labels("llama", how)._value.get()


TOPICS = ("NVLink", "HBM", "PCIe", "InfiniBand", "NVMe", "RoCE")


async def test_a_conversations_turns_stay_put_whichever_gateway_answers(world, gateway):
    await add(model_added, model("prefix"))
    await three_replicas(world)
    other = Gateway(django_inner)  # another process or server: nothing shared in memory
    before = routed("prefix")
    key = await new_key()
    try:
        async with client(gateway, key) as c, client(other, key) as o:
            sessions = [await conversation(c, topic, 4, o) for topic in TOPICS]
    finally:
        if other.runtime is not None:
            await other.runtime.close()
    replicas = ["llama-1", "llama-2", "llama-3"]
    assert sessions == [[home(t, replicas)] * 4 for t in TOPICS]
    # Other conversations under the same system prompt have homes of their own.
    assert len({turns[0] for turns in sessions}) > 1
    assert routed("prefix") - before == 4 * len(TOPICS)  # nothing else was in flight


async def test_a_home_busier_than_the_bound_allows_spills_to_the_next_in_order(world, gateway):
    await add(model_added, model("prefix"))
    await three_replicas(world)
    replicas = ["llama-1", "llama-2", "llama-3"]
    first = home("NVLink", replicas)
    async with client(gateway, await new_key()) as c:
        assert await conversation(c, "NVLink", 1) == [first]
        rt = gateway.runtime
        rt.inflight[first] = int(rt.cfg.routing.imbalance) + 1  # as if that many were running
        before = routed("imbalance")
        again = await conversation(c, "NVLink", 1)
        rt.inflight[first] = 0
        # Back within the bound: home again.
        assert await conversation(c, "NVLink", 1) == [first]
    assert again[0] != first
    body = {"messages": [{"role": "system", "content": SYSTEM}, asked("NVLink", 0)]}
    p = prefix_for("chat", body)
    assert again[0] == replicas[order(p.key, [(r, 1) for r in replicas])[1]]
    assert routed("imbalance") == before + 1


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
