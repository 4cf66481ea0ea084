"""Fleet writes: applying a reconciler plan, and what operators and the gateway ask.

What agents report is written by fleet/nodes/ (registration.py, reports.py, heard.py, fabric.py).

Each public service is one transaction; the commands it returns go to agents
only after that transaction has committed.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from catalog.domain import ModelSpec, Profile
from catalog.selectors import adapters_load, catalog_load
from llmgw.core.errors import Invalid, NotFound
from llmgw.core.secrets import engine_key
from mirror.domain.sources import fetched_remotely
from mirror.selectors import FolderRef, WeightsRef, weights_for_source, weights_said
from tenancy.services import audit_record

from .domain.conditions import HELD_KINDS
from .domain.power import (
    DERATING,
    KINDS,
    budget_refusal,
    feed_cap,
    name_refusal,
    phase_name_refusal,
    watts as watts_said,
)
from .domain.reconcile import Plan
from .models import DomainCondition, DomainHold, ModelState, Node, PowerBudget, Replica, Shard
from .nodes.dispatch import Command, stop_command
from .nodes.figures import node_figures_refresh
from .selectors.installs import engine_build
from .selectors.passes import drains_stuck
from .selectors.routing import adapters_held
from .selectors.rows import chunks

log = logging.getLogger("llmgw.fleet")


def start_command(shard: Shard, replica: Replica, spec: ModelSpec | None) -> Command | None:
    """The start_shard message for a shard; None when its model or profile is gone."""
    profile = spec.profile(replica.profile) if spec else None
    if profile is None:
        return None
    return Command(
        shard.node_id,
        {
            "type": "start_shard",
            "shard_id": shard.id,
            "replica_id": replica.id,
            "rank": shard.rank,
            "model": replica.model,
            "profile": profile.to_dict(),
            "profile_fp": replica.profile_fp,
            "source": spec.source,
            "gpu_indices": list(shard.gpu_indices or ()),
            "http_port": shard.http_port,
            "api_key": engine_key(settings.SECRET_KEY, replica.id),
            "threads": shard.cpu_cores or 0,
            "startup_timeout_s": profile.startup_timeout_s,
            # What it reserved on the node, and how far past it its agent lets it go.
            "memory_gb": shard.memory_gb or profile.min_memory_gb or None,
            "memory_watch": {
                "margin": settings.LLMGW.agents.memory_margin,
                "grace_s": settings.LLMGW.agents.memory_grace,
            },
            **_weights(spec.source),
            **engine_build(node_id=shard.node_id, engine=profile.engine),
            # LoRA adapters (docs/adapters.md): loaded when first asked for, except on
            # llama-server, which takes them only at its start.
            "adapter_slots": profile.adapter_slots,
            "adapters": start_adapters(spec.name, profile),
        },
    )


def start_adapters(model: str, profile: Profile) -> list[dict]:
    """The adapters a replica of `model` on `profile` starts holding: none where its engine
    loads them while it runs (vLLM, the sim engine); on llama-server, which cannot, the
    model's LoRA GGUFs by name, as many as its adapter slots (one added later is held from
    the replica's next start: `llmgw ctl restart`)."""
    if profile.engine != "llamacpp" or profile.adapter_slots <= 0:
        return []
    held = sorted(
        (a for a in adapters_load().values() if a.base == model and a.format == "gguf"),
        key=lambda a: a.name,
    )[: profile.adapter_slots]
    return [{"name": a.name, "path": a.source, "format": a.format} for a in held]


# adapter -> [what ("loaded" or "unloaded"), the replica, when (epoch seconds)]: the last load
# or unload the gateway asked of it, kept for the gateway's window, in the cache (Redis where
# there is one), so that however many gateway processes judge its demand, one unloads it at a
# time and none right after a load.
ADAPTER_CHANGED_KEY = "llmgw:adapters:changed:{}"


