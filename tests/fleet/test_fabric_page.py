"""The NVLink page (`/fabric`), the cluster page's link to it, and a node page's fabric,
through the Django client, upon fabrics registered as agents report them."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import Replica, Shard
from fleet.selectors.state import caches_clear

from .builders import H100, T0, node_add
from .test_fabric_record import register

pytestmark = pytest.mark.django_db

CLUSTER = "7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f"


@pytest.fixture(autouse=True)
def _fresh_views():
    caches_clear()


def gpu(index: int, *, clique: int = 1, **more) -> dict:
    fabric = {"cluster_uuid": CLUSTER, "clique_id": clique, "state": "completed", "status": 0}
    return {"index": index, "fabric": fabric, **more}


def tray(node_id: str, *gpus: dict, imex: str = "up") -> None:
    """A tray of an NVL72 rack, registered with its fabric."""
    register(
        node_id,
        fabric={"gpus": list(gpus), "imex": {"state": imex, "domain": "imex-rack-a"}},
        gpus=(H100,) * len(gpus),
    )


def holding(replica_id: str, model: str, shards: dict[str, list[int]]) -> None:
    """A ready replica of `model` holding these GPUs, node by node."""
    Replica.objects.create(
        id=replica_id, model=model, profile="gpu", profile_fp="x", state="ready",
        state_since=T0, created_at=T0, ready_at=T0,
    )  # fmt: skip
    for rank, (node_id, indices) in enumerate(shards.items()):
        Shard.objects.create(
            id=f"{replica_id}-{rank}", replica_id=replica_id, node_id=node_id, rank=rank,
            gpu_indices=indices, http_port=20000 + rank, state="ready",
        )  # fmt: skip


def rack():
    """Two trays of clique 1 (IMEX down on the second, GPU 1 there with uncorrected ECC
    errors and a link down), a tray of clique 2, and a replica across the first two."""
    tray("tray-1", gpu(0), gpu(1), gpu(2), gpu(3))
    tray(
        "tray-2",
        gpu(0, nvlinks=[{"link": 0, "up": True, "peer_index": 1}, {"link": 1, "up": False}]),
        gpu(1, ecc={"enabled": True, "uncorrected_volatile": 2, "corrected_volatile": 5}),
        gpu(2),
        gpu(3),
        imex="down",
    )
    tray("tray-3", gpu(0, clique=2), gpu(1, clique=2))
    holding("big-1", "big", {"tray-1": [0, 1, 2, 3], "tray-2": [2, 3]})


def section(body: str, clique: int) -> str:
    return re.search(rf'data-clique="{clique}">(.*?)</section>', body, re.S).group(1)


def test_the_page_draws_each_domain_as_a_rack_of_its_trays(staff):
    rack()
    node_add("plain", now=T0)
    body = staff.get("/fabric").content.decode()
    one, two = section(body, 1), section(body, 2)
    assert re.findall(r'data-tray="([^"]+)"', one) == ["tray-1", "tray-2"]
    assert re.findall(r'data-tray="([^"]+)"', two) == ["tray-3"]
    # Each GPU by its use: tray-1's four and two of tray-2's are the replica's.
    assert len(re.findall(r'data-use="replica"', one)) == 6
    assert "6 GPUs free" not in one and "1 of 8 GPUs free" in one
    # Its health: the GPU with uncorrected errors says so, in placement's sentence.
    bad = re.search(r'<span class="gpu[^"]*health-bad"[^>]*>', one).group(0)
    assert 'data-gpu="1"' in bad and "GPU 1 of node tray-2 has 2 uncorrected ECC errors" in bad
    assert "1 GPU with a problem" in one
    # IMEX per tray, and the domain's count of it.
    assert re.findall(r'data-imex="(\w+)"', one) == ["up", "down"]
    assert "IMEX up on 1 of 2" in one
    # The replica spanning the two trays, with how many GPUs it holds on each.
    assert 'data-replica="big-1"' in one and "spans 2 trays" in one
    assert "(4)" in one and "(2)" in one
    assert "No replica holds a GPU of this domain." in two
    # A node with GPUs but no domain is named, not drawn.
    assert 'data-tray="plain"' not in body
    assert "1 node with GPUs reports no NVLink domain: plain." in body


def test_without_a_fabric_the_page_says_so_and_the_cluster_page_does_not_link_to_it(staff):
    node_add("plain", now=T0)
    body = staff.get("/fabric").content.decode()
    assert 'id="no-fabric"' in body and "No node reports an NVLink domain" in body
    assert "fabric-rack" not in body and "data-tray" not in body
    assert 'id="fabric-link"' not in staff.get("/").content.decode()


def test_the_cluster_page_links_to_the_page_when_a_node_reports_a_fabric(staff):
    tray("tray-1", gpu(0), gpu(1))
    assert 'href="/fabric"' in staff.get("/").content.decode()


def test_the_page_is_for_staff_only(client):
    assert client.get("/fabric").status_code == 302


def test_a_nodes_page_lists_its_links_ports_and_ecc_counters(staff):
    register("nvl-1")  # test_fabric_record.FABRIC: a link down, ECC errors, Xid 79, a port
    body = staff.get("/nodes/nvl-1").content.decode()
    fabric = re.search(r'<section id="node-fabric">(.*?)</section>', body, re.S).group(1)
    assert f"{CLUSTER} clique 1" in fabric
    assert 'data-imex="up"' in fabric and "imex-0123456789ab" in fabric
    row0 = re.search(r'<tr data-gpu="0">(.*?)</tr>', fabric).group(1)
    assert "1 of 2" in row0 and "down: 1" in row0
    row1 = re.search(r'<tr data-gpu="1">(.*?)</tr>', fabric).group(1)
    assert '<span class="bad">2</span>' in row1 and "79" in row1
    assert "GPU 1 of node nvl-1 had Xid 79 (fallen off the bus), which needs a reset" in row1
    assert re.findall(r'data-link="([^"]+)"', fabric) == ["0-0", "0-1"]
    port = re.search(r'<tr data-port="mlx5_0/1">(.*?)</tr>', fabric).group(1)
    assert "ACTIVE" in port and "400 Gb/s" in port


def test_a_gpu_node_without_a_fabric_says_so_in_a_line(staff):
    node_add("plain", now=T0)
    body = staff.get("/nodes/plain").content.decode()
    assert 'id="node-fabric"' not in body
    assert "Its GPUs report no NVLink fabric" in body
    node_add("vm", now=T0, gpus=())
    assert "node-fabric" not in staff.get("/nodes/vm").content.decode()


def test_the_page_makes_as_many_queries_at_thirty_trays_as_at_three(staff):
    def counted() -> int:
        staff.get("/fabric")  # the views are cached per process: warm them
        with CaptureQueriesContext(connection) as seen:
            assert staff.get("/fabric").status_code == 200
        return len(seen)

    for i in range(3):
        tray(f"tray-{i:02}", gpu(0), gpu(1))
    small = counted()
    for i in range(3, 30):
        tray(f"tray-{i:02}", gpu(0), gpu(1))
    holding("big-1", "big", {"tray-00": [0, 1], "tray-29": [0, 1]})
    big = counted()
    print(f"/fabric: {big} queries at 30 trays")
    assert big == small
