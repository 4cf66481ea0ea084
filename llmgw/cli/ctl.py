"""``llmgw ctl``: the operator's command line for the REST API under ``/api/v1/``.

Each command makes one or two HTTP calls and shows the answer as a table or a
few sentences; ``--json`` prints the server's JSON as it came instead. The
server is the only judge of what is valid: a command checks only what it
needs to build a request, and shows the server's own sentence when it refuses.

This module is the parser and the global options; the commands are the
``ctl_*.py`` modules in :data:`COMMANDS`, built on :mod:`llmgw.cli.base`.

Exit status: 0 done; 1 the server refused or could not be reached; 2 the
command line was wrong (including no token), so nothing was sent.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import httpx

from llmgw.cli import (
    ctl_adapters,
    ctl_bench,
    ctl_budget,
    ctl_capacity,
    ctl_engines,
    ctl_events,
    ctl_fabric,
    ctl_facility,
    ctl_keys,
    ctl_logs,
    ctl_models,
    ctl_nodes,
    ctl_quota,
    ctl_replicas,
    ctl_status,
    ctl_tenancy,
    ctl_upgrade,
    ctl_usage,
    ctl_weights,
)
from llmgw.cli.base import DEFAULT_TIMEOUT_S, Api, CtlError, Handler, Output, positive_number
from llmgw.cli.tables import number

DEFAULT_SERVER = "http://127.0.0.1:8000"

# Every command module, in the order `llmgw ctl --help` lists their commands. Each has
# register(add, commands, groups); `models` comes before those that add to its actions.
COMMANDS = [
    ctl_status,
    ctl_nodes,
    ctl_models,
    ctl_tenancy,
    ctl_quota,
    ctl_facility,
    ctl_fabric,
    ctl_capacity,
    ctl_keys,
    ctl_usage,
    ctl_budget,
    ctl_bench,
    ctl_logs,
    ctl_events,
    ctl_weights,
    ctl_engines,
    ctl_replicas,
    ctl_upgrade,
    ctl_adapters,
]


def _global_options() -> argparse.ArgumentParser:
    """The options every command takes, before or after its name.

    Their defaults are SUPPRESS so a subcommand's parser does not overwrite a
    value given before the subcommand; :func:`settings` fills in the defaults.
    """
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("global options")
    g.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        help=f"the control plane's URL (env LLMGW_SERVER, else {DEFAULT_SERVER})",
    )
    g.add_argument(
        "--token",
        default=argparse.SUPPRESS,
        help="an admin token from `llmgw createtoken NAME` (env LLMGW_TOKEN)",
    )
    g.add_argument(
        "--actor",
        default=argparse.SUPPRESS,
        help="who is acting, recorded beside each change (default: the token's name)",
    )
    g.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the server's JSON as it came instead of a table",
    )
    g.add_argument(
        "--timeout",
        type=positive_number,
        default=argparse.SUPPRESS,
        help=f"seconds to wait for the server (default {number(DEFAULT_TIMEOUT_S)})",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    """The ``llmgw ctl`` argument parser, every command with its handler."""
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog="llmgw ctl",
        description="Operate an llmgw control plane through its REST API.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        group: Any, name: str, help: str, handler: Handler | None = None, aliases: tuple = ()
    ) -> Any:
        sub = group.add_parser(
            name, help=help, description=help, parents=[common], aliases=list(aliases)
        )
        if handler:
            sub.set_defaults(handler=handler)
        return sub

    groups: dict[str, Any] = {}
    for module in COMMANDS:
        module.register(add, commands, groups)
    return parser


def settings(args: argparse.Namespace) -> tuple[str, str, str | None, float, bool]:
    """Server, token, actor, timeout and --json, from the options, else the environment."""
    server = getattr(args, "server", None) or os.environ.get("LLMGW_SERVER") or DEFAULT_SERVER
    if "://" not in server:
        server = f"http://{server}"
    token = getattr(args, "token", None) or os.environ.get("LLMGW_TOKEN") or ""
    return (
        server.rstrip("/"),
        token.strip(),
        getattr(args, "actor", None) or None,
        getattr(args, "timeout", DEFAULT_TIMEOUT_S),
        getattr(args, "json", False),
    )


def main(argv: list[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    """Run ``llmgw ctl`` with ``argv`` (the arguments after ``ctl``) and return the exit status.

    ``transport`` replaces httpx's network transport, so tests can answer with
    ``httpx.MockTransport``.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else 2
    server, token, actor, timeout, as_json = settings(args)
    if not token:
        print(
            "error: no token: set LLMGW_TOKEN or pass --token "
            "(an admin token, made with `llmgw createtoken NAME`)",
            file=sys.stderr,
        )
        return 2
    try:
        with Api(
            server=server, token=token, actor=actor, timeout=timeout, transport=transport
        ) as api:
            args.handler(api, args, Output(as_json=as_json))
    except CtlError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        # Ctrl-C while a call is in flight: what the server did with it is unknown.
        print("stopped by Ctrl-C; a change already sent may have been made", file=sys.stderr)
        return 130
    return 0


__all__ = ["COMMANDS", "build_parser", "main"]