def adapter_load_commands(
    *,
    replica_id: str,
    name: str,
    source: str,
    format: str,
    unload: str | None = None,
    window_s: float | None = None,
) -> list[Command]:
    """The load_adapter message for a replica's first shard (whose engine serves HTTP), after
    the unload_adapter that makes room when `unload` names one; [] when the replica has no
    shard now. The adapter's `path` is its source; `weights` too when the mirror holds it,
    for the agent to fetch into its cache as it fetches a model's (fleet/agent/
    shard_adapters.py). NotMirrored, and nothing sent, while the mirror does not hold it.
    With `window_s` (the gateway's), no process unloads the adapter for that long after."""
    weights = _adapter_weights(name, source)
    shard = _serving_shard(replica_id)
    if shard is None:
        return []
    commands = [_unload_command(shard, unload)] if unload else []
    ref = {"name": name, "path": source, "format": format}
    commands.append(
        Command(
            shard[1],
            {"type": "load_adapter", "shard_id": shard[0], "adapter": ref, **weights},
        )
    )
    if window_s:
        _changed(name, "loaded", replica_id, window_s)
    return commands


class UnloadRefused(Exception):
    """An unload the gateway's demand rule asked for that would leave the adapter held
    nowhere, or that comes within a window of another load or unload of it; the message
    says which, a sentence."""


def adapter_unload_commands(*, replica_id: str, name: str, window_s: float) -> list[Command]:
    """The unload_adapter message for a replica's first shard (whose engine serves HTTP),
    asked when the adapter's demand fell; [] when the replica has no shard now. Each
    gateway process judges that from its own view, so it is judged here again: the holders
    as the engines last said (UnloadRefused when the replica is the only one, or holds it
    no more), and at most one load or unload of an adapter per `window_s`, whichever
    process asks (UnloadRefused naming the last)."""
    holders = _adapter_holders(name)
    if replica_id not in holders:
        raise UnloadRefused(
            f"Adapter {name} was not unloaded from replica {replica_id}: its engine does not "
            "say it holds it now."
        )
    if len(holders) < 2:
        raise UnloadRefused(
            f"Adapter {name} was not unloaded from replica {replica_id}: it is the only "
            "replica holding it, as the engines last said, and the last holder keeps it."
        )
    shard = _serving_shard(replica_id)
    if shard is None:
        return []
    if not _changed(name, "unloaded", replica_id, window_s, first=True):
        what, other, at = cache.get(ADAPTER_CHANGED_KEY.format(name)) or ("changed", "?", 0)
        raise UnloadRefused(
            f"Adapter {name} was not unloaded from replica {replica_id}: it was {what} "
            f"{'on' if what == 'loaded' else 'from'} replica {other} {time.time() - at:.0f} s "
            f"ago, and one replica changes at a time, at most once in {window_s:g} s."
        )
    return [_unload_command(shard, name)]


def _adapter_holders(name: str) -> set[str]:
    """The ready replicas whose engines last said they hold adapter `name`."""
    spec = adapters_load().get(name)
    held = adapters_held(model=spec.base if spec is not None else None)
    return {replica for replica, names in held.items() if name in names}


def _changed(name: str, what: str, replica_id: str, window_s: float, first: bool = False) -> bool:
    """Mark that `replica_id` `what` adapter `name` now, for `window_s`; with `first`, only
    when no mark stands (atomic where the cache is Redis): whether it was marked."""
    key, mark = ADAPTER_CHANGED_KEY.format(name), [what, replica_id, time.time()]
    if first:
        return cache.add(key, mark, timeout=window_s)
    cache.set(key, mark, timeout=window_s)
    return True


def _unload_command(shard: tuple[str, str], name: str) -> Command:
    shard_id, node_id = shard
    return Command(node_id, {"type": "unload_adapter", "shard_id": shard_id, "name": name})


def _serving_shard(replica_id: str) -> tuple[str, str] | None:
    """A replica's first shard and its node: the one whose engine serves HTTP."""
    return Shard.objects.filter(replica_id=replica_id, rank=0).values_list("id", "node_id").first()


class NotMirrored(Exception):
    """An adapter whose weights the mirror does not hold (yet); the message says how far it
    got, a sentence."""


