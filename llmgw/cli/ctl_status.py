"""``llmgw ctl status``: the control plane's own health on one screen (GET /status):
database, Redis, the reconciler's last pass, the workers, the nodes by state, and the
models needing attention, each with why."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output
from llmgw.cli.tables import age, key_values, number

# How many models needing attention are named before the rest are counted.
NAMED = 10


def _health(part: Mapping[str, Any]) -> str:
    """``ok, sqlite (0.4 ms)``, ``not used: …`` or ``FAILING: …``."""
    said = part.get("said") or ""
    if part.get("ok") is None:
        return said
    if not part.get("ok"):
        return f"FAILING: {said}"
    ms = part.get("ms")
    return f"ok, {said}" + (f" ({number(ms)} ms)" if ms is not None else "")


def _reconciler(r: Mapping[str, Any]) -> str:
    if r.get("warning"):
        return f"FAILING: {r['warning']}"
    if not r.get("last_pass_at"):
        return "no pass yet"
    every = f", every {number(r.get('interval_s'))} s" if r.get("interval_s") else ""
    settling = "; settling after a start" if r.get("settling") else ""
    return f"ok, last pass {age(r['last_pass_at'])} ago{every}{settling}"


def _workers(w: Mapping[str, Any]) -> str:
    text = _health(w)
    if w.get("names"):
        text += f": {', '.join(w['names'])}"
    return text


def _nodes(n: Mapping[str, int]) -> str:
    total = sum(n.get(s, 0) for s in ("ready", "unreachable", "lost"))
    parts = [f"{n.get(s, 0)} {s}" for s in ("ready", "unreachable", "lost")]
    text = f"{total}: {', '.join(parts)}"
    extra = [f"{n[s]} {s}" for s in ("draining", "cordoned") if n.get(s)]
    return text + (f" ({', '.join(extra)})" if extra else "")


def render_status(s: Mapping[str, Any]) -> str:
    """The one screen."""
    attention = s.get("attention") or []
    pairs = [
        ("database", _health(s.get("database") or {})),
        ("redis", _health(s.get("redis") or {})),
        ("reconciler", _reconciler(s.get("reconciler") or {})),
        ("workers", _workers(s.get("workers") or {})),
        ("nodes", _nodes(s.get("nodes") or {})),
        ("attention", f"{len(attention)} model(s)" if attention else "nothing"),
    ]
    lines = [key_values(pairs)]
    for m in attention[:NAMED]:
        lines.append(f"  {m['name']} ({m.get('status') or 'failing'}): {m.get('reason') or '-'}")
    if len(attention) > NAMED:
        lines.append(f"  and {len(attention) - NAMED} more: llmgw ctl models")
    return "\n".join(lines)


def cmd_status(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/status"), render_status)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``status``."""
    add(
        commands,
        "status",
        "the control plane's own health: database, Redis, reconciler, workers, nodes, models "
        "needing attention",
        cmd_status,
    )
