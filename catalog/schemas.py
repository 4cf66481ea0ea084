"""The catalog API's shapes (interfaces.md, REST API: ModelView and the model actions)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from .domain import CLASSES, ENGINES, MAX_IDLE_TIMEOUT_S, MAX_REPLICAS, ROUTING_PROFILES, ROUTINGS


class SloOut(Schema):
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None


class FailureOut(Schema):
    """The failure that counted last, while the model backs off or is parked: its replica,
    node, the engine's exit code, and the agent's sentence with the engine's last log lines."""

    replica: str
    node: str
    exit_code: int | None = None
    detail: str
    at: datetime | None = None
    # The failure in one line: the engine's log line that says why, else the sentence.
    said: str = ""
    # How the engine ended: "exit code 1", "stopped by SIGKILL"; "" when not known.
    exit: str = ""


class ModelOut(Schema):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    aliases: list[str]
    description: str
    source: str
    ready: int
    # Serving still, on their way out (a restart, a drain): not among the ready.
    retiring: int = 0
    desired: int
    min: int
    max: int
    idle_timeout: int
    target_waiting: float | None = None
    kv_ceiling: float | None = None
    on_demand: bool
    status: str
    reason: str
    class_: str = Field(alias="class")
    owner: str
    memory_gb: float | None
    cpu_cores: int | None
    suggested_cores: int | None = None
    measured_memory_gb: float | None
    warnings: list[str]
    preempted: int
    held_for: str
    unplaceable: bool
    parked: bool
    failures: int
    last_failure: FailureOut | None = None
    profiles: list[dict]
    fallbacks: list[str]
    routing_profile: str
    declared: bool
    slo: SloOut = Field(default_factory=SloOut)
    context_length: int | None = None
    max_output: int | None = None
    # The LoRA adapters served on it, by name (GET /adapters?base= shows each).
    adapters: list[str] = []


class AdapterIn(BaseModel):
    """Documents POST /adapters; catalog.domain.parse_adapter judges the body."""

    name: str
    base: str = Field(description="the model it adapts")
    source: str = Field(description="hf://org/repo (PEFT), a LoRA .gguf, or a local path")
    format: str = Field(json_schema_extra={"enum": ["peft", "gguf"]})
    rank: int = Field(description="the LoRA's r; at most the base profile's --max-lora-rank")
    owner: str = Field(description="team:Acme/ml or project:… (by name or ID): whose keys reach it")
    aliases: list[str] = []
    description: str = ""


class AdapterOut(Schema):
    name: str
    base: str
    aliases: list[str]
    description: str
    source: str
    format: str
    rank: int
    owner: str
    held_by: list[str] = Field(description="ready replicas whose engines hold it now")
    mirror: str | None = Field(
        None,
        description="how far the mirror got with its weights: ready, 40% of 12 MB, a failure "
        "and how to retry; absent for a path on the nodes",
    )


class ScaleIn(Schema):
    """Types only: the bounds are catalog.domain.parse_scaling's, the same as for a new model."""

    model_config = ConfigDict(extra="forbid")

    min: int | None = None
    max: int | None = None
    idle_timeout: int | None = None
    target_waiting: float | None = None
    kv_ceiling: float | None = None


class ClassIn(Schema):
    """Types only: the service refuses an unknown class with the classes it takes."""

    model_config = ConfigDict(extra="forbid")

    class_: StrictStr = Field(
        alias="class",
        json_schema_extra={"enum": ["", *CLASSES]},
        description='"" returns to the default: opportunistic when on demand, else standard',
    )


class ClassOut(Schema):
    model_config = ConfigDict(populate_by_name=True)

    model: str
    class_: str = Field(alias="class", description="the effective class")


class OwnerIn(Schema):
    model_config = ConfigDict(extra="forbid")

    owner: StrictStr = Field(
        description='org:Acme, team:Acme/ml, project:Acme/ml/training or with IDs; "" for shared'
    )


class OwnerOut(Schema):
    model: str
    owner: str = Field(description='team:ID and the like; "" for shared')


class ResourcesIn(Schema):
    """What a replica reserves of a node; judged by catalog.services.model_resources_set."""

    model_config = ConfigDict(extra="forbid")

    profile: StrictStr | None = Field(None, description="one profile; every profile when left out")
    memory_gb: StrictInt | StrictFloat = Field(description="host memory a replica needs")
    cpu_cores: StrictInt | None = Field(
        None,
        description="cores a CPU-only replica reserves; 0 none; left out, each profile keeps its own",
    )


class CapacityIn(Schema):
    """What `ctl bench --save` found: the most requests at once that met the SLO, and the rate."""

    model_config = ConfigDict(extra="forbid")

    profile: StrictStr
    max_concurrency: StrictInt = Field(description="at least 1")
    tok_per_sec: StrictInt | StrictFloat = Field(description="above 0")
    ttft_p95_ms: StrictInt | StrictFloat | None = None
    tpot_p95_ms: StrictInt | StrictFloat | None = None
    watts: StrictInt | StrictFloat | None = Field(
        None, description="what one replica drew while measured, in watts; above 0"
    )
    power_share: StrictInt | StrictFloat | None = Field(
        None,
        description="the share of their default power limit its GPUs were held to while "
        "measured, above 0 and at most 1; none: at their default",
    )


