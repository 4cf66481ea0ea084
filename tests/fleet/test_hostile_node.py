"""A node speaks only for what it was given (issue 35): each attack of the report, made by a
node holding its own credential through the real agents' websocket and HTTP, now changes
nothing of anyone else's. The rules themselves: tests/domain/test_adoption.py."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import httpx
import pytest
from django.db import IntegrityError, transaction
from hypothesis import HealthCheck, given, settings, strategies as st

from catalog.domain import parse_model
from fleet.models import Event, Lease, Node, Replica, Shard
from fleet.nodes.connections import GATE
from fleet.nodes.reports import shard_status_record
from fleet.protocol import BadMessage, ShardStatus
from fleet.reconciler.run import LEASE, reconcile_once
from fleet.selectors.events import events_page
from llmgw.core import clock
from mirror.models import WeightFile
from mirror.worker import work_until_idle
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

from .builders import cpu_model, gpu_model, model_added, node_add, register_frame, running_shard
from .conftest import answer, barrier, in_db
from .test_identity import _refused, closed_with
from .test_pages import place

pytestmark = pytest.mark.django_db(transaction=True)

EVIL = "10.0.0.66"


def ran_all_along() -> None:
    """A control plane that started long ago and passed a moment ago: it lost nothing."""
    now, long_ago = clock.now(), clock.now() - timedelta(hours=3)
    Lease.objects.update_or_create(
        pk=LEASE,
        defaults={
            "expires_at": now,
            "last_pass_at": now,
            "settled_from": long_ago,
            "served_since": long_ago,
        },
    )


def evil_frame(*shards: dict, **fields) -> dict:
    """The hostile node's register: its own GPUs, address and whatever shards it claims."""
    frame = register_frame("evil", shards=shards) | {"mgmt_addr": EVIL}
    return frame | fields


def at(shard: dict, address: str = EVIL, **fields) -> dict:
    """A claimed shard with its engine on `address`."""
    port = shard["endpoint"].rsplit(":", 1)[1]
    return shard | {"endpoint": f"http://{address}:{port}"} | fields


async def stops(comm, count: int) -> list[str]:
    frames = [await answer(comm) for _ in range(count)]
    assert {f["type"] for f in frames} == {"stop_shard"}, frames
    return [f["shard_id"] for f in frames]


def placements() -> list[tuple]:
    return list(
        Shard.objects.order_by("id").values_list(
            "id", "node_id", "rank", "state", "endpoint", "replica__state"
        )
    )


def refused_count(reason: str) -> float:
    from django.test import Client

    return _refused(Client().get("/metrics").content.decode(), reason)


@pytest.fixture
async def victim(agents, no_settle):
    """gpu-a runs a ready replica of llama, placed there by the control plane, which has
    run all along."""
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)
    endpoint = f"http://10.0.0.7:{start['http_port']}"
    await comm.send_json_to(
        {
            "type": "shard_status",
            "shard_id": start["shard_id"],
            "state": "ready",
            "endpoint": endpoint,
        }
    )
    await barrier(comm)
    await in_db(ran_all_along)
    assert await in_db(lambda: Replica.objects.get().state) == "ready"
    return start


async def test_a_node_cannot_attach_itself_to_another_nodes_replica_nor_stop_it(agents, victim):
    replica = victim["replica_id"]
    before = await in_db(placements)
    claimed = at(running_shard(replica, gpu_model("llama"), "gpu", port=31000))

    evil = await agents.registered(
        evil_frame(
            claimed, at(claimed, shard_id=f"{replica}-00"), at(claimed, shard_id=f"{replica}-1")
        ),
        client=EVIL,
    )

    assert await stops(evil, 3) == [f"{replica}-0", f"{replica}-00", f"{replica}-1"]
    assert await in_db(placements) == before
    # Failing the shard it claimed, and going silent, leave gpu-a's replica as it was.
    await evil.send_json_to({"type": "shard_status", "shard_id": f"{replica}-0", "state": "failed"})
    await barrier(evil)
    await evil.disconnect()
    assert await in_db(placements) == before
    assert await in_db(lambda: Replica.objects.get().state) == "ready"
    # Said once, counted, and kept in the event log of the node that said it.
    [event] = await in_db(lambda: list(Event.objects.filter(kind="shards_refused")))
    assert event.node == "evil"
    assert event.message.startswith(
        "node evil reported 3 shard(s) the control plane did not give it or cannot believe, "
        "and was told to stop them (1 elsewhere, 2 not placed): "
        f"shard {replica}-0 is placed on node gpu-a, not on node evil"
    )
    assert await in_db(lambda: refused_count("shard_elsewhere")) >= 1
    assert await in_db(lambda: refused_count("shard_status_not_placed")) >= 1


