"""The agent protocol's messages (interfaces.md, Agent protocol), validated on arrival.

Every frame an agent sends is parsed into one of these; anything that does not
fit is answered with an `error` frame and changes nothing. Fields may be
absent: absent is unknown, never zero. Unknown fields are ignored so newer
agents can talk to older control planes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

MAX_FRAME_BYTES = 256 * 1024
# A shard_status detail: a sentence and the engine's last log lines.
DETAIL_CHARS = 8000
# An engine_log answer: lines as the agent cuts them (fleet/agent/enginelog.py).
LOG_LINES = 1000
LOG_LINE_CHARS = 4000

NodeId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
ShardId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,89}$")]
ReplicaId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")]
# Text may not hold NUL: PostgreSQL can store it neither in text nor in JSON.
_TEXT = r"^[^\x00]*$"
Short = Annotated[str, StringConstraints(max_length=255, pattern=_TEXT)]
# Lengths and sizes the columns they are stored in can hold.
Name = Annotated[str, StringConstraints(max_length=100, pattern=_TEXT)]
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
Label = Annotated[str, StringConstraints(min_length=1, max_length=127, pattern=_TEXT)]
Count = Annotated[int, Field(ge=0, le=1_000_000)]
Positive = Annotated[int, Field(gt=0, le=1 << 50)]
Reading = Annotated[float, Field(ge=-300, le=1_000_000)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# A catalog adapter's name (catalog.domain.NAME_RE).
AdapterName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]
ShardState = Literal["pending", "fetching", "starting", "ready", "failed", "stopped"]


class _Message(BaseModel):
    # NaN and Infinity are not JSON: PostgreSQL's JSON refuses them and every reading compares false.
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)


class GpuInfo(_Message):
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: Name = ""
    name: Name = ""
    memory_total_mb: Annotated[int, Field(gt=0, le=2**31 - 1)] | None = None
    # Compute processes on it that none of the agent's shards runs (NVML's); absent where
    # the agent cannot tell, which is unknown, not none.
    unknown_processes: Count | None = None


class Disk(_Message):
    free_gb: Annotated[float, Field(ge=0)] | None = None
    total_gb: Annotated[float, Field(ge=0)] | None = None


class Weight(_Message):
    """A file the node's weight cache holds: its digest, and the source it was fetched for."""

    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    source: Annotated[str, StringConstraints(max_length=500, pattern=_TEXT)] = ""
    digest: Short = ""
    # When a shard last started on it, in Unix seconds: what reclaim goes by.
    used_at: Annotated[float, Field(ge=0, le=1e11)] | None = None
    size: Annotated[int, Field(ge=0, le=1 << 50)] | None = None  # bytes


class EngineInstallReport(_Message):
    """Where installing an engine from the mirror stands on the node (fleet/agent/install.py)."""

    engine: Label
    version: Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=_TEXT)]
    state: Literal["installing", "installed", "failed"]
    # Why it failed, in a sentence.
    detail: Annotated[str, StringConstraints(max_length=2000, pattern=_TEXT)] = ""


Platform = Annotated[str, StringConstraints(pattern=r"^([a-z0-9_]+-[a-z0-9_]+)?$", max_length=40)]
Engines = Annotated[dict[Label, Short], Field(max_length=16)]
Installs = Annotated[list[EngineInstallReport], Field(max_length=16)]


class RunningShard(_Message):
    shard_id: ShardId
    replica_id: ReplicaId
    model: Annotated[str, StringConstraints(max_length=64)]
    profile: Annotated[str, StringConstraints(max_length=64)]
    profile_fp: Annotated[str, StringConstraints(max_length=16)] = ""
    gpu_indices: Annotated[list[Annotated[int, Field(ge=0, le=1023)]], Field(max_length=64)] = []
    endpoint: Short = ""
    state: ShardState = "ready"


GpuIndex = Annotated[int, Field(ge=0, le=1023)]
ErrorCount = Annotated[int, Field(ge=0, le=1 << 62)]


