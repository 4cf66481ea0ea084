"""Adapters through the gateway's app, in front of a real sim engine that holds them: each
team's key reaches its own adapter only, a request for one no replica holds makes one load it
(the agent's part played here: the engine asked, its report written) and waits, each answer
differs from the base's, and usage names the adapter (docs/adapters.md)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import httpx
import pytest
from asgiref.sync import sync_to_async
from hypothesis import given, strategies as st

from catalog.services import adapter_add
from fleet.domain.readings import Reading
from fleet.models import Node
from llmgw.gateway import adapters as gateway_adapters
from llmgw.gateway.adapters import load_choice
from llmgw.gateway.tables import Upstream
from tenancy.models import Usage
from tenancy.services import api_key_create, project_create, team_create
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.test_app import add, client
from tests.gateway.world import _replica

pytestmark = pytest.mark.django_db(transaction=True)


def _teams() -> None:
    team_create(org="Acme", name="ops", actor="t")
    project_create(team="Acme/ops", name="desk", actor="t")
    Node.objects.filter(pk="gpu-a").update(state=Node.READY)
    for name, owner in (("ml-tone", "team:Acme/ml"), ("ops-tone", "team:Acme/ops")):
        adapter_add(
            data={
                "name": name,
                "base": "llama",
                "source": f"hf://acme/{name}",
                "format": "peft",
                "rank": 8,
                "owner": owner,
            },
            actor="t",
        )


def _engine_says(adapters: list[str]) -> None:
    """What the agent reports of the engine's adapters (engine_load), as it lands."""
    Node.objects.filter(pk="gpu-a").update(
        load={"engines": {"llama-1-0": {"running": 0, "adapters": [{"name": n} for n in adapters]}}}
    )


def ask(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 4}


async def answer(c, model: str) -> httpx.Response:
    return await c.post("/v1/chat/completions", json=ask(model))


@pytest.fixture
async def served(world, monkeypatch):
    """llama on one sim replica with two adapter slots; an agent that loads what it is asked."""
    data = gpu_model("llama")
    data["profiles"][0]["adapter_slots"] = 2
    await add(model_added, data)
    url = await world.engine("llama-1", "llama", max_loras=2)
    await add(_replica, "llama-1", "llama", url)
    await add(_teams)
    await add(_engine_says, [])
    asked = []

    async def agent(replica, adapter, evict):
        asked.append((replica, adapter.name, evict))
        engine = world.engines["llama-1"]
        if evict:
            engine.adapters.pop(evict, None)
        engine.adapters[adapter.name] = adapter.source
        await add(_engine_says, list(engine.adapters))

    monkeypatch.setattr(gateway_adapters, "_send", agent)
    gateway_adapters._asked.clear()
    return asked


async def keys() -> tuple[str, str]:
    _, ml = await add(api_key_create, project="Acme/ml/chat", name="ml", actor="t")
    _, ops = await add(api_key_create, project="Acme/ops/desk", name="ops", actor="t")
    return ml, ops


async def test_each_teams_key_reaches_its_own_adapter_loaded_when_first_asked(served, gateway):
    ml, ops = await keys()
    async with client(gateway, ml) as c, client(gateway, ops) as o:
        base = await answer(c, "llama")
        assert base.status_code == 200, base.text
        first = await answer(c, "ml-tone")
        assert first.status_code == 200, first.text
        assert served == [("llama-1", "ml-tone", None)]
        again = await answer(c, "ml-tone")
        assert served == [("llama-1", "ml-tone", None)]  # held now: not asked again
        theirs = await answer(o, "ops-tone")
        assert theirs.status_code == 200, theirs.text
        # Another team's adapter is not there for this key, as a model it may not use.
        refused = await answer(c, "ops-tone")
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
        assert (await answer(o, "ml-tone")).status_code == 404
        models = (await c.get("/v1/models")).json()["data"]
        await gateway.runtime._flush()

    text = [r.json()["choices"][0]["message"]["content"] for r in (base, first, theirs)]
    assert len(set(text)) == 3, text  # each adapter's answer differs from the base's
    assert again.json()["choices"][0]["message"]["content"] == text[1]
    assert first.headers["x-llmgw-replica"] == "llama-1"
    assert first.json()["model"] == "ml-tone"
    assert [(m["id"], m.get("parent")) for m in models] == [("llama", None), ("ml-tone", "llama")]
    by_model = await sync_to_async(
        lambda: sorted(set(Usage.objects.values_list("model", flat=True)))
    )()
    assert by_model == ["llama", "ml-tone", "ops-tone"]