async def test_a_node_cannot_take_a_models_traffic_with_a_replica_it_was_never_given(
    agents, victim
):
    forged = at(running_shard("llama-ffffff", gpu_model("llama"), "gpu", port=31000))

    evil = await agents.registered(evil_frame(forged), client=EVIL)

    assert await stops(evil, 1) == ["llama-ffffff-0"]
    assert await in_db(lambda: list(Replica.objects.values_list("id", flat=True))) == [
        victim["replica_id"]
    ]
    assert await in_db(lambda: refused_count("shard_late")) >= 1


async def test_a_restored_control_plane_takes_back_a_few_running_shards_each_said(
    agents, no_settle
):
    """A new database (no pass ever) adopts what nodes run, as the catalog has it and at
    most LLMGW_ADOPT_PER_REGISTER a registration: not 300 made-up replicas in one frame."""
    model = cpu_model("tiny", cores=1, memory_gb=1)
    await in_db(lambda: model_added(model))
    made_up = [
        at(running_shard(f"tiny-{i:06x}", model, "cpu", port=30000 + i) | {"gpu_indices": []})
        for i in range(300)
    ]

    evil = await agents.registered(evil_frame(*made_up, gpus=()), client=EVIL)

    assert len(await stops(evil, 292)) == 292
    adopted = await in_db(lambda: list(Shard.objects.values_list("node_id", "adopted_at")))
    assert len(adopted) == 8 and all(n == "evil" and a is not None for n, a in adopted)
    said = await in_db(lambda: events_page(node="evil", limit=20)["events"])
    assert sum(e["kind"] == "shard_adopted" for e in said) == 8
    assert any("292 too many" in e["message"] for e in said if e["kind"] == "shards_refused")


async def test_weights_follow_placements_not_what_a_node_claims(
    agents,
    no_settle,
    api,
    mirror_dir,  # noqa: F811
):
    path = mirror_dir / "allowed" / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 1000)
    weights = await in_db(lambda: api.call("POST", "/weights", {"source": str(path)}).json())
    await in_db(work_until_idle)
    digest = await in_db(lambda: WeightFile.objects.get().sha256)
    model = cpu_model("tiny", cores=1, memory_gb=1) | {"source": weights["source"]}
    await in_db(lambda: model_added(model))
    claimed = at(running_shard("tiny-0a1b2c", model, "cpu") | {"gpu_indices": []})
    # A new database: its claim is adopted, as a lost state's would be ...
    await agents.registered(evil_frame(claimed, gpus=()), client=EVIL)
    assert await in_db(lambda: Shard.objects.get().node_id) == "evil"

    from llmgw.asgi import application

    transport = httpx.ASGITransport(app=application)
    token = agents.node_tokens["evil"]
    async with httpx.AsyncClient(transport=transport, base_url="http://llmgw") as client:
        r = await client.get(
            f"/api/v1/mirror/files/{digest}", headers={"authorization": f"Bearer {token}"}
        )
    # ... but an adopted shard was placed by nobody: it reads no weights.
    assert r.status_code == 403
    assert r.json()["detail"] == f"Node evil was given no shard that needs the file {digest} now."


async def test_a_node_cannot_name_an_address_it_does_not_connect_from(agents, victim, api):
    """The report's node connected from 127.0.0.1 and named 203.0.113.7: its engines are
    believed nowhere, nothing is placed on it, until an operator approves that address."""
    forged = at(running_shard("llama-0a1b2c", gpu_model("llama"), "gpu"), "203.0.113.7")

    evil = await agents.registered(evil_frame(forged, mgmt_addr="203.0.113.7"), client="127.0.0.1")

    assert await stops(evil, 1) == ["llama-0a1b2c-0"]
    node = await in_db(lambda: api.call("GET", "/nodes/evil").json())
    assert (node["state"], node["seen_addr"], node["mgmt_addr"]) == (
        "unapproved",
        "127.0.0.1",
        "203.0.113.7",
    )
    assert node["address_refusal"] == (
        "node evil says its engines are at 203.0.113.7 but connects from 127.0.0.1: nothing is "
        "placed on it and none of its engines is used until an operator approves that address "
        "(llmgw ctl node approve evil --address 203.0.113.7)"
    )
    await in_db(lambda: Replica.objects.filter(model="llama").update(state="stopped"))
    await in_db(lambda: Node.objects.filter(pk="gpu-a").update(cordoned=True))
    await in_db(reconcile_once)
    explained = await in_db(lambda: api.call("GET", "/models/llama/explain").json())
    assert node["address_refusal"] in str(explained)
    # A status naming that address changes nothing either.
    await evil.send_json_to(
        {
            "type": "shard_status",
            "shard_id": "x-0",
            "state": "ready",
            "endpoint": "http://203.0.113.7:1",
        }
    )
    assert (await answer(evil))["type"] == "stop_shard"

    approved = await in_db(
        lambda: api.call("POST", "/nodes/evil/approve", {"address": "203.0.113.7"}).json()
    )
    assert approved["detail"] == (
        "node evil approved with its engines at 203.0.113.7: placement may use it from the next "
        "reconciler pass"
    )
    node = await in_db(lambda: api.call("GET", "/nodes/evil").json())
    assert (node["state"], node["address_refusal"]) == ("ready", "")


