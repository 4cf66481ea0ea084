"""A node's registration, written in batches: who it is and what it has (GPUs, engines,
weights, its address judged), and the shards it says it runs, reconciled with what the
control plane gave it — adopted when the control plane starts and does not know them,
refused when they are not its own."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from urllib.parse import urlparse

from django.conf import settings
from django.db import transaction

from catalog.selectors import catalog_load
from llmgw.core import clock

from .. import event_log
from ..domain.adoption import KEEP, STOP, Claim, Ground, Terms, Verdict, adoption_window_open, judge
from ..domain.gpuclass import gpu_class
from ..domain.passes import gap_allowed
from ..domain.plan import Event
from ..domain.power import phase_refusal
from ..domain.types import parse_shard_id
from ..models import Gpu, Lease, Node, Replica, Shard
from ..protocol import (
    Register,
    RunningShard,
)
from ..reconciler.run import LEASE
from ..services import start_command
from .connections import refused
from .dispatch import Command, stop_command
from .fabric import (
    gpu_fabric_write,
    gpu_reports,
    node_fabric,
)
from .figures import node_figures_refresh
from .heard import believe_figures
from .identity import (
    AgentCredential,
    Refused,
    credential_issue,
    node_address_refusal,
    register_refusal,
)
from .reports import replica_progress, stopped_once_all_shards_are

log = logging.getLogger("llmgw.fleet")


def _sync_gpus(node: Node, msg: Register, *, new: bool, rows: list[Gpu] | None = None) -> bool:
    """Make the node's Gpu rows what it reported, with the processes llmgw did not start on
    each; True when its GPUs or their fabric reports changed (read once, not at all for a
    node just made, and not again when its batch read them: `rows`)."""
    reports = gpu_reports(msg.fabric)
    wanted = {
        # Cut to the column's length: only an odd product name makes a class that long.
        g.index: (g.uuid, g.name, g.memory_total_mb, gpu_class(g.name, g.memory_total_mb)[:40])
        for g in msg.gpus
    }
    if rows is None:
        rows = [] if new else list(node.gpus.all())
    have = {g.index: (g.uuid, g.name, g.memory_mb, g.gpu_class) for g in rows}
    if wanted == have:
        _note_unknown_processes(node, msg, rows, save=True)
        return gpu_fabric_write(rows, reports)
    if rows:
        node.gpus.all().delete()
    made = [
        Gpu(node=node, index=i, uuid=u, name=n, memory_mb=m, gpu_class=c, fabric=reports.get(i))
        for i, (u, n, m, c) in sorted(wanted.items())
    ]
    _note_unknown_processes(node, msg, made, save=False)
    Gpu.objects.bulk_create(made)
    if have:
        log.info(
            "node %s now reports %d GPUs (was %d)",
            node.id,
            len(wanted),
            len(have),
            extra={"node": node.id},
        )
    return True


@dataclass(frozen=True)
class Registration:
    """What registering gave: when it was written, commands for the agent, and the node's own
    credential when this registration issued one (sent once, kept nowhere)."""

    at: datetime
    commands: list[Command] = field(default_factory=list)
    node_token: str | None = None
    approved: bool = True


def node_register(
    *, msg: Register, session: str, now: datetime, credential: AgentCredential, seen_addr: str
) -> Registration:
    """Create or refresh a node from its registration and reconcile the shards it runs.

    The credential must be this node's own, or a join token for a node id that has none
    (then this registration issues the node's credential); otherwise Refused is raised and
    nothing changes. `seen_addr` is the address its connection came from ("" unknown): the
    address the node declares is believed only when it is that one, or one an operator
    approved (fleet/domain/endpoints.py address_refusal). Shards placed on this node are
    kept (or stopped again when they should be stopping); a shard it was not given is
    adopted only as fleet/domain/adoption.py allows, and stopped otherwise, as is every
    shard whose endpoint is not on the node's believed address. Shards it should run but
    does not report are started again, or failed when they had been running.
    """
    with transaction.atomic():
        return _register(
            msg=msg, session=session, now=now, credential=credential, seen_addr=seen_addr
        )


# What heartbeats write (the write-behind): a registration neither reads nor writes it, and
# a node's last load is the largest of its columns.
_HEARTBEATS_OWN = (
    "load",
    "load1",
    "memory_used_bytes",
    "cpu_temp_c",
    "cpu_power_w",
    "inlet_temp_c",
)


def _nodes_locked():
    """Nodes as a registration reads them: locked, less what heartbeats write (saved, a
    node so read writes only the columns it read)."""
    return Node.objects.select_for_update().defer(*_HEARTBEATS_OWN)


class _Read:
    """What the registrations of one batch read together: their nodes (locked), those
    nodes' GPUs and their shards with their replicas. A node's rows go to its first
    registration; a second of the same node in the batch reads what the first wrote."""

    def __init__(self, node_ids: list[str]) -> None:
        # Locked in one order, whoever else locks several (another server's batch).
        locked = _nodes_locked().filter(pk__in=node_ids).order_by("pk")
        self.nodes = {n.pk: n for n in locked}
        self.gpus: dict[str, list[Gpu]] = {n: [] for n in self.nodes}
        for gpu in Gpu.objects.filter(node_id__in=list(self.nodes)).order_by("node_id", "index"):
            self.gpus[gpu.node_id].append(gpu)
        self.shards: dict[str, dict[str, Shard]] = {n: {} for n in self.nodes}
        for shard in Shard.objects.filter(node_id__in=list(self.nodes)).select_related("replica"):
            self.shards[shard.node_id][shard.id] = shard
        self.taken: set[str] = set()

    def take(self, node_id: str) -> tuple[Node | None, list[Gpu], dict[str, Shard]] | None:
        """The node (None: there was none) with its GPUs and shards; None once taken."""
        if node_id in self.taken:
            return None
        self.taken.add(node_id)
        return (
            self.nodes.pop(node_id, None),
            self.gpus.pop(node_id, []),
            self.shards.pop(node_id, {}),
        )


def registrations_write(calls: list[dict]) -> list[Registration | Exception]:
    """node_register for each call (its msg, session and credential) in one transaction,
    the nodes, their GPUs and shards read once for all: a fleet registering again after a
    restart paid for a transaction and those reads once a node. Each is stamped when it is
    written. A Refused is that call's answer alone (raised before it wrote anything); any
    other failure undoes the batch, and each is written again on its own, so that one
    node's failure is its own."""
    try:
        with transaction.atomic():
            read = _Read([c["msg"].node_id for c in calls])
            answers: list[Registration | Exception] = []
            for call in calls:
                try:
                    answers.append(_register(now=clock.now(), read=read, **call))
                except Refused as exc:
                    answers.append(exc)
            return answers
    except Exception:
        if len(calls) == 1:
            raise
    answers = []
    for call in calls:
        try:
            answers.append(node_register(now=clock.now(), **call))
        except Exception as exc:
            answers.append(exc)
    return answers


def _register(
    *,
    msg: Register,
    session: str,
    now: datetime,
    credential: AgentCredential,
    seen_addr: str,
    read: _Read | None = None,
) -> Registration:
    """node_register in the caller's transaction, with the node's rows from `read` when
    its batch read them."""
    rows = read.take(msg.node_id) if read is not None else None
    if rows is None:
        node, gpus, shards = (
            _nodes_locked().filter(pk=msg.node_id).first(),
            None,
            None,
        )
    else:
        node, gpus, shards = rows
    if node is None and not credential.joining:
        # Its credential was found a moment ago: the node was forgotten since.
        raise Refused(f"node {msg.node_id} was forgotten", "forgotten")
    register_refusal(credential=credential, node_id=msg.node_id, now=now)
    new = node is None
    if new:
        node = Node(
            id=msg.node_id,
            registered_at=now,
            state_since=now,
            last_seen=now,
            approved=settings.LLMGW.agents.approval == "auto",
        )
        log.info("node %s registered", msg.node_id, extra={"node": msg.node_id})
    elif node.state != Node.READY:
        log.info("node %s is ready again (was %s)", node.id, node.state, extra={"node": node.id})
        node.state_since = now
    node_token = (
        credential_issue(node, credential=credential, now=now) if credential.joining else None
    )
    labels_before = node.labels
    node.hostname = msg.hostname
    _address_judge(node, declared=msg.mgmt_addr, seen=seen_addr, now=now)
    node.labels = dict(msg.labels)
    if node.labels != labels_before:
        _phases_judge(node, now=now)
    node.agent_version = msg.agent_version
    believe_figures(node, msg.memory_total_mb, msg.cpu_count)
    node.engines = dict(msg.engines)
    node.engines_probed = msg.engines_probed
    node.disk_free_gb = msg.disk.free_gb if msg.disk else None
    node.disk_total_gb = msg.disk.total_gb if msg.disk else None
    node.weights = [w.model_dump() for w in msg.weights]
    node.platform = msg.platform
    node.engine_installs = [i.model_dump() for i in msg.engine_installs]
    node.imex, node.ib_ports = node_fabric(msg.fabric)
    node.fabric_at = now
    node.state = Node.READY
    node.session = session
    node.last_seen = now
    node.spec_at = now
    node.save()
    gpus_changed = _sync_gpus(node, msg, new=new, rows=gpus)
    known = (
        shards
        if shards is not None
        else {s.id: s for s in Shard.objects.filter(node=node).select_related("replica")}
    )
    before = {s.replica_id: s.replica.state for s in known.values()}
    commands, wrote = _reconcile_reported_shards(node, msg, known, now)
    # Its GPUs and labels are new; a replica it failed or stopped frees GPUs elsewhere
    # too. Only those: nodes that all register at once (a restart) must not each lock
    # the others' rows while holding their own. A node registering again as it was (a
    # restart of the control plane) changed none of its figures.
    if new or gpus_changed or wrote or node.labels != labels_before:
        after = dict(Replica.objects.filter(pk__in=before).values_list("id", "state"))
        ended = [r for r, state in before.items() if after.get(r) != state]
        node_figures_refresh(nodes=[node.id], replicas=ended)
    return Registration(at=now, commands=commands, node_token=node_token, approved=node.approved)


def _phases_judge(node: Node, *, now: datetime) -> None:
    """Say, when a node's new labels name PDU phases that cannot be read (power.phase_refusal),
    that they are ignored: the node is then under its PDUs' budgets alone, never refused for
    a label (an agent's labels are what it says, not a request to refuse)."""
    if why := phase_refusal(node.labels):
        said = f"node {node.id}'s PDU phases are ignored: {why}"
        log.warning("%s", said, extra={"node": node.id})
        event_log.record([Event(said, "phases_ignored", node=node.id)], now=now)


def _address_judge(node: Node, *, declared: str, seen: str, now: datetime) -> None:
    """Set what the node says of its address, where it connects from, and whether the one
    is believed; a change of that is logged and said in the event log."""
    was = node.address_refusal
    node.mgmt_addr, node.seen_addr = declared, seen
    node.address_refusal = node_address_refusal(node)
    if node.address_refusal and node.address_refusal != was:
        log.warning("%s", node.address_refusal, extra={"node": node.id})
        event_log.record([Event(node.address_refusal, "address_refused", node=node.id)], now=now)


def _reconcile_reported_shards(
    node: Node, msg: Register, known: dict[str, Shard], now: datetime
) -> tuple[list[Command], bool]:
    """The commands for the shards the node reported and those it should run, and whether a
    shard or replica row was written. `known` are the node's shards, with their replicas."""
    commands: list[Command] = []
    wrote = False
    catalog: dict | None = None  # read only for a shard the node does not hold as known
    reports = list({s.shard_id: s for s in msg.shards}.values())
    verdicts = judge([_claim(rep) for rep in reports], _ground(node, msg, reports, known, now))
    reported: set[str] = set()
    refusals: list[Verdict] = []
    for rep, verdict in zip(reports, verdicts, strict=True):
        if verdict.action == STOP:
            refusals.append(verdict)
            commands.append(stop_command(node.id, rep.shard_id, 0))
            continue
        reported.add(rep.shard_id)
        if verdict.action == KEEP:
            cmd, moved = _known_reported(node, rep, known[rep.shard_id], now)
            commands += cmd
            wrote |= moved
            continue
        catalog = catalog_load() if catalog is None else catalog
        _adopt(node, rep, catalog[rep.model].profile(rep.profile), now)
        wrote = True
    _refusals_told(node, refusals, now)
    for shard_id, shard in known.items():
        if shard_id in reported:
            continue
        replica = shard.replica
        if replica.state in ("stopping", "stopped", "failed"):
            shard.state = "stopped"
            shard.save(update_fields=["state"])
            stopped_once_all_shards_are(replica.id, now)
            wrote = True
        elif shard.state in ("pending", "starting") and replica.state in ("pending", "starting"):
            # It may never have received start_shard while it was away: start_shard is idempotent.
            catalog = catalog_load() if catalog is None else catalog
            cmd = start_command(shard, replica, catalog.get(replica.model))
            if cmd:
                commands.append(cmd)
        else:
            reason = f"shard {shard_id} was not running when node {node.id} registered again"
            shard.state = "failed"
            shard.save(update_fields=["state"])
            # Only a replica that never became ready failed to start (domain.md, Failures).
            Replica.objects.filter(pk=replica.pk).exclude(state__in=("stopped", "failed")).update(
                state="failed",
                state_since=now,
                reason=reason,
                counts_as_failure=replica.state in ("pending", "starting"),
            )
            log.info(reason, extra={"node": node.id, "replica": replica.id})
            wrote = True
    return commands, wrote


def _known_reported(
    node: Node, rep: RunningShard, shard: Shard, now: datetime
) -> tuple[list[Command], bool]:
    """A shard placed on this node that it reports running: stopped again when its replica
    is being given up, else its state and endpoint taken. (commands, whether it wrote)."""
    replica = shard.replica
    if replica.state in ("stopping", "stopped", "failed"):
        return [stop_command(node.id, shard.id, replica.stop_grace_s)], False
    state = rep.state if rep.state != "pending" else shard.state
    endpoint = rep.endpoint or shard.endpoint
    if (state, endpoint) == (shard.state, shard.endpoint) and replica.state not in (
        "pending",
        "starting",
    ):
        return [], False  # as the control plane knew it: nothing to move along
    shard.state, shard.endpoint = state, endpoint
    shard.save(update_fields=["state", "endpoint"])
    replica_progress(replica.id, now)
    return [], True


def _claim(rep: RunningShard) -> Claim:
    return Claim(
        shard_id=rep.shard_id,
        replica_id=rep.replica_id,
        model=rep.model,
        profile=rep.profile,
        profile_fp=rep.profile_fp,
        gpu_indices=tuple(rep.gpu_indices),
        endpoint=rep.endpoint,
        state=rep.state,
    )


def _ground(
    node: Node, msg: Register, reports: list[RunningShard], known: dict[str, Shard], now: datetime
) -> Ground:
    """What adoption's rules need to know of this node and the shards it reports; the
    database is asked only about shards not placed on it."""
    agents = settings.LLMGW.agents
    ground = Ground(
        node_id=node.id,
        placed=frozenset(known),
        address=node.mgmt_addr,
        address_refusal=node.address_refusal or None,
        most=agents.adopt_per_register,
    )
    others = [r for r in reports if r.shard_id not in known]
    if not others:
        return ground
    catalog = catalog_load()
    terms = {}
    for r in others:
        spec = catalog.get(r.model)
        profile = spec.profile(r.profile) if spec else None
        if profile is not None:
            terms[r.model, r.profile] = Terms(
                profile.fingerprint(), profile.nodes, profile.gpus_on_each_node
            )
    return replace(
        ground,
        elsewhere=dict(
            Shard.objects.filter(pk__in=[r.shard_id for r in others])
            .exclude(node=node)
            .values_list("id", "node_id")
        ),
        replicas=frozenset(
            Replica.objects.filter(pk__in={r.replica_id for r in others}).values_list(
                "id", flat=True
            )
        ),
        catalog=terms,
        gpus=frozenset(g.index for g in msg.gpus),
        held=frozenset(
            i
            for s in known.values()
            if s.state not in ("stopped", "failed") and s.replica.state not in ("stopped", "failed")
            for i in s.gpu_indices
        ),
        adopting=_adopting(now),
    )


def _adopting(now: datetime) -> bool:
    """Whether the control plane still takes back shards it did not place (adoption.py)."""
    lease = (
        Lease.objects.filter(pk=LEASE)
        .values_list("last_pass_at", "settled_from", "served_since")
        .first()
    )
    last_pass_at, settled_from, served_since = lease or (None, None, None)
    return adoption_window_open(
        now=now,
        last_pass_at=last_pass_at,
        settled_from=settled_from,
        served_since=served_since,
        window_s=settings.LLMGW.agents.adopt_window,
        gap_s=gap_allowed(settings.LLMGW.timings),
    )


def _refusals_told(node: Node, refusals: list[Verdict], now: datetime) -> None:
    """Count, log once and keep in the event log the shards a registration refused."""
    if not refusals:
        return
    counts = Counter(v.reason for v in refusals)
    for reason, n in counts.items():
        refused(f"shard_{reason}", count=n)
    kinds = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(counts.items()))
    more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
    sentence = (
        f"node {node.id} reported {len(refusals)} shard(s) the control plane did not give it "
        f"or cannot believe, and was told to stop them ({kinds}): {refusals[0].why}{more}"
    )
    log.warning("%s", sentence, extra={"node": node.id})
    event_log.record(
        [Event(sentence, "shards_refused", **counts, node=node.id)],
        now=now,
    )