def _adapter_weights(name: str, source: str) -> dict:
    """``weights`` for an adapter's load: its mirror files, as a model's. A source that is
    not a path on the nodes (``hf://``, ``https://``) is fetched through the mirror only, so
    until the mirror holds it there is nothing to load: NotMirrored saying how far it got."""
    ref = weights_for_source(source)
    if isinstance(ref, WeightsRef | FolderRef):
        return {"weights": ref.message()}
    if ref is None and source.startswith("/"):
        return {}  # a path on the nodes, as given
    if not fetched_remotely(source):  # stored before such sources were refused at add
        raise NotMirrored(
            f"Adapter {name}'s source {source} is neither a path on the nodes nor one the "
            "mirror fetches (hf://ORG/REPO, https://…), so it cannot be loaded: remove the "
            "adapter and add it again from one of those."
        )
    raise NotMirrored(f"Adapter {name}'s weights are not mirrored yet: {weights_said(source)}.")


def _weights(source: str) -> dict:
    """``weights`` when the model's source is mirror weights the agent fetches: one file,
    or every file of a folder (mirror/domain/refs.py)."""
    ref = weights_for_source(source)
    return {"weights": ref.message()} if isinstance(ref, WeightsRef | FolderRef) else {}


def plan_apply(*, plan: Plan, now: datetime, before: dict) -> list[Command]:
    """Write a plan in the caller's transaction; return the commands to send after commit."""
    commands: list[Command] = []
    heard_meanwhile = _node_states_write(plan, now)
    for h in plan.health:
        _health_write(h.replica_id, h.reason, now)
    # What a lost node's replicas are told, and that they are forgotten, stands only if it was lost.
    stops = [s for s in plan.stops if s.lost_node not in heard_meanwhile]
    shards_of = _shards_of([s.replica_id for s in stops])
    forgotten = [f.replica_id for f in plan.forgets if f.lost_node not in heard_meanwhile]
    # The nodes whose GPUs free and replicas change: read before the forgotten go.
    touched = {n for held in _shards_of(forgotten).values() for n, _ in held}
    touched |= {n for held in shards_of.values() for n, _ in held}
    touched |= {sp.node_id for start in plan.starts for _, sp in start.shards}
    Replica.objects.filter(pk__in=forgotten).delete()
    for retire in plan.retires:
        Replica.objects.filter(pk=retire.replica_id).update(
            retiring=True, drain_deadline=retire.deadline, reason=retire.reason[:500]
        )
    for kept in plan.unretires:
        Replica.objects.filter(pk=kept.replica_id, retiring=True).update(
            retiring=False, drain_deadline=None, reason=""
        )
    for drain in plan.drains:
        Replica.objects.filter(pk=drain.replica_id, state="ready").update(
            state="draining",
            state_since=now,
            drain_deadline=drain.deadline,
            preempted_for=drain.preempted_for,
            reason=drain.reason[:500],
        )
    for stop in stops:
        # A failed replica may still have shards running elsewhere: it stops like any other.
        Replica.objects.filter(pk=stop.replica_id).exclude(state="stopped").update(
            state="stopping", state_since=now, stop_grace_s=stop.grace_s, reason=stop.reason[:500]
        )
        for node_id, shard_id in shards_of.get(stop.replica_id, ()):
            commands.append(stop_command(node_id, shard_id, stop.grace_s))
    commands.extend(_record_starts(plan.starts, before["catalog"], now))
    node_figures_refresh(nodes=touched)
    _write_states(plan, before["states"])
    return commands


def _node_states_write(plan: Plan, now: datetime) -> set[str]:
    """Write the nodes' new states; return the nodes found lost that were heard from since
    the snapshot. A heartbeat written since means a node is not silent after all; at the
    threshold, as the rules count it: silent for that many seconds or more.

    One UPDATE per state and CHUNK of nodes, not one per node: the pass after a restart
    marks thousands at once, and on SQLite every statement of it held the database's one
    write lock while it waited its turn for the interpreter, the fleet's registrations
    queued behind it."""
    t = settings.LLMGW.timings
    by_state: dict[str, list[str]] = {}
    for change in plan.node_changes:
        by_state.setdefault(change.state, []).append(change.node_id)
    heard_meanwhile: set[str] = set()
    for state, node_ids in by_state.items():
        silent = t.lost if state == Node.LOST else t.unreachable
        for part in chunks(node_ids):
            Node.objects.filter(
                pk__in=part, last_seen__lte=now - timedelta(seconds=silent)
            ).exclude(state=state).update(state=state, state_since=now)
            if state == Node.LOST:
                written = Node.objects.filter(pk__in=part, state=state, state_since=now)
                heard_meanwhile |= set(part) - set(written.values_list("pk", flat=True))
    return heard_meanwhile


