"""``llmgw ctl upgrade [VERSION] [--nodes …]``: a rolling upgrade of the nodes' agents.

One node at a time: the agent is told the release (POST /nodes/{id}/upgrade), installs it
and re-executes itself, its engines kept running; the roll waits for the node to be back,
ready and on the release, before the next, and stops at the first that is not, saying
which and why. `llmgw serve` and the mirror's host are not upgraded by it
(docs/upgrading.md), and it says so at its end.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from llmgw.cli.base import Api, CtlError, Output, positive_number, segment

DEFAULT_WAIT_S = 180.0
POLL_S = 1.0


def cmd_upgrade(api: Api, args: argparse.Namespace, out: Output) -> None:
    release = api.post("/releases", {"version": args.version} if args.version else {})
    version = release["version"]
    nodes = api.get("/nodes")
    if args.nodes:
        wanted = [n.strip() for n in args.nodes.split(",") if n.strip()]
        known = {n["id"] for n in nodes}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise CtlError(f"there is no node {unknown[0]}; nothing was upgraded", 2)
        nodes = [n for n in nodes if n["id"] in wanted]
    out.say(f"upgrading to llmgw {version} (sha256 {release['sha256'][:12]}…), one node at a time")
    done = already = 0
    for node in sorted(nodes, key=lambda n: n["id"]):
        if node.get("agent_version") == version:
            already += 1
            continue
        _one(api, out, node, version, args.wait)
        done += 1
    out.say(f"{done} node(s) upgraded to {version}, {already} already on it")
    out.say(
        "llmgw serve and the mirror's host are not upgraded by this: upgrade each llmgw serve in "
        "turn behind the balancer (docs/upgrading.md), and on a host the control plane does "
        f"not reach run: sudo llmgw upgrade {version} --service UNIT"
    )


def _one(api: Api, out: Output, node: dict, version: str, wait_s: float) -> None:
    """Upgrade one node and wait for it to be back on `version`; CtlError stops the roll."""
    node_id = node["id"]
    # What the node had said before, by the server's clock: only what it says after counts.
    newest = api.get("/events", node=node_id, limit=1)["events"]
    before = newest[0]["last_at"] if newest else None
    api.post(f"/nodes/{segment(node_id)}/upgrade", {"version": version})
    out.say(f"{node_id}: {node.get('agent_version') or 'unknown'} → {version} …")
    deadline = time.monotonic() + wait_s
    while True:
        failed = [
            e
            for e in api.get("/events", node=node_id, since=before, limit=20)["events"]
            if e["kind"] == "upgrade_failed" and (before is None or e["last_at"] > before)
        ]
        if failed:
            raise CtlError(f"the roll stopped at {node_id}: {failed[0]['message']}")
        now = api.get(f"/nodes/{segment(node_id)}")
        if now.get("agent_version") == version and now.get("state") == "ready":
            out.say(f"{node_id}: on {version}, ready, its engines kept running")
            return
        if time.monotonic() > deadline:
            raise CtlError(
                f"the roll stopped at {node_id}: it is not back on llmgw {version} after "
                f"{wait_s:g} s (it is {now.get('state')}, on {now.get('agent_version') or 'unknown'}); "
                f"see llmgw ctl events --node {node_id}"
            )
        time.sleep(POLL_S)


def register(add: Callable[..., Any], commands: Any, groups: dict[str, Any]) -> None:
    """Add ``upgrade``."""
    upgrade = add(
        commands,
        "upgrade",
        "upgrade the nodes' agents one at a time, their engines kept running",
        cmd_upgrade,
    )
    upgrade.add_argument(
        "version", nargs="?", help="a release in the mirror (default: the control plane's own)"
    )
    upgrade.add_argument("--nodes", help="only these nodes, comma-separated (default: every node)")
    upgrade.add_argument(
        "--wait",
        type=positive_number,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"how long a node may take to come back (default {DEFAULT_WAIT_S:g})",
    )