class GpuFabric(_Message):
    """A GPU's place in an NVLink fabric (nvmlDeviceGetGpuFabricInfoV)."""

    # The fabric's cluster UUID as text; "" unknown.
    cluster_uuid: Short = ""
    clique_id: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = None
    state: Literal["not_supported", "not_started", "in_progress", "completed"] | None = None
    # NVML's return code of the GPU's registration with the fabric: 0 is success.
    status: Int32 | None = None
    # Its health mask says degraded bandwidth or an unhealthy route.
    health_degraded: bool | None = None


class NvLink(_Message):
    """One NVLink of a GPU: up or not, the GPU of the same node at its other end, and its
    data-link error counters."""

    link: Annotated[int, Field(ge=0, le=63)]
    up: bool | None = None
    peer_index: GpuIndex | None = None
    replay_errors: ErrorCount | None = None
    recovery_errors: ErrorCount | None = None
    crc_flit_errors: ErrorCount | None = None
    crc_data_errors: ErrorCount | None = None


# An NVLink's data-link error counters by the protocol's names, in one place: the agent
# reads them from NVML, /metrics publishes them, the node page sums them, and a change
# in them alone moves no placement view (they tick on a healthy GPU).
NVLINK_ERRORS = tuple(name for name in NvLink.model_fields if name.endswith("_errors"))


class Ecc(_Message):
    """A GPU's memory errors: ECC mode and counts, and the repairs its memory waits for."""

    enabled: bool | None = None
    corrected_volatile: ErrorCount | None = None
    uncorrected_volatile: ErrorCount | None = None
    corrected_aggregate: ErrorCount | None = None
    uncorrected_aggregate: ErrorCount | None = None
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None


# Xid codes an agent keeps per GPU, the newest last.
XIDS_KEPT = 32


class GpuFabricReport(_Message):
    """One GPU's fabric, links, memory errors and Xids; a part NVML says nothing of is absent."""

    index: GpuIndex
    fabric: GpuFabric | None = None
    nvlinks: Annotated[list[NvLink], Field(max_length=64)] | None = None
    ecc: Ecc | None = None
    xids: Annotated[
        list[Annotated[int, Field(ge=0, le=2**32 - 1)]], Field(max_length=XIDS_KEPT)
    ] = []


class Imex(_Message):
    """The IMEX service that lets the GPUs of a multi-node NVLink domain share memory."""

    state: Literal["up", "down"] | None = None
    domain: Short = ""


class IbPort(_Message):
    """One InfiniBand port, as /sys/class/infiniband/<device>/ports/<port>/ says."""

    device: Short
    port: Annotated[int, Field(ge=0, le=255)]
    state: Short = ""
    rate_gbps: Annotated[float, Field(ge=0, le=100_000)] | None = None
    link_downed: ErrorCount | None = None
    symbol_errors: ErrorCount | None = None
    port_rcv_errors: ErrorCount | None = None


class Fabric(_Message):
    """A node's GPU fabric, IMEX and InfiniBand (fleet/agent/fabric.py reads it)."""

    gpus: Annotated[list[GpuFabricReport], Field(max_length=64)] = []
    # None: no IMEX on this node; no InfiniBand.
    imex: Imex | None = None
    ib_ports: Annotated[list[IbPort], Field(max_length=256)] | None = None


class Register(_Message):
    type: Literal["register"]
    node_id: NodeId
    hostname: Short = ""
    mgmt_addr: Short = ""
    labels: Annotated[dict[Label, Short], Field(max_length=64)] = {}
    agent_version: Annotated[str, StringConstraints(max_length=40, pattern=_TEXT)] = ""
    memory_total_mb: Positive | None = None
    cpu_count: Annotated[int, Field(gt=0, le=100_000)] | None = None
    gpus: Annotated[list[GpuInfo], Field(max_length=64)] = []
    engines: Engines = {}
    engines_probed: bool = False
    # `<os>-<machine>`: which engine builds of the mirror this node can install; absent
    # from an agent that installs none.
    platform: Platform = ""
    engine_installs: Installs = []
    disk: Disk | None = None
    weights: Annotated[list[Weight], Field(max_length=1000)] = []
    shards: Annotated[list[RunningShard], Field(max_length=1000)] = []
    fabric: Fabric | None = None


