"""``llmgw ctl fabric``, ``ctl gpu cordon|uncordon NODE:INDEX`` and ``ctl model defrag
NAME`` (a dry run, as ``model preemption``): the GPU fabric.

A replica over several nodes is placed within one NVLink domain (the fabric manager's
cluster UUID and clique) on trays with IMEX up; a GPU with a problem (uncorrected ECC
errors, an Xid that needs a reset, a fabric registration not completed) or cordoned
takes no new replica (docs/fabric.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, said, segment
from llmgw.cli.tables import DASH, render

HEADERS = ["DOMAIN", "TRAY", "STATE", "GPUS FREE", "IMEX", "REPLICAS"]
NOTHING = (
    "No GPU reports an NVLink domain: replicas over several nodes go by the llmgw.io/fabric label."
)
LEGEND = "GPUS FREE: those placement would give out now (no replica, no problem, no cordon)."
# Whether the reconciler carries a defragmentation plan out (LLMGW_DEFRAG, docs/fabric.md).
DEFRAG_DONE = {
    True: "LLMGW_DEFRAG is on: the reconciler makes these moves.",
    False: "LLMGW_DEFRAG is off: the reconciler only says these moves.",
}


def gpu_address(text: str) -> tuple[str, int]:
    """argparse type: ``NODE:INDEX`` (``n1:3``), the node's id and the GPU's index."""
    node, sep, index = text.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not NODE:INDEX (e.g. n1:3)")
    return node, int(index)


def _domain_rows(d: Mapping[str, Any]) -> list[list[Any]]:
    """A row for the domain's figures, then one per tray."""
    rows: list[list[Any]] = [
        [
            d["name"],
            f"{len(d['trays'])} trays",
            DASH,
            f"{d['gpus_free']}/{d['gpus_total']}",
            f"up on {d['imex_up']}",
            ", ".join(d["replicas"]) or DASH,
        ]
    ]
    for t in d["trays"]:
        rows.append(
            [
                "",
                t["node"],
                t["state"],
                f"{t['gpus_free']}/{t['gpus_total']}",
                t["imex"] or DASH,
                ", ".join(t["replicas"]) or DASH,
            ]
        )
    return rows


def render_fabric(fabric: Mapping[str, Any]) -> str:
    """``ctl fabric``: each domain and its trays, then every GPU kept out of service."""
    domains, problems = fabric.get("domains") or [], fabric.get("problems") or []
    parts = []
    if domains:
        rows = [row for d in domains for row in _domain_rows(d)]
        parts.append(f"{render(HEADERS, rows)}\n\n{LEGEND}")
    else:
        parts.append(NOTHING)
    if problems:
        parts.append("Out of service:\n" + "\n".join(f"  {p}" for p in problems))
    return "\n\n".join(parts)


def cmd_fabric(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/fabric"), render_fabric)


def cmd_gpu_action(api: Api, args: argparse.Namespace, out: Output) -> None:
    node, index = args.gpu
    answer = api.post(f"/nodes/{segment(node)}/gpus/{index}/{args.action}")
    out.show(answer, lambda a: said(a, f"GPU {index} of node {node} {args.action}ed"))


def render_defrag(d: Mapping[str, Any]) -> str:
    """``ctl model defrag``: what would move to free an NVLink domain for one more replica,
    and whether the reconciler would do it; or why no domain can be freed."""
    blocks = [d["summary"]]
    moves = d.get("moves") or []
    if moves:
        rows = [[m["replica"], m["model"], ", ".join(m["from"]), ", ".join(m["to"])] for m in moves]
        blocks.append("Would move:\n" + render(["REPLICA", "MODEL", "FROM", "TO"], rows))
    if d.get("leaving"):
        blocks.append("Counts on these leaving already: " + ", ".join(d["leaving"]))
    if d.get("blocked"):
        blocks.append("\n".join(d["blocked"]))
    if moves:
        blocks.append(DEFRAG_DONE[bool(d.get("done"))])
    return "\n\n".join(blocks)


def cmd_model_defrag(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/models/{segment(args.name)}/defrag"), render_defrag)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``fabric`` and ``gpu cordon|uncordon`` to the commands, ``defrag`` to ``model``."""
    add(commands, "fabric", "NVLink domains: GPUs free, trays, IMEX, problems", cmd_fabric)
    gpu = add(commands, "gpu", "cordon or uncordon one GPU of a node")
    actions = gpu.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, help in (
        ("cordon", "place no new replica on a GPU; the one it runs stays"),
        ("uncordon", "let placement give a GPU out again"),
    ):
        add(actions, action, help, cmd_gpu_action).add_argument(
            "gpu", metavar="NODE:INDEX", type=gpu_address, help="e.g. n1:3"
        )
    defrag = add(
        groups["model"],
        "defrag",
        "what would move to free an NVLink domain for a model now (changes nothing)",
        cmd_model_defrag,
    )
    defrag.add_argument("name")
