"""The fleet: nodes and their GPUs, replicas and their shards, the controller's state."""

from django.db import models
from django.db.models import Func


class JsonNumber(Func):
    """A key of a JSON object column when it holds a number; NULL for anything else.

    What a node does not report (an absent key, text, true, a list) is unknown, never a
    reading, and never fails the write: a cast alone would make "abc" an error on
    PostgreSQL and true a 1 on SQLite.
    """

    output_field = models.FloatField()

    def __init__(self, column: str, key: str):
        super().__init__(models.F(column), models.Value(key))
        self.key = key

    def as_sqlite(self, compiler, connection, **extra):
        column, _ = compiler.compile(self.source_expressions[0])
        path = f'$."{self.key}"'
        return (
            f"CASE WHEN json_type({column}, %s) IN ('integer', 'real') "
            f"THEN json_extract({column}, %s) END",
            [path, path],
        )

    def as_postgresql(self, compiler, connection, **extra):
        column, _ = compiler.compile(self.source_expressions[0])
        # A number past a double's range (JSON has no limit) is no reading either, not an error.
        number = f"({column} -> %s)::numeric"
        return (
            f"CASE WHEN jsonb_typeof({column} -> %s) = 'number' AND abs({number}) < 1e300 "
            f"AND ({number} = 0 OR abs({number}) > 1e-300) "
            f"THEN ({column} ->> %s)::double precision END",
            [self.key] * 5,
        )


def _load_figure(key: str) -> models.GeneratedField:
    # Kept by the database from `load` on every write (the heartbeats' write-behind, a
    # test's update), so the cluster page can sort and filter by it and it cannot drift.
    return models.GeneratedField(
        expression=JsonNumber("load", key), output_field=models.FloatField(), db_persist=True
    )


def revision() -> models.BigIntegerField:
    """A row's number, set by the database on every insert and update (migration 0014's
    triggers; a node's, 0015's, only on a change to what its view is built from), never by
    llmgw: a pass reads in full only the rows whose number moved
    (fleet/selectors/rows.py RowsByRevision)."""
    return models.BigIntegerField(db_default=0, editable=False)


