"""The mirror API's shapes (interfaces.md, Weights)."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import ConfigDict, StrictStr


class WeightsIn(Schema):
    model_config = ConfigDict(extra="forbid")

    source: StrictStr
    sha256: StrictStr = ""


class WeightFileOut(Schema):
    path: str
    size: int | None
    sha256: str | None
    state: str
    bytes_done: int
    detail: str


class WeightsOut(Schema):
    id: int
    source: str
    revision: str
    state: str
    detail: str
    bytes_done: int
    bytes_total: int | None
    files: list[WeightFileOut]
    added_by: str
    added_at: datetime
    last_used_at: datetime | None
    models: list[str]


class PlanQuery(Schema):
    ctx: int | None = None
    file: str | None = None
    gpu_memory_utilization: float | None = None
    # Labels a node must have, as `key=value,key=value`.
    selector: str | None = None
    # The scope whose capacity limit is asked about (by name or id).
    owner: str | None = None
    # vLLM's --kv-cache-dtype: auto (the model's 16-bit dtype) or fp8.
    kv_cache_dtype: str | None = None


class GpuPlanOut(Schema):
    gpu_class: str
    gpu_memory_gb: float
    gpu_memory_utilization: float
    tp: int | None
    nodes: int | None
    sequences: int | None
    kv_tokens: int | None
    free_per_gpu_gb: float | None
    said: str
    fits: list[str]
    blocked: list[str]
    quota: str | None


class PlanOut(Schema):
    format: str
    architecture: str
    parameters: int
    quantization: str
    context_length: int
    ctx: int
    # None for a safetensors model: a GPU profile reserves no host memory or cores.
    memory_gb: int | None
    cpu_cores: int | None
    basis: str
    fits: list[str]
    blocked: list[str]
    quota: str | None
    weights_bytes: int
    bytes_by_dtype: dict[str, int] | None = None
    kv_bytes_per_token: int
    gpu_memory_utilization: float
    gpus: list[GpuPlanOut]


class EngineBuildOut(Schema):
    id: int
    engine: str
    version: str
    platform: str
    sha256: str
    size: int
    added_by: str
    added_at: datetime
