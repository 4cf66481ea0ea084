"""``llmgw ctl nodes`` and ``node show|cordon|uncordon|drain|approve|forget``: the machines
of the cluster, what they have and report, and what an operator does to one."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, said, segment
from llmgw.cli.tables import DASH, age, cell, gb, joined, key_values, number, render


def known(value: Any) -> Any:
    """A figure a node reports, or None: zero from an agent means it did not say."""
    if value is None or isinstance(value, bool):
        return None
    return value if value else None


def gpus_cell(node: Mapping[str, Any]) -> str:
    """``6/8 h100-80g``: free over total and the class; ``-`` for a node with no GPUs."""
    total = node.get("gpu_total")
    if not total:
        return DASH
    text = f"{cell(node.get('gpu_free'))}/{total}"
    if node.get("gpu_class"):
        text += f" {node['gpu_class']}"
    return text


def node_load(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node's latest load, or an empty mapping when it has none."""
    load = node.get("load")
    return load if isinstance(load, dict) else {}


def load_text(load: Mapping[str, Any]) -> str:
    """``cpu 12%, load 0.50 0.40 0.30, memory 20.1 of 512 GB used``; ``-`` when none is known."""
    parts = []
    if load.get("cpu_percent") is not None:
        parts.append(f"cpu {number(load['cpu_percent'])}%")
    averages = [load.get(k) for k in ("load1", "load5", "load15")]
    if any(v is not None for v in averages):
        parts.append("load " + " ".join(DASH if v is None else f"{v:.2f}" for v in averages))
    used, available = load.get("memory_used_bytes"), load.get("memory_available_bytes")
    if used is not None and available is not None and used + available > 0:
        parts.append(
            f"memory {number(used / 2**30)} of {number((used + available) / 2**30)} GB used"
        )
    elif load.get("memory_percent") is not None:
        parts.append(f"memory {number(load['memory_percent'])}% used")
    return ", ".join(parts) or DASH


def sensors_text(load: Mapping[str, Any]) -> str:
    """``cpu 55 °C, cpu 120 W, inlet 24 °C, node 1180 W (BMC)``: only the sensors the node
    has, as the server sends them, beside the rest of its load."""
    parts = []
    if load.get("cpu_temp_c") is not None:
        parts.append(f"cpu {number(load['cpu_temp_c'])} °C")
    if load.get("cpu_power_w") is not None:
        parts.append(f"cpu {number(load['cpu_power_w'])} W")
    if load.get("inlet_temp_c") is not None:
        parts.append(f"inlet {number(load['inlet_temp_c'])} °C")
    if load.get("node_power_w") is not None:
        parts.append(f"node {number(load['node_power_w'])} W (BMC)")
    return ", ".join(parts) or DASH


def mapping_text(value: Any, sep: str = "=") -> str:
    """``{"a": "1"}`` → ``a=1``; a list is joined as it is."""
    if isinstance(value, dict):
        return joined(f"{k}{sep}{v}" if v not in (None, "") else str(k) for k, v in value.items())
    return joined(value) if isinstance(value, list) else cell(value)


def disk_text(disk: Any) -> str:
    """``800 of 1000 GB free``; ``-`` when the node did not say."""
    if not isinstance(disk, dict) or disk.get("total_gb") in (None, 0):
        return DASH
    return f"{number(disk.get('free_gb'))} of {number(disk['total_gb'])} GB free"


def render_nodes(nodes: list[dict[str, Any]]) -> str:
    """``ctl nodes``: a row per node."""
    if not nodes:
        return "No nodes have registered."
    rows = []
    for n in nodes:
        load1 = node_load(n).get("load1")
        rows.append(
            [
                n.get("id"),
                n.get("state"),
                gpus_cell(n),
                gb(known(n.get("memory_gb"))),
                known(n.get("cpu_count")),
                DASH if load1 is None else f"{load1:.2f}",
                len(n["replicas"]) if isinstance(n.get("replicas"), list) else None,
                age(n.get("last_seen")),
            ]
        )
    headers = ["NODE", "STATE", "GPUS", "MEMORY", "CPUS", "LOAD", "REPLICAS", "LAST SEEN"]
    if any(_where(n) for n in nodes):  # only a fleet that says where its nodes are
        headers.insert(2, "WHERE")
        for row, n in zip(rows, nodes, strict=True):
            row.insert(2, _where(n) or DASH)
    # Why a node is held for an address, under the table: the sentence says what to run.
    held = [f"  {n['address_refusal']}" for n in nodes if n.get("address_refusal")]
    # A drain that cannot go on, and why: a state alone says "draining" for five minutes.
    held += [f"  {n.get('id')}: drain {n['drain_stuck']}" for n in nodes if n.get("drain_stuck")]
    return "\n".join([render(headers, rows), *held])


def _where(node: dict[str, Any]) -> str:
    """Its zone, rack and PDU as its labels say ("zone a, rack r12-07"), those it has."""
    where = node.get("location")
    if not isinstance(where, dict):
        return ""
    return ", ".join(f"{k} {where[k]}" for k in ("zone", "rack", "pdu") if where.get(k))


