"""The GPU fabric end to end: real agents with simulated fabrics report two NVLink domains,
a 16-GPU replica over four trays is placed inside the one that has room, and a GPU
cordoned with `llmgw ctl gpu cordon` takes no new replica until it is uncordoned."""

from __future__ import annotations

from .harness import wait_for

SIM = {"args": ["--ttft-ms", "2", "--tokens-per-sec", "2000"], "startup_timeout": 60}
# 16 GPUs: a shard of 4 on each of 4 trays.
WIDE = {
    "name": "wide",
    "source": "org/wide-model",
    "profiles": [
        {"name": "nvl", "engine": "sim", "gpu_class": "h100-80g", "tp": 16, "nodes": 4, **SIM}
    ],
}
# A shard of 4 GPUs on one tray; two replicas.
TRAY = {
    "name": "tray",
    "source": "org/tray-model",
    "profiles": [{"name": "tp4", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, **SIM}],
    "scaling": {"min": 2},
}
# Domain B's two trays come first in placement's order: only the domain rule keeps the
# wide replica off them.
DOMAINS = {"t1": "nvl-b:1", "t2": "nvl-b:1"} | {f"t{i}": "nvl-a:1" for i in range(3, 7)}


def _two_domains(cluster) -> None:
    for i, (node, fabric) in enumerate(DOMAINS.items()):
        cluster.start_agent(
            node,
            "--simulate-gpus",
            "4xh100-80g",
            "--simulate-fabric",
            fabric,
            port_range=f"{32000 + 200 * i}-{32199 + 200 * i}",
        )
    wait_for(
        "six ready trays in two domains",
        lambda: (
            len(cluster.get("/fabric")["domains"]) == 2
            and sum(len(d["trays"]) for d in cluster.get("/fabric")["domains"]) == 6
            and all(n["state"] == "ready" for n in cluster.get("/nodes"))
        ),
    )


def test_a_wide_replica_is_placed_in_one_domain_and_a_cordoned_gpu_takes_no_new_one(cluster):
    _two_domains(cluster)

    cluster.post("/models", WIDE)
    ready = wait_for("the wide replica ready", lambda: cluster.ready_replicas("wide"))

    (replica,) = ready
    nodes = sorted(s["node"] for s in replica["shards"])
    assert nodes == ["t3", "t4", "t5", "t6"]
    assert all(len(s["gpu_indices"]) == 4 for s in replica["shards"])
    domains = {d["name"].split()[1]: d for d in cluster.get("/fabric")["domains"]}
    full = next(d for d in domains.values() if d["replicas"])
    assert [t["node"] for t in full["trays"]] == nodes
    assert (full["gpus_free"], full["gpus_total"], full["imex_up"]) == (0, 16, 4)
    other = next(d for d in domains.values() if not d["replicas"])
    assert (other["gpus_free"], other["gpus_total"]) == (8, 8)

    cordoned = cluster.ctl("gpu", "cordon", "t1:0")
    assert cordoned.returncode == 0, cordoned.stderr
    assert cordoned.stdout.strip() == "GPU 0 of node t1 cordoned: no new replica is placed on it"
    cluster.post("/models", TRAY)
    (placed,) = wait_for("one tray replica ready", lambda: cluster.ready_replicas("tray"))
    assert placed["shards"][0]["node"] == "t2"
    explained = wait_for(
        "the second refused for the cordon",
        lambda: (
            "GPU 0 of node t1 is cordoned" in (e := cluster.ctl("model", "explain", "tray")).stdout
            and e.stdout
        ),
        every=1.0,
    )
    assert "node t1 has 3 free h100-80g GPUs of 4, needs 4" in explained
    assert len(cluster.ready_replicas("tray")) == 1
    shown = cluster.ctl("fabric").stdout
    assert "GPU 0 of node t1 is cordoned" in shown

    assert cluster.ctl("gpu", "uncordon", "t1:0").returncode == 0
    wait_for("the second replica on t1", lambda: len(cluster.ready_replicas("tray")) == 2)
    assert sorted(r["shards"][0]["node"] for r in cluster.ready_replicas("tray")) == ["t1", "t2"]
