"""What the reconciler sees of the fleet in one pass, as frozen snapshots."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from catalog.domain import ModelSpec
from tenancy.quota import Amount, Policy

from .capped import Caps
from .causes import exit_said, summary
from .conditions import Facility
from .power import Power

FABRIC_LABEL = "llmgw.io/fabric"

# Replica states that hold capacity on their nodes until the engine is confirmed gone.
HOLDING = frozenset({"pending", "starting", "ready", "draining", "stopping"})
# Replica states that count toward a model's desired replicas (unless retiring).
ACTIVE = frozenset({"pending", "starting", "ready"})


def shard_id(replica_id: str, rank: int) -> str:
    """A shard's id: its replica's and its rank, so agents and logs show what it belongs to."""
    return f"{replica_id}-{rank}"


def parse_shard_id(value: str) -> tuple[str, int]:
    """The replica id and rank in a shard id made by `shard_id`; (the id, 0) for any other."""
    head, _, tail = value.rpartition("-")
    if head and tail.isdigit() and len(tail) <= 3:
        return head, int(tail)
    return value, 0


@dataclass(frozen=True)
class GpuView:
    index: int
    gpu_class: str
    healthy: bool = True
    # Its agent found compute processes on it that no shard of llmgw runs (an engine of an
    # agent whose state was lost, someone's own job): placement leaves it alone. False where
    # the agent could not tell (no NVML, simulated GPUs): unknown, as for any figure.
    held: bool = False
    # Its memory as registered (placement does not read it; the console's charts take its
    # memory use as a share of it); None where the agent did not say.
    memory_mb: int | None = None
    # Why it takes no new replicas, in a sentence (fabric.gpu_problem: an Xid that needs a
    # reset, uncorrected ECC errors, a fabric registration not completed); None: none known.
    problem: str | None = None
    # Its NVLink domain, (cluster UUID, clique id), once its fabric registration completed
    # (fabric.gpu_domain); None: no fabric, or not known.
    domain: tuple[str, int] | None = None
    # The GPUs of the same node it reaches by an NVLink that is up (fabric.nvlink_peers);
    # empty where the node says nothing of its links.
    nvlink_peers: frozenset[int] = frozenset()
    # An operator's `ctl gpu cordon NODE:INDEX`: no new replicas, the running one stays.
    cordoned: bool = False

    @property
    def free_to_place(self) -> bool:
        """Whether placement may give it out once no replica holds it. A GPU with a problem
        or cordoned keeps the replica it runs: only new ones are kept off it."""
        return self.healthy and not self.held and self.problem is None and not self.cordoned

    @property
    def out_of_service(self) -> bool:
        """Healthy and not held, yet taking no new replicas: a problem, or cordoned."""
        return self.healthy and not self.held and not self.free_to_place


@dataclass(frozen=True)
class EngineInstall:
    """Where installing an engine from the mirror stands on a node, as its agent last said:
    ``installing``, ``installed`` or ``failed`` with its sentence."""

    engine: str
    version: str
    state: str
    detail: str = ""


@dataclass(frozen=True)
class NodeView:
    """A node as placement sees it. None for a figure means the node did not report it."""

    id: str
    state: str = "ready"
    cordoned: bool = False
    draining: bool = False
    # False while LLMGW_NODE_APPROVAL=manual holds a new node for an operator to let in.
    approved: bool = True
    # Why the address it declares is not believed (fleet/domain/endpoints.py), while it is
    # not: nothing is placed on it until an operator approves that address.
    address_refusal: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    memory_gb: float | None = None
    cpu_count: int | None = None
    gpus: tuple[GpuView, ...] = ()
    # None: the agent never probed for engines, so engines constrain nothing.
    engines: frozenset[str] | None = None
    disk_free_gb: float | None = None
    weights: frozenset[str] = frozenset()
    # `<os>-<machine>` as the agent said; empty from an agent that cannot install engines.
    platform: str = ""
    installs: tuple[EngineInstall, ...] = ()
    # Engine -> the version of the build the mirror holds for this node's platform: an
    # engine it lacks but would install when a shard of it is placed here.
    installable: Mapping[str, str] = field(default_factory=dict)
    # IMEX (memory shared over a multi-node NVLink domain) up on the node; False: down;
    # None: not installed, or not known.
    imex: bool | None = None

    def install_of(self, engine: str) -> EngineInstall | None:
        """What the node said of installing ``engine``, if anything."""
        return next((i for i in self.installs if i.engine == engine), None)

    @cached_property
    def gpu_totals(self) -> dict[str, int]:
        """GPUs per class, healthy or not: what a profile's class could ever have here."""
        out: dict[str, int] = {}
        for g in self.gpus:
            out[g.gpu_class] = out.get(g.gpu_class, 0) + 1
        return out

    @cached_property
    def links(self) -> Mapping[int, frozenset[int]]:
        """Per GPU that has some, the GPUs it is joined to by NVLink; empty where the node
        says nothing of its links (or has none)."""
        return {g.index: g.nvlink_peers for g in self.gpus if g.nvlink_peers}

    @property
    def shown_state(self) -> str:
        """What an operator sees: lost and unreachable win, then awaiting approval, then
        draining, then cordoned."""
        if self.state != "ready":
            return self.state
        if not self.approved or self.address_refusal:
            return "unapproved"
        if self.draining:
            return "draining"
        if self.cordoned:
            return "cordoned"
        return "ready"


