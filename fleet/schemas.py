"""The fleet API's shapes (interfaces.md, REST API)."""

from __future__ import annotations

from datetime import datetime

from ninja import Field, Schema
from pydantic import ConfigDict, StrictFloat, StrictInt, StrictStr


class NodeOut(Schema):
    id: str
    hostname: str
    state: str
    labels: dict
    # Where its llmgw.io/zone, llmgw.io/rack and llmgw.io/pdu labels say it is.
    location: dict[str, str] = {}
    gpu_total: int
    gpu_free: int
    gpu_class: str | None
    gpus: list[dict]
    memory_gb: float | None
    cpu_count: int | None
    engines: dict
    disk: dict
    # Its IMEX service ({state, domain}) and InfiniBand ports, as its agent last said; null
    # where it has none or did not say. Each GPU's own report is its `fabric`, shown for
    # one node (GET /nodes/{id}), not in the list.
    imex: dict | None = None
    ib_ports: list[dict] | None = None
    weights: list[dict] = []
    replicas: list[str]
    load: dict
    agent_version: str
    # The address it says its engines are at; the one its connection last came from; the
    # one an operator approved; and, while the first is not believed, why.
    mgmt_addr: str
    seen_addr: str = ""
    approved_addr: str = ""
    address_refusal: str = ""
    # A drain that cannot go on for lack of room: why, and when its replicas stop.
    drain_stuck: str = ""
    last_seen: str | None
    registered_at: str | None


class ShardOut(Schema):
    id: str
    node: str
    rank: int
    gpu_indices: list[int]
    memory_gb: float | None
    cpu_cores: int | None


class AdapterFetchOut(Schema):
    name: str
    done: int
    total: int | None = None


class ReadingOut(Schema):
    """What a ready replica's engine last said (fleet/domain/readings.py); each figure it did
    not report is null."""

    running: int | None = None
    waiting: int | None = None
    kv_cache: float | None = None
    prefix_hit_rate: float | None = None
    # How many requests its engine runs at once, as its command sets it; null: unknown.
    slots: int | None = None
    # The LoRA adapters its engine holds, by name; null when it said nothing of them.
    adapters: list[str] | None = None
    # The adapters its node is fetching from the mirror for it to load: name, bytes done,
    # of total (null: unknown); absent when none.
    adapters_fetching: list[AdapterFetchOut] | None = None


class ReplicaOut(Schema):
    id: str
    model: str
    profile: str
    state: str
    shards: list[ShardOut]
    endpoint: str
    created_at: str | None
    ready_at: str | None
    last_used_at: str | None
    preempted_for: str
    reason: str
    retiring: bool
    outdated: bool
    # While its agent fetches the weights from the mirror: {"done", "total"} in bytes.
    fetching: dict[str, int | None] | None = None
    # Since when no gateway routes to it although ready (fleet/domain/health.py).
    unhealthy_since: str | None = None
    # What its engine last said of itself, while it is ready and its engine said anything.
    engine: ReadingOut | None = None


class DetailOut(Schema):
    detail: str


class ApproveIn(Schema):
    """An operator letting a node in: `address`, where its engines are reached, when that is
    not the address its connection comes from (behind NAT or a proxy)."""

    address: str = Field("", max_length=255)


class ReconcileOut(Schema):
    ran: bool
    settling: bool = False
    events: list[str]
    starts: int = 0
    stops: int = 0
    drains: int = 0
    forgets: int = 0
    detail: str = ""


class HeadroomOut(Schema):
    model: str
    current: int
    retiring: int = 0
    more: int
    nodes: list[list[str]]
    limited: bool
    blocked: list[str]
    tok_per_sec: float | None
    # Why one more counts less than was measured: its GPUs are held below their default power.
    capped: list[str] = []