def _record_starts(starts, catalog: dict[str, ModelSpec], now: datetime) -> list[Command]:
    """Insert the new replicas and shards in bulk (a pass from empty places thousands);
    return their start commands."""
    replicas, shards, commands = [], [], []
    fingerprints: dict[tuple[str, str], str] = {}
    for start in starts:
        fp = fingerprints.get((start.model, start.profile.name))
        if fp is None:
            fp = fingerprints[(start.model, start.profile.name)] = start.profile.fingerprint()
        replica = Replica(
            id=start.replica_id,
            model=start.model,
            profile=start.profile.name,
            profile_fp=fp,
            state="pending",
            state_since=now,
            created_at=now,
            reason=start.reason[:500],
        )
        replicas.append(replica)
        for shard_id, sp in start.shards:
            shard = Shard(
                id=shard_id,
                replica=replica,
                node_id=sp.node_id,
                rank=sp.rank,
                gpu_indices=list(sp.gpu_indices),
                memory_gb=sp.memory_gb,
                cpu_cores=sp.cpu_cores,
                http_port=sp.http_port,
            )
            shards.append(shard)
            cmd = start_command(shard, replica, catalog.get(start.model))
            if cmd:
                commands.append(cmd)
    Replica.objects.bulk_create(replicas, batch_size=500)
    Shard.objects.bulk_create(shards, batch_size=500)
    return commands