async def test_a_load_that_fails_is_a_503_with_the_engines_words(served, gateway, monkeypatch):
    from fleet.services import adapter_load_commands  # noqa: F401 - the real one is tested below

    async def failing(replica, adapter, evict):
        from django.utils import timezone

        from fleet.nodes.reports import adapter_status_record
        from fleet.protocol import AdapterStatus

        msg = AdapterStatus(
            type="adapter_status",
            shard_id="llama-1-0",
            name=adapter.name,
            state="failed",
            detail="ValueError: adapter rank 8 needs --max-lora-rank",
        )
        await add(adapter_status_record, node_id="gpu-a", msg=msg, now=timezone.now())

    monkeypatch.setattr(gateway_adapters, "_send", failing)
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        r = await asyncio.wait_for(answer(c, "ml-tone"), 15)
    assert r.status_code == 503
    error = r.json()["error"]
    assert error["code"] == "model_unplaceable"
    assert error["message"].startswith(
        "Adapter ml-tone could not be loaded: adapter ml-tone failed"
    )
    assert "needs --max-lora-rank" in error["message"]


async def test_a_node_speaks_only_for_adapters_of_its_replicas_model(served):
    from django.utils import timezone

    from fleet.models import Event
    from fleet.nodes.reports import adapter_status_record
    from fleet.protocol import AdapterStatus

    def said(name: str, state: str = "failed") -> None:
        msg = AdapterStatus(type="adapter_status", shard_id="llama-1-0", name=name, state=state)
        adapter_status_record(node_id="gpu-a", msg=msg, now=timezone.now())

    def recorded() -> list[str]:
        return list(
            Event.objects.filter(kind__startswith="adapter_").values_list("model", flat=True)
        )

    await add(said, "not-an-adapter")
    assert await add(recorded) == []  # refused: nothing a waiting request would read
    await add(said, "ml-tone", "loaded")
    assert await add(recorded) == ["ml-tone"]


async def test_the_agents_word_that_it_loaded_routes_before_the_readings_say_it(
    served, gateway, monkeypatch, world
):
    from django.utils import timezone

    from fleet.nodes.reports import adapter_status_record
    from fleet.protocol import AdapterStatus

    async def agent(replica, adapter, evict):
        world.engines["llama-1"].adapters[adapter.name] = adapter.source
        msg = AdapterStatus(
            type="adapter_status", shard_id="llama-1-0", name=adapter.name, state="loaded"
        )
        await add(adapter_status_record, node_id="gpu-a", msg=msg, now=timezone.now())

    monkeypatch.setattr(gateway_adapters, "_send", agent)
    monkeypatch.setattr(gateway_adapters, "LOADED", {})
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        r = await asyncio.wait_for(answer(c, "ml-tone"), 10)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "ml-tone"
    assert list(gateway_adapters.LOADED) == [("llama-1", "ml-tone")]


async def test_a_load_not_done_in_time_is_the_on_demand_503(served, gateway, monkeypatch, settings):
    async def silent(replica, adapter, evict):
        pass

    settings.LLMGW = replace(settings.LLMGW, on_demand_wait=0.5)
    monkeypatch.setattr(gateway_adapters, "_send", silent)
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        r = await answer(c, "ml-tone")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "model_loading"
    assert r.headers["retry-after"] == "10"
    assert r.json()["error"]["message"].startswith(
        "Adapter ml-tone is loading: no replica held it within 0.5 s. Try again shortly."
    )


def up(replica: str, slots: int = 2) -> Upstream:
    return Upstream(replica, "a", "http://x", "Bearer k", 1, engine="vllm", adapter_slots=slots)


