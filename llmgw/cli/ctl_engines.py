"""``llmgw ctl engines``: engine builds in the mirror, added from a binary, listed, removed.

A node whose agent lacks a placed profile's engine installs the build the mirror holds for
its platform (the newest added), fetched by digest as weights are.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, whole_number
from llmgw.cli.tables import DASH, render, size
from mirror.domain.platforms import this_platform

HEADERS = ["ID", "ENGINE", "VERSION", "PLATFORM", "SIZE", "SHA256", "ADDED"]


def render_builds(builds: list[Mapping[str, Any]]) -> str:
    if not builds:
        return (
            "No engine builds yet: llmgw engines build llamacpp (on the control plane's host), "
            "or llmgw ctl engines add --file PATH --engine llamacpp"
        )
    rows = [
        [
            b["id"],
            b["engine"],
            b["version"],
            b["platform"],
            size(b.get("size")),
            str(b["sha256"])[:12],
            f"{str(b.get('added_at', ''))[:16].replace('T', ' ')} by {b.get('added_by') or DASH}",
        ]
        for b in builds
    ]
    return render(HEADERS, rows)


def render_one(b: Mapping[str, Any]) -> str:
    return (
        f"engine build {b['id']}: {b['engine']} {b['version']} for {b['platform']}, "
        f"{size(b.get('size'))}, sha256 {b['sha256']}"
    )


def version_of(path: Path) -> str:
    """What the binary says its version is (``llama-server --version``)."""
    from llmgw.cli.engines import BuildError, engine_version

    try:
        return engine_version(path)
    except BuildError as exc:
        raise CtlError(f"{exc} Give its version with --version.") from None


def cmd_engines_add(api: Api, args: argparse.Namespace, out: Output) -> None:
    path: Path = args.file
    if not path.is_file():
        raise CtlError(f"{path} is not a file.", 2)
    fields = {
        "engine": args.engine,
        "version": args.version or version_of(path),
        "platform": args.platform or this_platform(),
    }
    if args.sha256:
        fields["sha256"] = args.sha256
    with open(path, "rb") as f:
        build = api.request("POST", "/engines", files={"file": (path.name, f)}, data=fields)
    out.show(build, render_one)


def cmd_engines_list(api: Api, args: argparse.Namespace, out: Output) -> None:
    out.show(api.get("/engines"), render_builds)


def cmd_engines_rm(api: Api, args: argparse.Namespace, out: Output) -> None:
    api.delete(f"/engines/{args.id}")
    out.say(f"engine build {args.id} removed; nodes that installed it keep their copy")


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``engines add|list|rm``."""
    engines = add(commands, "engines", "engine builds in the mirror: add, list, rm")
    actions = engines.add_subparsers(dest="action", required=True, metavar="ACTION")
    added = add(actions, "add", "upload an engine binary nodes lacking it install", cmd_engines_add)
    added.add_argument("--file", type=Path, required=True, help="the binary (llama-server)")
    added.add_argument("--engine", default="llamacpp", help="the engine it is (default llamacpp)")
    added.add_argument("--version", help="its version (default: what FILE --version says)")
    added.add_argument(
        "--platform", help=f"the nodes it runs on (default this machine's: {this_platform()})"
    )
    added.add_argument("--sha256", help="its digest, checked by the mirror")
    add(actions, "list", "every build, by engine and platform", cmd_engines_list)
    add(actions, "rm", "forget a build", cmd_engines_rm).add_argument("id", type=whole_number)
