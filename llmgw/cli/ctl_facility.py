"""``llmgw ctl facility list|set|clear|conditions|hold|release``: racks, PDUs and their
phases, what they draw, their budgets, and every domain's condition and hold.

A node is in the rack and PDUs its ``llmgw.io/rack`` and ``llmgw.io/pdu`` labels
name (``llmgw agent --rack R --pdu P``), and on the phase of each PDU its
``llmgw.io/pdu-phase`` label names (a phase is ``<pdu>/<phase>``: ``r12-a/L2``). A
budget is the most a rack, PDU or phase may draw, in watts; placement refuses a
replica whose estimated draw would pass it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, positive_number, segment
from llmgw.cli.tables import DASH, render

HEADERS = ["KIND", "NAME", "NODES", "GPUS", "RESERVED W", "MEASURED W", "BUDGET W"]
LEGEND = (
    "RESERVED W: per GPU held by a replica, the larger of its power limit and its measured "
    "draw, with each node's own share and the other equipment declared; MEASURED W: what "
    "the facility's meter reads (a power_watts signal), else what its agents measured the "
    "GPUs draw; BUDGET W: the cap, and what placement loads it to after its margin."
)
NOTHING = (
    "No node has a llmgw.io/rack or llmgw.io/pdu label and no budget is set: "
    "placement does not look at power."
)
FACILITY_HELP = """\
A replica's draw is its profile's declared power_watts, else estimated from
the enforced power limits of the GPUs it would be given, as their agents
report them, else for a CPU replica from its cores (LLMGW_POWER_CORE_WATTS);
one whose draw is unknown is placed as if there were no budget. A budget is
loaded to its cap less --margin; a dual-fed rack's cap is --feeds' smaller
rating at --derating (80 %). A phase of a three-phase PDU has a budget of its
own, named by its PDU and phase: set phase r12-a/L2 7400; hold phase r12-a/L2
takes no new replicas on its nodes (a phase takes its PDU's condition).
Changes take effect at the next reconciler pass."""


def _watts(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return DASH
    return f"{float(value):,.0f}"


def _budget(d: Mapping[str, Any]) -> str:
    """ "16,000", or "16,000 (14,400 after margin)" where a margin keeps some back."""
    cap, limit = d.get("budget_w"), d.get("limit_w")
    if cap is None or limit is None or abs(float(cap) - float(limit)) < 0.5:
        return _watts(cap)
    return f"{_watts(cap)} ({_watts(limit)} after margin)"


def render_facility(domains: list[Mapping[str, Any]]) -> str:
    """``ctl facility list``: a row per rack, PDU and phase, and how to read the figures."""
    if not domains:
        return NOTHING
    rows = []
    for d in domains:
        reserved = d.get("reserved_w", d.get("estimated_w"))
        held = _watts(reserved) if reserved is not None else "unknown"
        if d.get("over"):
            held += " (over)"
        if d.get("unknown_gpus"):
            held += f" ({d['unknown_gpus']} GPUs unknown)"
        rows.append(
            [
                d.get("kind"),
                d.get("name"),
                d.get("nodes"),
                d.get("gpus"),
                held,
                _watts(d.get("measured_w")),
                _budget(d),
            ]
        )
    return f"{render(HEADERS, rows)}\n\n{LEGEND}"


CONDITION_HEADERS = ["KIND", "NAME", "CONDITION", "READ", "HOLD"]
NO_CONDITIONS = "No domain has been read or held: every rack, PDU, row, room and zone is unknown (placed as ok)."


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "never"
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.1f} h ago"


def render_conditions(domains: list[Mapping[str, Any]]) -> str:
    """``ctl facility conditions``: each domain's condition, its readings' age, its hold."""
    if not domains:
        return NO_CONDITIONS
    rows = []
    for d in domains:
        hold = DASH
        if d.get("held"):
            hold = f"held by {d.get('held_by') or 'an operator'}"
            if d.get("hold_reason"):
                hold += f": {d['hold_reason']}"
        rows.append(
            [d.get("kind"), d.get("name"), d.get("said"), _age(d.get("reading_age_s")), hold]
        )
    enforced = any(d.get("enforced") for d in domains)
    mode = (
        "Conditions are enforced: hot domains take no new replicas, warm ones come last."
        if enforced
        else "Observe-only (LLMGW_FACILITY_ENFORCE off): conditions are said, not enforced; "
        "holds are."
    )
    return f"{render(CONDITION_HEADERS, rows)}\n\n{mode}"


def cmd_facility_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/facility"), render_facility)


def render_sources(sources: Mapping[str, Any] | None) -> str:
    """The facility sources that failed at the reconciler's last read, each with why."""
    failed = (sources or {}).get("failed") or []
    if not failed:
        return ""
    lines = [
        f"Source {f.get('source')} failing since {f.get('since')}: {f.get('why')}" for f in failed
    ]
    return "\n".join(lines) + "\n(domains it reads are unknown, treated as ok)"


def cmd_facility_conditions(api: Api, args: argparse.Namespace, out: Output) -> None:
    try:
        sources = api.get("/facility/sources")
    except CtlError:
        sources = None  # a server from before sources were said: the conditions alone
    failing = render_sources(sources)
    out.show(
        api.get("/facility/conditions"),
        lambda d: render_conditions(d) + (f"\n\n{failing}" if failing else ""),
    )


def cmd_facility_hold(api: Api, args: argparse.Namespace, out: Output) -> None:
    body = {"kind": args.kind, "name": args.name, "reason": args.reason or ""}
    out.show(
        api.put("/facility/holds", body),
        lambda a: (
            f"{a['kind']} {a['name']} held: no new placements there from the next "
            "reconciler pass; nothing running is stopped"
        ),
    )


def cmd_facility_release(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/facility/holds/{segment(args.kind)}/{segment(args.name)}")
    out.show(answer, lambda a: f"{a['kind']} {a['name']} released (was held by {a['held_by']})")


def cmd_facility_set(api: Api, args: argparse.Namespace, out: Output) -> None:
    body: dict[str, Any] = {"kind": args.kind, "name": args.name}
    if args.watts is not None:
        body["watts"] = args.watts
    for key in ("margin", "feeds", "derating", "other_watts"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    answer = api.put("/facility/budgets", body)
    out.show(answer, _set_said)


def _set_said(a: Mapping[str, Any]) -> str:
    """ "rack r1: budget 5,920 W (the smaller of 7,400 and 9,000 W at 80 %), less a 10 %
    margin; it takes effect at the next reconciler pass"."""
    said = f"{a['kind']} {a['name']}: budget {_watts(a['watts'])} W"
    if feeds := a.get("feeds"):
        ratings = " and ".join(_watts(f) for f in feeds)
        said += f" (the smaller of {ratings} W at {a.get('derating', 0.8) * 100:g} %)"
    if margin := a.get("margin"):
        said += f", less a {margin * 100:g} % margin"
    if other := a.get("other_watts"):
        said += f", {_watts(other)} W of other equipment held"
    return f"{said}; it takes effect at the next reconciler pass"


def _feeds(text: str) -> list[float]:
    """argparse type: feeds' ratings, comma separated: 7400,7400."""
    return [positive_number(t) for t in text.split(",")]


def cmd_facility_clear(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/facility/budgets/{segment(args.kind)}/{segment(args.name)}")
    out.show(answer, lambda a: f"{a['kind']} {a['name']}: budget removed")


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``facility`` to the commands."""
    facility = add(commands, "facility", "racks and PDUs: what they draw, and their budgets")
    facility.epilog = FACILITY_HELP
    facility.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = facility.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(
        actions,
        "list",
        "every rack, PDU and phase, with what it draws and its budget",
        cmd_facility_list,
    )
    setting = add(
        actions, "set", "set the most a rack, PDU or phase may draw, in watts", cmd_facility_set
    )
    setting.add_argument("kind", metavar="KIND", help="rack, pdu, phase, row, room or site")
    setting.add_argument(
        "name",
        metavar="NAME",
        help="the nodes' llmgw.io/rack, pdu, row, room or site label; a phase: r12-a/L2",
    )
    setting.add_argument(
        "watts", metavar="WATTS", type=positive_number, nargs="?", help="e.g. 16000"
    )
    setting.add_argument(
        "--feeds", type=_feeds, help="a dual-fed rack's feeds' ratings instead: 7400,7400"
    )
    setting.add_argument("--derating", type=float, help="of a feed's rating, 0.8 unless said")
    setting.add_argument("--margin", type=float, help="the share kept back: 0.1 is 10 %%")
    setting.add_argument(
        "--other-watts", dest="other_watts", type=float, help="switches, storage: e.g. 1200"
    )
    clearing = add(actions, "clear", "remove a rack's, PDU's or phase's budget", cmd_facility_clear)
    clearing.add_argument("kind", metavar="KIND", help="rack, pdu, phase, row, room or site")
    clearing.add_argument("name", metavar="NAME")
    add(
        actions,
        "conditions",
        "every domain's condition (ok, warm, hot, unknown), its readings' age and hold",
        cmd_facility_conditions,
    )
    holding = add(actions, "hold", "take no new placements in a domain", cmd_facility_hold)
    holding.add_argument("kind", metavar="KIND", help="rack, pdu, phase, row, room or zone")
    holding.add_argument(
        "name", metavar="NAME", help="the nodes' location label; a phase: r12-a/L2"
    )
    holding.add_argument("--reason", help="why, for whoever reads it")
    releasing = add(actions, "release", "release a domain's hold", cmd_facility_release)
    releasing.add_argument("kind", metavar="KIND", help="rack, pdu, phase, row, room or zone")
    releasing.add_argument("name", metavar="NAME")
