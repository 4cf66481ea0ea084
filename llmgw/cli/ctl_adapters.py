"""``llmgw ctl adapter add|list|show|rm``: LoRA adapters served on their base model's
replicas (docs/adapters.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, said, segment, whole_number
from llmgw.cli.tables import DASH, render

HEADERS = ["NAME", "BASE", "FORMAT", "RANK", "OWNER", "HELD BY"]


def render_adapters(adapters: list[Mapping[str, Any]]) -> str:
    if not adapters:
        return (
            "No adapters yet: llmgw ctl adapter add NAME --base MODEL --source SOURCE "
            "--format peft|gguf --rank R --owner TEAM"
        )
    rows = [
        [
            a["name"],
            a["base"],
            a["format"],
            a["rank"],
            a["owner"],
            ", ".join(a.get("held_by") or ()) or DASH,
        ]
        for a in adapters
    ]
    return render(HEADERS, rows)


def render_one(a: Mapping[str, Any]) -> str:
    lines = [
        f"adapter {a['name']} on {a['base']}",
        f"  source:  {a['source']} ({a['format']}, rank {a['rank']})",
        f"  owner:   {a['owner']}",
        f"  aliases: {', '.join(a.get('aliases') or ()) or 'none'}",
        f"  held by: {', '.join(a.get('held_by') or ()) or 'no replica now'}",
    ]
    if a.get("mirror"):
        lines.insert(2, f"  mirror:  {a['mirror']}")
    if a.get("description"):
        lines.insert(1, f"  {a['description']}")
    return "\n".join(lines)


def cmd_adapter_add(api: Api, args: argparse.Namespace, out: Output) -> None:
    body: dict[str, Any] = {
        "name": args.name,
        "base": args.base,
        "source": args.source,
        "format": args.format,
        "rank": args.rank,
        "owner": args.owner,
        "aliases": args.alias or [],
    }
    if args.description:
        body["description"] = args.description
    out.show(api.post("/adapters", body), render_one)


def cmd_adapter_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    params = {"base": args.base} if args.base else {}
    out.show(api.get("/adapters", **params), render_adapters)


def cmd_adapter_show(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/adapters/{segment(args.name)}"), render_one)


def cmd_adapter_rm(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/adapters/{segment(args.name)}")
    out.show(answer, lambda a: said(a, f"adapter {args.name} removed"))


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``adapter add|list|show|rm``."""
    adapter = add(commands, "adapter", "LoRA adapters on a base model: add, list, show, rm")
    actions = adapter.add_subparsers(dest="action", required=True, metavar="ACTION")
    added = add(actions, "add", "add an adapter on a base model", cmd_adapter_add)
    added.add_argument("name", help="its name, as requests give it in `model`")
    added.add_argument("--base", required=True, help="the model it adapts")
    added.add_argument(
        "--source", required=True, help="hf://ORG/REPO (PEFT), a LoRA .gguf, or a local path"
    )
    added.add_argument("--format", required=True, choices=["peft", "gguf"])
    added.add_argument("--rank", required=True, type=whole_number, help="the LoRA's r")
    added.add_argument(
        "--owner", required=True, help="the team or project whose keys reach it (name or ID)"
    )
    added.add_argument("--alias", action="append", help="another name (repeat for several)")
    added.add_argument("--description")
    listed = add(actions, "list", "every adapter, with the replicas holding it", cmd_adapter_list)
    listed.add_argument("--base", help="only those on this model")
    for name, help, handler in (
        ("show", "one adapter", cmd_adapter_show),
        ("rm", "remove an adapter", cmd_adapter_rm),
    ):
        add(actions, name, help, handler).add_argument("name")
