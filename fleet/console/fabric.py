"""What the NVLink page (`/fabric`) and a node's page show of the GPU fabric.

The page draws each NVLink domain (a cluster UUID and clique, `GpuView.domain`) as a
rack of its trays: the nodes whose GPUs report it, each GPU coloured by what holds it
and marked by its health (`GpuView.problem`, `cordoned`, `healthy`), IMEX per tray
(`NodeView.imex`), and the replicas holding GPUs there. It reads the views every
reader shares (fleet/selectors/state.py: cached per process) and the replicas, and
the nodes' IMEX domains in one query. It groups trays into domains as the API does
(fleet/selectors/fabric.py), by `domain_trays`; this is what the page draws, in the
page's words.

A node's page lists its own report as stored (`Gpu.fabric`, `Node.imex`,
`Node.ib_ports`): `node_fabric_shown` turns it into rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from ..domain.fabric import Domain, domain_trays, gpu_domain, gpu_problem
from ..domain.types import HOLDING, GpuView, NodeView, ReplicaView
from ..models import Node
from ..protocol import NVLINK_ERRORS

# Replicas in a domain take these hues in turn (fleet.css .hue-N): enough to tell the
# replicas of one rack apart, beside the legend naming each.
HUES = 8


def fabric_page(nodes: Mapping[str, NodeView], replicas: Iterable[ReplicaView]) -> dict:
    """The page's context: every domain drawn (`domains`), and how many nodes with GPUs
    report none (`without`). One query, for the trays' IMEX domains, when any."""
    domains = fabric_domains(nodes, replicas)
    trays = {t["node"] for d in domains for t in d["trays"]}
    names = imex_domains(trays) if trays else {}
    for d in domains:
        for t in d["trays"]:
            t["imex_domain"] = names.get(t["node"], "")
        d["imex_domains"] = sorted({t["imex_domain"] for t in d["trays"]} - {""})
    drawn = {n for d in domains for n in (t["node"] for t in d["trays"])}
    without = sorted(n.id for n in nodes.values() if n.gpus and n.id not in drawn)
    return {"domains": domains, "without": without}


def imex_domains(node_ids: Iterable[str]) -> dict[str, str]:
    """The IMEX domain each node's agent named, where it named one: one query."""
    rows = Node.objects.filter(pk__in=list(node_ids)).values_list("id", "imex")
    return {
        node_id: str(imex.get("domain") or "")
        for node_id, imex in rows
        if isinstance(imex, dict) and imex.get("domain")
    }


def fabric_domains(
    nodes: Mapping[str, NodeView], replicas: Iterable[ReplicaView]
) -> list[dict[str, Any]]:
    """Each NVLink domain, by UUID then clique: its trays by node id, each GPU's use and
    health, the replicas holding its GPUs, and its figures. Pure. The trays, and the GPUs
    drawn in each, are `domain_trays`'."""
    holder = {
        (s.node_id, i): r for r in replicas if r.state in HOLDING for s in r.shards
        for i in s.gpu_indices
    }  # fmt: skip
    return [_domain(d, trays, holder) for d, trays in domain_trays(nodes.values()).items()]


def _domain(
    domain: Domain, trays: list[tuple[NodeView, list[GpuView]]], holder: Mapping
) -> dict[str, Any]:
    hues: dict[str, int] = {}
    spans: dict[str, dict[str, int]] = defaultdict(dict)
    drawn = []
    for node, gpus in trays:
        cells = []
        for g in gpus:
            replica = holder.get((node.id, g.index))
            if replica is not None:
                hues.setdefault(replica.id, len(hues) % HUES)
                spans[replica.id][node.id] = spans[replica.id].get(node.id, 0) + 1
            cells.append(_gpu(node, g, replica, hues))
        drawn.append(
            {
                "node": node.id,
                "state": node.shown_state,
                "imex": {True: "up", False: "down", None: "none"}[node.imex],
                "gpus": cells,
            }
        )
    cells = [c for t in drawn for c in t["gpus"]]
    by_id = {r.id: r for r in holder.values()}
    return {
        "uuid": domain[0],
        "clique": domain[1],
        "anchor": f"domain-{domain[0]}-{domain[1]}",
        "trays": drawn,
        "gpus": len(cells),
        "free": sum(1 for c in cells if c["use"] == "free"),
        "problems": sum(1 for c in cells if c["health"] != "ok"),
        "imex_up": sum(1 for t in drawn if t["imex"] == "up"),
        "replicas": [
            {
                "id": rid,
                "model": by_id[rid].model,
                "state": by_id[rid].state,
                "hue": hue,
                "trays": sorted(spans[rid].items()),
                "shards": len(by_id[rid].shards),
            }
            for rid, hue in hues.items()
        ],
    }


