"""Upgrading a node's agent in place: told the release (from the mirror, by its SHA-256),
it tries it beside its own, installs it into its own environment and re-executes itself;
its engines keep running and the new agent adopts them (fleet/agent/upgrade.py).
`llmgw ctl upgrade` rolls this over the nodes one at a time and stops at the first that
does not come back (docs/upgrading.md). What a node is upgraded to runs as its agent's
user: only holders of fleet.upgrade_node may ask.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from llmgw.core.errors import Invalid, NotFound
from mirror.selectors import release_get, release_view
from mirror.services import release_offer
from tenancy.services import audit_record

from .. import event_log
from ..domain.plan import Event
from ..models import Node
from ..protocol import UpgradeStatus
from .dispatch import Command, dispatch

log = logging.getLogger("llmgw.fleet")


def release_for_upgrade(*, version: str | None, actor: str, now: datetime) -> dict:
    """The release nodes would be upgraded to (the mirror's `version`, or the one this
    control plane runs, built and kept on first asking)."""
    return release_view(release_offer(version=version, actor=actor, now=now))


def node_upgrade(*, node_id: str, version: str, actor: str, now: datetime) -> str:
    """Tell node `node_id`'s agent to upgrade to `version`; a sentence of what was done.
    NotFound for no such node or release; Invalid for a node that cannot be told now."""
    build = release_get(version)
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        raise NotFound(f"There is no node {node_id}.")
    if node.agent_version == version:
        return f"node {node_id} already runs llmgw {version}"
    if node.state in (Node.UNREACHABLE, Node.LOST) or not node.session:
        raise Invalid(
            f"node {node_id} is {node.state or 'not connected'}: its agent cannot be told to "
            "upgrade until it is connected again"
        )
    old = node.agent_version or "an unknown release"
    said = f"node {node_id} told to upgrade from llmgw {old} to {version} by {actor}"
    with transaction.atomic():
        audit_record(actor=actor, action="node.upgrade", target=node_id, detail={"to": version})
        event_log.record([Event(said, "upgrade", node=node_id)], now=now)
        payload = {
            "type": "upgrade",
            "version": version,
            "sha256": build.sha256,
            "size": build.size,
        }
        transaction.on_commit(lambda: dispatch([Command(node_id, payload)]))
    log.info(said, extra={"node": node_id})
    return said


def upgrade_reported(*, node_id: str, msg: UpgradeStatus, now: datetime) -> None:
    """What an agent says of its upgrade: installing, restarting into it, or why it failed
    (kept as an event, which `ctl upgrade` reads to stop its roll)."""
    if msg.state == "failed":
        said = f"node {node_id} could not upgrade to llmgw {msg.version}: {msg.detail}"
        log.warning(said, extra={"node": node_id})
    else:
        said = f"node {node_id} is {msg.state} llmgw {msg.version}"
        log.info(said, extra={"node": node_id})
    kind = "upgrade_failed" if msg.state == "failed" else "upgrade"
    event_log.record([Event(said, kind, node=node_id)], now=now)
