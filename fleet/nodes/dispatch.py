"""Commands to agents go through the channel layer, to a group per node, after the commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from llmgw.core.outage import Outage

log = logging.getLogger("llmgw.fleet")
_layer = Outage("sending commands to agents through the channel layer (Redis)", log)


@dataclass(frozen=True)
class Command:
    node_id: str
    payload: dict


def stop_command(node_id: str, shard_id: str, grace_s: int) -> Command:
    """The stop_shard message for a shard: its engine gets `grace_s` to finish what it serves."""
    return Command(node_id, {"type": "stop_shard", "shard_id": shard_id, "grace_s": grace_s})


def node_group(node_id: str) -> str:
    return f"node.{node_id}"


async def send_commands(commands: list[Command]) -> None:
    layer = get_channel_layer()
    for cmd in commands:
        await layer.group_send(
            node_group(cmd.node_id), {"type": "agent.command", "payload": cmd.payload}
        )


def node_disconnect(node_id: str) -> None:
    """Close a forgotten node's connection, wherever it is served, after its last commands."""
    try:
        async_to_sync(get_channel_layer().group_send)(
            node_group(node_id), {"type": "agent.forgotten"}
        )
    except Exception:  # its credential is revoked already: it cannot register again
        log.exception("could not close node %s's connection", node_id)


def dispatch(commands: list[Command]) -> None:
    """Send commands from sync code; called from transaction.on_commit so nothing leaves early."""
    if not commands:
        return
    try:
        async_to_sync(send_commands)(commands)
    except Exception as exc:  # the channel layer being away must not undo a committed pass
        # Said when it starts and when it ends; the commands are sent again on re-register.
        _layer.failed(exc)
    else:
        _layer.worked()
