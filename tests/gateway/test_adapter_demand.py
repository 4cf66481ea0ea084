"""An adapter loaded on more replicas than its demand needs is unloaded from one: the rule
(adapter_demand.shrink_choice) as a table and as properties beside the rule that loads one
more (adapters.spread_choice), the demand summed over every gateway process, the gateway's
shim that notes it and asks for the unload_adapter, and the control plane's service that
judges the unload again over them all (docs/adapters.md)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from hypothesis import given, strategies as st

from catalog.domain import AdapterSpec
from fleet.domain.readings import Reading
from llmgw.gateway import adapters as gateway_adapters
from llmgw.gateway.adapter_demand import (
    BUCKET_S,
    WINDOW_S,
    Shrink,
    Window,
    bucket_of,
    demand_peak,
    shared_buckets,
    shrink_choice,
)
from llmgw.gateway.adapters import not_holding, sent, shrink, spread_choice
from llmgw.gateway.load import BOARD
from llmgw.gateway.tables import Upstream

HELD = (("a", None),)
UNLOAD = gateway_adapters._unload_logged  # the real one: the runtime fixture records instead


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
        f"{WINDOW_S:g} s on every gateway process together, below the 4 the other 1 replica "
        "holding it run at once; unloading it from r2, to which this process sent 3 of them",
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


BOOKS = ("USED", "LOADED", "UNLOADING", "WINDOWS", "PEAKS", "_asked")  # one process's


@pytest.fixture
def runtime(monkeypatch):
    """A gateway runtime holding adapter a on r1 and r2 (4 slots each, nothing queued), whose
    unloads are recorded instead of sent."""
    for book in BOOKS:
        monkeypatch.setattr(gateway_adapters, book, {})
    monkeypatch.setattr(BOARD, "running", {})
    cache.clear()
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

    await shrink(rt, now=start + WINDOW_S / 2)  # not a whole window yet
    await asyncio.sleep(0)
    assert unloads == []

    await shrink(rt, now=start + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]
    # Not routed to while it unloads, though its engine still says it holds it.
    assert not_holding(rt, "a", set()) == {"r2", "r3"}
    # Its window starts again: one unload at a time, each after a whole window.
    assert gateway_adapters.WINDOWS == {}
    await shrink(rt, now=start + WINDOW_S + 1)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]


async def test_a_load_asked_again_overtakes_the_unload_and_restarts_the_window(runtime):
    rt, unloads = runtime
    sent(rt, request(), up("r1"))
    await shrink(rt, now=gateway_adapters.WINDOWS["a"].since + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]
    gateway_adapters._loading("r2", "a")  # spread or a request asked r2 for it again
    assert not_holding(rt, "a", set()) == {"r3"}


async def test_busy_holders_keep_the_adapter(runtime):
    rt, unloads = runtime
    rt.readings["r2"] = held(waiting=2)
    sent(rt, request(), up("r1"))
    await shrink(rt, now=gateway_adapters.WINDOWS["a"].since + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == []
    assert not_holding(rt, "a", set()) == {"r3"}


def process(monkeypatch, books: dict, running: int) -> None:
    """Be one gateway process of several: its own books, `running` of a's requests in flight
    at it now; the cache (Redis in production) is what they share."""
    for book in BOOKS:
        monkeypatch.setattr(gateway_adapters, book, books.setdefault(book, {}))
    monkeypatch.setattr(BOARD, "running", {"a": running})


T = 1000 * BUCKET_S  # a bucket's start, wall-clock


async def test_processes_each_seeing_half_the_demand_keep_what_the_whole_needs(
    runtime, monkeypatch
):
    """Two processes each had 2 of a's requests in flight at once: 4 together, which r1's 3
    slots cannot run alone. Each, counting its own, would unload r2 (and load it again when
    r1 queues, every minute); counting them all, neither does."""
    rt, unloads = runtime
    rt.readings.update(r1=held(slots=3), r2=held(slots=3))
    one: dict = {}
    two: dict = {}
    for books, replica in ((one, "r1"), (two, "r2")):
        process(monkeypatch, books, running=1)
        await shrink(rt, now=T)  # its window starts
        sent(rt, request(), up(replica))  # 2 in flight here now
        await shrink(rt, now=T + BUCKET_S + 0.05)  # adds its 2 to the bucket just ended
    for books in (one, two):
        process(monkeypatch, books, running=0)
        await shrink(rt, now=T + WINDOW_S)
        assert books["WINDOWS"] == {}  # judged, and started again
    await asyncio.sleep(0)
    assert unloads == []


async def test_a_process_alone_sees_its_own_demand(runtime, monkeypatch):
    """The same 2 from one process alone: below r1's 3, so r2 (sent none) leaves."""
    rt, unloads = runtime
    rt.readings.update(r1=held(slots=3), r2=held(slots=3))
    process(monkeypatch, {}, running=1)
    await shrink(rt, now=T)
    sent(rt, request(), up("r1"))
    await shrink(rt, now=T + BUCKET_S + 0.05)
    BOARD.running["a"] = 0
    await shrink(rt, now=T + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == [("r2", "a")]


@given(st.lists(st.lists(st.integers(0, 4), min_size=12, max_size=12), min_size=1, max_size=4))
def test_the_shared_sums_bound_the_demand_of_every_process_together(timelines):
    """Each process's in flight at each second (12 s, 3 buckets of 4 here, as if BUCKET_S
    were 4): the largest bucket sum of the processes' peaks is at least the most in flight
    at once over them all."""
    per = 4
    sums = [sum(max(line[b * per : (b + 1) * per]) for line in timelines) for b in range(12 // per)]
    together = max(sum(line[t] for line in timelines) for t in range(12))
    assert demand_peak(sums) >= together


def test_a_window_reads_the_buckets_every_process_has_added_to():
    assert bucket_of(T) == 1000 and bucket_of(T - 0.01) == 999
    # From its start to the bucket before the last: the last may lack a later process's add.
    assert shared_buckets(T + 1, T + WINDOW_S + 0.05) == range(1000, 1011)
    assert demand_peak([]) == 0


async def test_an_unload_the_control_plane_refuses_is_routed_to_again(runtime, monkeypatch):
    from fleet import services

    rt, _ = runtime

    def refused(**_):
        raise services.UnloadRefused("Adapter a was not unloaded from replica r2: …")

    monkeypatch.setattr(services, "adapter_unload_commands", refused)
    gateway_adapters.UNLOADING[("r2", "a")] = time.monotonic()
    assert not_holding(rt, "a", set()) == {"r2", "r3"}
    await UNLOAD("r2", "a")
    assert not_holding(rt, "a", set()) == {"r3"}


@pytest.fixture
def two_holders(db, monkeypatch):
    """Replicas llama-1 and llama-2 ready on n1, both engines saying they hold ml-tone; the
    commands sent, recorded."""
    import fleet.nodes.dispatch
    from fleet.models import Node
    from llmgw.core import clock
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import node_add

    cache.clear()
    node_add("n1", now=clock.now())
    ready_replica("llama-1", "llama", node="n1", gpus=[0])
    ready_replica("llama-2", "llama", node="n1", gpus=[1])

    def engines_say(*holders: str) -> None:
        said = {"running": 0, "waiting": 0}
        Node.objects.filter(pk="n1").update(
            load={
                "engines": {
                    f"llama-{n}-0": {
                        **said,
                        "adapters": [{"name": "ml-tone"}] if f"llama-{n}" in holders else [],
                    }
                    for n in (1, 2)
                }
            }
        )

    engines_say("llama-1", "llama-2")
    commands: list = []

    async def send(cs):
        commands.extend(cs)

    monkeypatch.setattr(fleet.nodes.dispatch, "send_commands", send)
    yield engines_say, commands
    cache.clear()


@pytest.mark.django_db(transaction=True)
async def test_the_unload_goes_to_the_replicas_first_shard(two_holders):
    _, commands = two_holders
    await gateway_adapters._unload_logged("llama-1", "ml-tone")
    assert [(c.node_id, c.payload) for c in commands] == [
        ("n1", {"type": "unload_adapter", "shard_id": "llama-1-0", "name": "ml-tone"})
    ]


def test_two_processes_unloading_at_once_unload_one_replica(two_holders):
    """Each process picked a different replica, before the engines said either unloaded:
    the first unloads, the second is refused for a window, whichever replica it names."""
    from fleet.services import UnloadRefused, adapter_unload_commands

    [first] = adapter_unload_commands(replica_id="llama-1", name="ml-tone", window_s=WINDOW_S)
    assert first.payload["shard_id"] == "llama-1-0"
    with pytest.raises(UnloadRefused) as refused:
        adapter_unload_commands(replica_id="llama-2", name="ml-tone", window_s=WINDOW_S)
    said = str(refused.value)
    assert said.startswith(
        "Adapter ml-tone was not unloaded from replica llama-2: it was unloaded from replica "
        "llama-1 0 s ago, and one replica changes at a time, at most once in 60 s."
    ), said


def test_a_load_holds_off_unloads_for_a_window(two_holders):
    from fleet.services import UnloadRefused, adapter_load_commands, adapter_unload_commands

    adapter_load_commands(
        replica_id="llama-2", name="ml-tone", source="/l/ml", format="peft", window_s=WINDOW_S
    )
    with pytest.raises(UnloadRefused, match="it was loaded on replica llama-2 0 s ago"):
        adapter_unload_commands(replica_id="llama-1", name="ml-tone", window_s=WINDOW_S)


def test_the_last_holder_keeps_it_as_the_engines_say_now(two_holders):
    """The gateway judged on readings a few seconds old: the control plane reads them again,
    and never unloads the last replica holding it, nor one that holds it no more."""
    from fleet.services import UnloadRefused, adapter_unload_commands

    engines_say, _ = two_holders
    engines_say("llama-1")
    with pytest.raises(UnloadRefused) as refused:
        adapter_unload_commands(replica_id="llama-1", name="ml-tone", window_s=WINDOW_S)
    assert str(refused.value) == (
        "Adapter ml-tone was not unloaded from replica llama-1: it is the only replica "
        "holding it, as the engines last said, and the last holder keeps it."
    )
    with pytest.raises(UnloadRefused, match="its engine does not say it holds it now"):
        adapter_unload_commands(replica_id="llama-2", name="ml-tone", window_s=WINDOW_S)
    # Neither refusal took the window: an unload may follow once a second replica holds it.
    engines_say("llama-1", "llama-2")
    assert adapter_unload_commands(replica_id="llama-2", name="ml-tone", window_s=WINDOW_S)


async def test_a_load_asked_while_the_sums_are_added_starts_the_window_again(runtime, monkeypatch):
    """The sums are added off the loop; a load asked meanwhile restarts the window, which is
    then not judged (nor is a window the next request opened)."""
    rt, unloads = runtime
    BOARD.running["a"] = 1
    await shrink(rt, now=T)

    def added(peaks, bucket):
        gateway_adapters._loading("r2", "a")  # as a request would, meanwhile
        sent(rt, request(), up("r1"))

    monkeypatch.setattr(gateway_adapters, "demand_add", added)
    await shrink(rt, now=T + WINDOW_S)
    await asyncio.sleep(0)
    assert unloads == []
    assert "a" in gateway_adapters.WINDOWS
