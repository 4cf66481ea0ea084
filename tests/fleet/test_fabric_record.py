"""A node's GPU fabric as its agent reports it: recorded at register and from a heartbeat
that says it changed, shown by `GET /api/v1/nodes/{id}`, and turned into placement's fields
(fleet/selectors/state.py)."""

from __future__ import annotations

import copy

import pytest

from fleet.models import Gpu, Node
from fleet.nodes.fabric import node_fabric_record
from fleet.protocol import BadMessage, Fabric, parse
from fleet.selectors.state import caches_clear, gpu_fabric_fields, node_fabric_fields, node_views

from .builders import H100, T0, at, node_add, register_frame

pytestmark = pytest.mark.django_db

CLUSTER = "7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f"
FABRIC = {
    "gpus": [
        {"index": 0,
         "fabric": {"cluster_uuid": CLUSTER, "clique_id": 1, "state": "completed", "status": 0},
         "nvlinks": [{"link": 0, "up": True, "peer_index": 1}, {"link": 1, "up": False}],
         "ecc": {"enabled": True, "uncorrected_volatile": 0}},
        {"index": 1,
         "fabric": {"cluster_uuid": CLUSTER, "clique_id": 1, "state": "completed", "status": 0},
         "ecc": {"uncorrected_volatile": 2}, "xids": [79]},
    ],
    "imex": {"state": "up", "domain": "imex-0123456789ab"},
    "ib_ports": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0}],
}  # fmt: skip


def register(node_id="nvl-1", *, fabric=FABRIC, gpus=(H100, H100), now=T0):
    frame = register_frame(node_id, gpus=gpus)
    if fabric is not None:
        frame["fabric"] = fabric
    node_add_frame(frame, now)


def node_add_frame(frame, now):
    from fleet.nodes.registration import node_register

    from .builders import agent_credential

    msg = parse(__import__("json").dumps(frame))
    node_register(
        msg=msg,
        session=f"session-{frame['node_id']}",
        now=now,
        credential=agent_credential(frame["node_id"]),
        seen_addr="10.0.0.7",
    )


def stored(node_id="nvl-1"):
    node = Node.objects.get(pk=node_id)
    return node.imex, node.ib_ports, {g.index: g.fabric for g in Gpu.objects.filter(node=node)}


def test_a_register_records_each_gpus_report_and_the_nodes_imex_and_ports():
    register()

    imex, ports, gpus = stored()

    assert imex == {"state": "up", "domain": "imex-0123456789ab"}
    assert ports == [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0}]
    assert gpus[1] == {
        "fabric": {"cluster_uuid": CLUSTER, "clique_id": 1, "state": "completed", "status": 0},
        "ecc": {"uncorrected_volatile": 2},
        "xids": [79],
    }
    assert gpus[0]["nvlinks"][1] == {"link": 1, "up": False}


def test_registering_again_without_a_fabric_forgets_it_and_new_gpus_keep_theirs():
    register()
    register(fabric=None, now=at(1))
    assert stored() == (None, None, {0: None, 1: None})

    register(gpus=(H100, H100, H100), now=at(2))  # its GPUs changed: rows made anew
    imex, _, gpus = stored()
    assert imex["state"] == "up" and gpus[1]["xids"] == [79] and gpus[2] is None


def test_a_heartbeats_fabric_is_recorded_and_moves_what_the_views_are_built_from():
    register()
    node = Node.objects.get(pk="nvl-1")
    changed = copy.deepcopy(FABRIC)
    changed["gpus"][0]["nvlinks"][0]["up"] = False
    changed["imex"] = {"state": "down"}
    changed["ib_ports"] = None

    node_fabric_record(node_id="nvl-1", fabric=Fabric.model_validate(changed), now=at(5))

    after = Node.objects.get(pk="nvl-1")
    imex, ports, gpus = stored()
    assert (imex, ports) == ({"state": "down"}, None)
    assert gpus[0]["nvlinks"][0] == {"link": 0, "up": False, "peer_index": 1}
    assert after.spec_at == after.fabric_at == at(5) and after.rev != node.rev


