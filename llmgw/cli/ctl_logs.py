"""``llmgw ctl logs REPLICA``: the engine's recent log, as its node reads it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.cli.base import Api, Output, segment, whole_number

DEFAULT_LINES = 100


def render_log(log: Mapping[str, Any]) -> str:
    """The lines as they are, oldest first; a line saying so when there are none."""
    lines = [str(line) for line in log.get("lines") or ()]
    if not lines:
        return f"{log.get('shard')} on node {log.get('node')} has logged nothing yet."
    return "\n".join(lines)


def cmd_logs(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get(f"/replicas/{segment(args.replica)}/logs", lines=args.lines), render_log)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``logs REPLICA [--lines N]`` to the commands."""
    logs = add(commands, "logs", "a replica's engine log, read from its node", cmd_logs)
    logs.add_argument("replica", help="a replica's id (llmgw ctl replicas, ctl model explain)")
    logs.add_argument(
        "--lines", "-n", type=whole_number, default=DEFAULT_LINES, help="how many, 1 to 1000"
    )