def test_the_least_loaded_replica_with_a_free_slot_loads_it():
    readings = {
        "r1": Reading(running=5, adapters=(("x", None),)),
        "r2": Reading(running=1, adapters=(("x", None), ("y", None))),  # full
        "r3": Reading(running=2, adapters=()),
    }
    assert load_choice([up("r1"), up("r2"), up("r3")], readings, {}, {}) == ("r3", None)
    # This gateway's 3 in flight to r1 are the 3 its engine says it runs: counted once, r1
    # holds less than r3's 4.
    readings = {"r1": Reading(running=3, adapters=()), "r3": Reading(running=4, adapters=())}
    assert load_choice([up("r1"), up("r3")], readings, {"r1": 3}, {}) == ("r1", None)


def test_when_every_replica_is_full_the_least_recently_used_adapter_makes_room():
    readings = {
        "r1": Reading(running=5, adapters=(("x", None), ("y", None))),
        "r2": Reading(running=1, adapters=(("x", None), ("y", None))),
    }
    used = {("r2", "x"): 20.0, ("r2", "y"): 10.0}
    assert load_choice([up("r1"), up("r2")], readings, {}, used) == ("r2", "y")
    assert load_choice([up("r1", slots=0)], readings, {}, used) is None


def test_the_load_goes_to_the_replicas_first_shard(db):
    from fleet.services import adapter_load_commands
    from llmgw.core import clock
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import node_add

    node_add("n1", now=clock.now())
    ready_replica("llama-1", "llama", node="n1", gpus=[0])
    commands = adapter_load_commands(
        replica_id="llama-1", name="a", source="/srv/a", format="peft", unload="b"
    )
    assert [(c.node_id, c.payload) for c in commands] == [
        ("n1", {"type": "unload_adapter", "shard_id": "llama-1-0", "name": "b"}),
        (
            "n1",
            {
                "type": "load_adapter",
                "shard_id": "llama-1-0",
                "adapter": {"name": "a", "path": "/srv/a", "format": "peft"},
            },
        ),
    ]
    assert adapter_load_commands(replica_id="gone", name="a", source="/a", format="peft") == []


def test_a_llama_server_starts_with_its_bases_gguf_adapters_as_many_as_its_slots(db):
    from catalog.domain import parse_model
    from fleet.services import start_adapters
    from tenancy.services import org_create

    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    model_added(
        {
            "name": "small",
            "source": "/srv/small.gguf",
            "profiles": [
                {"name": "cpu", "engine": "llamacpp", "min_memory_gb": 2, "adapter_slots": 2}
            ],
        }
    )
    for name in ("c", "a", "b"):
        adapter_add(
            data={
                "name": name,
                "base": "small",
                "source": f"/srv/{name}.gguf",
                "format": "gguf",
                "rank": 8,
                "owner": "team:Acme/ml",
            },
            actor="t",
        )
    spec = parse_model(
        {"name": "small", "profiles": [{"name": "cpu", "engine": "llamacpp", "adapter_slots": 2}]}
    )
    assert start_adapters("small", spec.profiles[0]) == [
        {"name": "a", "path": "/srv/a.gguf", "format": "gguf"},
        {"name": "b", "path": "/srv/b.gguf", "format": "gguf"},
    ]
    vllm = parse_model(
        {
            "name": "x",
            "profiles": [
                {"name": "g", "engine": "vllm", "gpu_class": "h100-80g", "adapter_slots": 2}
            ],
        }
    )
    assert start_adapters("small", vllm.profiles[0]) == []