class GpuLoad(_Message):
    index: Annotated[int, Field(ge=0, le=1023)]
    temp_c: Reading | None = None
    memory_temp_c: Reading | None = None
    power_w: Reading | None = None
    power_limit_w: Reading | None = None
    # Its default power limit and the least it allows: a power cap is kept against them.
    power_default_w: Reading | None = None
    power_min_w: Reading | None = None
    throttle: Annotated[list[Short], Field(max_length=16)] = []
    utilization: Annotated[float, Field(ge=0, le=100)] | None = None
    memory_used_mb: Count | None = None


class ShardUse(_Message):
    cpu_cores: Annotated[float, Field(ge=0, le=100_000)] | None = None
    rss_bytes: Annotated[int, Field(ge=0)] | None = None


class Load(_Message):
    cpu_percent: Annotated[float, Field(ge=0, le=100)] | None = None
    load1: Annotated[float, Field(ge=0)] | None = None
    load5: Annotated[float, Field(ge=0)] | None = None
    load15: Annotated[float, Field(ge=0)] | None = None
    memory_used_bytes: Annotated[int, Field(ge=0)] | None = None
    memory_available_bytes: Annotated[int, Field(ge=0)] | None = None
    shards: Annotated[dict[ShardId, ShardUse], Field(max_length=1000)] = {}
    cpu_temp_c: Reading | None = None
    cpu_power_w: Reading | None = None
    inlet_temp_c: Reading | None = None
    # The whole node's input power, as its BMC reads it (fleet/agent/bmc.py).
    node_power_w: Reading | None = None
    gpus: Annotated[list[GpuLoad], Field(max_length=64)] = []


class ShardSeen(_Message):
    shard_id: ShardId
    state: ShardState


class Heartbeat(_Message):
    type: Literal["heartbeat"]
    seq: Annotated[int, Field(ge=0)]
    memory_total_mb: Positive | None = None
    cpu_count: Annotated[int, Field(gt=0, le=100_000)] | None = None
    load: Load | None = None
    shards: Annotated[list[ShardSeen], Field(max_length=1000)] = []
    # Sent only when what the weight cache holds (or the free disk) changed; absent is
    # "as last said".
    weights: Annotated[list[Weight], Field(max_length=1000)] | None = None
    disk: Disk | None = None
    # Sent only when an install moved on (and with it, once installed, the engines probed
    # again); absent is "as last said".
    engines: Engines | None = None
    engine_installs: Installs | None = None
    # Sent only when it changed since the last one sent; absent is "as last said".
    fabric: Fabric | None = None


class Progress(_Message):
    done: Annotated[int, Field(ge=0, le=1 << 50)]
    total: Annotated[int, Field(ge=0, le=1 << 50)] | None = None


class ShardStatus(_Message):
    type: Literal["shard_status"]
    shard_id: ShardId
    state: Literal["fetching", "starting", "ready", "failed", "stopped"]
    endpoint: Short = ""
    # While fetching its weights from the mirror: bytes so far, and of how many.
    progress: Progress | None = None
    # A sentence and the engine's last lines (the agent sends at most 4 KiB of them).
    detail: Annotated[str, StringConstraints(max_length=DETAIL_CHARS, pattern=_TEXT)] = ""
    exit_code: Int32 | None = None
    # Set when the agent stopped the engine itself for what it used (fleet/agent/contain.py):
    # a failure of the model's, counted as a crash on start is.
    stopped_for: Literal["memory"] | None = None


