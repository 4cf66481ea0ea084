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


class PlanOut(Schema):
    architecture: str
    parameters: int
    quantization: str
    context_length: int
    ctx: int
    memory_gb: int
    cpu_cores: int
    basis: str
    fits: list[str]
    blocked: list[str]


class EngineBuildOut(Schema):
    id: int
    engine: str
    version: str
    platform: str
    sha256: str
    size: int
    added_by: str
    added_at: datetime
