"""The agents' websocket for real: the ASGI application, Channels' communicator, the database."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from django.conf import settings
from django.db import transaction

from fleet.models import Gpu, Node, Replica, Shard
from fleet.nodes.heard import node_live_flush
from fleet.nodes.live import LIVE
from fleet.reconciler.run import reconcile_once
from llmgw.core import clock
from llmgw.core.secrets import engine_key

from .builders import L4, cpu_model, gpu_model, model_added, register_frame, running_shard
from .conftest import answer, barrier, in_db

pytestmark = pytest.mark.django_db(transaction=True)


def fleet_rows() -> list:
    """Everything the fleet keeps in the database, to show a frame changed none of it."""
    return [
        list(Node.objects.order_by("id").values()),
        list(Gpu.objects.order_by("node", "index").values()),
        list(Replica.objects.order_by("id").values()),
        list(Shard.objects.order_by("id").values()),
    ]


async def test_register_creates_the_node_with_its_gpus_and_their_class(agents):
    await agents.registered(register_frame("gpu-a", cpu_count=48))

    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    gpus = await in_db(
        lambda: list(Gpu.objects.filter(node_id="gpu-a").values_list("index", "gpu_class"))
    )
    assert node.state == Node.READY
    assert node.cpu_count == 48
    assert node.memory_total_mb == 256 * 1024
    assert node.hostname == "gpu-a.lab"
    assert gpus == [(0, "h100-80g"), (1, "h100-80g")]


async def test_registering_again_with_other_gpus_replaces_them(agents):
    first = await agents.registered(register_frame("gpu-a"))
    await first.disconnect()
    await agents.registered(register_frame("gpu-a", gpus=(L4,)))

    gpus = await in_db(lambda: list(Gpu.objects.values_list("node_id", "index", "gpu_class")))
    assert gpus == [("gpu-a", 0, "l4-24g")]


async def test_a_registration_waiting_behind_the_database_is_stamped_when_written(agents):
    """In a fleet's restart a register waits seconds in the database thread's queue: stamped
    when its frame came, a node registered a moment ago looked silent for those seconds, and
    the reconciler marked it unreachable."""
    comm = await agents.connect()
    release = threading.Event()
    busy = asyncio.ensure_future(in_db(lambda: release.wait(10)))  # the thread held
    await comm.send_json_to(register_frame("gpu-a"))
    await asyncio.sleep(0.3)
    released_at = clock.now()
    release.set()
    await busy

    assert (await answer(comm))["type"] == "registered"
    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.last_seen >= released_at
    assert LIVE.nodes["gpu-a"].last_seen >= released_at


async def test_a_handshake_does_not_wait_behind_the_database_thread(agents):
    """A fleet's registrations queue on the database thread after a restart: handshakes
    waiting behind them went past the agents' open timeout, and the agents gave up."""
    first = await agents.registered(register_frame("gpu-a"))
    await first.disconnect()
    release = threading.Event()
    busy = asyncio.ensure_future(in_db(lambda: release.wait(10)))  # the thread held
    try:
        again = await agents.connect(agents.node_tokens["gpu-a"])
        assert again.refused is None
        assert not busy.done()
    finally:
        release.set()
        await busy


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param([], id="no token"),
        pytest.param([(b"authorization", b"Bearer llmgw_agt_not-a-real-token")], id="wrong token"),
        pytest.param([(b"authorization", b"Basic dXNlcjpwYXNz")], id="not a bearer token"),
    ],
)
async def test_a_connection_without_a_valid_agent_token_is_refused(agents, headers):
    comm = await agents.connect(headers=headers)

    assert comm.refused is not None
    assert await in_db(lambda: Node.objects.count()) == 0


async def test_an_admin_token_is_not_an_agent_token(agents, admin_token):
    comm = await agents.connect(admin_token)

    assert comm.refused is not None


async def test_the_first_message_must_be_register(agents):
    comm = await agents.connect()

    await comm.send_json_to({"type": "heartbeat", "seq": 1})

    reply = await answer(comm)
    assert reply["type"] == "error"
    assert "register" in reply["detail"]
    assert await in_db(lambda: Node.objects.count()) == 0