def test_counters_that_tick_are_recorded_without_rebuilding_the_nodes_view():
    register()
    node = Node.objects.get(pk="nvl-1")
    ticked = copy.deepcopy(FABRIC)
    ticked["gpus"][0]["nvlinks"][0]["replay_errors"] = 41
    ticked["gpus"][0]["ecc"]["corrected_volatile"] = 7
    ticked["ib_ports"][0]["symbol_errors"] = 3

    node_fabric_record(node_id="nvl-1", fabric=Fabric.model_validate(ticked), now=at(5))

    after = Node.objects.get(pk="nvl-1")
    _, ports, gpus = stored()
    assert gpus[0]["nvlinks"][0]["replay_errors"] == 41 and ports[0]["symbol_errors"] == 3
    assert (after.spec_at, after.rev) == (node.spec_at, node.rev)
    assert after.fabric_at == at(5)


def test_a_fabric_for_a_node_forgotten_meanwhile_writes_nothing():
    node_fabric_record(node_id="gone", fabric=Fabric.model_validate(FABRIC), now=at(5))

    assert not Node.objects.filter(pk="gone").exists()


def test_the_node_api_shows_the_fabric(api):
    register()
    node_add("plain", now=T0)

    shown = api.call("GET", "/nodes/nvl-1").json()
    plain = api.call("GET", "/nodes/plain").json()

    assert shown["imex"]["state"] == "up" and shown["ib_ports"][0]["device"] == "mlx5_0"
    assert shown["gpus"][1]["fabric"]["xids"] == [79]
    assert shown["gpus"][0]["cordoned"] is False
    assert (plain["imex"], plain["ib_ports"], plain["gpus"][0]["fabric"]) == (None, None, None)
    listed = {n["id"]: n for n in api.call("GET", "/nodes").json()}
    assert listed["nvl-1"]["imex"]["state"] == "up"
    assert "fabric" not in listed["nvl-1"]["gpus"][1]  # kilobytes a GPU: for one node only


@pytest.mark.parametrize(
    "bad",
    [
        {"gpus": [{"index": 0, "ecc": {"uncorrected_volatile": -1}}]},
        {"gpus": [{"index": 0, "nvlinks": [{"link": 64}]}]},
        {"gpus": [{"index": 0, "xids": list(range(33))}]},
        {"gpus": [{"index": 0, "fabric": {"state": "joined"}}]},
        {"imex": {"state": "sideways"}},
        {"ib_ports": [{"device": "mlx5_0", "port": 1, "rate_gbps": float("nan")}]},
        {"ib_ports": [{"device": "mlx5_\x00", "port": 1}]},
    ],
)
def test_a_fabric_that_is_not_the_protocols_is_refused(bad):
    frame = {"type": "heartbeat", "seq": 1, "fabric": bad}

    with pytest.raises(BadMessage):
        parse(__import__("json").dumps(frame, allow_nan=True))


def test_the_node_field_says_imex_up_down_or_unknown():
    assert node_fabric_fields({"state": "up", "domain": "d"}) == {"imex": True}
    assert node_fabric_fields({"state": "down"}) == {"imex": False}
    assert node_fabric_fields({}) == node_fabric_fields(None) == {"imex": None}


def test_the_gpu_fields_are_placements_rules_on_what_is_stored():
    register()
    _, _, gpus = stored()

    ok = gpu_fabric_fields("nvl-1", 0, gpus[0])
    bad = gpu_fabric_fields("nvl-1", 1, gpus[1], cordoned=True)
    unsaid = gpu_fabric_fields("nvl-1", 2, None)

    assert ok == {
        "problem": None,
        "domain": (CLUSTER, 1),
        "nvlink_peers": frozenset({1}),
        "cordoned": False,
    }
    assert bad["problem"].startswith("GPU 1 of node nvl-1 ") and bad["cordoned"] is True
    assert unsaid == {
        "problem": None,
        "domain": None,
        "nvlink_peers": frozenset(),
        "cordoned": False,
    }


def test_placement_sees_what_the_agent_said_of_its_gpus():
    register()
    caches_clear()
    node = node_views()["nvl-1"]
    by_index = {g.index: g for g in node.gpus}
    assert by_index[0].problem is None and by_index[0].domain == (CLUSTER, 1)
    assert by_index[1].problem.startswith("GPU 1 of node nvl-1 ")
    assert node.imex is not None
