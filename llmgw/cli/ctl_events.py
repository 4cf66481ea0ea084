"""``llmgw ctl events``: what happened to models, replicas and nodes, and who changed what,
newest first, a page at a time."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, whole_number
from llmgw.cli.tables import age, render

EVENT_HEADERS = ["WHEN", "KIND", "WHAT"]


def render_events(answer: Mapping[str, Any], more: str) -> str:
    events = answer.get("events") or []
    if not events:
        return "No events."
    rows = []
    for e in events:
        when = age(e.get("last_at"))
        if (e.get("count") or 1) > 1:
            when += f" (×{e['count']}, first {age(e.get('at'))})"
        rows.append([when, e.get("kind"), e.get("message")])
    out = render(EVENT_HEADERS, rows)
    if answer.get("next"):
        out += f"\nolder: {more} --before {shlex.quote(answer['next'])}"
    return out


def cmd_events(api: Api, args: argparse.Namespace, out: Output) -> None:
    model = api.model_name(args.model) if args.model else None
    answer = api.get(
        "/events",
        model=model,
        node=args.node,
        since=args.since,
        before=args.before,
        limit=args.limit,
    )
    again = ["llmgw ctl events"]
    for flag, value in (("--model", args.model), ("--node", args.node), ("--since", args.since)):
        if value:
            again += [flag, shlex.quote(value)]
    if args.limit is not None:
        again += ["--limit", str(args.limit)]
    out.show(answer, lambda a: render_events(a, " ".join(again)))


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``events``."""
    events = add(
        commands,
        "events",
        "what happened to models and nodes, and who changed what, newest first",
        cmd_events,
    )
    events.add_argument("--model", help="only this model's (its name or an alias)")
    events.add_argument("--node", help="only this node's")
    events.add_argument("--since", help="a time (2026-01-31T09:00:00Z) or a span back: 15m, 24h")
    events.add_argument(
        "--limit", type=whole_number, help="how many a page (default 50, at most 500)"
    )
    events.add_argument("--before", help="the page after the one that printed it")