async def test_an_invalid_register_creates_no_node(agents):
    comm = await agents.connect()

    await comm.send_json_to(register_frame("../../etc/passwd"))

    assert (await answer(comm))["type"] == "error"
    assert await in_db(lambda: Node.objects.count()) == 0


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(register_frame("gpu-a") | {"agent_version": "1." * 30}, id="a long version"),
        pytest.param(
            register_frame("gpu-a", gpus=({"name": "H100", "memory_total_mb": 2**40},)),
            id="a GPU of a petabyte",
        ),
        pytest.param(
            register_frame("gpu-a", gpus=({"name": "x" * 101},)), id="a GPU name of 101 characters"
        ),
        pytest.param(
            register_frame("gpu-a", shards=(running_shard("r" * 81, "llama", "gpu"),)),
            id="a replica id longer than the database holds",
        ),
    ],
)
async def test_a_register_with_figures_the_database_cannot_hold_is_refused(agents, frame):
    comm = await agents.connect()

    await comm.send_json_to(frame)

    assert (await answer(comm))["type"] == "error"
    assert await in_db(lambda: Node.objects.count()) == 0


async def test_a_gpu_with_an_odd_long_name_gets_a_class_that_fits(agents):
    gpu = {"name": "NVIDIA " + "Quantum" * 13, "memory_total_mb": 81559}

    await agents.registered(register_frame("gpu-a", gpus=(gpu,)))

    gpu_class = await in_db(lambda: Gpu.objects.get().gpu_class)
    assert gpu_class.startswith("quantumquantum")
    assert len(gpu_class) <= 40


BAD_FRAMES = {
    "invalid JSON": '{"type": "heartbeat", "seq": ',
    "not an object": "[1, 2, 3]",
    "an unknown type": '{"type": "reboot", "node_id": "gpu-a"}',
    "no type": '{"seq": 1}',
    "a negative seq": '{"type": "heartbeat", "seq": -1, "load": {"cpu_percent": 99}}',
    "a seq that is not a number": '{"type": "heartbeat", "seq": "one"}',
    "a reading out of range": '{"type": "heartbeat", "seq": 1, "load": {"cpu_percent": 250}}',
    "memory of zero": '{"type": "heartbeat", "seq": 1, "memory_total_mb": 0}',
    "a shard_status in an unknown state": '{"type": "shard_status", "shard_id": "x-0", "state": "exploded"}',
    "a shard id with a slash": '{"type": "shard_status", "shard_id": "../x", "state": "failed"}',
    "a register for another node": json.dumps(register_frame("gpu-b")),
    "arrays nested thousands deep": '{"type": "heartbeat", "seq": 1, "load": '
    + "[" * 5000
    + "]" * 5000
    + "}",
    "text with a NUL character": json.dumps(
        {"type": "heartbeat", "seq": 1, "load": {"gpus": [{"index": 0, "throttle": ["a\x00"]}]}}
    ),
    "a reading of Infinity": '{"type": "heartbeat", "seq": 1, "load": {"load1": Infinity}}',
    "a reading of NaN": '{"type": "heartbeat", "seq": 1, "load": {"cpu_percent": NaN}}',
    "an exit code beyond 32 bits": json.dumps(
        {"type": "shard_status", "shard_id": "x-0", "state": "failed", "exit_code": 2**40}
    ),
    # Unknown fields are ignored, so only the size check stops this one.
    "a frame over 256 KiB": json.dumps(
        {"type": "heartbeat", "seq": 1, "load": {"cpu_percent": 99}, "pad": "x" * (256 * 1024)}
    ),
}


