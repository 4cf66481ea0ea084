"""Operating the GPU fabric: a GPU cordoned and uncordoned through the API (audited, read
again by placement), GET /api/v1/fabric, and GPUs kept out of service not counted free."""

from __future__ import annotations

import pytest

from fleet.models import Gpu, Node, Replica, Shard
from fleet.reconciler.run import reconcile_once
from fleet.selectors.state import node_views
from tenancy.models import AuditEvent
from tests.helpers import detail

from .builders import H100, T0, agent_credential, at, gpu_model, model_added, register_frame

pytestmark = pytest.mark.django_db

CLUSTER = "7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f"


def joined(index: int, clique: int = 1, **extra) -> dict:
    fabric = {"cluster_uuid": CLUSTER, "clique_id": clique, "state": "completed", "status": 0}
    return {"index": index, "fabric": fabric, **extra}


def register(node_id: str, gpus: list[dict], imex: str | None = "up") -> None:
    from fleet.nodes.registration import node_register
    from fleet.protocol import Register

    frame = register_frame(node_id, gpus=(H100,) * len(gpus))
    frame["fabric"] = {"gpus": gpus, **({"imex": {"state": imex, "domain": "a"}} if imex else {})}
    node_register(
        msg=Register.model_validate(frame),
        session=f"session-{node_id}",
        now=T0,
        credential=agent_credential(node_id),
        seen_addr="10.0.0.7",
    )


def test_a_gpu_cordoned_through_the_api_takes_no_new_replica_and_the_change_is_audited(
    api, no_settle
):
    register("n1", [joined(0), joined(1)])
    spec_at = Node.objects.get(pk="n1").spec_at
    node_views()  # placement's cache holds the node as it was

    answer = api.call("POST", "/nodes/n1/gpus/1/cordon")

    assert answer.status_code == 200
    assert detail(answer) == "GPU 1 of node n1 cordoned: no new replica is placed on it"
    assert list(Gpu.objects.filter(node="n1").values_list("index", "cordoned")) == [
        (0, False),
        (1, True),
    ]
    assert Node.objects.get(pk="n1").spec_at != spec_at
    assert [g.cordoned for g in node_views()["n1"].gpus] == [False, True]
    audit = AuditEvent.objects.get(action="node.gpu_cordon")
    assert (audit.target, audit.detail) == ("n1", {"gpu": 1})
    model_added(gpu_model("two", scaling={"min": 2}))
    reconcile_once(now=at(1))
    assert [s.gpu_indices for r in Replica.objects.all() for s in r.shards.all()] == [[0]]

    again = api.call("POST", "/nodes/n1/gpus/1/uncordon")

    assert detail(again) == "GPU 1 of node n1 uncordoned"
    assert not Gpu.objects.get(node="n1", index=1).cordoned
    assert AuditEvent.objects.filter(action="node.gpu_uncordon", target="n1").count() == 1


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/nodes/nx/gpus/0/cordon", "There is no node 'nx'."),
        ("/nodes/n1/gpus/7/cordon", "Node n1 has no GPU 7."),
    ],
)
def test_cordoning_a_gpu_there_is_not_is_a_404(api, path, said):
    register("n1", [joined(0)])

    answer = api.call("POST", path)

    assert (answer.status_code, detail(answer)) == (404, said)
    assert not AuditEvent.objects.exists()


def test_the_fabric_lists_each_domain_with_its_trays_imex_and_what_is_out_of_service(api):
    register("n1", [joined(0), joined(1, ecc={"uncorrected_volatile": 2})])
    register("n2", [joined(0), joined(1)], imex="down")
    register("n3", [joined(0, clique=2), {"index": 1, "fabric": {"state": "in_progress"}}])
    register("plain", [{"index": 0}], imex=None)
    api.call("POST", "/nodes/n2/gpus/0/cordon")

    answer = api.call("GET", "/fabric")

    assert answer.status_code == 200
    body = answer.json()
    assert [
        (d["name"], d["gpus_free"], d["gpus_total"], d["imex_up"]) for d in body["domains"]
    ] == [
        (f"domain {CLUSTER} clique 1", 2, 4, 1),
        (f"domain {CLUSTER} clique 2", 1, 2, 1),
    ]
    trays = [(t["node"], t["gpus_free"], t["imex"]) for t in body["domains"][0]["trays"]]
    assert trays == [("n1", 1, "up"), ("n2", 1, "down")]
    assert body["domains"][0]["trays"][0]["problems"] == [
        "GPU 1 of node n1 has 2 uncorrected ECC errors"
    ]
    assert body["problems"] == [
        "GPU 1 of node n1 has 2 uncorrected ECC errors",
        "GPU 0 of node n2 is cordoned",
        "GPU 1 of node n3 has its fabric registration not completed (in_progress)",
    ]