def test_an_adapters_demand_at_the_gateway_is_its_bases():
    from fleet.selectors.snapshot import on_bases

    counts = {"llama": (2, 1), "ml-tone": (3, 0), "ops-tone": (0, 4), "qwen": (1, 1)}
    assert on_bases(counts, {"ml-tone": "llama", "ops-tone": "llama"}) == {
        "llama": (5, 5),
        "qwen": (1, 1),
    }


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=5
    ),
    st.data(),
)
def test_a_load_goes_where_there_is_room_and_unloads_only_what_that_replica_holds(specs, data):
    ups, readings = [], {}
    for i, (slots, held, running) in enumerate(specs):
        rid = f"r{i}"
        ups.append(up(rid, slots=slots))
        names = tuple((f"a{j}", None) for j in range(min(held, slots)))
        readings[rid] = Reading(running=running, adapters=names)
    used = {(r, n): data.draw(st.floats(0, 100)) for r in readings for n in ("a0", "a1", "a2")}

    choice = load_choice(ups, readings, {}, used)

    slotted = [u for u in ups if u.adapter_slots > 0]
    if not slotted:
        assert choice is None
        return
    replica, evict = choice
    assert replica in {u.replica_id for u in slotted}
    room = [u for u in slotted if len(readings[u.replica_id].adapters) < u.adapter_slots]
    assert (evict is None) == bool(room)
    if evict is not None:
        assert evict in {n for n, _ in readings[replica].adapters}
    else:  # the least loaded of those with room
        least = min(readings[u.replica_id].running for u in room)
        assert readings[replica].running == least


async def test_requests_for_an_adapter_go_only_to_replicas_holding_it(world, gateway):
    data = gpu_model("llama")
    data["profiles"][0].update(adapter_slots=2, routing="prefix")
    await add(model_added, data)
    for rid in ("llama-1", "llama-2", "llama-3"):
        await add(_replica, rid, "llama", await world.engine(rid, "llama", max_loras=2))
    await add(_teams)
    world.engines["llama-2"].adapters["ml-tone"] = "/x"

    def said() -> None:
        Node.objects.filter(pk="gpu-a").update(
            load={
                "engines": {
                    "llama-1-0": {"adapters": []},
                    "llama-2-0": {"adapters": [{"name": "ml-tone"}]},
                    "llama-3-0": {"adapters": []},
                }
            }
        )

    await add(said)
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        await answer(c, "llama")  # the runtime starts
        await gateway.runtime._read_readings()
        served = set()
        for i in range(8):
            body = ask("ml-tone")
            body["messages"][0]["content"] = f"question {i} " * 20
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            served.add(r.headers["x-llmgw-replica"])
    assert served == {"llama-2"}


def test_an_adapter_queuing_on_every_holder_is_loaded_on_one_more():
    from llmgw.gateway.adapters import spread_choice

    ups = [up("r1"), up("r2"), up("r3")]
    busy = {
        "r1": Reading(running=4, waiting=2, adapters=(("a", None),)),
        "r2": Reading(running=1, waiting=0, adapters=()),
        "r3": Reading(running=3, waiting=0, adapters=(("x", None), ("y", None))),
    }
    assert spread_choice("a", ups, busy, {}, {}) == ("r2", None)
    # A holder with nothing queued: no more needed.
    calm = {**busy, "r1": Reading(running=4, waiting=0, adapters=(("a", None),))}
    assert spread_choice("a", ups, calm, {}, {}) is None
    # An engine that did not say what it queues is not taken as busy.
    unknown = {**busy, "r1": Reading(running=4, adapters=(("a", None),))}
    assert spread_choice("a", ups, unknown, {}, {}) is None
    # Every replica holds it already; or none does (the first load is the wait's).
    every = {r: Reading(running=1, waiting=1, adapters=(("a", None),)) for r in busy}
    assert spread_choice("a", ups, every, {}, {}) is None
    assert spread_choice("b", ups, busy, {}, {}) is None


async def test_a_request_to_an_adapter_queuing_everywhere_it_is_loads_it_on_one_more(
    world, gateway, monkeypatch
):
    data = gpu_model("llama")
    data["profiles"][0]["adapter_slots"] = 2
    await add(model_added, data)
    for rid in ("llama-1", "llama-2"):
        await add(_replica, rid, "llama", await world.engine(rid, "llama", max_loras=2))
    await add(_teams)
    world.engines["llama-1"].adapters["ml-tone"] = "/x"

    def said() -> None:
        Node.objects.filter(pk="gpu-a").update(
            load={
                "engines": {
                    "llama-1-0": {"running": 4, "waiting": 3, "adapters": [{"name": "ml-tone"}]},
                    "llama-2-0": {"running": 0, "waiting": 0, "adapters": []},
                }
            }
        )

    await add(said)
    asked = []

    async def agent(replica, adapter, evict):
        asked.append((replica, adapter.name, evict))

    monkeypatch.setattr(gateway_adapters, "_send", agent)
    gateway_adapters._asked.clear()
    ml, _ = await keys()
    async with client(gateway, ml) as c:
        await answer(c, "llama")
        await gateway.runtime._read_readings()
        r = await answer(c, "ml-tone")
        await asyncio.sleep(0.05)  # the ask goes on beside the answer
        await answer(c, "ml-tone")  # asked once, not again within ASK_EVERY_S
    assert r.headers["x-llmgw-replica"] == "llama-1"
    assert asked == [("llama-2", "ml-tone", None)]