class Node(models.Model):
    """A machine running `llmgw agent`, as it registered and last reported.

    `state` is what the control plane knows of its connection (ready,
    unreachable, lost); `cordoned` and `draining` are what an operator set.
    Figures a node did not report are null: unknown, never zero.
    """

    READY = "ready"
    UNREACHABLE = "unreachable"
    LOST = "lost"
    STATES = [(READY, READY), (UNREACHABLE, UNREACHABLE), (LOST, LOST)]

    id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=255, blank=True)
    # The address its agent says its engines are at; the one its connection last came from
    # (empty: not known); the one an operator approved for it (behind NAT or a proxy); and,
    # while the first is neither of the others, the sentence saying so: nothing is then
    # placed on it nor any endpoint of it believed (fleet/domain/endpoints.py).
    mgmt_addr = models.CharField(max_length=255, blank=True)
    seen_addr = models.CharField(max_length=255, blank=True)
    approved_addr = models.CharField(max_length=255, blank=True)
    address_refusal = models.CharField(max_length=500, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    agent_version = models.CharField(max_length=40, blank=True)
    memory_total_mb = models.PositiveBigIntegerField(null=True, blank=True)
    cpu_count = models.PositiveIntegerField(null=True, blank=True)
    engines = models.JSONField(default=dict, blank=True)
    engines_probed = models.BooleanField(default=False)
    disk_free_gb = models.FloatField(null=True, blank=True)
    disk_total_gb = models.FloatField(null=True, blank=True)
    weights = models.JSONField(default=list, blank=True)
    # `<os>-<machine>`, and where installing engines from the mirror stands (as the agent
    # last said: [{engine, version, state, detail}]); empty from an agent that installs none.
    platform = models.CharField(max_length=40, blank=True)
    engine_installs = models.JSONField(default=list, blank=True)
    # Its IMEX service ({state, domain}) and InfiniBand ports ([{device, port, state, ...}]),
    # as its agent last said (fleet/protocol.py Fabric); null: it has none, or did not say.
    imex = models.JSONField(null=True, blank=True)
    ib_ports = models.JSONField(null=True, blank=True)
    # When its agent last said its fabric changed (a register, or a heartbeat): what the
    # metrics' cached fabric series are keyed by. spec_at moves only when what placement
    # reads of it did (fleet/nodes/fabric.py node_fabric_record): counters that tick.
    fabric_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=STATES, default=READY, db_index=True)
    state_since = models.DateTimeField()
    cordoned = models.BooleanField(default=False)
    draining = models.BooleanField(default=False)
    load = models.JSONField(default=dict, blank=True)
    # The figures of `load` the cluster page shows, sorts by and counts (fleet/protocol.py, Load).
    load1 = _load_figure("load1")
    memory_used_bytes = _load_figure("memory_used_bytes")
    cpu_temp_c = _load_figure("cpu_temp_c")
    cpu_power_w = _load_figure("cpu_power_w")
    inlet_temp_c = _load_figure("inlet_temp_c")
    # What the cluster page derives from the node's GPUs, labels and the replicas holding
    # them, kept by fleet.nodes.figures.node_figures_refresh in each writer's transaction:
    # its GPUs, those healthy and not held (null when it has none: no figure, not zero),
    # their classes as placement names them, and how many holding replicas run here.
    gpu_total = models.PositiveIntegerField(default=0)
    gpu_free = models.PositiveIntegerField(null=True, blank=True)
    gpu_classes = models.JSONField(default=list, blank=True)
    replica_count = models.PositiveIntegerField(default=0)
    session = models.CharField(max_length=32, blank=True)
    # The node's own credential (only its SHA-256), issued at its first register with a
    # join token; from then on only that credential registers this id.
    credential_hash = models.CharField(max_length=64, null=True, blank=True, unique=True)
    credential_issued_at = models.DateTimeField(null=True, blank=True)
    # The join token it first came with (its name), and whether an operator let it in yet
    # (LLMGW_NODE_APPROVAL=manual holds new nodes out of placement until approved).
    joined_with = models.CharField(max_length=100, blank=True)
    approved = models.BooleanField(default=True)
    registered_at = models.DateTimeField()
    # When the agent last registered: what it registers (labels, engines, GPUs, disk,
    # weights) changes only then, so the reconciler caches it per node until this moves.
    spec_at = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField()
    # Moves only with what a pass's view of the node is built from (migration 0015).
    rev = revision()

    class Meta:
        ordering = ["id"]
        # Upgrading runs a release on the node as its agent's user (often root): the
        # permission of release managers, not operators (llmgw/core/permissions.py).
        permissions = [("upgrade_node", "Can upgrade nodes' agents to an llmgw release")]

    def __str__(self) -> str:
        return self.id


