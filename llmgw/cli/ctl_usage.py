"""``llmgw ctl usage`` and ``llmgw ctl limit list|set|clear``: what the gateway served, and
the requests and tokens per minute a scope may use.

Scopes are written org:Acme, team:Acme/ml or project:Acme/ml/training, or with IDs;
the server resolves them, and judges ``--since``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any

from llmgw.cli.base import Api, Output, segment, whole_number
from llmgw.cli.tables import DASH, parse_time, render

GROUPINGS = ("project", "key", "model")
FIGURE_HEADERS = ["REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "LATENCY"]
# The columns that name a row, by grouping; every row is split by model too.
NAME_HEADERS = {
    "project": ["PROJECT", "MODEL"],
    "key": ["KEY", "PROJECT", "MODEL"],
    "model": ["MODEL"],
}
GROUPED = {"project": "by project and model", "key": "by key and model", "model": "by model"}
LIMIT_HEADERS = ["SCOPE", "NAME", "REQUESTS/MIN", "TOKENS/MIN", "SET BY"]
NO_LIMITS = "No scope limits: only keys' own limits apply."
LIMIT_HELP = """\
A scope's limits count every request and token of the keys of the projects
beneath it, as each key's own limits count its own; past any of them the
gateway answers 429 with Retry-After. A figure left out is not limited.

Scopes are written org:Acme, team:Acme/ml or project:Acme/ml/training, or
with IDs."""


def count(value: Any) -> str:
    """``12345`` → ``12,345``; absent → ``-``."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return DASH
    return f"{round(value):,}"


def latency(value: Any) -> str:
    """The average latency in whole milliseconds, ``812 ms``; ``-`` with no requests."""
    text = count(value)
    return text if text == DASH else f"{text} ms"