class AdapterHeld(_Message):
    """A LoRA adapter an engine holds now: its catalog name, and llama-server's index of it
    (what a request names it by there; None for vLLM, which is asked by name)."""

    name: AdapterName
    engine_id: Annotated[int, Field(ge=0, le=10_000)] | None = None


class AdapterFetch(_Message):
    """A LoRA adapter whose files the agent is fetching from the mirror for its engine to
    load: bytes in its cache so far, of how many (None: not known)."""

    name: AdapterName
    done: Annotated[int, Field(ge=0, le=1 << 62)]
    total: Annotated[int, Field(ge=0, le=1 << 62)] | None = None


class EngineShardLoad(_Message):
    shard_id: ShardId
    running: Count | None = None
    waiting: Count | None = None
    kv_cache: Fraction | None = None
    # Prompt tokens found in the prefix cache over those looked up, over the last minute.
    prefix_hit_rate: Fraction | None = None
    # How many requests its engine runs at once, as its command sets it; absent: unknown.
    slots: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    # The adapters its engine holds now; absent is not reported (unknown), [] is none.
    adapters: Annotated[list[AdapterHeld], Field(max_length=1000)] | None = None
    # The adapters whose files it is fetching to load, and how far each got; absent: none.
    adapters_fetching: Annotated[list[AdapterFetch], Field(max_length=1000)] | None = None


class AdapterStatus(_Message):
    """How a `load_adapter` or `unload_adapter` the control plane asked for went: the
    adapter loaded, unloaded, or failed with the engine's words."""

    type: Literal["adapter_status"]
    shard_id: ShardId
    name: AdapterName
    state: Literal["loaded", "unloaded", "failed"]
    detail: Annotated[str, StringConstraints(max_length=2000, pattern=_TEXT)] = ""


class EngineLoad(_Message):
    type: Literal["engine_load"]
    shards: Annotated[list[EngineShardLoad], Field(max_length=1000)] = []


class EngineLogLines(_Message):
    """The answer to an `engine_log` request: the shard's last log lines, oldest first;
    `found` false when the node has no log of it."""

    type: Literal["engine_log_lines"]
    request_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    shard_id: ShardId
    found: bool = True
    lines: Annotated[
        list[Annotated[str, StringConstraints(max_length=LOG_LINE_CHARS, pattern=_TEXT)]],
        Field(max_length=LOG_LINES),
    ] = []


class UpgradeStatus(_Message):
    """How an `upgrade` the control plane asked for goes: the release being installed, the
    agent restarting into it, or failed with why (nothing changed then)."""

    type: Literal["upgrade_status"]
    version: Annotated[str, StringConstraints(min_length=1, max_length=40, pattern=_TEXT)]
    state: Literal["installing", "restarting into", "failed"]
    detail: Annotated[str, StringConstraints(max_length=2000, pattern=_TEXT)] = ""


Message = (
    Register | Heartbeat | ShardStatus | EngineLoad | EngineLogLines | UpgradeStatus | AdapterStatus
)
AgentMessage = Annotated[Message, Field(discriminator="type")]
_adapter: TypeAdapter[AgentMessage] = TypeAdapter(AgentMessage)


class BadMessage(ValueError):
    """A frame that is not a valid message; the text is what the agent is told."""


def parse(text: str) -> Message:
    """Validate one frame into its message, or raise BadMessage with a one-line reason."""
    if len(text) > MAX_FRAME_BYTES:
        raise BadMessage(f"message of {len(text)} bytes is larger than {MAX_FRAME_BYTES}")
    try:
        return _adapter.validate_json(text)
    except ValidationError as exc:
        raise BadMessage(_first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "json_invalid":
        return "not a JSON object"
    if err["type"] in (
        "union_tag_invalid",
        "union_tag_not_found",
        "model_attributes_type",
        "model_type",
    ):
        return (
            "expected an object with type register, heartbeat, shard_status, engine_load, "
            "engine_log_lines, upgrade_status or adapter_status"
        )
    return f"{where}: {err['msg']}" if where else err["msg"]