class Gpu(models.Model):
    """One GPU of a node, with the class placement matches profiles against."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    uuid = models.CharField(max_length=100, blank=True)
    name = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(null=True, blank=True)
    gpu_class = models.CharField(max_length=40, blank=True)
    healthy = models.BooleanField(default=True)
    # Compute processes its agent found on it that no shard of llmgw runs, as last
    # registered; placement gives out no GPU with any. Null: the agent could not tell.
    unknown_processes = models.PositiveIntegerField(null=True, blank=True)
    # Its fabric, NVLinks, memory errors and Xids as its agent last said (fleet/protocol.py
    # GpuFabricReport without the index); null: it said nothing of them.
    fabric = models.JSONField(null=True, blank=True)
    # Set by an operator: it takes no new replicas (`llmgw ctl gpu cordon NODE:INDEX`).
    cordoned = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique")]

    def __str__(self) -> str:
        return f"{self.node_id} GPU {self.index} ({self.gpu_class})"


class Replica(models.Model):
    """One running copy of a model, made of one shard per node it spans."""

    STATES = [
        (s, s)
        for s in ("pending", "starting", "ready", "draining", "stopping", "stopped", "failed")
    ]

    id = models.CharField(primary_key=True, max_length=80)
    model = models.CharField(max_length=64, db_index=True)
    profile = models.CharField(max_length=64)
    profile_fp = models.CharField(max_length=16)
    state = models.CharField(max_length=16, choices=STATES, default="pending", db_index=True)
    state_since = models.DateTimeField()
    created_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    retiring = models.BooleanField(default=False)
    drain_deadline = models.DateTimeField(null=True, blank=True)
    stop_grace_s = models.PositiveIntegerField(default=30)
    preempted_for = models.CharField(max_length=64, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    counts_as_failure = models.BooleanField(default=True)
    # Set while a ready replica is not routed to: a gateway could not reach its engine, or
    # its node went unheard for the unreachable window. Cleared once its agents are heard
    # from again (a crashed engine they report failed, and it is replaced).
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    unhealthy_reason = models.CharField(max_length=300, blank=True)
    rev = revision()

    class Meta:
        ordering = ["model", "created_at"]

    def __str__(self) -> str:
        return self.id


class Shard(models.Model):
    """A replica's allocation on one node: its GPUs, reserved memory and cores, and its engine."""

    STATES = [(s, s) for s in ("pending", "fetching", "starting", "ready", "failed", "stopped")]

    id = models.CharField(primary_key=True, max_length=90)
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="shards")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="shards")
    rank = models.PositiveIntegerField(default=0)
    gpu_indices = models.JSONField(default=list, blank=True)
    memory_gb = models.FloatField(null=True, blank=True)
    cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    http_port = models.PositiveIntegerField()
    endpoint = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=STATES, default="pending")
    detail = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # While its agent fetches the weights from the mirror: bytes so far, of how many.
    progress_done = models.PositiveBigIntegerField(null=True, blank=True)
    progress_total = models.PositiveBigIntegerField(null=True, blank=True)
    # When it was taken back from what its node reported rather than placed here (a
    # control plane that lost its state): such a shard reads no weights from the mirror.
    adopted_at = models.DateTimeField(null=True, blank=True)
    rev = revision()

    class Meta:
        ordering = ["replica", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "rank"], name="shard_rank_unique")
        ]

    def __str__(self) -> str:
        return self.id


class ModelState(models.Model):
    """The controller's memory of a model between passes: failures, backoff, parking, why not."""

    model = models.CharField(primary_key=True, max_length=64)
    desired = models.PositiveIntegerField(default=0)
    extra = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    backoff_until = models.DateTimeField(null=True, blank=True)
    parked_since = models.DateTimeField(null=True, blank=True)
    parked_reason = models.TextField(blank=True)
    unplaceable = models.BooleanField(default=False)
    explanation = models.JSONField(default=list, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_requested_at = models.DateTimeField(null=True, blank=True)
    restart_requested_at = models.DateTimeField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    held_for = models.CharField(max_length=64, blank=True)
    preempted = models.PositiveIntegerField(default=0)
    busy_since = models.DateTimeField(null=True, blank=True)
    quiet_since = models.DateTimeField(null=True, blank=True)
    # Room being freed for this model by its preemption victims: [{replica, node, gpu_indices,
    # memory_gb, cpu_cores}], kept for it until it is placed or reserved_until passes.
    reserved = models.JSONField(default=list, blank=True)
    reserved_until = models.DateTimeField(null=True, blank=True)
    # The failure that counted last while failures count: {replica, node, exit_code, detail,
    # at}, the detail being the agent's sentence and the engine's last log lines.
    last_failure = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    rev = revision()

    def __str__(self) -> str:
        return self.model


class Lease(models.Model):
    """The reconciler's row: who runs a pass (on SQLite the lease itself, with its expiry;
    on PostgreSQL an advisory lock keeps passes apart), when the last began, and when the
    control plane last (re)started, which the settle period counts from."""

    name = models.CharField(primary_key=True, max_length=40)
    holder = models.CharField(max_length=100, blank=True)
    expires_at = models.DateTimeField()
    last_pass_at = models.DateTimeField(null=True, blank=True)
    settle_until = models.DateTimeField(null=True, blank=True)
    # The restart the settle period last began from, and the latest `llmgw serve` start.
    settled_from = models.DateTimeField(null=True, blank=True)
    served_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class Event(models.Model):
    """Something that happened to a model, a replica or a node, in a sentence with its
    figures: a decision of the reconciler or what an agent reported (fleet/event_log.py).
    The same sentence again about the same thing counts on the last row, as Kubernetes'
    events do, rather than adding one per pass."""

    at = models.DateTimeField()  # the first time it was said
    last_at = models.DateTimeField()  # the latest
    count = models.PositiveIntegerField(default=1)
    kind = models.CharField(max_length=40)
    model = models.CharField(max_length=64, blank=True)
    node = models.CharField(max_length=64, blank=True)
    replica = models.CharField(max_length=80, blank=True)
    message = models.TextField()
    fields = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["-last_at", "-id"], name="event_newest"),
            models.Index(fields=["model", "-last_at", "-id"], name="event_model_newest"),
            models.Index(fields=["node", "-last_at", "-id"], name="event_node_newest"),
        ]

    def __str__(self) -> str:
        return self.message