def test_a_llama_server_is_told_which_adapter_to_apply_by_its_index():
    from types import SimpleNamespace

    from catalog.domain import AdapterSpec
    from llmgw.gateway.adapters import not_holding, sent

    spec = AdapterSpec("a", "base", "/a.gguf", "gguf", 8, "team:1")
    cpp = Upstream("r1", "a", "http://x", "Bearer k", 1, engine="llamacpp", adapter_slots=2)
    rt = SimpleNamespace(
        tables=SimpleNamespace(adapters={"a": spec}, upstreams={"a": (cpp,)}),
        readings={"r1": Reading(adapters=(("z", 0), ("a", 1)))},
    )
    req = SimpleNamespace(body={"model": "a"}, body_changed=False)
    sent(rt, req, cpp)
    assert req.body["lora"] == [{"id": 1, "scale": 1.0}] and req.body_changed
    assert req.answer_model == "a"  # llama-server names its base in the answer
    # Its base's request names one at 0, said outright: with none named, llama-server reuses
    # the prompt cache an adapter's request left and answers in its words.
    base = Upstream("r1", "base", "http://x", "Bearer k", 1, engine="llamacpp", adapter_slots=2)
    req = SimpleNamespace(body={"model": "base"}, body_changed=False)
    sent(rt, req, base)
    assert req.body["lora"] == [{"id": 0, "scale": 0.0}] and req.body_changed
    # A replica holding none, or not read, is left as asked.
    for readings in ({"r1": Reading(adapters=())}, {}):
        rt.readings = readings
        req = SimpleNamespace(body={"model": "base"}, body_changed=False)
        sent(rt, req, base)
        assert "lora" not in req.body and not req.body_changed
        # But a caller's own lora never reaches an engine: it could pick another team's.
        req = SimpleNamespace(body={"model": "base", "lora": [{"id": 0, "scale": 1}]})
        sent(rt, req, base)
        assert "lora" not in req.body and req.body_changed
    # Its agent's word that it loaded one is not enough there: only the reading has the index.
    rt.readings = {}
    gateway_adapters.LOADED[("r1", "a")] = time.monotonic()
    assert not_holding(rt, "a", set()) == {"r1"}


def test_what_is_kept_of_gone_replicas_and_adapters_is_forgotten(monkeypatch):
    from types import SimpleNamespace

    from catalog.domain import AdapterSpec
    from llmgw.gateway.adapters import forget_gone

    spec = AdapterSpec("a", "base", "/a.gguf", "gguf", 8, "team:1")
    up = Upstream("r1", "a", "http://x", "Bearer k", 1, engine="llamacpp", adapter_slots=2)
    rt = SimpleNamespace(tables=SimpleNamespace(adapters={"a": spec}, upstreams={"a": (up,)}))
    monkeypatch.setattr(gateway_adapters, "USED", {("r1", "a"): 1.0, ("r0", "a"): 1.0})
    monkeypatch.setattr(gateway_adapters, "LOADED", {("r1", "gone"): 1.0})
    monkeypatch.setattr(gateway_adapters, "_asked", {"a": (1.0, "r1"), "gone": (1.0, "r1")})
    forget_gone(rt)
    assert gateway_adapters.USED == {("r1", "a"): 1.0}
    assert gateway_adapters.LOADED == {}
    assert gateway_adapters._asked == {"a": (1.0, "r1")}