def _note_unknown_processes(node: Node, msg: Register, gpus: list[Gpu], *, save: bool) -> None:
    """Keep what the agent said of processes no shard of llmgw runs on each GPU: placement
    gives out no GPU they hold (an orphan of a lost agent state, someone's own job)."""
    said = {g.index: g.unknown_processes for g in msg.gpus}
    for gpu in gpus:
        count = said.get(gpu.index)
        if count == gpu.unknown_processes:
            continue
        if count:
            log.warning(
                "node %s: GPU %d runs %d processes llmgw did not start; nothing is placed on "
                "it until its agent registers without them",
                node.id,
                gpu.index,
                count,
                extra={"node": node.id},
            )
        elif gpu.unknown_processes:
            log.info(
                "node %s: GPU %d no longer runs processes llmgw did not start",
                node.id,
                gpu.index,
                extra={"node": node.id},
            )
        gpu.unknown_processes = count
        if save:
            gpu.save(update_fields=["unknown_processes"])


def _adopt(node: Node, rep, profile, now: datetime) -> None:
    """Take back a running shard of a replica this control plane does not know (judged by
    fleet/domain/adoption.py), so nothing runs twice."""
    replica = Replica.objects.create(
        pk=rep.replica_id,
        model=rep.model,
        profile=rep.profile,
        profile_fp=rep.profile_fp,
        state=rep.state,
        state_since=now,
        created_at=now,
        ready_at=now if rep.state == "ready" else None,
        counts_as_failure=True,
    )
    _, rank = parse_shard_id(rep.shard_id)
    try:
        port = urlparse(rep.endpoint).port or 0
    except ValueError:  # a port out of range: the shard is still taken over, not left running
        port = 0
    Shard.objects.create(
        id=rep.shard_id,
        replica=replica,
        node=node,
        rank=rank,
        gpu_indices=list(rep.gpu_indices),
        memory_gb=profile.min_memory_gb,
        cpu_cores=profile.reserved_cores,
        http_port=port,
        endpoint=rep.endpoint,
        state=rep.state,
        adopted_at=now,
    )
    sentence = (
        f"node {node.id} runs shard {rep.shard_id} of {rep.model} that this control plane "
        "did not know; it was taken back (adopted) as the control plane starts"
    )
    log.info(sentence, extra={"node": node.id, "replica": replica.id})
    event_log.record(
        [Event(sentence, "shard_adopted", model=rep.model, node=node.id, replica=replica.id)],
        now=now,
    )
