"""``llmgw ctl quota list|set|clear`` and ``model owner``: capacity quotas and who models count against.

A capacity quota belongs to an organization, team or project and counts the
GPUs, CPU cores and memory held by the replicas of the models it owns, and of
those its teams and projects own. Scopes are written org:Acme, team:Acme/ml or
project:Acme/ml/training, or with IDs; the server resolves them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, segment, whole_number
from llmgw.cli.tables import DASH, number, render

RESOURCES = ("gpus", "cpu_cores", "memory_gb")
QUOTA_HEADERS = ["SCOPE", "NAME", "GPUS", "CORES", "MEMORY GB"]
LEGEND = "Each cell: holds / guaranteed (at most limit). - is not governed."
NO_QUOTAS = "No capacity quotas: everything shares the cluster by class alone."
QUOTA_HELP = """\
The guarantee is kept for the scope: when it holds less and a model of its
needs room, replicas other scopes hold beyond their own guarantees are
stopped to make it, whatever their class. Beyond its guarantee it borrows:
free room is used, and given back when asked for. The limit is the most it
may hold, borrowing included.

Scopes are written org:Acme, team:Acme/ml or project:Acme/ml/training, or
with IDs. Changes take effect at the next reconciler pass."""


def quota_cell(holds: Any, guarantee: Any, limit: Any) -> str:
    """``6 / 8 (≤ 16)``: held, guaranteed, and the limit; ``-`` when neither governs it."""
    if guarantee is None and limit is None:
        return DASH
    text = f"{number(holds)} / {DASH if guarantee is None else number(guarantee)}"
    if limit is not None:
        text += f" (≤ {number(limit)})"
    return text


def render_quotas(quotas: list[Mapping[str, Any]]) -> str:
    """``ctl quota list``: a row per quota, a cell per resource, and how to read a cell."""
    if not quotas:
        return NO_QUOTAS
    rows = []
    for q in quotas:
        holds = q.get("holds") or {}
        guarantee, limit = q.get("guarantee") or {}, q.get("limit") or {}
        cells = [quota_cell(holds.get(r), guarantee.get(r), limit.get(r)) for r in RESOURCES]
        rows.append([q.get("scope"), q.get("name"), *cells])
    return f"{render(QUOTA_HEADERS, rows)}\n\n{LEGEND}"


def cmd_quota_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/quotas"), render_quotas)


# (flag's destination, side of the quota, resource, metavar, help)
QUOTA_FLAGS = (
    ("gpus", "guarantee", "gpus", "N", "GPUs guaranteed"),
    ("cores", "guarantee", "cpu_cores", "N", "CPU cores guaranteed"),
    ("memory", "guarantee", "memory_gb", "GB", "memory guaranteed, in GB"),
    ("limit_gpus", "limit", "gpus", "N", "the most GPUs it may hold"),
    ("limit_cores", "limit", "cpu_cores", "N", "the most CPU cores it may hold"),
    ("limit_memory", "limit", "memory_gb", "GB", "the most memory it may hold, in GB"),
)


def quota_body(args: argparse.Namespace) -> dict[str, Any]:
    """The PUT body: the scope and only the figures whose flags were given."""
    body: dict[str, Any] = {"scope": args.scope}
    for dest, side, resource, _, _ in QUOTA_FLAGS:
        value = getattr(args, dest)
        if value is not None:
            body.setdefault(side, {})[resource] = value
    return body


def cmd_quota_set(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.put("/quotas", quota_body(args))
    # Named as typed (team:Acme/ml), not by the key the server keeps (team:7).
    out.show(answer, lambda a: f"{args.scope}: set; it takes effect at the next reconciler pass")


def cmd_quota_clear(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/quotas/{segment(args.scope)}")
    out.show(answer, lambda a: f"{args.scope}: quota removed")


def cmd_model_owner(api: Api, args: argparse.Namespace, out: Output) -> None:
    owner = "" if args.owner == "shared" else args.owner
    answer = api.post(f"/models/{segment(args.name)}/owner", {"owner": owner})

    def sentence(a: Mapping[str, Any]) -> str:
        if a["owner"]:  # named as typed (team:Acme/ml), not by the key kept (team:7)
            return f"{a['model']} counts against {args.owner}"
        return f"{a['model']} is shared"

    out.show(answer, sentence)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``quota`` to the commands and ``owner`` to the ``model`` actions."""
    model_actions = groups["model"]
    quota = add(commands, "quota", "what parts of the tenancy tree are guaranteed, and may hold")
    quota.epilog = QUOTA_HELP
    quota.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = quota.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(actions, "list", "every quota, with what its scope holds now", cmd_quota_list)

    setting = add(
        actions, "set", "set a scope's guarantee and limit, replacing what it had", cmd_quota_set
    )
    setting.add_argument("scope", help="org:Acme, team:Acme/ml, project:Acme/ml/training, or IDs")
    for dest, _, _, metavar, text in QUOTA_FLAGS:
        flag = "--" + dest.replace("_", "-")
        setting.add_argument(flag, dest=dest, type=whole_number, metavar=metavar, help=text)

    clearing = add(actions, "clear", "remove a scope's quota", cmd_quota_clear)
    clearing.add_argument("scope")

    owner = add(
        model_actions, "owner", "set whose capacity quota a model counts against", cmd_model_owner
    )
    owner.add_argument("name")
    owner.add_argument(
        "owner",
        metavar="SCOPE|shared",
        help="org:Acme, team:Acme/ml or project:Acme/ml/training; shared counts against nobody",
    )