def when(value: Any) -> str:
    """``2026-03-01 12:00 UTC`` from the server's ISO 8601 time."""
    parsed = parse_time(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if parsed else str(value)


def render_usage(report: Mapping[str, Any]) -> str:
    """``ctl usage``: a row per project, key or model (and model), and what it covers."""
    by = report.get("by") if report.get("by") in GROUPINGS else "project"
    under = f"{report['name']} ({report['scope']}) " if report.get("scope") else ""
    rows = report.get("rows") or []
    if not rows:
        return f"No requests {'under ' + under if under else ''}since {when(report['since'])}."
    table = []
    for r in rows:
        names = {"project": [r.get("name")], "key": [r.get("key"), r.get("name")], "model": []}
        table.append(
            [
                *names[by],
                r.get("model"),
                count(r.get("requests")),
                count(r.get("errors")),
                count(r.get("prompt_tokens")),
                count(r.get("completion_tokens")),
                latency(r.get("avg_latency_ms")),
            ]
        )
    since = f"{under}since {when(report['since'])}" if under else f"Since {when(report['since'])}"
    footer = f"{since}, {GROUPED[by]}; latency is the average."
    estimated = sum(r.get("estimated_tokens") or 0 for r in rows)
    if estimated:
        footer += (
            f"\n{count(estimated)} of the tokens are estimates: requests cut before their "
            "engine counted them (docs/gateway.md, Usage)."
        )
    return f"{render(NAME_HEADERS[by] + FIGURE_HEADERS, table)}\n\n{footer}"


def render_request(found: Mapping[str, Any]) -> str:
    """``ctl usage --request ID``: each record of the request in sentences, the latest
    first."""
    return "\n\n".join(_request_said(r) for r in found.get("records") or [])


def _request_said(r: Mapping[str, Any]) -> str:
    key = r.get("key") or f"{r.get('key_id')} (deleted since)"
    model = f" for {r['model']}" if r.get("model") else ""
    by = f" by replica {r['replica']}" if r.get("replica") else ""
    lines = [
        f"Request {r.get('request_id')}: {r.get('endpoint')}{model}, "
        f"at {_to_the_second(r.get('at'))}.",
        f"Key {key}, of {r.get('name')} ({r.get('scope')}).",
        f"Answered {r.get('status') or 'nothing'} in {count(r.get('duration_ms'))} ms{by}; "
        f"{count(r.get('prompt_tokens'))} prompt and "
        f"{count(r.get('completion_tokens'))} completion tokens.",
    ]
    if r.get("error"):
        lines.append(f"Failed: {r['error']}.")
    return "\n".join(lines)


def _to_the_second(value: Any) -> str:
    """``2026-03-01 12:00:03 UTC``: a request is found to the second."""
    parsed = parse_time(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if parsed else str(value)


def cmd_usage(api: Api, args: argparse.Namespace, out: Output) -> None:
    if args.request:
        out.show(api.get(f"/usage/requests/{segment(args.request)}"), render_request)
        return
    out.show(api.get("/usage", scope=args.scope, since=args.since, by=args.by), render_usage)


def render_limits(limits: list[Mapping[str, Any]]) -> str:
    """``ctl limit list``: a row per scope with limits; ``-`` is not limited."""
    if not limits:
        return NO_LIMITS
    rows = [
        [
            v.get("scope"),
            v.get("name"),
            count(v.get("requests_per_minute")),
            count(v.get("tokens_per_minute")),
            v.get("updated_by"),
        ]
        for v in limits
    ]
    return render(LIMIT_HEADERS, rows)


def cmd_limit_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/limits"), render_limits)


def limit_body(args: argparse.Namespace) -> dict[str, Any]:
    """The PUT body: the scope and only the figures whose flags were given."""
    body: dict[str, Any] = {"scope": args.scope}
    for name in ("requests_per_minute", "tokens_per_minute"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def cmd_limit_set(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.put("/limits", limit_body(args))
    # Named as typed (team:Acme/ml), not by the key the server keeps (team:7).
    out.show(answer, lambda a: f"{args.scope}: limits set")


def cmd_limit_clear(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.delete(f"/limits/{segment(args.scope)}")
    out.show(answer, lambda a: f"{args.scope}: limits removed")


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``usage`` and ``limit list|set|clear`` to the commands."""
    usage = add(
        commands,
        "usage",
        "requests, errors, tokens and latency per project, key or model",
        cmd_usage,
    )
    usage.add_argument(
        "--scope", help="only under org:Acme, team:Acme/ml or project:Acme/ml/training"
    )
    usage.add_argument(
        "--since",
        help="a time (2026-01-31T09:00:00Z) or a span back (15m, 24h, 7d); default 24h",
    )
    usage.add_argument(
        "--by",
        choices=GROUPINGS,
        help="one row per project (default), key or model; each split by model",
    )
    usage.add_argument(
        "--request",
        metavar="ID",
        help="one request, by the id its caller was told (x-request-id), in sentences",
    )

    limit = add(commands, "limit", "requests and tokens per minute a scope may use")
    limit.epilog = LIMIT_HELP
    limit.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = limit.add_subparsers(dest="action", required=True, metavar="ACTION")
    add(actions, "list", "every scope's limits", cmd_limit_list)
    setting = add(actions, "set", "set a scope's limits, replacing what it had", cmd_limit_set)
    setting.add_argument("scope", help="org:Acme, team:Acme/ml, project:Acme/ml/training, or IDs")
    setting.add_argument(
        "--requests-per-minute",
        "--rpm",
        dest="requests_per_minute",
        type=whole_number,
        metavar="N",
        help="requests per minute, at most (left out: not limited)",
    )
    setting.add_argument(
        "--tokens-per-minute",
        "--tpm",
        dest="tokens_per_minute",
        type=whole_number,
        metavar="N",
        help="prompt and completion tokens per minute, at most (left out: not limited)",
    )
    add(actions, "clear", "remove a scope's limits", cmd_limit_clear).add_argument("scope")