class TargetOut(Schema):
    model: str
    tok_per_sec: float
    per_replica_tok_per_sec: float
    profile: str
    needed: int
    current: int
    more: int
    room: int
    fits: bool
    blocked: list[str]
    # Why the running replicas count less than was measured, where that asks for more.
    capped: list[str] = []


class VictimOut(Schema):
    replica: str
    model: str
    class_: str = Field(alias="class")
    node: str
    why: str


class ProtectedOut(Schema):
    replica: str
    model: str
    why: str


class PreemptionOut(Schema):
    model: str
    class_: str = Field(alias="class")
    wants: int
    fits: bool
    summary: str
    victims: list[VictimOut]
    protected: list[ProtectedOut]
    blocked: list[str]


class DefragMoveOut(Schema):
    """One replica defragmentation would move: a replacement placed on `to` first, then
    the old one on `from` stopped, as a drain does."""

    replica: str
    model: str
    from_: list[str] = Field(alias="from")
    to: list[str]


class DefragOut(Schema):
    """The defragmentation dry run (fleet/domain/defrag.py `defrag_dry_run`): the domain
    it would free for one replica of `model`, the moves, and why none can be freed."""

    model: str
    done: bool = Field(description="whether the reconciler carries such plans out (LLMGW_DEFRAG)")
    summary: str
    domain: str | None = None
    moves: list[DefragMoveOut]
    leaving: list[str] = Field(default_factory=list, description="replicas already leaving it")
    blocked: list[str]


class EngineLogOut(Schema):
    """A replica's engine log as its node read it: the last lines, oldest first."""

    replica: str
    shard: str
    node: str
    lines: list[str]


class ReconcilerOut(Schema):
    """When the last reconciler pass began, and a sentence when passes stopped."""

    last_pass_at: datetime | None
    settling: bool
    interval_s: float
    warning: str | None


class EventOut(Schema):
    at: datetime = Field(description="when it was first said")
    last_at: datetime = Field(description="when it was last said")
    count: int = Field(description="how many times it was said, from at to last_at")
    kind: str = Field(
        description="placement, preemption, replica_failed, shard_ready, …; model.scale, node.drain, … for a change someone made"
    )
    model: str
    node: str
    replica: str
    message: str
    by: str = Field(description="who made the change; empty for what the cluster did")


class EventsOut(Schema):
    events: list[EventOut]
    next: str | None = Field(description="`before` for the next page; null at the end")


class ReleaseIn(Schema):
    version: str | None = Field(
        None, description="a release the mirror holds; none: this control plane's own"
    )


class ReleaseOut(Schema):
    version: str
    sha256: str
    size: int


class UpgradeIn(Schema):
    version: str = Field(description="a release the mirror holds (POST /releases offers one)")


class PowerBudgetIn(Schema):
    model_config = ConfigDict(extra="forbid")

    kind: StrictStr = Field(description="rack, pdu, phase, row, room or site")
    name: StrictStr = Field(
        description="the value of the nodes' llmgw.io/rack or llmgw.io/pdu label; for a "
        "phase, the PDU, a slash and its llmgw.io/pdu-phase: r12-a/L2"
    )
    watts: StrictFloat | StrictInt | None = Field(
        None, description="the most it may draw, in watts; left out when feeds are given"
    )
    margin: StrictFloat | StrictInt = Field(
        0.0, description="the share of the cap kept back, from 0 to 0.5 (0.1: 10 %)"
    )
    feeds: list[StrictFloat | StrictInt] | None = Field(
        None,
        description="a dual-fed domain's feeds' ratings, in watts: the cap is then the "
        "smaller's at its derating",
    )
    derating: StrictFloat | StrictInt = Field(
        0.8, description="the share of a feed's rating it may carry (0.8: 80 %)"
    )
    other_watts: StrictFloat | StrictInt = Field(
        0.0, description="what else stands in it that reports nothing: switches, storage"
    )


class PowerBudgetOut(Schema):
    kind: str
    name: str
    # The cap: as given, or the smaller feed's rating at its derating.
    watts: float
    margin: float = 0.0
    feeds: list[float] = []
    derating: float = 0.8
    other_watts: float = 0.0


