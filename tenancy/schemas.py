"""The tenancy API's shapes (interfaces.md, REST API: orgs, teams, projects and quotas).

Types only: names and figures are judged by tenancy.services, in sentences.
"""

from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import ConfigDict, Field, StrictFloat, StrictInt, StrictStr


class _In(Schema):
    model_config = ConfigDict(extra="forbid")


class OrgIn(_In):
    name: StrictStr


class OrgOut(Schema):
    id: int
    name: str


class TeamIn(_In):
    org: StrictStr | StrictInt = Field(description="the organization's name or ID")
    name: StrictStr


class TeamOut(Schema):
    id: int
    name: str
    org: str = Field(description="the organization's name")
    path: str = Field(description="Acme/ml")


class ProjectIn(_In):
    team: StrictStr | StrictInt = Field(description="the team as Acme/ml, or its ID")
    name: StrictStr


class ProjectOut(Schema):
    id: int
    name: str
    team: str = Field(description="the team's path, Acme/ml")
    path: str = Field(description="Acme/ml/training")


class RenameIn(_In):
    name: StrictStr = Field(description="the new name")


class ResourcesIn(_In):
    """Each resource a whole number; one left out is not governed."""

    gpus: StrictInt | None = None
    cpu_cores: StrictInt | None = None
    memory_gb: StrictInt | None = None


class QuotaIn(_In):
    scope: StrictStr = Field(description="org:Acme, team:Acme/ml, project:Acme/ml/training or ID")
    guarantee: ResourcesIn | None = None
    limit: ResourcesIn | None = None


class HoldsOut(Schema):
    gpus: int
    cpu_cores: int
    memory_gb: float


class QuotaOut(Schema):
    scope: str = Field(description="team:ID")
    name: str = Field(description="Acme / ml")
    guarantee: dict[str, int] = Field(description="only the governed resources")
    limit: dict[str, int] = Field(description="only the governed resources")
    holds: HoldsOut
    updated_by: str
    updated_at: datetime | None


class QuotaSetOut(Schema):
    scope: str


class QuotaClearOut(Schema):
    removed: str


class KeyLimitsIn(_In):
    requests_per_minute: StrictInt | None = None
    tokens_per_minute: StrictInt | None = None
    max_tokens: StrictInt | None = Field(
        None, description="the most completion tokens one request may ask for"
    )


class KeyIn(_In):
    project: StrictStr | StrictInt = Field(description="Acme/ml/training or the project's ID")
    name: StrictStr
    models: list[StrictStr] | None = Field(None, description="left out: every model")
    limits: KeyLimitsIn | None = None
    band: StrictStr = Field("", description="low, normal or high; left out: its project's")


class BandIn(_In):
    scope: StrictStr = Field(description="key:ID, or a project: project:Acme/ml/training")
    band: StrictStr = Field(description="low, normal or high; for a key, empty: its project's")


class BandSetOut(Schema):
    scope: str
    band: str


class KeyMadeOut(Schema):
    id: int
    name: str
    prefix: str
    secret: str = Field(description="shown only here, once")


class KeyOut(Schema):
    id: int
    name: str
    prefix: str
    project: str
    models: list[str]
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_tokens: int | None = Field(description="null: requests may ask for any max_tokens")
    band: str = Field(description="its priority under overload: its own or its project's")
    revoked_at: str | None
    created_at: str
    created_by: str


class KeyRevokedOut(Schema):
    revoked: int


class LimitIn(_In):
    """Each figure a whole number from 1; one left out is not limited."""

    scope: StrictStr = Field(description="org:Acme, team:Acme/ml, project:Acme/ml/training or ID")
    requests_per_minute: StrictInt | None = None
    tokens_per_minute: StrictInt | None = None


class LimitOut(Schema):
    scope: str = Field(description="team:ID")
    name: str = Field(description="Acme / ml")
    requests_per_minute: int | None = Field(description="null: not limited")
    tokens_per_minute: int | None = Field(description="null: not limited")
    updated_by: str
    updated_at: datetime | None


