"""An adapter loaded on more replicas than its demand needs is unloaded from one: the rule
(adapter_demand.shrink_choice) as a table and as properties beside the rule that loads one
more (adapters.spread_choice), and the gateway's shim that notes the demand and sends the
unload_adapter (docs/adapters.md)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

from catalog.domain import AdapterSpec
from fleet.domain.readings import Reading
from llmgw.gateway import adapters as gateway_adapters
from llmgw.gateway.adapter_demand import WINDOW_S, Shrink, Window, shrink_choice
from llmgw.gateway.adapters import not_holding, sent, shrink, spread_choice
from llmgw.gateway.tables import Upstream

HELD = (("a", None),)


def up(replica: str, engine: str = "vllm") -> Upstream:
    return Upstream(replica, "a", "http://x", "Bearer k", 1, engine=engine, adapter_slots=2)


def held(slots: int | None = 4, waiting: int | None = 0, adapters=HELD) -> Reading:
    return Reading(running=1, waiting=waiting, slots=slots, adapters=adapters)


def window(peak: int, **sent: int) -> Window:
    return Window(since=0.0, peak=peak, sent=dict(sent))


UPS = [up("r1"), up("r2"), up("r3")]
LLAMA = {"r4"}  # a llama-server beside them, in the properties


@pytest.mark.parametrize(
    ("readings", "win", "leaves"),
    [
        # Held on two, 2 at once at most, below the other's 4: the one sent fewest leaves.
        ({"r1": held(), "r2": held()}, window(2, r1=10, r2=3), "r2"),
        # As many as the other runs at once: it would queue there. Kept.
        ({"r1": held(), "r2": held()}, window(4, r1=10, r2=3), None),
        # One holder queues now: the demand is not low, whatever this gateway saw.
        ({"r1": held(), "r2": held(waiting=1)}, window(0), None),
        # Unknown is no reason: a holder that did not say what it queues, or its slots.
        ({"r1": held(), "r2": held(waiting=None)}, window(0), None),
        ({"r1": held(), "r2": held(slots=None)}, window(0), None),
        # Never below one replica.
        ({"r1": held(), "r2": held(adapters=())}, window(0), None),
        ({"r1": held(), "r2": held(adapters=None)}, window(0), None),
        # Three holders, 7 at once below the other two's 8: ties go by replica id.
        ({"r1": held(), "r2": held(), "r3": held()}, window(7), "r1"),
        ({"r1": held(), "r2": held(), "r3": held()}, window(8), None),
        # Replicas that do not hold it count for nothing, their queues neither.
        ({"r1": held(), "r2": held(), "r3": held(waiting=9, adapters=())}, window(1, r1=1), "r2"),
        # The slots of those that stay are what counts: r2 (8) stays, r1 (2) leaves.
        ({"r1": held(slots=2), "r2": held(slots=8)}, window(5, r1=1, r2=6), "r1"),
        ({"r1": held(slots=2), "r2": held(slots=8)}, window(5, r1=6, r2=1), None),
    ],
)
def test_an_adapter_leaves_one_replica_when_the_others_would_run_its_demand(readings, win, leaves):
    choice = shrink_choice("a", UPS, readings, win)
    assert (choice.replica if choice else None) == leaves


def test_a_llama_server_holding_it_counts_but_never_leaves():
    """llama-server holds its adapters from its start until it stops: it cannot unload one."""
    ups = [up("r1", "llamacpp"), up("r2"), up("r3", "llamacpp")]
    readings = {"r1": held(), "r2": held(), "r3": held()}
    choice = shrink_choice("a", ups, readings, window(3, r1=0, r2=9, r3=0))
    assert choice is not None and choice.replica == "r2"
    assert shrink_choice("a", [ups[0], ups[2]], readings, window(0)) is None


def test_the_unload_is_said_with_its_figures():
    choice = shrink_choice("a", UPS, {"r1": held(), "r2": held()}, window(2, r1=10, r2=3))
    assert choice == Shrink(
        "r2",
        f"adapter a's demand fell: at most 2 of its requests were in flight at once over "
        f"{WINDOW_S:g} s, below the 4 the other 1 replica holding it run at once; unloading "
        "it from r2, which was sent 3 of them",
    )


readings_st = st.dictionaries(
    st.sampled_from(["r1", "r2", "r3", "r4"]),
    st.builds(
        held,
        slots=st.none() | st.integers(1, 8),
        waiting=st.none() | st.integers(0, 3),
        adapters=st.sampled_from([HELD, (), None, (("b", None),), (("b", None), ("a", None))]),
    ),
)


@given(
    readings_st,
    st.integers(0, 30),
    st.dictionaries(st.sampled_from(["r1", "r2", "r3", "r4"]), st.integers(0, 50)),
)
def test_an_unload_keeps_one_holder_and_room_for_the_demand_and_never_meets_a_load(
    readings, peak, sent_to
):
    ups = [*UPS, up("r4", "llamacpp")]
    choice = shrink_choice("a", ups, readings, Window(0.0, peak, sent_to))
    holders = {r for r, reading in readings.items() if reading.holds("a")}
    if spread_choice("a", ups, readings, {}, {}) is not None:
        assert choice is None  # never unloaded where it would be loaded on one more
    if choice is None:
        return
    assert choice.replica in holders and len(holders) >= 2
    assert choice.replica not in LLAMA
    assert all(readings[r].waiting == 0 for r in holders)
    assert peak < sum(readings[r].slots for r in holders - {choice.replica})
    fewest = min(sent_to.get(r, 0) for r in holders - LLAMA)
    assert sent_to.get(choice.replica, 0) == fewest


@pytest.fixture
def runtime(monkeypatch):
    """A gateway runtime holding adapter a on r1 and r2 (4 slots each, nothing queued), whose
    unloads are recorded instead of sent."""
    for book in ("USED", "LOADED", "UNLOADING", "WINDOWS", "_asked"):
        monkeypatch.setattr(gateway_adapters, book, {})
    unloads: list[tuple[str, str]] = []

    async def unload(replica: str, adapter: str) -> None:
        unloads.append((replica, adapter))

    monkeypatch.setattr(gateway_adapters, "_unload_logged", unload)
    spec = AdapterSpec("a", "base", "hf://acme/a", "peft", 8, "team:1")
    rt = SimpleNamespace(
        tables=SimpleNamespace(adapters={"a": spec}, upstreams={"a": tuple(UPS)}),
        readings={"r1": held(), "r2": held(), "r3": held(adapters=())},
        beside=lambda work, name: asyncio.get_running_loop().create_task(work, name=name),
    )
    return rt, unloads


def request() -> SimpleNamespace:
    return SimpleNamespace(body={"model": "a"}, body_changed=False)


async def test_the_gateway_unloads_from_the_replica_it_sent_fewest_after_a_whole_window(runtime):
    rt, unloads = runtime
    for replica in ("r1", "r1", "r2"):
        sent(rt, request(), up(replica))
    start = gateway_adapters.WINDOWS["a"].since
    assert gateway_adapters.WINDOWS["a"].sent == {"r1": 2, "r2": 1}

    shrink(rt, now=start + WINDOW_S / 2)  # not a whole window yet
    await asyncio.sleep(0)
    assert unloads == []

    shrink(rt, now=start + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]
    # Not routed to while it unloads, though its engine still says it holds it.
    assert not_holding(rt, "a", set()) == {"r2", "r3"}
    # Its window starts again: one unload at a time, each after a whole window.
    assert gateway_adapters.WINDOWS == {}
    shrink(rt, now=start + WINDOW_S + 1)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]


async def test_a_load_asked_again_overtakes_the_unload_and_restarts_the_window(runtime):
    rt, unloads = runtime
    sent(rt, request(), up("r1"))
    shrink(rt, now=gateway_adapters.WINDOWS["a"].since + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]
    gateway_adapters._loading("r2", "a")  # spread or a request asked r2 for it again
    assert not_holding(rt, "a", set()) == {"r3"}


async def test_busy_holders_keep_the_adapter(runtime):
    rt, unloads = runtime
    rt.readings["r2"] = held(waiting=2)
    sent(rt, request(), up("r1"))
    shrink(rt, now=gateway_adapters.WINDOWS["a"].since + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == []
    assert not_holding(rt, "a", set()) == {"r3"}


@pytest.mark.django_db(transaction=True)
async def test_the_unload_goes_to_the_replicas_first_shard(monkeypatch):
    from asgiref.sync import sync_to_async

    import fleet.nodes.dispatch
    from llmgw.core import clock
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import node_add

    def placed() -> None:
        node_add("n1", now=clock.now())
        ready_replica("llama-1", "llama", node="n1", gpus=[0])

    await sync_to_async(placed)()
    commands = []

    async def send(cs):
        commands.extend(cs)

    monkeypatch.setattr(fleet.nodes.dispatch, "send_commands", send)
    await gateway_adapters._unload_logged("llama-1", "ml-tone")
    assert [(c.node_id, c.payload) for c in commands] == [
        ("n1", {"type": "unload_adapter", "shard_id": "llama-1-0", "name": "ml-tone"})
    ]