@pytest.mark.parametrize("frame", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
async def test_an_invalid_frame_is_answered_with_an_error_and_changes_nothing(agents, frame):
    comm = await agents.registered(register_frame("gpu-a"))
    before = await in_db(fleet_rows)
    live_before = (LIVE.nodes["gpu-a"].last_seq, LIVE.nodes["gpu-a"].load)

    await comm.send_to(text_data=frame)

    reply = await answer(comm)
    assert reply["type"] == "error"
    assert reply["detail"]
    assert await in_db(fleet_rows) == before
    assert (LIVE.nodes["gpu-a"].last_seq, LIVE.nodes["gpu-a"].load) == live_before


async def test_a_binary_frame_is_answered_with_an_error(agents):
    comm = await agents.registered(register_frame("gpu-a"))

    await comm.send_to(bytes_data=b'{"type": "heartbeat", "seq": 1}')

    reply = await answer(comm)
    assert reply["type"] == "error"
    assert LIVE.nodes["gpu-a"].last_seq == -1


async def test_a_heartbeat_that_is_not_after_the_last_one_is_refused(agents):
    comm = await agents.registered(register_frame("gpu-a"))
    await comm.send_json_to({"type": "heartbeat", "seq": 5, "load": {"cpu_percent": 10}})

    await comm.send_json_to({"type": "heartbeat", "seq": 5, "load": {"cpu_percent": 90}})
    reply = await answer(comm)
    await comm.send_json_to({"type": "heartbeat", "seq": 3, "load": {"cpu_percent": 90}})
    reply_older = await answer(comm)

    assert reply["type"] == reply_older["type"] == "error"
    assert "seq" in reply["detail"]
    assert LIVE.nodes["gpu-a"].last_seq == 5
    assert json.loads(LIVE.nodes["gpu-a"].load)["cpu_percent"] == 10


async def test_ten_invalid_frames_in_a_row_close_the_connection(agents):
    comm = await agents.registered(register_frame("gpu-a"))

    for _ in range(10):
        await comm.send_to(text_data="not json")
        assert (await answer(comm))["type"] == "error"

    closed = await comm.receive_output(timeout=5)
    assert closed["type"] == "websocket.close"


async def test_a_valid_frame_between_invalid_ones_keeps_the_connection_open(agents):
    comm = await agents.registered(register_frame("gpu-a"))

    for seq in range(1, 4):
        for _ in range(9):
            await comm.send_to(text_data="not json")
            assert (await answer(comm))["type"] == "error"
        await comm.send_json_to({"type": "heartbeat", "seq": seq})

    await barrier(comm)
    assert LIVE.nodes["gpu-a"].last_seq == 3
    assert await comm.receive_nothing(timeout=0.2)


async def test_a_heartbeat_is_kept_in_memory_and_written_behind(agents):
    comm = await agents.registered(register_frame("gpu-a"))
    registered = await in_db(lambda: Node.objects.get(pk="gpu-a"))

    await comm.send_json_to(
        {
            "type": "heartbeat",
            "seq": 1,
            # The agent repeats its memory and CPUs in every heartbeat; unchanged, they wait too.
            "memory_total_mb": 256 * 1024,
            "cpu_count": 32,
            "load": {"cpu_percent": 42.5, "load1": 3.0, "cpu_temp_c": 61},
        }
    )
    await barrier(comm)

    assert json.loads(LIVE.nodes["gpu-a"].load)["cpu_percent"] == 42.5
    row = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert (row.last_seen, row.load) == (registered.last_seen, {})

    writes = LIVE.due(only="gpu-a")
    await in_db(lambda: node_live_flush(writes=writes, now=clock.now()))

    row = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert (row.load["cpu_percent"], row.load["load1"], row.load["cpu_temp_c"]) == (42.5, 3.0, 61)
    assert row.last_seen > registered.last_seen


async def test_the_flusher_writes_heartbeats_behind_by_itself(agents, monkeypatch):
    from fleet.nodes import consumers

    monkeypatch.setattr(consumers, "FLUSH_EVERY_S", 0.02)
    comm = await agents.registered(register_frame("gpu-a"))
    monkeypatch.setattr(LIVE, "write_every", 0.0)

    await comm.send_json_to({"type": "heartbeat", "seq": 1, "load": {"cpu_percent": 7}})

    import asyncio

    for _ in range(250):
        load = await in_db(lambda: Node.objects.get(pk="gpu-a").load)
        if load:
            break
        await asyncio.sleep(0.02)
    assert load["cpu_percent"] == 7


async def test_a_heartbeat_reporting_other_memory_or_cpus_is_written_at_once(agents):
    comm = await agents.registered(register_frame("gpu-a", memory_total_mb=65536, cpu_count=16))

    await comm.send_json_to(
        {"type": "heartbeat", "seq": 1, "memory_total_mb": 32768, "cpu_count": 8}
    )
    await barrier(comm)

    row = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert (row.memory_total_mb, row.cpu_count) == (32768, 8)


async def test_a_heartbeat_with_a_changed_fabric_is_recorded_at_once(agents):
    frame = register_frame("gpu-a")
    frame["fabric"] = {"gpus": [{"index": 0, "ecc": {"uncorrected_volatile": 0}}]}
    comm = await agents.registered(frame)
    registered = await in_db(lambda: Node.objects.get(pk="gpu-a"))

    await comm.send_json_to(
        {
            "type": "heartbeat",
            "seq": 1,
            "fabric": {
                "gpus": [{"index": 0, "ecc": {"uncorrected_volatile": 2}, "xids": [79]}],
                "imex": {"state": "down"},
            },
        }
    )
    await barrier(comm)

    row = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    gpu = await in_db(lambda: Gpu.objects.get(node_id="gpu-a", index=0))
    assert gpu.fabric == {"ecc": {"uncorrected_volatile": 2}, "xids": [79]}
    assert row.imex == {"state": "down"} and row.spec_at > registered.spec_at


async def test_engine_load_with_requests_running_marks_the_replica_used(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    await comm.send_json_to(
        {"type": "engine_load", "shards": [{"shard_id": start["shard_id"], "running": 3}]}
    )
    await barrier(comm)
    writes = LIVE.due(only="gpu-a")
    await in_db(lambda: node_live_flush(writes=writes, now=clock.now()))

    replica = await in_db(lambda: Replica.objects.get(pk=start["replica_id"]))
    assert replica.last_used_at is not None


async def test_engine_load_says_how_far_an_adapters_fetch_got(agents, no_settle):
    """What the gateway's 503 for a request waiting on the adapter reads; a fetch not said
    in the next engine_load is over."""
    from fleet.selectors.routing import replica_readings

    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)
    shard = {"shard_id": start["shard_id"], "running": 0}

    async def said(entry: dict):
        await comm.send_json_to({"type": "engine_load", "shards": [entry]})
        await barrier(comm)
        writes = LIVE.due(only="gpu-a")
        await in_db(lambda: node_live_flush(writes=writes, now=clock.now()))
        await in_db(lambda: Replica.objects.filter(pk=start["replica_id"]).update(state="ready"))
        return (await in_db(replica_readings))[start["replica_id"]]

    fetching = [{"name": "ml-tone", "done": 4_800_000, "total": 12_000_000}]
    reading = await said({**shard, "adapters_fetching": fetching})
    assert reading.fetched("ml-tone") == (4_800_000, 12_000_000)
    assert (await engine_shown(start["replica_id"]))["adapters_fetching"] == fetching
    assert (await said(shard)).fetched("ml-tone") is None
    assert "adapters_fetching" not in await engine_shown(start["replica_id"])


async def engine_shown(replica_id: str) -> dict:
    """The replica's engine reading as GET /replicas shows it."""
    from fleet.selectors import listings

    rows = await in_db(lambda: listings.replicas_list(model="llama"))
    return next(r["engine"] for r in rows if r["id"] == replica_id)


async def test_a_closed_connection_makes_the_node_unreachable(agents):
    comm = await agents.registered(register_frame("gpu-a"))

    await comm.disconnect()

    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.state == Node.UNREACHABLE
    assert "gpu-a" not in LIVE.nodes


async def test_a_second_connection_for_the_same_node_closes_the_first(agents):
    first = await agents.registered(register_frame("gpu-a"))

    second = await agents.registered(register_frame("gpu-a"))

    closed = await first.receive_output(timeout=5)
    assert closed["type"] == "websocket.close"
    await first.disconnect()
    # The older connection going away does not make the node unreachable: the newer one holds it.
    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.state == Node.READY
    await second.send_json_to({"type": "heartbeat", "seq": 1, "load": {"cpu_percent": 1}})
    await barrier(second)
    assert LIVE.nodes["gpu-a"].last_seq == 1


async def test_start_shard_reaches_only_the_chosen_node_after_the_commit(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama", gpu_class="h100-80g")))
    h100 = await agents.registered(register_frame("gpu-a"))
    l4 = await agents.registered(register_frame("gpu-b", gpus=(L4, L4)))

    def rolled_back_pass():
        with pytest.raises(RuntimeError), transaction.atomic():
            reconcile_once()
            raise RuntimeError("the commit never happens")

    await in_db(rolled_back_pass)
    assert await h100.receive_nothing(timeout=0.3)
    assert await in_db(lambda: Replica.objects.count()) == 0

    await in_db(reconcile_once)

    start = await answer(h100)
    shard = await in_db(lambda: Shard.objects.select_related("replica").get())
    assert start["type"] == "start_shard"
    assert (start["shard_id"], start["replica_id"], start["rank"]) == (
        shard.id,
        shard.replica_id,
        0,
    )
    assert start["model"] == "llama"
    assert start["profile"]["name"] == "gpu"
    assert start["profile_fp"] == shard.replica.profile_fp
    assert start["source"] == "hf://acme/llama"
    assert len(start["gpu_indices"]) == 1
    assert start["gpu_indices"] == shard.gpu_indices
    assert start["http_port"] == shard.http_port > 0
    assert start["api_key"] == engine_key(settings.SECRET_KEY, shard.replica_id)
    assert start["threads"] == 0
    assert start["startup_timeout_s"] == 600
    # What it reserved, and how far past it its agent lets it go (the settings' defaults).
    assert start["memory_gb"] == shard.memory_gb
    assert start["memory_watch"] == {"margin": 0.25, "grace_s": 5.0}
    assert await l4.receive_nothing(timeout=0.3)


async def test_a_cpu_shard_is_started_with_its_reserved_cores_as_threads(agents, no_settle):
    await in_db(lambda: model_added(cpu_model("tiny", cores=3, selector={"pool": "b"})))
    a = await agents.registered(register_frame("cpu-a", gpus=(), labels={"pool": "a"}))
    b = await agents.registered(register_frame("cpu-b", gpus=(), labels={"pool": "b"}))

    await in_db(reconcile_once)

    start = await answer(b)
    assert start["type"] == "start_shard"
    assert (start["threads"], start["gpu_indices"]) == (3, [])
    assert await a.receive_nothing(timeout=0.3)


async def test_register_adopts_a_running_shard_of_a_known_model(agents):
    await in_db(lambda: model_added(gpu_model("llama")))
    shard = running_shard("llama-0a1b2c", gpu_model("llama"), "gpu")
    frame = register_frame("gpu-a", shards=(shard,))

    comm = await agents.registered(frame)

    assert await comm.receive_nothing(timeout=0.3)
    shard = await in_db(lambda: Shard.objects.select_related("replica").get())
    assert (shard.id, shard.node_id, shard.http_port) == ("llama-0a1b2c-0", "gpu-a", 20000)
    assert (shard.replica.id, shard.replica.model, shard.replica.state) == (
        "llama-0a1b2c",
        "llama",
        "ready",
    )


async def test_adopted_replicas_are_not_started_again_by_the_next_pass(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    shard = running_shard("llama-0a1b2c", gpu_model("llama"), "gpu")
    frame = register_frame("gpu-a", shards=(shard,))
    comm = await agents.registered(frame)

    result = await in_db(reconcile_once)

    assert result["starts"] == 0
    assert await comm.receive_nothing(timeout=0.3)


async def test_register_stops_a_shard_of_an_unknown_model(agents):
    frame = register_frame("gpu-a", shards=(running_shard("ghost-0a1b2c", "ghost", "gpu"),))

    comm = await agents.registered(frame)

    assert await answer(comm) == {"type": "stop_shard", "shard_id": "ghost-0a1b2c-0", "grace_s": 0}
    assert await in_db(lambda: Replica.objects.count()) == 0


async def test_a_pending_shard_the_node_does_not_report_is_started_again(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    first = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    sent = await answer(first)
    await first.disconnect()

    again = await agents.registered(register_frame("gpu-a"))

    resent = await answer(again)
    assert resent["type"] == "start_shard"
    assert (resent["shard_id"], resent["http_port"]) == (sent["shard_id"], sent["http_port"])
    assert await in_db(lambda: Replica.objects.get().state) == "pending"


async def test_a_ready_shard_the_node_no_longer_reports_fails_its_replica(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    first = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    sent = await answer(first)
    await first.send_json_to(
        {"type": "shard_status", "shard_id": sent["shard_id"], "state": "ready"}
    )
    await barrier(first)
    await first.disconnect()

    again = await agents.registered(register_frame("gpu-a"))

    assert await again.receive_nothing(timeout=0.3)
    replica = await in_db(lambda: Replica.objects.get())
    assert replica.state == "failed"
    assert sent["shard_id"] in replica.reason


async def test_shard_status_ready_makes_the_replica_ready(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    await comm.send_json_to(
        {"type": "shard_status", "shard_id": start["shard_id"], "state": "starting"}
    )
    await barrier(comm)
    assert await in_db(lambda: Replica.objects.get().state) == "starting"
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

    replica = await in_db(lambda: Replica.objects.get())
    assert replica.state == "ready"
    assert replica.ready_at is not None
    assert await in_db(lambda: Shard.objects.get().endpoint) == endpoint


async def test_shard_status_failed_fails_the_replica_with_the_reason(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    await comm.send_json_to(
        {
            "type": "shard_status",
            "shard_id": start["shard_id"],
            "state": "failed",
            "detail": "CUDA out of memory",
            "exit_code": 1,
        }
    )
    await barrier(comm)

    replica = await in_db(lambda: Replica.objects.get())
    assert replica.state == "failed"
    assert "CUDA out of memory" in replica.reason
    assert "exit code 1" in replica.reason


async def test_a_node_cannot_report_the_state_of_another_nodes_shard(agents, no_settle):
    await in_db(lambda: model_added(gpu_model("llama", gpu_class="h100-80g")))
    owner = await agents.registered(register_frame("gpu-a"))
    other = await agents.registered(register_frame("gpu-b", gpus=(L4,)))
    await in_db(reconcile_once)
    start = await answer(owner)

    await other.send_json_to(
        {"type": "shard_status", "shard_id": start["shard_id"], "state": "failed"}
    )
    await barrier(other)

    assert await in_db(lambda: Replica.objects.get().state) == "pending"


async def test_a_node_found_lost_while_still_connected_is_asked_to_register_again(agents):
    comm = await agents.registered(register_frame("gpu-a", cpu_count=32))
    # The reconciler gave the node up (its replicas with it) while its heartbeats were held up.
    await in_db(lambda: Node.objects.filter(pk="gpu-a").update(state=Node.LOST))

    await comm.send_json_to({"type": "heartbeat", "seq": 1, "cpu_count": 16})

    closed = await comm.receive_output(timeout=5)
    assert closed["type"] == "websocket.close"


async def test_a_running_shard_with_a_malformed_endpoint_is_stopped_not_left_untracked(agents):
    await in_db(lambda: model_added(gpu_model("llama")))
    shard = running_shard("llama-0a1b2c", "llama", "gpu") | {"endpoint": "http://10.0.0.7:99999"}

    comm = await agents.registered(register_frame("gpu-a", shards=(shard,)))

    assert await answer(comm) == {"type": "stop_shard", "shard_id": "llama-0a1b2c-0", "grace_s": 0}
    assert await in_db(lambda: Shard.objects.count()) == 0


async def test_a_shard_another_node_holds_is_stopped_not_adopted_twice(agents):
    await in_db(lambda: model_added(gpu_model("llama")))
    shard = running_shard("llama-0a1b2c", gpu_model("llama"), "gpu")
    await agents.registered(register_frame("gpu-a", shards=(shard,)))

    impostor = await agents.registered(register_frame("gpu-b", shards=(shard,)))

    assert await answer(impostor) == {
        "type": "stop_shard",
        "shard_id": "llama-0a1b2c-0",
        "grace_s": 0,
    }
    assert await in_db(lambda: list(Shard.objects.values_list("id", "node_id"))) == [
        ("llama-0a1b2c-0", "gpu-a")
    ]


async def test_an_engine_the_agent_runs_but_the_control_plane_does_not_know_is_stopped(
    agents, monkeypatch
):
    from fleet.nodes import consumers

    monkeypatch.setattr(consumers, "FLUSH_EVERY_S", 0.02)
    comm = await agents.registered(register_frame("gpu-a"))
    monkeypatch.setattr(LIVE, "write_every", 0.0)

    await comm.send_json_to(
        {
            "type": "heartbeat",
            "seq": 1,
            "shards": [{"shard_id": "ghost-abc123-0", "state": "ready"}],
        }
    )

    assert await answer(comm) == {"type": "stop_shard", "shard_id": "ghost-abc123-0", "grace_s": 0}


def test_a_connection_whose_agent_hung_up_while_its_frame_waited_is_no_longer_there():
    """daphne puts the hang-up in the connection's inbox, where it waits until the frame's
    handler ends: a registration still queued then is not written for no one."""
    from fleet.nodes.consumers import AgentConsumer
    from llmgw.core.inbox import Inbox

    consumer = AgentConsumer()
    consumer._inbox = Inbox()
    consumer._inbox.put_nowait({"type": "websocket.receive", "text": "{}"})
    assert consumer._still_there()

    consumer._inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})
    assert not consumer._still_there()
