"""Small builders for the pure rules: nodes, models, replicas and snapshots, on a fixed clock.

Every figure a test does not name has a dull default, so a test says only what
it is about. `run` is one reconciler pass with predictable replica ids, and
`apply` plays the shell: it feeds a plan back into the next snapshot the way
the database and the agents would, so several passes can be driven in a row.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from catalog.domain import ModelSpec, Profile
from fleet.domain.placement import Inventory, NodeRoom, Placement, Refusal
from fleet.domain.reconcile import Plan, decide
from fleet.domain.types import (
    FABRIC_LABEL,
    GpuView,
    ModelState,
    NodeView,
    ReplicaView,
    ShardView,
    Snapshot,
)
from llmgw.core.config import Timings

NOW = datetime(2026, 3, 2, 12, 0, 0, tzinfo=UTC)
TIMINGS = Timings()
H100 = "h100-80g"


def at(seconds: float) -> datetime:
    """A moment `seconds` after NOW (before it when negative)."""
    return NOW + timedelta(seconds=seconds)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def gpu_node(
    node_id: str,
    *,
    gpus: int = 8,
    gpu_class: str = H100,
    unhealthy: Iterable[int] = (),
    held: Iterable[int] = (),
    memory_gb: float | None = None,
    cpus: int | None = None,
    labels: Mapping[str, str] | None = None,
    fabric: str | None = None,
    engines: Iterable[str] | None = None,
    disk_free_gb: float | None = None,
    weights: Iterable[str] = (),
    state: str = "ready",
    cordoned: bool = False,
    draining: bool = False,
) -> NodeView:
    """A GPU machine; memory and CPUs unknown unless given (unknown constrains nothing).
    `held`: GPUs its agent found processes on that no shard of llmgw runs."""
    bad, others = set(unhealthy), set(held)
    labels = dict(labels or {})
    if fabric is not None:
        labels[FABRIC_LABEL] = fabric
    return NodeView(
        id=node_id,
        state=state,
        cordoned=cordoned,
        draining=draining,
        labels=labels,
        memory_gb=memory_gb,
        cpu_count=cpus,
        gpus=tuple(
            GpuView(i, gpu_class, healthy=i not in bad, held=i in others) for i in range(gpus)
        ),
        engines=frozenset(engines) if engines is not None else None,
        disk_free_gb=disk_free_gb,
        weights=frozenset(weights),
    )


def cpu_node(
    node_id: str,
    *,
    cpus: int | None = 8,
    memory_gb: float | None = 64,
    **kw,
) -> NodeView:
    """A machine without GPUs, reporting 8 CPUs and 64 GB unless told otherwise."""
    return gpu_node(node_id, gpus=0, cpus=cpus, memory_gb=memory_gb, **kw)


def gpu_profile(name: str = "gpu", *, gpu_class: str = H100, tp: int = 1, **kw) -> Profile:
    return Profile(name=name, engine=kw.pop("engine", "vllm"), gpu_class=gpu_class, tp=tp, **kw)


def cpu_profile(
    name: str = "cpu", *, memory_gb: float | None = 4, cores: int | None = None, **kw
) -> Profile:
    return Profile(
        name=name,
        engine=kw.pop("engine", "llamacpp"),
        min_memory_gb=memory_gb,
        cpu_cores=cores,
        **kw,
    )


def model(
    name: str,
    *profiles: Profile,
    min: int = 1,
    max: int | None = None,
    capacity_class: str = "",
    source: str = "",
    idle_timeout_s: int = 600,
    owner: str = "",
) -> ModelSpec:
    """A model with one GPU profile unless profiles are given; max follows min when left out."""
    return ModelSpec(
        name=name,
        profiles=profiles or (gpu_profile(),),
        min_replicas=min,
        max_replicas=min if max is None else max,
        idle_timeout_s=idle_timeout_s,
        capacity_class=capacity_class,
        source=source,
        owner=owner,
    )


def shard(
    node_id: str,
    *,
    gpus: Iterable[int] = (),
    memory_gb: float | None = None,
    cores: int | None = None,
    rank: int = 0,
    port: int = 20000,
    shard_id: str = "",
) -> ShardView:
    return ShardView(
        id=shard_id or f"s-{node_id}-{rank}",
        node_id=node_id,
        rank=rank,
        gpu_indices=tuple(gpus),
        memory_gb=memory_gb,
        cpu_cores=cores,
        http_port=port,
        state="ready",
    )


def replica(
    replica_id: str,
    model_name: str,
    *,
    on: str | Iterable[str] = "n1",
    gpus: Iterable[int] = (0,),
    memory_gb: float | None = None,
    cores: int | None = None,
    profile: str = "gpu",
    state: str = "ready",
    created: datetime | None = None,
    ready_at: datetime | None = None,
    **kw,
) -> ReplicaView:
    """A replica of `model_name` with one shard on `on` (several nodes: one shard each)."""
    nodes = [on] if isinstance(on, str) else list(on)
    created = created or ago(3600)
    shards = tuple(
        shard(n, gpus=gpus, memory_gb=memory_gb, cores=cores, rank=i, shard_id=f"{replica_id}-{i}")
        for i, n in enumerate(nodes)
    )
    if ready_at is None and state == "ready":
        ready_at = created + timedelta(seconds=60)
    return ReplicaView(
        id=replica_id,
        model=model_name,
        profile=profile,
        profile_fp="",
        state=state,
        created_at=created,
        state_since=kw.pop("state_since", created),
        shards=shards,
        ready_at=ready_at,
        **kw,
    )


def snapshot(
    nodes: Iterable[NodeView] = (),
    models: Iterable[ModelSpec] = (),
    replicas: Iterable[ReplicaView] = (),
    states: Iterable[ModelState] = (),
    *,
    settling: bool = False,
    silence_floor: datetime | None = None,
    heard: Mapping[str, datetime] | None = None,
) -> Snapshot:
    """`heard`: when nodes were last heard from; every node not in it, at NOW."""
    nodes = {n.id: n for n in nodes}
    return Snapshot(
        nodes=nodes,
        heard={n: NOW for n in nodes} | dict(heard or {}),
        models={m.name: m for m in models},
        replicas=tuple(replicas),
        states={s.model: s for s in states},
        settling=settling,
        silence_floor=silence_floor,
    )


def counter_ids() -> Callable[[str], str]:
    """Replica ids `model-1`, `model-2`, ... in the order they are asked for."""
    n = itertools.count(1)
    return lambda model_name: f"{model_name}-{next(n)}"


def run(
    snap: Snapshot,
    now: datetime = NOW,
    timings: Timings = TIMINGS,
    new_id: Callable[[str], str] | None = None,
) -> Plan:
    """One reconciler pass with predictable replica ids."""
    return decide(snap, now, timings, new_id or counter_ids())


def started_as_replicas(plan: Plan, now: datetime, state: str = "pending") -> list[ReplicaView]:
    """The plan's starts as the replicas the shell would record."""
    return [
        ReplicaView(
            id=s.replica_id,
            model=s.model,
            profile=s.profile.name,
            profile_fp=s.profile.fingerprint(),
            state=state,
            created_at=now,
            state_since=now,
            shards=tuple(
                ShardView(
                    id=shard_id,
                    node_id=p.node_id,
                    rank=p.rank,
                    gpu_indices=p.gpu_indices,
                    memory_gb=p.memory_gb,
                    cpu_cores=p.cpu_cores,
                    http_port=p.http_port,
                )
                for shard_id, p in s.shards
            ),
            ready_at=now if state == "ready" else None,
        )
        for s in plan.starts
    ]


