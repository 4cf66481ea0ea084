"""What a node's connection says of it: heartbeats written behind, a silence or a closed
connection marked unreachable at once, a node heard from again ready, and engines nobody
knows of stopped.

The serving process holding a node's connection knows to the second when its agent was
last heard; the reconciler reads the written-behind copy, seconds older. So the process
marks a silent node unreachable itself (`node_silent_mark`, from the consumers' flusher
each second) and the reconciler's own silence rule is the backstop for a process that
went away with its connections.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from .. import event_log
from ..domain.plan import Event, duration, seconds_since
from ..models import Node, Replica, Shard
from ..protocol import EngineInstallReport
from .dispatch import Command, stop_command
from .live import NodeWrite, Silence

log = logging.getLogger("llmgw.fleet")


def believe_figures(
    node: Node | _Heard, memory_total_mb: int | None, cpu_count: int | None
) -> None:
    """A node that reports less memory or more CPUs than before is believed, and the change logged."""
    for attr, value, unit in (
        ("memory_total_mb", memory_total_mb, "MB of memory"),
        ("cpu_count", cpu_count, "CPUs"),
    ):
        old = getattr(node, attr)
        if value is not None and old is not None and value != old:
            log.info(
                "node %s reports %s %s (was %s)", node.id, value, unit, old, extra={"node": node.id}
            )
        if value is not None:
            setattr(node, attr, value)


def node_disconnected(*, node_id: str, session: str, now: datetime) -> None:
    """The agent's connection closed: unreachable at once, unless it already reconnected elsewhere."""
    changed = Node.objects.filter(pk=node_id, session=session, state=Node.READY).update(
        state=Node.UNREACHABLE, state_since=now
    )
    if changed:
        log.info("node %s is unreachable: its connection closed", node_id, extra={"node": node_id})


def node_silent_mark(*, silent: list[Silence], now: datetime) -> list[str]:
    """Nodes this process has heard nothing from for the unreachable window: unreachable
    now, with the reconciler's sentence, unless they registered again elsewhere or are
    already not ready. Returns the nodes marked."""
    if not silent:
        return []
    by_id = {s.node_id: s for s in silent}
    with transaction.atomic():
        rows = Node.objects.filter(pk__in=by_id, state=Node.READY).values_list("id", "session")
        marked = sorted(node_id for node_id, session in rows if session == by_id[node_id].session)
        if not marked:
            return []
        Node.objects.filter(pk__in=marked, state=Node.READY).update(
            state=Node.UNREACHABLE, state_since=now
        )
        happened = []
        for node_id in marked:
            said = f"node {node_id} is unreachable: nothing heard for "
            said += duration(seconds_since(by_id[node_id].last_seen, now))
            log.info(said, extra={"node": node_id, "event": "node_state", "state": "unreachable"})
            happened.append(_node_state(node_id, Node.UNREACHABLE, said))
        event_log.record(happened, now=now)
    return marked


def _node_state(node_id: str, state: str, said: str) -> Event:
    return Event(said, "node_state", node=node_id, state=state)


