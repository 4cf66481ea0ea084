"""``llmgw ctl scale|restart|retry|replicas|reconcile``: a model's running replicas: how
many it runs, replacing them, placing it again after failures, where they run, and the
reconciler pass that acts on them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llmgw.cli.base import (
    Api,
    Output,
    duration,
    positive_number,
    said,
    segment,
    whole_number,
)
from llmgw.cli.tables import DASH, age, cell, joined, render
from mirror.domain.progress import fetched_said


def cmd_scale(api: Api, args: argparse.Namespace, out: Output) -> None:
    body: dict[str, Any] = {"min": args.min}
    if args.max is not None:
        body["max"] = args.max
    if args.idle_timeout is not None:
        body["idle_timeout"] = args.idle_timeout
    if args.target_waiting is not None:
        body["target_waiting"] = args.target_waiting
    if args.kv_ceiling is not None:
        body["kv_ceiling"] = args.kv_ceiling
    answer = api.post(f"/models/{segment(args.name)}/scale", body)

    def sentence(a: Any) -> str:
        got = a if isinstance(a, dict) else {}
        lo, hi = got.get("min", args.min), got.get("max", args.max)
        return said(a, f"{got.get('name', args.name)}: min {lo}, max {cell(hi)}")

    out.show(answer, sentence)


def cmd_restart(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/models/{segment(args.model)}/restart")
    default = f"restarting {args.model}: each replica is replaced in turn, a new one first"
    out.show(answer, lambda a: said(a, default))


def cmd_retry(api: Api, args: argparse.Namespace, out: Output) -> None:
    answer = api.post(f"/models/{segment(args.name)}/retry")
    out.show(answer, lambda a: said(a, f"{args.name}: failures cleared; it will be placed again"))


def shard_gpus(shards: Sequence[Mapping[str, Any]]) -> str:
    """``n1:0,1,2,3 n2:0,1,2,3``: each shard's node and GPU indices; ``-`` for CPU replicas."""
    parts = [
        f"{s.get('node')}:{','.join(str(i) for i in s['gpu_indices'])}"
        for s in shards
        if s.get("gpu_indices")
    ]
    return " ".join(parts) or DASH


def render_replicas(replicas: list[dict[str, Any]]) -> str:
    """``ctl replicas``: a row per replica with its shards' nodes and GPUs."""
    if not replicas:
        return "No replicas."
    rows = []
    for r in replicas:
        shards = sorted(
            (s for s in r.get("shards") or () if isinstance(s, dict)),
            key=lambda s: (s.get("rank") is None, s.get("rank") or 0),
        )
        nodes = list(dict.fromkeys(s.get("node") for s in shards if s.get("node")))
        state = cell(r.get("state"))
        fetching = r.get("fetching")
        if isinstance(fetching, dict):
            state = f"fetching {fetched_said(fetching.get('done'), fetching.get('total'))}"
        if r.get("retiring") and r.get("state") in ("pending", "starting", "ready"):
            # It serves until its replacement is ready, but no longer counts as one of the
            # model's replicas: say so, and why (a restart, its node's drain).
            state += f", retiring: {r['reason']}" if r.get("reason") else ", retiring"
        if r.get("outdated"):
            state += " (outdated)"
        rows.append(
            [
                r.get("id"),
                r.get("model"),
                r.get("profile"),
                state,
                joined(nodes),
                shard_gpus(shards),
                *engine_cells(r.get("engine")),
                r.get("endpoint"),
                age(r.get("created_at")),
            ]
        )
    headers = ["REPLICA", "MODEL", "PROFILE", "STATE", "NODES", "GPUS"]
    headers += ["RUN", "WAIT", "KV", "HITS", "ENDPOINT", "AGE"]
    held = [(r.get("engine") or {}).get("adapters") for r in replicas]
    if any(held):
        # The LoRA adapters each engine holds, when any does (docs/adapters.md).
        headers.append("ADAPTERS")
        for row, names in zip(rows, held, strict=True):
            row.append(joined(names) if names else "-")
    return render(headers, rows)


def engine_cells(engine: Any) -> list[str]:
    """What a replica's engine said: requests running and waiting, KV cache use and prefix
    cache hit rate as percentages; ``-`` for each it did not say (absent, not 0)."""
    said = engine if isinstance(engine, dict) else {}

    def share(value: Any) -> str:
        return f"{value:.0%}" if isinstance(value, int | float) else "-"

    return [
        cell(said.get("running")),
        cell(said.get("waiting")),
        share(said.get("kv_cache")),
        share(said.get("prefix_hit_rate")),
    ]


def cmd_replicas(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/replicas", model=args.model), render_replicas)


def event_line(event: Any) -> str:
    """One reconciler event as a line, whether the server sent a sentence or an object."""
    if isinstance(event, dict):
        for key in ("message", "detail", "event"):
            if isinstance(event.get(key), str):
                return event[key]
        return " ".join(f"{k}={v}" for k, v in event.items())
    return str(event)


def render_reconcile(answer: Any) -> str:
    """``ctl reconcile``: what the pass did, or that there was nothing to do."""
    events = answer.get("events") if isinstance(answer, dict) else None
    if not events:
        return said(answer, "nothing to do")
    return "\n".join(event_line(e) for e in events)


def cmd_reconcile(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.post("/reconcile"), render_reconcile)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``scale``, ``restart``, ``retry``, ``replicas`` and ``reconcile`` to the commands."""
    scale = add(commands, "scale", "set how many replicas a model runs", cmd_scale)
    scale.add_argument("name")
    scale.add_argument("--min", type=whole_number, required=True, help="replicas it always runs")
    scale.add_argument(
        "--max", type=whole_number, help="the most under load (left out: follows --min)"
    )
    scale.add_argument(
        "--idle-timeout",
        type=duration,
        help="how long an on-demand model stays up unused: seconds, or 90s, 10m, 1h",
    )
    scale.add_argument(
        "--target-waiting",
        type=positive_number,
        help="requests waiting per ready replica that add one (default 1; ctl bench's QUEUED)",
    )
    scale.add_argument(
        "--kv-ceiling",
        type=positive_number,
        help="the engines' KV cache use, 0.9 for 90 %%, held above which one is added "
        "(ctl bench's KV)",
    )
    restart = add(commands, "restart", "replace a model's replicas one at a time", cmd_restart)
    restart.add_argument("--model", required=True)
    retry = add(commands, "retry", "clear a parked model's failures and place it again", cmd_retry)
    retry.add_argument("name")

    replicas = add(commands, "replicas", "list replicas and where they run", cmd_replicas)
    replicas.add_argument("--model", help="only this model's")
    add(commands, "reconcile", "run one reconciler pass now and show what it did", cmd_reconcile)