def apply(snap: Snapshot, plan: Plan, now: datetime) -> Snapshot:
    """Feed a plan back as the shell would: forgets removed, stops stopping, drains draining,
    retires marked (with their deadline and reason) and unmarked, starts recorded as pending, node states and model states kept."""
    forgotten = {f.replica_id for f in plan.forgets}
    stopping = {s.replica_id for s in plan.stops}
    draining = {}
    for d in plan.drains:
        # The shell drains a ready replica once: a second drain of it finds it draining.
        draining.setdefault(d.replica_id, d)
    retiring = {r.replica_id: r for r in plan.retires}
    kept = {u.replica_id for u in plan.unretires}
    replicas = []
    for r in snap.replicas:
        if r.id in forgotten:
            continue
        if r.id in stopping:
            r = replace(r, state="stopping", state_since=now)
        elif r.id in draining:
            drain = draining[r.id]
            r = replace(
                r,
                state="draining",
                state_since=now,
                drain_deadline=drain.deadline,
                preempted_for=drain.preempted_for,
            )
        if r.id in retiring:
            retire = retiring[r.id]
            r = replace(r, retiring=True, drain_deadline=retire.deadline, reason=retire.reason)
        elif r.id in kept:
            r = replace(r, retiring=False, drain_deadline=None, reason="")
        replicas.append(r)
    replicas.extend(started_as_replicas(plan, now))
    nodes = dict(snap.nodes)
    for change in plan.node_changes:
        nodes[change.node_id] = replace(nodes[change.node_id], state=change.state)
    return replace(snap, nodes=nodes, replicas=tuple(replicas), states=dict(plan.states))