def _gpu(node: NodeView, g: GpuView, replica: ReplicaView | None, hues: dict) -> dict:
    """One GPU as the rack draws it: `use` (a replica's, free, or not to be placed on) for
    its fill, `health` for its mark, and a title saying both."""
    if replica is not None:
        use = "replica"
    elif g.free_to_place and node.shown_state == "ready":
        use = "free"
    else:
        use = "idle"
    if not g.healthy:
        health, said = "bad", "unhealthy"
    elif g.problem:
        health, said = "bad", g.problem
    elif g.cordoned:
        health, said = "cordoned", "cordoned"
    elif g.domain is None:
        health, said = "bad", "not in the domain yet"
    else:
        health, said = "ok", ""
    held = f"replica {replica.id} ({replica.model})" if replica else use
    if use == "idle" and g.held:
        held = "held by processes llmgw did not start"
    return {
        "index": g.index,
        "use": use,
        "hue": hues.get(replica.id) if replica else None,
        "replica": replica.id if replica else "",
        "health": health,
        "title": "; ".join(p for p in (f"GPU {g.index}", held, said) if p),
    }


# A node's own report, as its page lists it.

# ECC's counters as the node page's columns name them.
ECC_COUNTERS = (
    "corrected_volatile",
    "uncorrected_volatile",
    "corrected_aggregate",
    "uncorrected_aggregate",
)


def node_fabric_shown(view: Mapping[str, Any]) -> dict[str, Any] | None:
    """A node's fabric as its page lists it: per GPU its domain, links and ECC counters
    (`gpus`), every link (`links`), its IMEX and InfiniBand ports; None when its agent
    said nothing of any (the page says so in a line)."""
    gpus = [_gpu_shown(view["id"], g) for g in view["gpus"] if g.get("fabric")]
    ports = [p for p in view.get("ib_ports") or () if isinstance(p, dict)]
    imex = view.get("imex") if isinstance(view.get("imex"), dict) else None
    if not gpus and not ports and imex is None:
        return None
    return {
        "gpus": gpus,
        "links": [dict(link, gpu=g["index"]) for g in gpus for link in g["links"]],
        "ecc": any(g["ecc"] for g in gpus),
        "imex": imex,
        "ib_ports": ports,
        "domains": sorted({g["domain"] for g in gpus if g["domain"]}),
    }


def _gpu_shown(node_id: str, g: Mapping[str, Any]) -> dict[str, Any]:
    report = {**g["fabric"], "index": g["index"]}
    fabric = report.get("fabric") if isinstance(report.get("fabric"), dict) else {}
    links = [link for link in report.get("nvlinks") or () if isinstance(link, dict)]
    ecc = report.get("ecc") if isinstance(report.get("ecc"), dict) else {}
    domain = gpu_domain(report)
    return {
        "index": g["index"],
        "state": fabric.get("state") or "",
        "domain": f"{domain[0]} clique {domain[1]}" if domain else "",
        "degraded": fabric.get("health_degraded") is True,
        "links": links,
        "links_up": sum(1 for link in links if link.get("up") is True),
        "links_down": [link["link"] for link in links if link.get("up") is False],
        "link_errors": _sum(links, NVLINK_ERRORS),
        "ecc": {k: ecc[k] for k in ECC_COUNTERS if isinstance(ecc.get(k), int)},
        "waiting": [
            words
            for key, words in (
                ("remap_failure", "a row remapping failed"),
                ("remap_pending", "rows to remap"),
                ("retired_pending", "pages to retire"),
            )
            if ecc.get(key) is True
        ],
        "xids": list(report.get("xids") or ()),
        "problem": gpu_problem(report, node_id=node_id) or "",
    }


def _sum(links: list[dict], keys: tuple[str, ...]) -> int | None:
    """The links' counters added up; None when no link reports any (unknown, not 0)."""
    found = [link[k] for link in links for k in keys if isinstance(link.get(k), int)]
    return sum(found) if found else None
