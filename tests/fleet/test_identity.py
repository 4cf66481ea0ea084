"""A node is who it says it is: the join token makes only a first registration, the node's own
credential every one after; a node speaks only for its own shards (issue 12, items 1 and 2).
Through the real ASGI application, the agents' websocket and the REST API."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
from django.conf import settings

from fleet.models import Node, Replica, Shard
from fleet.nodes.connections import PENALTY, FrameBudget
from fleet.nodes.heard import node_live_flush
from fleet.nodes.live import LIVE
from fleet.reconciler.run import reconcile_once
from fleet.selectors.listings import measured_memory
from fleet.selectors.snapshot import model_loads
from fleet.selectors.state import replica_views
from llmgw.core import clock

from .builders import gpu_model, model_added, register_frame
from .conftest import answer, barrier, in_db

pytestmark = pytest.mark.django_db(transaction=True)

CLOSE_REFUSED = 4403


async def closed_with(comm) -> int:
    """The close code of a connection the server closes (after any frames before it)."""
    while True:
        out = await comm.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            return out["code"]


async def refused_register(agents, frame: dict, token: str | None = None) -> tuple[str, int]:
    comm = await agents.connect(token)
    assert comm.refused is None
    await comm.send_json_to(frame)
    error = await answer(comm)
    assert error["type"] == "error"
    return error["detail"], await closed_with(comm)


def with_agents(**figures):
    settings.LLMGW = replace(settings.LLMGW, agents=replace(settings.LLMGW.agents, **figures))


@pytest.fixture
def agent_settings():
    saved = settings.LLMGW
    yield with_agents
    settings.LLMGW = saved


async def test_the_first_register_issues_the_node_its_own_credential_and_keeps_only_its_hash(
    agents,
):
    await agents.registered(register_frame("gpu-a"))

    token = agents.node_tokens["gpu-a"]
    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert token.startswith("llmgw_node_")
    assert node.credential_hash == hashlib.sha256(token.encode()).hexdigest()
    assert node.joined_with == "agents" and node.credential_issued_at is not None
    assert token not in repr(await in_db(lambda: list(Node.objects.values())))


async def test_a_join_token_cannot_take_a_node_that_has_its_credential(agents, no_settle):
    """The impostor is told why and closed; the real agent keeps its connection, its state,
    and its commands."""
    await in_db(lambda: model_added(gpu_model("llama")))
    real = await agents.registered(register_frame("gpu-a"))
    session = await in_db(lambda: Node.objects.get(pk="gpu-a").session)

    detail, code = await refused_register(agents, register_frame("gpu-a") | {"hostname": "evil"})

    assert code == CLOSE_REFUSED
    assert "gpu-a has its own credential" in detail and "ctl node forget gpu-a" in detail
    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert (node.session, node.hostname, node.state) == (session, "gpu-a.lab", Node.READY)
    # The real agent still gets what is placed on it.
    await in_db(reconcile_once)
    assert (await answer(real))["type"] == "start_shard"


async def test_the_nodes_own_credential_registers_it_but_no_other_node(agents):
    first = await agents.registered(register_frame("gpu-a"))
    await first.disconnect()

    await agents.registered(register_frame("gpu-a"))  # with its credential, after a restart
    detail, code = await refused_register(
        agents, register_frame("gpu-b"), token=agents.node_tokens["gpu-a"]
    )

    assert code == CLOSE_REFUSED
    assert detail == "this connection's credential is node gpu-a's; it cannot register node gpu-b."
    assert not await in_db(lambda: Node.objects.filter(pk="gpu-b").exists())


async def test_a_revoked_join_token_leaves_joined_nodes_alone(agents, agent_token):
    from tenancy.models import Token

    first = await agents.registered(register_frame("gpu-a"))
    await first.disconnect()
    await in_db(lambda: Token.objects.filter(kind=Token.AGENT).update(revoked_at=clock.now()))

    await agents.registered(register_frame("gpu-a"))
    refused = await agents.connect(agent_token)

    assert refused.refused is not None


async def test_a_join_token_registers_at_most_so_many_new_nodes_a_minute(agents, agent_settings):
    agent_settings(joins_per_minute=2)
    await agents.registered(register_frame("gpu-a"))
    await agents.registered(register_frame("gpu-b"))

    detail, code = await refused_register(agents, register_frame("gpu-c"))

    assert code == CLOSE_REFUSED
    assert detail.startswith("join token 'agents' registered 2 nodes in the last minute")
    assert "LLMGW_JOINS_PER_MINUTE (2)" in detail


async def test_refusals_are_counted_on_metrics(agents, client):
    def scraped() -> float:
        return _refused(client.get("/metrics").content.decode(), "node_has_credential")

    await agents.registered(register_frame("gpu-a"))
    before = await in_db(scraped)

    await refused_register(agents, register_frame("gpu-a"))

    assert await in_db(scraped) == before + 1


def _refused(text: str, reason: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'llmgw_agent_refused_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


async def test_manual_approval_holds_a_new_node_out_of_placement_until_approved(
    agents, agent_settings, api, no_settle
):
    agent_settings(approval="manual")
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.connect()
    await comm.send_json_to(register_frame("gpu-a"))
    reply = await answer(comm)
    assert reply["approved"] is False and reply["node_token"]

    await in_db(reconcile_once)
    shown = await in_db(lambda: api.call("GET", "/nodes/gpu-a").json())
    explained = await in_db(lambda: api.call("GET", "/models/llama/explain").json())
    assert await in_db(lambda: Replica.objects.count()) == 0
    assert shown["state"] == "unapproved"
    assert "node gpu-a awaits an operator's approval" in str(explained)

    approved = await in_db(lambda: api.call("POST", "/nodes/gpu-a/approve", {}))
    assert approved.status_code == 200
    await in_db(reconcile_once)
    assert (await answer(comm))["type"] == "start_shard"


async def test_forgetting_a_node_stops_what_it_ran_closes_it_and_revokes_its_credential(
    agents, api, no_settle
):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    forgot = await in_db(lambda: api.call("DELETE", "/nodes/gpu-a"))

    assert forgot.status_code == 200, forgot.content
    assert "its credential is revoked" in forgot.json()["detail"]
    stop = await answer(comm)
    assert stop == {"type": "stop_shard", "shard_id": start["shard_id"], "grace_s": 0}
    assert "forgotten" in (await answer(comm))["detail"]
    assert await closed_with(comm) == CLOSE_REFUSED
    replica = await in_db(lambda: Replica.objects.get(pk=start["replica_id"]))
    assert replica.state == "failed" and "forgotten" in replica.reason
    assert (await agents.connect(agents.node_tokens["gpu-a"])).refused is not None
    # Joining again with a join token is a new node with a new credential.
    del agents.node_tokens["gpu-a"]
    await agents.registered(register_frame("gpu-a"))


async def test_an_endpoint_not_on_the_nodes_address_is_refused_and_changes_nothing(
    agents, no_settle
):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    await comm.send_json_to(
        {
            "type": "shard_status",
            "shard_id": start["shard_id"],
            "state": "ready",
            "endpoint": "http://10.9.9.9:8080",
        }
    )
    error = await answer(comm)

    assert error["type"] == "error"
    assert "not on the node's own address 10.0.0.7" in error["detail"]
    shard = await in_db(lambda: Shard.objects.get(pk=start["shard_id"]))
    assert (shard.state, shard.endpoint) == ("pending", "")


async def test_a_node_cannot_report_load_or_memory_for_another_nodes_shard(agents, no_settle):
    """Each node runs a replica of llama; gpu-b speaks of gpu-a's shard as well as its own."""
    await in_db(lambda: model_added(gpu_model("llama", scaling={"min": 2, "max": 3})))
    owner = await agents.registered(register_frame("gpu-a"))
    fake = await agents.registered(register_frame("gpu-b"))
    await in_db(reconcile_once)
    starts = {}
    for comm in (owner, fake):
        start = await answer(comm)
        starts[comm] = start["shard_id"]
        await comm.send_json_to(
            {
                "type": "shard_status",
                "shard_id": start["shard_id"],
                "state": "ready",
                "endpoint": "http://10.0.0.7:20000",
            }
        )
        await barrier(comm)
    theirs, mine = starts[owner], starts[fake]

    await fake.send_json_to(
        {
            "type": "engine_load",
            "shards": [
                {"shard_id": theirs, "running": 5, "waiting": 1_000_000},
                {"shard_id": mine, "running": 1, "waiting": 2},
            ],
        }
    )
    await fake.send_json_to(
        {
            "type": "heartbeat",
            "seq": 1,
            "load": {"shards": {theirs: {"rss_bytes": 10**21}, mine: {"rss_bytes": 3 * 1024**3}}},
        }
    )
    await barrier(fake)
    writes = LIVE.due(only="gpu-b")
    await in_db(lambda: node_live_flush(writes=writes, now=clock.now()))

    def read():
        from catalog.selectors import catalog_load

        replicas = replica_views()
        catalog = catalog_load()
        return model_loads(replicas, catalog), measured_memory(replicas, catalog)

    loads, memory = await in_db(read)
    # What gpu-b said of gpu-a's shard is kept as its own load, and counts for nothing.
    said = await in_db(lambda: Node.objects.get(pk="gpu-b").load)
    assert said["engines"][theirs]["waiting"] == 1_000_000
    assert said["shards"][theirs]["rss_bytes"] == 10**21
    assert (loads["llama"].running, loads["llama"].waiting) == (1, 2)
    assert memory == {"llama": 3.0}
    assert await in_db(lambda: Replica.objects.filter(last_used_at__isnull=False).count()) == 1