def with_states(
    snap: Snapshot, ids_to_state: Mapping[str, str], now: datetime, reason: str = ""
) -> Snapshot:
    """What the agents reported since: replicas moved to the states given."""
    replicas = []
    for r in snap.replicas:
        if r.id in ids_to_state:
            new = ids_to_state[r.id]
            r = replace(
                r,
                state=new,
                state_since=now,
                ready_at=now if new == "ready" else r.ready_at,
                reason=reason or r.reason,
            )
        replicas.append(r)
    return replace(snap, replicas=tuple(replicas))


class Cluster:
    """A reconciler and a fake shell driven pass by pass on a fake clock.

    Nodes keep sending heartbeats as the clock moves unless they are silenced;
    agents report only what a test tells them to.
    """

    def __init__(self, snap: Snapshot, now: datetime = NOW, timings: Timings = TIMINGS):
        self.snap = snap
        self.now = now
        self.timings = timings
        self.new_id = counter_ids()
        self.silent: set[str] = set()

    def step(self) -> Plan:
        """One pass, its plan applied."""
        plan = decide(self.snap, self.now, self.timings, self.new_id)
        self.snap = apply(self.snap, plan, self.now)
        return plan

    def wait(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        heard = dict(self.snap.heard)
        heard.update(
            (node_id, self.now) for node_id in self.snap.nodes if node_id not in self.silent
        )
        self.snap = replace(self.snap, heard=heard)

    def report(self, replica_id: str, state: str, reason: str = "") -> None:
        """An agent says a replica reached `state`."""
        assert replica_id in self.ids(), f"no replica {replica_id} in {self.ids()}"
        self.snap = with_states(self.snap, {replica_id: state}, self.now, reason)

    def all_stopped(self) -> None:
        """Every replica asked to stop has stopped."""
        stopping = {r.id: "stopped" for r in self.snap.replicas if r.state == "stopping"}
        self.snap = with_states(self.snap, stopping, self.now)

    def ids(self, state: str | None = None) -> list[str]:
        return [r.id for r in self.snap.replicas if state in (None, r.state)]

    def replica(self, replica_id: str) -> ReplicaView:
        return next(r for r in self.snap.replicas if r.id == replica_id)

    def state(self, model_name: str) -> ModelState:
        return self.snap.states[model_name]

    def change(self, **kw) -> None:
        """Change the snapshot's own fields (models, settling, ...)."""
        self.snap = replace(self.snap, **kw)

    def set_state(self, model_name: str, **kw) -> None:
        """What the API records between passes: a restart asked for, a request seen, ..."""
        states = dict(self.snap.states)
        states[model_name] = replace(states.get(model_name) or ModelState(model=model_name), **kw)
        self.snap = replace(self.snap, states=states)


def inventory(nodes: Iterable[NodeView], replicas: Iterable[ReplicaView] = ()) -> Inventory:
    """These nodes, by id, with these replicas already holding their share of them."""
    return Inventory({n.id: n for n in nodes}, list(replicas))


def rooms(*nodes: NodeView, replicas: Iterable[ReplicaView] = ()) -> list[NodeRoom]:
    """Each node's free room once `replicas` are on it: what the mirror's sizing reads."""
    return list(inventory(nodes, replicas).rooms.values())


def place(
    nodes: Iterable[NodeView],
    *profiles: Profile,
    replicas: Iterable[ReplicaView] = (),
    avoid: Iterable[str] = (),
    source: str = "",
) -> Placement | Refusal:
    """Place one replica of `profiles` on these nodes, with these replicas already there."""
    return inventory(nodes, replicas).place(profiles, avoid=frozenset(avoid), weights_source=source)


def nodes_of(result: Placement | Refusal) -> list[str]:
    assert isinstance(result, Placement), f"expected a placement, got {result}"
    return [s.node_id for s in result.shards]


def reasons_of(result: Placement | Refusal, profile: str | None = None) -> list[str]:
    assert isinstance(result, Refusal), f"expected a refusal, got {result}"
    return [r for name, reasons in result.reasons if profile in (None, name) for r in reasons]