def _shards_of(replica_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for replica_id, node_id, shard_id in Shard.objects.filter(
        replica_id__in=replica_ids
    ).values_list("replica_id", "node_id", "id"):
        out.setdefault(replica_id, []).append((node_id, shard_id))
    return out


# The fields a pass decides that the API also writes (retry, restart): written only if the
# API did not change them since the snapshot.
_SHARED_FIELDS = (
    "desired", "failures", "last_failure_at", "backoff_until", "parked_since",
    "parked_reason", "unplaceable", "explanation", "restart_requested_at", "last_failure",
)  # fmt: skip
# The fields only a pass writes: preemption's holds and kept room, the autoscaler's clocks.
# Always written, so a retry asked meanwhile cannot drop half of a preemption.
_PASS_FIELDS = (
    "extra", "held_until", "held_for", "preempted", "busy_since", "quiet_since",
    "reserved", "reserved_until",
)  # fmt: skip


def _state_values(s, fields: tuple[str, ...]) -> dict:
    values = {f: getattr(s, f) for f in fields}
    if "explanation" in values:
        values["explanation"] = list(values["explanation"])
    if "reserved" in values:
        values["reserved"] = [r.as_dict() for r in values["reserved"]]
    if "last_failure" in values:
        failure = values["last_failure"]
        values["last_failure"] = failure.as_dict() if failure is not None else None
    return values


def _write_states(plan: Plan, before: dict) -> None:
    """Write the model states that changed. The fields the API also writes go by
    compare-and-set: a retry or restart asked meanwhile wins, and the next pass decides
    again from it. A pass with nothing to do writes nothing."""
    created = []
    for name, s in plan.states.items():
        was = before.get(name)
        if was == s:
            continue
        if was is None:
            created.append(
                ModelState(model=name, **_state_values(s, _SHARED_FIELDS + _PASS_FIELDS))
            )
            continue
        changed = tuple(f for f in _SHARED_FIELDS if getattr(s, f) != getattr(was, f))
        if changed:
            # Only what changed: the engine's log a stop brought since the snapshot
            # (failure_log_attach) stays unless this pass counted a failure of its own.
            ModelState.objects.filter(
                pk=name,
                restart_requested_at=was.restart_requested_at,
                parked_since=was.parked_since,
                failures=was.failures,
            ).update(**_state_values(s, changed))
        if any(getattr(s, f) != getattr(was, f) for f in _PASS_FIELDS):
            ModelState.objects.filter(pk=name).update(**_state_values(s, _PASS_FIELDS))
    # A row the API created meanwhile (retry, restart, a request) is its to keep.
    ModelState.objects.bulk_create(created, ignore_conflicts=True)


def _node(node_id: str) -> Node:
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        raise NotFound(f"There is no node {node_id!r}.")
    return node


def node_set_schedule(*, node_id: str, action: str, actor: str) -> str:
    """Cordon (no new placements), uncordon, or drain (cordon, and move its replicas away)."""
    with transaction.atomic():
        node = _node(node_id)
        fields = {
            "cordon": {"cordoned": True},
            "uncordon": {"cordoned": False, "draining": False},
            "drain": {"cordoned": True, "draining": True},
        }[action]
        Node.objects.filter(pk=node.pk).update(**fields)
        audit_record(actor=actor, action=f"node.{action}", target=node_id)
    log.info(
        "node %s %s by %s",
        node_id,
        {"drain": "draining"}.get(action, action + "ed"),
        actor,
        extra={"node": node_id},
    )
    ended = " and its drain ended: what it was moving stays" if node.draining else ""
    return {
        "cordon": f"node {node_id} cordoned: nothing new is placed on it",
        "uncordon": f"node {node_id} uncordoned{ended}",
        "drain": f"node {node_id} draining: its replicas move elsewhere, a replacement first",
    }[action]


def gpu_set_cordon(*, node_id: str, index: int, cordoned: bool, actor: str, now: datetime) -> str:
    """Cordon one GPU (it takes no new replica; the one it runs stays) or uncordon it.
    The node's spec_at moves with it: placement's and /metrics' views of a node's GPUs
    are read again only when it does."""
    action = "cordon" if cordoned else "uncordon"
    with transaction.atomic():
        node = _node(node_id)
        if not node.gpus.filter(index=index).exists():
            raise NotFound(f"Node {node_id} has no GPU {index}.")
        node.gpus.filter(index=index).update(cordoned=cordoned)
        Node.objects.filter(pk=node.pk).update(spec_at=now)
        # The cluster page's free GPUs count no cordoned one, as placement does.
        node_figures_refresh(nodes=[node_id])
        # A node's write, so the node's events list it (fleet/selectors/events.py).
        audit_record(
            actor=actor, action=f"node.gpu_{action}", target=node_id, detail={"gpu": index}
        )
    log.info("GPU %s of node %s %sed by %s", index, node_id, action, actor, extra={"node": node_id})
    if cordoned:
        return f"GPU {index} of node {node_id} cordoned: no new replica is placed on it"
    return f"GPU {index} of node {node_id} uncordoned"


def _state_for(name: str) -> ModelState:
    if name not in catalog_load():
        raise NotFound(f"There is no model {name!r}.")
    state, _ = ModelState.objects.get_or_create(pk=name)
    return state


def model_restart(*, name: str, actor: str, now: datetime) -> str:
    """Retire every replica in turn: a replacement beside each, the old one drained once it
    is ready. Returns the sentence, which says what the restart waits for first: a node's
    drain of this model's replicas that is stuck for lack of room."""
    with transaction.atomic():
        _state_for(name)
        ModelState.objects.filter(pk=name).update(restart_requested_at=now)
        audit_record(actor=actor, action="model.restart", target=name)
    stuck = drains_stuck(model=name)
    if not stuck:
        return f"model {name} restarting: each replica is replaced, one at a time"
    waits = "; and ".join(f"the drain of {node}, {said}" for node, said in stuck.items())
    return (
        f"model {name} restarts once its replicas retiring off a draining node are done; "
        f"it waits for {waits}. Then each replica is replaced, one at a time"
    )


def model_retry(*, name: str, actor: str) -> str:
    """Unpark a model and forget its failures, so the next pass tries it again."""
    with transaction.atomic():
        state = _state_for(name)
        was = state.parked_since is not None
        ModelState.objects.filter(pk=name).update(
            parked_since=None, parked_reason="", failures=0, backoff_until=None, last_failure=None
        )
        audit_record(actor=actor, action="model.retry", target=name)
    return (
        f"model {name} unparked: trying again"
        if was
        else f"model {name} was not parked; its failures are cleared"
    )


def model_forget(*, name: str) -> None:
    """Forget the controller's memory of a model (its failures, parking, restart), so one
    added again starts afresh: the catalog asks it as it removes the model, in its
    transaction."""
    ModelState.objects.filter(pk=name).delete()


def model_requested(*, name: str, now: datetime) -> None:
    """An on-demand model was asked for: it wants a replica until its idle timeout passes."""
    ModelState.objects.update_or_create(pk=name, defaults={"last_requested_at": now})


def _health_write(replica_id: str, reason: str | None, now: datetime) -> bool:
    """Mark a ready replica unhealthy (reason) or clear its mark (None); True when it changed.
    state_since moves too: it is what every gateway's tables notice a replica change by."""
    if reason is None:
        return bool(
            Replica.objects.filter(pk=replica_id, unhealthy_since__isnull=False).update(
                unhealthy_since=None, unhealthy_reason="", state_since=now
            )
        )
    return bool(
        Replica.objects.filter(pk=replica_id, state="ready", unhealthy_since=None).update(
            unhealthy_since=now, unhealthy_reason=reason[:300], state_since=now
        )
    )


def replica_unhealthy_mark(*, replica_id: str, reason: str, now: datetime) -> bool:
    """A gateway could not reach a ready replica's engine: no gateway routes to it until its
    agents are heard from again (fleet/domain/health.py); True when this marked it. The
    caller wakes the reconciler."""
    marked = _health_write(replica_id, reason, now)
    if marked:
        log.warning(
            "replica %s is not routed to: %s", replica_id, reason, extra={"replica": replica_id}
        )
    return marked


def replicas_used_mark(*, replica_ids: set[str], now: datetime) -> None:
    """The gateway served these replicas since its last write: an on-demand model's idle
    clock starts again from `now`."""
    Replica.objects.filter(pk__in=replica_ids).update(last_used_at=now)


def _budget_key(kind: object, name: object) -> tuple[str, str]:
    """The (kind, name) of a budget, checked; Invalid with the sentence when it is not one."""
    if kind not in KINDS:
        raise Invalid(
            "a power budget is for a rack, a pdu, a phase of a pdu, a row, a room or a site, "
            f"not {kind!r}."
        )
    why = phase_name_refusal(name) if kind == "phase" else name_refusal(str(kind), name)
    if why:
        raise Invalid(why)
    return str(kind), str(name)


def power_budget_set(
    *,
    kind: str,
    name: str,
    watts: float | None = None,
    actor: str,
    margin: float = 0.0,
    feeds: list[float] | None = None,
    derating: float = DERATING,
    other_watts: float = 0.0,
) -> dict:
    """Set the most a rack or PDU may draw, replacing what it had: `watts`, or for a
    dual-fed domain its `feeds`' ratings (the cap is then the smaller's at `derating`),
    loaded to the cap less `margin`, with `other_watts` of equipment that reports nothing
    held from the start. Returns the budget as `power_budget_view` gives it. Raises
    Invalid for an unknown kind, a name that no node label could carry, or figures that
    make no budget (power.budget_refusal). The next reconciler pass places against it."""
    kind, name = _budget_key(kind, name)
    if why := budget_refusal(watts, margin, feeds, derating, other_watts):
        raise Invalid(why)
    ratings = [float(f) for f in feeds or ()]
    cap = feed_cap(ratings, derating) if ratings else float(watts or 0)
    figures = {
        "watts": cap,
        "margin": float(margin),
        "feeds": ratings,
        "derating": float(derating),
        "other_watts": float(other_watts),
    }
    with transaction.atomic():
        old = PowerBudget.objects.filter(kind=kind, name=name).values_list("watts", flat=True)
        before = old.first()
        PowerBudget.objects.update_or_create(
            kind=kind, name=name, defaults={**figures, "updated_by": actor[:150]}
        )
        audit_record(
            actor=actor, action="power_budget.set", target=f"{kind}:{name}", detail=figures
        )
    log.info(
        "power budget of %s %s set by %s: %s W (was %s)",
        kind,
        name,
        actor,
        watts_said(cap),
        f"{watts_said(before)} W" if before is not None else "none",
        extra={"event": "power_budget", "kind": kind, "domain": name, "watts": cap},
    )
    return {"kind": kind, "name": name, **figures}


def _domain_row_removed(model, kind: str, name: str, actor: str, action: str, missing: str):
    """Delete a facility domain's row of `model` (its budget, its hold), audited as
    `action`; return what it was. NotFound saying `missing` when it has none."""
    with transaction.atomic():
        row = model.objects.filter(kind=kind, name=name).first()
        if row is None:
            raise NotFound(missing)
        row.delete()
        audit_record(actor=actor, action=action, target=f"{kind}:{name}")
    return row


def power_budget_clear(*, kind: str, name: str, actor: str) -> dict:
    """Remove a rack's or PDU's budget; return what it was ({kind, name, watts}). NotFound
    when it has none; Invalid when kind or name could not be one."""
    kind, name = _budget_key(kind, name)
    row = _domain_row_removed(
        PowerBudget, kind, name, actor, "power_budget.clear", f"{kind} {name} has no power budget."
    )
    log.info(
        "power budget of %s %s (%s W) removed by %s",
        kind,
        name,
        watts_said(row.watts),
        actor,
        extra={"event": "power_budget", "kind": kind, "domain": name, "watts": None},
    )
    return {
        "kind": kind,
        "name": name,
        "watts": row.watts,
        "margin": row.margin,
        "feeds": row.feeds or [],
        "derating": row.derating,
        "other_watts": row.other_watts,
    }


def _domain_key(kind: object, name: object) -> tuple[str, str]:
    """The (kind, name) of a facility domain, checked; Invalid with the sentence if not one."""
    if kind not in HELD_KINDS:
        kinds = f"{', '.join(HELD_KINDS[:-1])} or {HELD_KINDS[-1]}"
        raise Invalid(f"a domain is a {kinds}, not {kind!r}.")
    why = phase_name_refusal(name) if kind == "phase" else name_refusal(str(kind), name)
    if why:
        raise Invalid(why)
    return str(kind), str(name)


def domain_hold(*, kind: str, name: str, reason: str, actor: str, now: datetime) -> dict:
    """Hold a rack, PDU, PDU phase (named r12-a/L2), row, room or zone: no new placements in
    it, whatever its condition, from the next reconciler pass until released; nothing running
    there is stopped. Return
    the hold ({kind, name, reason, held_by, held_at}). Holding again replaces the reason.
    Invalid for another kind, a name no label could carry, or a reason over 300 characters."""
    kind, name = _domain_key(kind, name)
    if not isinstance(reason, str) or len(reason) > 300:
        raise Invalid("a hold's reason is text of at most 300 characters.")
    with transaction.atomic():
        DomainHold.objects.update_or_create(
            kind=kind,
            name=name,
            defaults={"reason": reason, "held_by": actor[:150], "held_at": now},
        )
        # A held domain has a condition row (unknown until read): the Racks table reads both
        # in one query (selectors/conditions.rack_conditions).
        DomainCondition.objects.get_or_create(kind=kind, name=name)
        audit_record(
            actor=actor,
            action="facility_hold.set",
            target=f"{kind}:{name}",
            detail={"reason": reason},
        )
    log.warning(
        "%s %s held by %s%s: no new placements there",
        kind,
        name,
        actor,
        f" ({reason})" if reason else "",
        extra={"event": "facility_hold", "kind": kind, "domain": name, "held": True},
    )
    return {"kind": kind, "name": name, "reason": reason, "held_by": actor, "held_at": now}


def domain_release(*, kind: str, name: str, actor: str) -> dict:
    """Release a domain's hold: it takes new placements again from the next pass (as its
    condition allows). Return what the hold was; NotFound when it has none."""
    kind, name = _domain_key(kind, name)
    row = _domain_row_removed(
        DomainHold, kind, name, actor, "facility_hold.release", f"{kind} {name} is not held."
    )
    log.info(
        "%s %s released by %s (held by %s)",
        kind,
        name,
        actor,
        row.held_by,
        extra={"event": "facility_hold", "kind": kind, "domain": name, "held": False},
    )
    return {
        "kind": kind,
        "name": name,
        "reason": row.reason,
        "held_by": row.held_by,
        "held_at": row.held_at,
    }