async def test_one_shard_per_rank_of_a_replica_whoever_writes_it(victim):
    def second_rank_zero():
        with transaction.atomic():
            Shard.objects.create(
                id=f"{victim['replica_id']}-00",
                replica_id=victim["replica_id"],
                node_id="gpu-a",
                rank=0,
                http_port=1,
            )

    with pytest.raises(IntegrityError):
        await in_db(second_rank_zero)


async def test_failed_handshakes_from_one_address_are_refused_before_the_database(agents):
    """The report's 300 failed handshakes in 0.3 s from one address: past the budget they
    are closed (4429) with no credential looked up, while a node's own credential that
    worked before, from the same address, and another address are let in."""
    node = await agents.registered(register_frame("gpu-a"))
    await node.disconnect()
    for _ in range(30):
        bad = await agents.connect("llmgw_node_guess", client="10.0.0.7")
        assert bad.refused is not None

    held = await agents.connect("llmgw_node_guess", client="10.0.0.7")
    assert held.refused is None and await closed_with(held) == 4429
    assert await in_db(lambda: refused_count("handshakes")) >= 1
    # The node that authenticated here before is not held by that storm.
    own = await agents.connect(agents.node_tokens["gpu-a"], client="10.0.0.7")
    assert own.refused is None
    elsewhere = await agents.connect(client="10.0.0.8")
    assert elsewhere.refused is None
    GATE.__init__()


# What node "evil" may say, drawn: shards of gpu-a's replicas under their ids and others,
# made-up ones, any state, any endpoint; then statuses of any of them.
_VICTIMS = ("llama-aaaaaa", "llama-bbbbbb")
_SHARD_IDS = st.sampled_from(
    [f"{r}-{rank}" for r in _VICTIMS for rank in ("0", "00", "1")] + ["llama-cccccc-0", "x"]
)


@st.composite
def _reports(draw):
    claims = []
    for shard_id in draw(st.lists(_SHARD_IDS, max_size=5)):
        claims.append(
            {
                "shard_id": shard_id,
                "replica_id": draw(st.sampled_from([*_VICTIMS, "llama-cccccc", shard_id])),
                "model": "llama",
                "profile": "gpu",
                "profile_fp": draw(st.sampled_from([_FP, ""])),
                "gpu_indices": draw(st.lists(st.integers(0, 1), max_size=2)),
                "endpoint": draw(st.sampled_from(["", f"http://{EVIL}:1", "http://10.0.0.7:1"])),
                "state": draw(st.sampled_from(["starting", "ready", "failed"])),
            }
        )
    statuses = draw(
        st.lists(st.tuples(_SHARD_IDS, st.sampled_from(["ready", "failed", "stopped"])), max_size=3)
    )
    return claims, statuses, draw(st.booleans())


_FP = parse_model(gpu_model("llama")).profile("gpu").fingerprint()


class _Undone(Exception):
    """Raised to roll each drawn example back."""


@pytest.mark.django_db(transaction=False)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reports())
def test_no_report_from_one_node_changes_a_replica_placed_on_another(drawn):
    claims, statuses, restarted = drawn
    try:
        with transaction.atomic():
            now = clock.now()
            model_added(gpu_model("llama"))
            node_add("gpu-a", now=now)
            for i, replica in enumerate(_VICTIMS):
                place(replica, "llama", "gpu-a", [i], now=now)
            if not restarted:
                ran_all_along()
            before = placements()
            node_add("evil", now=now, seen_addr=EVIL, shards=tuple(claims))
            for shard_id, state in statuses:
                with contextlib.suppress(BadMessage):
                    shard_status_record(
                        node_id="evil",
                        msg=ShardStatus(type="shard_status", shard_id=shard_id, state=state),
                        now=now,
                    )
            after = placements()
            assert [p for p in after if p[1] == "gpu-a"] == before
            assert all(p[0].startswith("llama-cccccc") for p in after if p[1] == "evil")
            raise _Undone
    except _Undone:
        pass