def node_live_flush(*, writes: list[NodeWrite], now: datetime) -> list[str]:
    """Write heartbeats behind in bulk: last_seen and load per node, last use per replica.

    A node marked unreachable that has been heard from since is ready again.
    Returns the nodes found lost while still connected: their replicas were given up, so
    their agents must register again to say what they run.
    """
    if not writes:
        return []
    by_id = {w.node_id: w for w in writes}
    with transaction.atomic():
        rows = Node.objects.filter(pk__in=by_id).values_list(
            "id", "session", "state", "state_since", "memory_total_mb", "cpu_count"
        )
        nodes = [
            _Heard(node_id, state, since, memory, cpus)
            for node_id, session, state, since, memory, cpus in rows
            # A node that registered again elsewhere is that connection's to write.
            if session == by_id[node_id].session
        ]
        heard_again = []
        lost = [node.id for node in nodes if node.state == Node.LOST]
        for node in nodes:
            w = by_id[node.id]
            node.last_seen = w.last_seen
            believe_figures(node, w.memory_total_mb, w.cpu_count)
            if node.state == Node.UNREACHABLE and node.state_since < w.last_seen:
                heard_again.append(node.id)
        _write_live(nodes, {w.node_id: w.load_json for w in writes})
        if heard_again:
            Node.objects.filter(pk__in=heard_again, state=Node.UNREACHABLE).update(
                state=Node.READY, state_since=now
            )
            log.info("nodes heard from again, ready: %s", ", ".join(sorted(heard_again)))
            event_log.record(
                [
                    _node_state(node_id, Node.READY, f"node {node_id} is ready: heard from again")
                    for node_id in sorted(heard_again)
                ],
                now=now,
            )
        used = set().union(*(w.used_replicas for w in writes))
        if used:
            # Only replicas with a shard on the node that said so: an agent speaks for itself.
            held = Shard.objects.filter(
                node_id__in={n for n, _ in used}, replica_id__in={r for _, r in used}
            ).values_list("node_id", "replica_id")
            mine = {replica for node, replica in held if (node, replica) in used}
            Replica.objects.filter(pk__in=mine).update(last_used_at=now)
    return lost


def node_running_unknown(*, writes: list[NodeWrite]) -> list[Command]:
    """Stop what agents say they run but this control plane does not know: a backstop for
    an engine whose stop never arrived, found within a heartbeat or two."""
    running = {(w.node_id, shard) for w in writes for shard in w.running}
    if not running:
        return []
    known = set(
        Shard.objects.filter(
            node_id__in={n for n, _ in running}, id__in={s for _, s in running}
        ).values_list("node_id", "id")
    )
    unknown = sorted(running - known)
    for node_id, shard_id in unknown:
        log.info(
            "stopping shard %s on node %s: nothing here runs it",
            shard_id,
            node_id,
            extra={"node": node_id},
        )
    return [stop_command(node_id, shard_id, 0) for node_id, shard_id in unknown]


@dataclass(slots=True)
class _Heard:
    """A node's row as a flush reads and writes it (model instances were a third of it)."""

    id: str
    state: str
    state_since: datetime
    memory_total_mb: int | None
    cpu_count: int | None
    last_seen: datetime | None = None


def _write_live(nodes: list[_Heard], loads: dict[str, str]) -> None:
    """One prepared UPDATE run for every node, its load written as the JSON text given:
    bulk_update's CASE expressions cost the serving process milliseconds of Python per
    node, in a thread beside the agents' loop."""
    table = Node._meta.db_table
    # The heartbeats' times are aware: straight to the driver's text, not through the field.
    adapt = connection.ops.adapt_datetimefield_value
    load = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    rows = [
        (
            adapt(n.last_seen),
            loads[n.id],
            n.memory_total_mb,
            n.cpu_count,
            n.id,
        )
        # In id order, as node_figures_refresh locks them: two writers never wait on each other.
        for n in sorted(nodes, key=lambda n: n.id)
    ]
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET last_seen = %s, load = {load}, memory_total_mb = %s,"
            " cpu_count = %s WHERE id = %s",
            rows,
        )


def node_engines_record(
    *,
    node_id: str,
    engines: Mapping[str, str] | None,
    installs: Iterable[EngineInstallReport] | None,
    now: datetime,
) -> None:
    """What a heartbeat says of the node's engines and installs, when either moved on.

    ``spec_at`` moves with it, so the reconciler's cache of what nodes registered reads
    the node again: an installed engine is then an engine it has. Absent is as it was.
    """
    fields: dict = {}
    if engines is not None:
        fields["engines"] = dict(engines)
        fields["engines_probed"] = True
    if installs is not None:
        fields["engine_installs"] = [i.model_dump() for i in installs]
    if fields:
        Node.objects.filter(pk=node_id).update(spec_at=now, **fields)