@dataclass(frozen=True)
class ShardView:
    id: str
    node_id: str
    rank: int = 0
    gpu_indices: tuple[int, ...] = ()
    memory_gb: float | None = None
    cpu_cores: int | None = None
    http_port: int = 0
    state: str = "pending"


@dataclass(frozen=True)
class ReplicaView:
    id: str
    model: str
    profile: str
    profile_fp: str
    state: str
    created_at: datetime
    state_since: datetime
    shards: tuple[ShardView, ...] = ()
    ready_at: datetime | None = None
    last_used_at: datetime | None = None
    retiring: bool = False
    drain_deadline: datetime | None = None
    stop_grace_s: int = 30
    preempted_for: str = ""
    reason: str = ""
    counts_as_failure: bool = True
    # Not routed to since then: a gateway could not reach it, or its node went unheard.
    unhealthy_since: datetime | None = None

    @cached_property
    def nodes(self) -> frozenset[str]:
        return frozenset(s.node_id for s in self.shards)

    @cached_property
    def amount(self) -> Amount:
        """What it holds: per shard its GPUs, its reserved cores and its memory."""
        gpus = cores = 0
        memory = 0.0
        for s in self.shards:
            gpus += len(s.gpu_indices)
            cores += s.cpu_cores or 0
            memory += s.memory_gb or 0.0
        return Amount(gpus, cores, memory)


@dataclass(frozen=True)
class Reservation:
    """Room kept for a model that preempted for it: one shard of the placement it counted
    on, and the victims whose stopping frees part of it (they hold that part until gone)."""

    node_id: str
    gpu_indices: tuple[int, ...] = ()
    memory_gb: float | None = None
    cpu_cores: int | None = None
    victims: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "node": self.node_id,
            "gpu_indices": list(self.gpu_indices),
            "memory_gb": self.memory_gb,
            "cpu_cores": self.cpu_cores,
            "victims": list(self.victims),
        }

    @classmethod
    def of(cls, data: Mapping) -> Reservation:
        return cls(
            node_id=str(data.get("node", "")),
            gpu_indices=tuple(int(i) for i in data.get("gpu_indices") or ()),
            memory_gb=data.get("memory_gb"),
            cpu_cores=data.get("cpu_cores"),
            victims=tuple(str(v) for v in data.get("victims") or ()),
        )


@dataclass(frozen=True)
class Load:
    """Requests running and waiting for a model, summed over its replicas, and their KV
    caches' use on average (None: no engine reported one)."""

    running: int = 0
    waiting: int = 0
    kv_cache: float | None = None


