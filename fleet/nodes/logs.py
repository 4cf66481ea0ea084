"""An engine's recent log, read from its node on request (`GET /replicas/{id}/logs`).

The log stays on the node (`<state-dir>/logs/<shard>.log`); the control plane
asks the agent for its last lines over the agent's websocket (`engine_log`,
answered by `engine_log_lines`) and waits a bounded time. A node that is away
or does not answer in time is a sentence, not a hang.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from channels.layers import get_channel_layer

from llmgw.core.db import database_call
from llmgw.core.errors import Invalid, NotFound, ServiceError

from ..domain.types import shard_id as shard_id_of
from ..models import ModelState, Node, Shard
from ..protocol import LOG_LINES
from .dispatch import node_group

DEFAULT_LINES = 100
# How long the agent has to answer: reading a file's end takes it milliseconds.
ANSWER_TIMEOUT_S = 5.0


class NodeAway(ServiceError):
    """The node that has the log cannot be asked now (503)."""

    status = 503


class NoAnswer(ServiceError):
    """The node was asked and did not answer in time (504)."""

    status = 504


@dataclass(frozen=True)
class LogTarget:
    replica: str
    shard: str
    node: str
    node_state: str | None  # None: the node is no longer known


def log_target(*, replica_id: str) -> LogTarget:
    """Where a replica's first shard's log is: its node, and whether that node is up.

    A replica that failed is forgotten by the next pass, but its model's last failure
    remembers where it ran, so the log of the failure being shown can still be read.
    Raises NotFound for a replica neither knows.
    """
    row = (
        Shard.objects.filter(replica_id=replica_id)
        .order_by("rank")
        .values_list("id", "node_id", "node__state")
        .first()
    )
    if row is not None:
        return LogTarget(replica_id, row[0], row[1], row[2])
    failure = (
        ModelState.objects.filter(last_failure__replica=replica_id)
        .values_list("last_failure", flat=True)
        .first()
    )
    node = failure.get("node") if isinstance(failure, dict) else None
    if not isinstance(node, str) or not node:
        raise NotFound(f"There is no replica {replica_id!r}.")
    state = Node.objects.filter(pk=node).values_list("state", flat=True).first()
    return LogTarget(replica_id, shard_id_of(replica_id, 0), node, state)


def lines_checked(lines: int) -> int:
    """`lines` when it is 1 to LOG_LINES; Invalid otherwise."""
    if isinstance(lines, bool) or not isinstance(lines, int) or not 1 <= lines <= LOG_LINES:
        raise Invalid(f"lines must be a whole number from 1 to {LOG_LINES}.")
    return lines


async def replica_log(
    *, replica_id: str, lines: int = DEFAULT_LINES, timeout_s: float | None = None
) -> dict:
    """The last `lines` lines of a replica's engine log, as its agent reads them:
    `{"replica", "shard", "node", "lines"}`, oldest first (see `log_ask`)."""
    lines = lines_checked(lines)
    target = await database_call(log_target)(replica_id=replica_id)
    return await log_ask(target=target, lines=lines, timeout_s=timeout_s)


async def log_ask(*, target: LogTarget, lines: int, timeout_s: float | None = None) -> dict:
    """Ask the agent of the target's node for the shard's last `lines` lines and wait for
    its answer; no database.

    Raises Invalid for a bad `lines`, NodeAway when the node cannot be reached, NoAnswer
    when it does not answer within `timeout_s` (ANSWER_TIMEOUT_S), NotFound when the node
    has no log of the shard.
    """
    lines = lines_checked(lines)
    timeout_s = ANSWER_TIMEOUT_S if timeout_s is None else timeout_s
    replica_id, node, shard = target.replica, target.node, target.shard
    if target.node_state is None:
        raise NodeAway(f"Node {node} is no longer known; the log of {replica_id} was on it.")
    if target.node_state != Node.READY:
        raise NodeAway(
            f"Node {node} is {target.node_state}: the log of {replica_id} can be read once "
            "its agent is back."
        )
    layer = get_channel_layer()
    reply_to = await layer.new_channel("enginelog.")
    request_id = uuid.uuid4().hex
    await layer.group_send(
        node_group(node),
        {
            "type": "agent.engine_log",
            "request_id": request_id,
            "shard_id": shard,
            "lines": lines,
            "reply_to": reply_to,
        },
    )
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                answer = await layer.receive(reply_to)
                if answer.get("request_id") == request_id:
                    break
    except TimeoutError:
        raise NoAnswer(
            f"Node {node} did not answer within {timeout_s:g} s; its agent may be busy or "
            "connected elsewhere. Try again."
        ) from None
    if not answer.get("found"):
        raise NotFound(f"Node {node} has no log of {shard}.")
    return {"replica": replica_id, "shard": shard, "node": node, "lines": answer["lines"]}