async def test_a_connection_flooding_frames_is_closed(agents, agent_settings):
    agent_settings(frames_per_second=2)
    comm = await agents.registered(register_frame("gpu-a"))

    for seq in range(1, 60):
        await comm.send_json_to({"type": "heartbeat", "seq": seq})

    assert await closed_with(comm) == 4429
    # Connecting again at once it is let in and closed straight away, for PENALTY_S.
    again = await agents.connect(agents.node_tokens["gpu-a"])
    assert again.refused is None and await closed_with(again) == 4429
    PENALTY._until.clear()


def test_the_frame_budget_drops_a_burst_past_it_and_closes_only_a_sustained_flood():
    budget = FrameBudget(per_second=10)
    verdicts = [budget.take(0.0) for _ in range(50)]
    assert verdicts == [FrameBudget.OK] * 50  # a burst of five seconds' worth
    assert budget.take(0.0) is FrameBudget.DROP
    # Kept to its budget again, it is paid back.
    assert all(budget.take(1.0 + i / 10) is FrameBudget.OK for i in range(100))
    flood = [budget.take(20.0) for _ in range(200)]
    assert FrameBudget.CLOSE in flood
    assert flood.index(FrameBudget.CLOSE) > 0


def test_mirror_files_are_read_only_by_nodes_a_shard_needing_them_was_placed_on(db, no_settle):
    """The rule the root hands the mirror's file server (fleet.nodes.identity.mirror_refusal)."""
    from fleet.nodes.identity import mirror_refusal
    from llmgw.core.secrets import digest
    from mirror.models import EngineBuild, WeightFile, Weights

    from .builders import node_add

    model_added(gpu_model("llama"))
    weights = Weights.objects.create(source="hf://acme/llama", added_by="t", added_at=clock.now())
    WeightFile.objects.create(
        weights=weights, path="w.gguf", fetch_url="x", size=1, sha256="a" * 64, state="ready"
    )
    EngineBuild.objects.create(
        engine="llamacpp",
        version="1",
        platform="linux-x86_64",
        sha256="b" * 64,
        size=1,
        added_by="t",
        added_at=clock.now(),
    )
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=clock.now())
        Node.objects.filter(pk=node_id).update(credential_hash=digest(f"llmgw_node_{node_id}"))
    Node.objects.filter(pk="gpu-b").update(cordoned=True)
    reconcile_once()
    assert Shard.objects.get().node_id == "gpu-a"

    assert mirror_refusal(secret="llmgw_node_gpu-a", sha256="a" * 64) is None
    refusal = (403, f"Node gpu-b was given no shard that needs the file {'a' * 64} now.")
    assert mirror_refusal(secret="llmgw_node_gpu-b", sha256="a" * 64) == refusal
    assert mirror_refusal(secret="llmgw_node_gpu-b", sha256="b" * 64) is None
    assert mirror_refusal(secret="llmgw_node_gpu-b", sha256="c" * 64)[0] == 404
    assert mirror_refusal(secret="llmgw_node_nobody", sha256="a" * 64)[0] == 401
    # Once its engine runs, the shard needs the weights no more: nor does its node.
    Shard.objects.update(state="ready")
    assert mirror_refusal(secret="llmgw_node_gpu-a", sha256="a" * 64)[0] == 403