@dataclass(frozen=True)
class Measured:
    """What one replica on a profile was measured to serve at its SLO (`ctl bench --save`)."""

    max_concurrency: int
    tok_per_sec: float
    # What one replica drew while it was measured, in watts (`PUT /models/NAME/capacity`'s
    # `watts`); None: not measured.
    watts: float | None = None
    # The share of their default power limit its GPUs were held to while measured
    # (`power_share`); None: at their default (docs/facility.md, What a capped replica counts).
    power_share: float | None = None


@dataclass(frozen=True)
class Failure:
    """A model's replica that failed to start: where, the engine's exit code, and what it
    said (a sentence and the last lines of its log), kept while the model backs off."""

    replica: str
    node: str = ""
    exit_code: int | None = None
    detail: str = ""
    at: datetime | None = None

    @property
    def summary(self) -> str:
        """One line: the line of the engine's log that says why, else the agent's sentence
        (causes.summary)."""
        return summary(self.detail)

    @property
    def exit_said(self) -> str:
        """How the engine ended in a few words: "exit code 1", "stopped by SIGKILL"; ""."""
        return exit_said(self.exit_code)

    def as_dict(self) -> dict:
        return {
            "replica": self.replica,
            "node": self.node,
            "exit_code": self.exit_code,
            "detail": self.detail,
            "at": self.at.isoformat() if self.at else None,
        }

    @classmethod
    def of(cls, data: Mapping) -> Failure:
        at = data.get("at")
        code = data.get("exit_code")
        return cls(
            replica=str(data.get("replica", "")),
            node=str(data.get("node", "")),
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            detail=str(data.get("detail") or ""),
            at=datetime.fromisoformat(at) if isinstance(at, str) and at else None,
        )


@dataclass(frozen=True)
class ModelState:
    """The controller's memory of one model between passes."""

    model: str
    desired: int = 0
    extra: int = 0
    failures: int = 0
    last_failure_at: datetime | None = None
    backoff_until: datetime | None = None
    parked_since: datetime | None = None
    parked_reason: str = ""
    unplaceable: bool = False
    explanation: tuple[dict, ...] = ()
    last_requested_at: datetime | None = None
    restart_requested_at: datetime | None = None
    held_until: datetime | None = None
    held_for: str = ""
    preempted: int = 0
    busy_since: datetime | None = None
    quiet_since: datetime | None = None
    # Room being freed for this model by its victims, until it is placed or the hold ends.
    reserved: tuple[Reservation, ...] = ()
    reserved_until: datetime | None = None
    # The failure that counted last, while failures count (cleared once a replica is ready).
    last_failure: Failure | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass decides on, loaded at once.

    `silence_floor` is when the reconciler (re)started: a node's silence is counted
    from then at the earliest, so a control plane that was down does not find
    every node lost when it comes back.
    """

    nodes: Mapping[str, NodeView]
    models: Mapping[str, ModelSpec]
    replicas: tuple[ReplicaView, ...]
    states: Mapping[str, ModelState]
    # When each node was last heard from; a node not in it, never (its silence counts from
    # now). Apart from the views, which every heartbeat would otherwise make anew.
    heard: Mapping[str, datetime] = field(default_factory=dict)
    settling: bool = False
    silence_floor: datetime | None = None
    policy: Policy = Policy()
    # Keyed (model, profile).
    measurements: Mapping[tuple[str, str], Measured] = field(default_factory=dict)
    loads: Mapping[str, Load] = field(default_factory=dict)
    # Keyed by replica: what a failed replica's failed shard reported (node, code, detail).
    failures: Mapping[str, Failure] = field(default_factory=dict)
    # Keyed by model: why its weights cannot be fetched from the mirror yet (still
    # downloading, failed); such a model is not placed until they can.
    weights_waiting: Mapping[str, str] = field(default_factory=dict)
    # Power budgets per rack and PDU, and the GPUs' power limits and draw under them.
    power: Power = field(default_factory=Power)
    # The facility domains' conditions and holds (None: no domain has either).
    facility: Facility | None = None
    # The GPUs held below their default power limit, which count less than measured.
    caps: Caps = field(default_factory=Caps)