class LimitSetOut(Schema):
    scope: str


class LimitClearOut(Schema):
    removed: str


class UsageRowOut(Schema):
    scope: str | None = Field(description="project:ID; null when by model")
    name: str | None = Field(description="the project, Acme / ml / training; null when by model")
    key: str | None = Field(description='the key, "ci (llmgw_key_ab…)"; null unless by key')
    key_id: int | None = Field(description="null unless by key")
    model: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    estimated_tokens: int = Field(
        description="of prompt_tokens and completion_tokens, those no engine counted: "
        "estimated for requests cut before their engine's usage came"
    )
    avg_latency_ms: float | None = Field(description="per request; null with no requests")


class UsageOut(Schema):
    scope: str | None = Field(description="the scope asked for, team:ID; null for everywhere")
    name: str | None = Field(description="Acme / ml")
    since: datetime
    by: str = Field(description="project, key or model; rows are always split by model too")
    rows: list[UsageRowOut] = Field(description="the most requests first")


class RequestRecordOut(Schema):
    request_id: str
    at: datetime = Field(description="when it arrived")
    key_id: int
    key: str | None = Field(description='"ci (llmgw_key_ab…)"; null for a key deleted since')
    scope: str = Field(description="its key's project, project:ID")
    name: str = Field(description="the project, Acme / ml / training")
    model: str = Field(description="the catalog model that served it; blank if none was found")
    endpoint: str = Field(description="the path asked, /v1/chat/completions")
    status: int = Field(description="the HTTP status answered; 0 when none was sent")
    prompt_tokens: int
    completion_tokens: int
    duration_ms: int = Field(description="from its arrival to the end of its answer")
    replica: str = Field(description="the replica that answered; blank for none")
    error: str = Field(
        description="why it failed (limit, no_replica, upstream_status…); blank if not"
    )


class RequestLookupOut(Schema):
    request_id: str
    keep_hours: float = Field(description="how long records are kept (LLMGW_REQUESTS_KEEP_HOURS)")
    records: list[RequestRecordOut] = Field(
        description="the latest first; several when a caller sent the same id again"
    )


# A cost: a JSON number, or its text when every decimal place matters (`"0.1500"`).
Cost = StrictInt | StrictFloat | StrictStr


class BudgetIn(_In):
    """Each figure above zero; one left out is not budgeted."""

    scope: StrictStr = Field(
        description="key:ID, org:Acme, team:Acme/ml, project:Acme/ml/training or ID"
    )
    tokens_per_day: StrictInt | None = Field(None, description="prompt and completion tokens")
    tokens_per_month: StrictInt | None = None
    cost_per_day: Cost | None = Field(None, description="by the models' prices")
    cost_per_month: Cost | None = None


class SpentOut(Schema):
    tokens: int
    cost: float


class BudgetOut(Schema):
    scope: str = Field(description="team:ID or key:ID")
    name: str = Field(description="Acme / ml")
    tokens_per_day: int | None = Field(description="null: not budgeted")
    tokens_per_month: int | None
    cost_per_day: float | None
    cost_per_month: float | None
    spent: dict[str, SpentOut] = Field(description="this UTC day and this UTC month")
    resets_at: dict[str, datetime] = Field(description="when the day and the month end")
    updated_by: str
    updated_at: datetime | None


class BudgetsOut(Schema):
    budgets: list[BudgetOut]
    unpriced: list[str] = Field(
        description="models used this month without a price: cost budgets count them free"
    )
    read_at: datetime


class BudgetSetOut(Schema):
    scope: str


class BudgetClearOut(Schema):
    removed: str


class PriceIn(_In):
    model: StrictStr = Field(description="the model's name as the catalog has it")
    prompt_per_million: Cost
    completion_per_million: Cost


class PriceOut(Schema):
    model: str
    prompt_per_million: float
    completion_per_million: float
    updated_by: str
    updated_at: datetime | None


class PriceSetOut(Schema):
    model: str


class PriceClearOut(Schema):
    removed: str
