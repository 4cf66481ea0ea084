"""The catalog API's shapes (interfaces.md, REST API: ModelView and the model actions)."""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict, Field


class ModelOut(Schema):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    aliases: list[str]
    description: str
    source: str
    ready: int
    desired: int
    min: int
    max: int
    idle_timeout: int
    on_demand: bool
    status: str
    reason: str
    class_: str = Field(alias="class")
    owner: str
    memory_gb: float | None
    cpu_cores: int | None
    measured_memory_gb: float | None
    warnings: list[str]
    preempted: int
    held_for: str
    unplaceable: bool
    parked: bool
    failures: int
    profiles: list[dict]
    fallbacks: list[str]
    routing_profile: str
    declared: bool


class ScaleIn(Schema):
    model_config = ConfigDict(extra="forbid")

    min: int | None = Field(default=None, ge=0, le=10_000)
    max: int | None = Field(default=None, ge=0, le=10_000)
    idle_timeout: int | None = Field(default=None, ge=1, le=30 * 86400)


class ExplainOut(Schema):
    model: str
    unplaceable: bool
    reason: str
    explanation: list[dict]