def test_a_node_reads_every_file_of_the_folder_its_shard_runs_on_and_no_other(db, no_settle):
    """A model on a safetensors repository runs on all its files; one on a single file of
    some weights runs on that file, not on the rest of them."""
    from fleet.nodes.identity import mirror_refusal
    from llmgw.core.secrets import digest
    from mirror.models import WeightFile, Weights

    from .builders import node_add

    folder = Weights.objects.create(source="hf://acme/llama", added_by="t", added_at=clock.now())
    held = Weights.objects.create(source="hf://acme/quant", added_by="t", added_at=clock.now())
    for weights, path, sha in (
        (folder, "config.json", "1"),
        (folder, "tokenizer/tokenizer.json", "2"),
        (folder, "model.safetensors", "3"),
        (held, "q4.gguf", "4"),
        (held, "q8.gguf", "5"),
    ):
        WeightFile.objects.create(
            weights=weights, path=path, fetch_url="x", size=1, sha256=sha * 64, state="ready"
        )
    model_added(gpu_model("llama"))
    model_added(gpu_model("quant", source="hf://acme/quant/q4.gguf"))
    node_add("gpu-a", now=clock.now())
    Node.objects.filter(pk="gpu-a").update(credential_hash=digest("llmgw_node_gpu-a"))
    reconcile_once()
    assert sorted(Shard.objects.values_list("replica__model", flat=True)) == ["llama", "quant"]

    for sha in "1234":
        assert mirror_refusal(secret="llmgw_node_gpu-a", sha256=sha * 64) is None, sha
    assert mirror_refusal(secret="llmgw_node_gpu-a", sha256="5" * 64) == (
        403,
        f"Node gpu-a was given no shard that needs the file {'5' * 64} now.",
    )


async def test_many_bearers_are_each_told_apart_with_the_nodes_found_in_one_query(
    agents, agent_token
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleet.nodes.identity import agents_authenticate

    for node_id in ("gpu-a", "gpu-b"):
        await agents.registered(register_frame(node_id))
    a, b = agents.node_tokens["gpu-a"], agents.node_tokens["gpu-b"]
    secrets = [b, "llmgw_node_not-a-node", agent_token, "", a, "x" * 201, "llmgw_agt_not-one"]

    def look_up():
        with CaptureQueriesContext(connection) as queries:
            found = agents_authenticate(secrets)
        nodes = [q for q in queries.captured_queries if 'FROM "fleet_node"' in q["sql"]]
        return found, len(nodes)

    found, node_queries = await in_db(look_up)

    assert [(c.node_id, c.join_token) if c else None for c in found] == [
        ("gpu-b", ""),
        None,
        (None, "agents"),
        None,
        ("gpu-a", ""),
        None,
        None,
    ]
    assert node_queries == 1