class GpuDrawOut(Schema):
    index: int
    # What it draws, in watts, as its agent last said; null: unreported or stale.
    power_w: float | None
    # The power limit it is held to, and its default limit, in watts, as its agent last
    # said; null: unreported or stale.
    power_limit_w: float | None
    power_default_w: float | None


class ShardDrawOut(Schema):
    node: str
    gpus: list[GpuDrawOut]
    # Its node's CPU packages' draw (RAPL), the whole node's; null: unreported or stale.
    cpu_power_w: float | None


class ReplicaDrawOut(Schema):
    id: str
    profile: str
    shards: list[ShardDrawOut]


class ModelPowerOut(Schema):
    """What a model's ready replicas draw now, as their nodes' agents last reported it."""

    model: str
    replicas: list[ReplicaDrawOut]


class FacilityDomainOut(Schema):
    kind: str
    name: str
    nodes: int
    gpus: int
    # Per GPU held by a replica, the larger of its power limit and its measured draw; null
    # when every GPU held there reports neither (unknown, not 0 W).
    estimated_w: float | None
    # What placement counts as held: the GPUs' estimate, its nodes' own share and its other
    # equipment; null as estimated_w is.
    reserved_w: float | None = None
    # What is measured there: its meter, else the held GPUs' draw and each node's own (its
    # RAPL reading, else the per-node share); null where nothing there reports a draw.
    measured_w: float | None
    # GPUs held by replicas whose agent reports neither figure: not counted.
    unknown_gpus: int
    budget_w: float | None
    # What placement loads it to: the budget less its margin.
    limit_w: float | None = None
    over: bool
    said: str


class FabricTrayOut(Schema):
    node: str
    state: str
    gpus_total: int
    # Those placement would give out now: no replica holds them, no problem, no cordon.
    gpus_free: int
    # "up" or "down" as its agent says; null where it has no IMEX or did not say.
    imex: str | None
    # The replicas over several nodes with a shard on it.
    replicas: list[str]
    # Why each of its GPUs kept out of service is (a problem, a cordon), in a sentence.
    problems: list[str]


class FabricDomainOut(Schema):
    name: str
    cluster_uuid: str
    clique: int
    gpus_total: int
    gpus_free: int
    imex_up: int
    replicas: list[str]
    trays: list[FabricTrayOut]


class FabricOut(Schema):
    domains: list[FabricDomainOut]
    # Every GPU kept out of service on any node, in a domain or not.
    problems: list[str]


class DomainHoldIn(Schema):
    model_config = ConfigDict(extra="forbid")

    kind: StrictStr = Field(description="rack, pdu, phase, row, room or zone")
    name: StrictStr = Field(
        description="the value of the nodes' location label; for a phase, the PDU, a slash "
        "and its llmgw.io/pdu-phase: r12-a/L2"
    )
    reason: StrictStr = Field("", description="why, for the people who read it (300 at most)")


class DomainHoldOut(Schema):
    kind: str
    name: str
    reason: str
    held_by: str
    held_at: datetime


class SourceFailedOut(Schema):
    # The source ("prometheus (signal inlet_temp_c)", "sources file", "simulated").
    source: str
    why: str
    since: datetime


class FacilitySourcesOut(Schema):
    # When the reconciler last read the sources; null: not since this server started.
    checked_at: datetime | None
    failed: list[SourceFailedOut]


class DomainConditionOut(Schema):
    kind: str
    name: str
    # ok, warm, hot or unknown (no fresh reading: placed as ok).
    condition: str
    said: str
    since: datetime | None
    # Seconds since its newest reading, fresh or not; null: never read.
    reading_age_s: float | None
    # Whether enforced: else observe-only (placement says what it would have done).
    enforced: bool
    held: bool
    held_by: str
    hold_reason: str