def test_the_node_list_does_not_count_a_gpu_with_a_problem_or_cordoned_as_free(api):
    register("n1", [joined(0), joined(1, xids=[79]), joined(2)])
    api.call("POST", "/nodes/n1/gpus/2/cordon")

    node = api.call("GET", "/nodes").json()[0]

    assert (node["gpu_free"], node["gpu_total"]) == (1, 3)
    assert api.call("GET", "/nodes/n1").json()["gpu_free"] == 1


def stored_free(node_id: str) -> int | None:
    """The GPUs free the cluster page sorts and counts by (fleet/nodes/figures.py)."""
    return Node.objects.get(pk=node_id).gpu_free


def test_the_cluster_pages_figures_count_free_what_placement_would_give_out(api):
    register("n1", [joined(0), joined(1, xids=[79]), joined(2)])
    assert stored_free("n1") == 2

    api.call("POST", "/nodes/n1/gpus/2/cordon")
    assert stored_free("n1") == 1
    api.call("POST", "/nodes/n1/gpus/2/uncordon")
    assert stored_free("n1") == 2


def test_a_problem_come_or_gone_in_a_heartbeat_moves_the_stored_figures():
    from fleet.nodes.fabric import node_fabric_record
    from fleet.protocol import Fabric

    register("n1", [joined(0), joined(1)])
    assert stored_free("n1") == 2
    sick = {"gpus": [joined(0), joined(1, ecc={"uncorrected_volatile": 1})]}

    node_fabric_record(node_id="n1", fabric=Fabric.model_validate(sick), now=at(1))
    assert stored_free("n1") == 1
    well = {"gpus": [joined(0), joined(1)]}
    node_fabric_record(node_id="n1", fabric=Fabric.model_validate(well), now=at(2))
    assert stored_free("n1") == 2


def test_a_replica_over_several_nodes_is_listed_on_each_tray_of_its_domain(api, no_settle):
    for node_id in ("n1", "n2"):
        register(node_id, [joined(0), joined(1)])
    profile = {"name": "wide", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, "nodes": 2}
    model_added({"name": "wide", "source": "hf://acme/wide", "profiles": [profile]})
    reconcile_once(now=at(1))
    replica = Replica.objects.get()

    domain = api.call("GET", "/fabric").json()["domains"][0]

    assert domain["replicas"] == [replica.id]
    assert [(t["node"], t["replicas"], t["gpus_free"]) for t in domain["trays"]] == [
        ("n1", [replica.id], 0),
        ("n2", [replica.id], 0),
    ]


def test_a_node_whose_gpus_report_two_domains_is_a_tray_of_each_as_the_page_draws_it(api):
    register("n1", [joined(0), joined(1, clique=2), {"index": 2}])

    domains = api.call("GET", "/fabric").json()["domains"]

    # Its GPU that reports no domain yet is counted with each, as the page draws it.
    assert [(d["clique"], [(t["node"], t["gpus_total"]) for t in d["trays"]]) for d in domains] == [
        (1, [("n1", 2)]),
        (2, [("n1", 2)]),
    ]


def holding(replica_id: str, model: str, node_id: str, indices: list[int]) -> None:
    """A ready replica of `model` holding these GPUs of one node."""
    Replica.objects.create(
        id=replica_id, model=model, profile="gpu", profile_fp="x", state="ready",
        state_since=T0, created_at=T0, ready_at=T0,
    )  # fmt: skip
    Shard.objects.create(
        id=f"{replica_id}-0", replica_id=replica_id, node_id=node_id, rank=0,
        gpu_indices=indices, http_port=20000, state="ready",
    )  # fmt: skip


def fragmented() -> None:
    """Two domains of four trays (c1-0.., c2-0..) with a replica of `small` on the first
    tray of each, so neither has the four trays `big` needs."""
    for clique in (1, 2):
        for tray in range(4):
            register(f"c{clique}-{tray}", [joined(i, clique=clique) for i in range(4)])
    model_added(gpu_model("small", scaling={"min": 2}))
    wide = {"name": "wide", "engine": "sim", "gpu_class": "h100-80g", "tp": 16, "nodes": 4}
    model_added({"name": "big", "source": "hf://acme/big", "profiles": [wide]})
    holding("small-1", "small", "c1-0", [0])
    holding("small-2", "small", "c2-0", [0])


def test_the_defrag_dry_run_names_the_moves_that_free_a_domain_and_changes_nothing(api):
    fragmented()

    answer = api.call("GET", "/models/big/defrag")

    assert answer.status_code == 200
    body = answer.json()
    assert body["moves"] == [
        {"replica": "small-1", "model": "small", "from": ["c1-0"], "to": ["c2-1"]}
    ]
    assert body["domain"] == f"domain {CLUSTER} clique 1"
    assert body["done"] is False and body["blocked"] == []
    assert body["summary"].startswith("moving small-1 of small from c1-0 to c2-1")
    assert Replica.objects.count() == 2
    assert api.call("GET", "/models/small/defrag").json()["summary"] == (
        "small has no profile over several trays of an NVLink domain"
    )
    assert api.call("GET", "/models/nope/defrag").status_code == 404