def render_node(n: dict[str, Any]) -> str:
    """``ctl node show``: its fields as ``key: value`` lines, then its GPUs."""
    load = node_load(n)
    seen = age(n.get("last_seen"))
    pairs: list[tuple[str, Any]] = [
        ("node", n.get("id")),
        ("hostname", n.get("hostname")),
        ("state", n.get("state")),
    ]
    # Not in the interface table, but worth showing when a server sends them.
    for key, label in (
        ("mgmt_addr", "address"),
        ("seen_addr", "connects from"),
        ("approved_addr", "approved address"),
        ("address_refusal", "address refused"),
        ("drain_stuck", "drain"),
        ("agent_version", "agent"),
    ):
        if n.get(key):
            pairs.append((label, n[key]))
    pairs += [
        ("labels", mapping_text(n.get("labels"))),
        ("gpus", gpus_cell(n)),
        ("memory", gb(known(n.get("memory_gb")))),
        ("cpus", known(n.get("cpu_count"))),
        ("engines", mapping_text(n.get("engines"), sep=" ")),
        ("disk", disk_text(n.get("disk"))),
        ("replicas", joined(n.get("replicas"))),
        ("load", load_text(load)),
        ("sensors", sensors_text(load)),
        ("last seen", DASH if seen == DASH else f"{seen} ago ({n['last_seen']})"),
    ]
    text = key_values(pairs)
    gpus = render_node_gpus(n)
    return f"{text}\n\n{gpus}" if gpus else text


def render_node_gpus(n: dict[str, Any]) -> str:
    """A row per GPU: what the node registered, with its latest sensor readings beside it
    (the heartbeat's ``load.gpus``, by index)."""
    cards = [g for g in n.get("gpus") or () if isinstance(g, dict)]
    sensors = {s.get("index"): s for s in node_load(n).get("gpus") or () if isinstance(s, dict)}
    indices = [g.get("index") for g in cards] or sorted(sensors, key=lambda i: (i is None, i))
    if not indices:
        return ""
    by_index = {g.get("index"): g for g in cards}
    rows = []
    for index in indices:
        g, s = by_index.get(index, {}), sensors.get(index, {})
        memory_mb = g.get("memory_total_mb", g.get("memory_mb"))
        power, limit = s.get("power_w"), s.get("power_limit_w")
        if power is None:
            power_text = DASH
        else:
            power_text = f"{number(power)}/{number(limit)} W" if limit else f"{number(power)} W"
        # An empty throttle list is a reading ("nothing holds it back"); a missing one is not.
        throttle = s.get("throttle")
        rows.append(
            [
                index,
                g.get("name"),
                g.get("gpu_class", g.get("class")),
                DASH if not memory_mb else gb(memory_mb / 1024),
                g.get("health") or {True: "ok", False: "unhealthy"}.get(g.get("healthy")),
                _unit(s.get("temp_c"), " °C"),
                _unit(s.get("memory_temp_c"), " °C"),
                power_text,
                "none" if throttle == [] else joined(throttle),
                _unit(s.get("utilization"), "%"),
            ]
        )
    headers = [
        "GPU",
        "NAME",
        "CLASS",
        "MEMORY",
        "HEALTH",
        "TEMP",
        "MEM TEMP",
        "POWER",
        "THROTTLE",
        "UTIL",
    ]
    return render(headers, rows)


def _unit(value: Any, unit: str) -> str:
    """``54 °C``; ``-`` when not measured."""
    return DASH if value is None else f"{number(value)}{unit}"


def cmd_nodes(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/nodes"), render_nodes)


def cmd_node_show(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/nodes/{segment(args.node)}"), render_node)


NODE_ACTIONS = {
    "cordon": "cordoned",
    "uncordon": "uncordoned",
    "drain": "draining",
    "approve": "approved",
}


def cmd_node_action(api: Api, args: argparse.Namespace, out: Output) -> None:
    address = getattr(args, "address", None)
    body = {"address": address} if address else None
    answer = api.post(f"/nodes/{segment(args.node)}/{args.action}", body)
    out.show(answer, lambda a: said(a, f"node {args.node} {NODE_ACTIONS[args.action]}"))


def cmd_node_forget(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/nodes/{segment(args.node)}")
    out.show(answer, lambda a: said(a, f"node {args.node} forgotten"))


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``nodes`` and ``node show|cordon|uncordon|drain|approve|forget`` to the commands."""
    add(commands, "nodes", "list nodes: state, GPUs, memory, CPUs, load", cmd_nodes)
    node = add(commands, "node", "show, cordon, uncordon, drain, approve or forget one node")
    node_actions = node.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(node_actions, "show", "one node in full, with its GPUs", cmd_node_show).add_argument("node")
    for action, help in (
        ("cordon", "place nothing new on a node"),
        ("uncordon", "let placement use a node again"),
        ("drain", "cordon a node and move its replicas elsewhere"),
    ):
        add(node_actions, action, help, cmd_node_action).add_argument("node")
    approve = add(
        node_actions,
        "approve",
        "let a node held by LLMGW_NODE_APPROVAL=manual into placement, or believe the address "
        "it says its engines are at",
        cmd_node_action,
    )
    approve.add_argument("node")
    approve.add_argument(
        "--address",
        help="the address its engines are reached at, when its connection comes from another "
        "(behind NAT or a proxy): the gateway sends tenants' requests there",
    )
    add(
        node_actions,
        "forget",
        "remove a node and revoke its credential; it can join again only with a join token",
        cmd_node_forget,
    ).add_argument("node")