class MeasurementOut(Schema):
    model: str
    profile: str
    max_concurrency: int
    tok_per_sec: float
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    watts: float | None
    power_share: float | None
    measured_at: datetime
    measured_by: str


# What `POST /models` takes, for the OpenAPI document only. The body is parsed by
# catalog.domain.parse_model, the same rules as the catalog file, so that a refusal
# reads the same sentence wherever the model came from; these are never used to parse.


class _Documented(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ProfileIn(_Documented):
    """One way the model may run."""

    name: str = Field(description="unique in its model: letters, digits, '.', '_' or '-'")
    engine: str = Field(json_schema_extra={"enum": list(ENGINES)})
    gpu_class: str = Field("", description="for example h100-80g; empty means CPU only")
    tp: int = Field(1, ge=1, description="tensor parallelism")
    pp: int = Field(1, ge=1, description="pipeline parallelism")
    nodes: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=1, description="default: tp × pp / nodes")
    args: list[str] = Field(default_factory=list, description="the engine's arguments")
    env: dict[str, str] = Field(default_factory=dict, description="the engine's environment")
    min_memory_gb: float | None = Field(
        None, gt=0, description="host memory a replica needs; required of a CPU profile"
    )
    cpu_cores: int | None = Field(None, ge=1, description="cores a CPU replica reserves")
    min_disk_gb: float | None = Field(None, gt=0)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="labels a node must carry"
    )
    weight: int = Field(1, ge=0, description="share of traffic")
    priority: int = Field(0, ge=-1000, description="placement tries higher first")
    startup_timeout: int = Field(600, ge=1, description="seconds (startup_timeout_s also read)")
    power_watts: float | None = Field(
        None,
        gt=0,
        description="what a replica draws, in watts; wins over placement's estimate against "
        "a power budget",
    )
    routing: str = Field(
        "",
        description="how the gateway picks a replica; empty: prefix for llamacpp and vllm, "
        "least_loaded for sim",
        json_schema_extra={"enum": ["", *ROUTINGS]},
    )


class ScalingIn(_Documented):
    min: int = Field(1, ge=0, le=MAX_REPLICAS, description="replicas it always runs")
    max: int | None = Field(
        None, ge=0, le=MAX_REPLICAS, description="the most under load; left out, follows min"
    )
    idle_timeout: int = Field(
        600,
        ge=1,
        le=MAX_IDLE_TIMEOUT_S,
        description="seconds an on-demand model (min 0) stays up unused",
    )
    target_waiting: float | None = Field(
        None, gt=0, description="requests waiting per ready replica that scale it up (1)"
    )
    kv_ceiling: float | None = Field(
        None,
        gt=0,
        le=1,
        description="the KV cache's use, on average, above which it scales up (not looked at)",
    )


class SloIn(_Documented):
    ttft_p95_ms: float | None = Field(None, gt=0, description="time to first token, p95")
    tpot_p95_ms: float | None = Field(None, gt=0, description="time per output token, p95")


class ModelIn(_Documented):
    """A runtime model (domain.md, Catalog); refused with a 400 and the reason when invalid."""

    name: str = Field(description="lowercase [a-z0-9][a-z0-9._-]*, at most 64")
    aliases: list[str] = Field(default_factory=list, description="unique across all names")
    description: str = ""
    source: str = Field("", description="a Hugging Face id org/name[:file], a path or a mirror")
    profiles: list[ProfileIn] = Field(min_length=1)
    scaling: ScalingIn | None = None
    class_: str = Field(
        "",
        alias="class",
        json_schema_extra={"enum": ["", *CLASSES]},
        description="empty: opportunistic when on demand, else standard",
    )
    owner: str = Field("", description="org:ID, team:ID, project:ID, or empty for shared")
    fallbacks: list[str] = Field(default_factory=list, description="other models' names")
    routing_profile: str = Field("chat", json_schema_extra={"enum": list(ROUTING_PROFILES)})
    slo: SloIn | None = None
    context_length: int | None = Field(None, ge=1, description="tokens")
    max_output: int | None = Field(None, ge=1, description="tokens; at most context_length")


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its nested models written in place of references.

    Pydantic points nested models at `#/$defs/...`, which means nothing inside an
    OpenAPI document; inlined, the schema can sit in an operation's `openapi_extra`.
    """
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                rest = {k: v for k, v in node.items() if k != "$ref"}
                return resolve({**defs[ref.removeprefix("#/$defs/")], **rest})
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


class ExplainOut(Schema):
    model: str
    unplaceable: bool
    reason: str
    explanation: list[dict]
    last_failure: FailureOut | None = None
    # The model's one-word status, as the models list says it ("failing", "waiting", …).
    status: str = ""
    # Its replicas waiting on their node installing the engine from the mirror.
    installing: list[str] = []