class PowerBudget(models.Model):
    """The most a rack or a PDU may draw, in watts, as an operator set it (docs/facility.md).

    `name` is the value of the nodes' `llmgw.io/rack` or `llmgw.io/pdu` label (for a
    PDU's phase, `<pdu>/<phase>` from `llmgw.io/pdu-phase`: "r12-a/L2"). Placement
    refuses a replica whose estimated draw would take the rack or PDU past `watts` less
    `margin`; a rack or PDU with no row has no budget. For a dual-fed domain `feeds` are
    the feeds' ratings and `watts` is the smaller's at `derating` (power.feed_cap).
    `other_watts` is what else stands in it that reports nothing (switches, storage).
    """

    KINDS = [
        ("rack", "rack"),
        ("pdu", "PDU"),
        ("phase", "PDU phase"),
        ("row", "row"),
        ("room", "room"),
        ("site", "site"),
    ]

    kind = models.CharField(max_length=8, choices=KINDS)
    # 63 for a label's value; a phase's is its PDU's, a slash and a phase of up to 8.
    name = models.CharField(max_length=72)
    watts = models.FloatField()
    margin = models.FloatField(default=0.0)
    feeds = models.JSONField(default=list, blank=True)
    derating = models.FloatField(default=0.8)
    other_watts = models.FloatField(default=0.0)
    updated_by = models.CharField(max_length=150, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="power_budget_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.watts:g} W"


class DomainCondition(models.Model):
    """A facility domain's thermal condition as the last pass found it (docs/facility.md,
    "Conditions"), and the timers its hold times run on: the state of
    `fleet.domain.conditions.State`, kept between passes.

    A domain is a rack, PDU, row, room or zone (`kind`), named as the nodes' location labels
    or a source's label name it. `read_at` is when its newest reading was taken, fresh or
    not (None: never read); a domain with no row has never been read and is `unknown`.
    """

    kind = models.CharField(max_length=8)
    # 63 for a label's value; a held phase's (it has a row, unknown) is 72: r12-a/L2.
    name = models.CharField(max_length=72)
    condition = models.CharField(max_length=8, default="unknown")
    since = models.DateTimeField(null=True, blank=True)
    why = models.CharField(max_length=300, blank=True)
    above_warm = models.DateTimeField(null=True, blank=True)
    above_hot = models.DateTimeField(null=True, blank=True)
    below_warm = models.DateTimeField(null=True, blank=True)
    below_hot = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # When a replica was last shed off it, or would have been under observe-only (shedding).
    shed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="domain_condition_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.condition}"


class DomainHold(models.Model):
    """An operator's hold on a facility domain (a rack, PDU, PDU phase, row, room or zone):
    no new placements in it, whatever its condition, until released (`llmgw ctl facility hold|release`). Nothing running there is
    stopped."""

    kind = models.CharField(max_length=8)
    # 63 for a label's value; a phase's is its PDU's, a slash and a phase of up to 8.
    name = models.CharField(max_length=72)
    reason = models.CharField(max_length=300, blank=True)
    held_by = models.CharField(max_length=150, blank=True)
    held_at = models.DateTimeField()

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="domain_hold_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} held by {self.held_by}"
