"""The tenancy tree over REST: orgs, teams, projects, keys, quotas, limits, usage, budgets
and prices."""

from __future__ import annotations

from django.conf import settings
from ninja import Router, Status

from fleet.selectors.state import holdings_load
from llmgw.core import clock
from llmgw.core.api import actor

from . import selectors, services
from .auth import can
from .schemas import (
    BandIn,
    BandSetOut,
    BudgetClearOut,
    BudgetIn,
    BudgetSetOut,
    BudgetsOut,
    KeyIn,
    KeyMadeOut,
    KeyOut,
    KeyRevokedOut,
    LimitClearOut,
    LimitIn,
    LimitOut,
    LimitSetOut,
    OrgIn,
    OrgOut,
    PriceClearOut,
    PriceIn,
    PriceOut,
    PriceSetOut,
    ProjectIn,
    ProjectOut,
    QuotaClearOut,
    QuotaIn,
    QuotaOut,
    QuotaSetOut,
    RenameIn,
    RequestLookupOut,
    TeamIn,
    TeamOut,
    UsageOut,
)
from .services import bands as band_services, budgets as budget_services

router = Router(tags=["tenancy"])


@router.get("/orgs", response=list[OrgOut], auth=can("tenancy.view_organization"))
def orgs_list(request):
    return selectors.orgs_list()


@router.post("/orgs", response={201: OrgOut}, auth=can("tenancy.add_organization"))
def org_add(request, payload: OrgIn):
    org = services.org_create(name=payload.name, actor=actor(request))
    return Status(201, selectors.org_view(org))


@router.get("/teams", response=list[TeamOut], auth=can("tenancy.view_team"))
def teams_list(request):
    return selectors.teams_list()


@router.post("/teams", response={201: TeamOut}, auth=can("tenancy.add_team"))
def team_add(request, payload: TeamIn):
    team = services.team_create(org=payload.org, name=payload.name, actor=actor(request))
    return Status(201, selectors.team_view(team))


@router.get("/projects", response=list[ProjectOut], auth=can("tenancy.view_project"))
def projects_list(request):
    return selectors.projects_list()


@router.post("/projects", response={201: ProjectOut}, auth=can("tenancy.add_project"))
def project_add(request, payload: ProjectIn):
    project = services.project_create(team=payload.team, name=payload.name, actor=actor(request))
    return Status(201, selectors.project_view(project))


@router.patch("/orgs/{ref}", response=OrgOut, auth=can("tenancy.change_organization"))
def org_rename(request, ref: str, payload: RenameIn):
    org = services.tree_rename(kind="org", scope=ref, name=payload.name, actor=actor(request))
    return selectors.org_view(org)


@router.patch("/teams/{path:ref}", response=TeamOut, auth=can("tenancy.change_team"))
def team_rename(request, ref: str, payload: RenameIn):
    """The team as `Acme/ml` or its ID."""
    team = services.tree_rename(kind="team", scope=ref, name=payload.name, actor=actor(request))
    return selectors.team_view(team)


@router.patch("/projects/{path:ref}", response=ProjectOut, auth=can("tenancy.change_project"))
def project_rename(request, ref: str, payload: RenameIn):
    """The project as `Acme/ml/training` or its ID."""
    project = services.tree_rename(
        kind="project", scope=ref, name=payload.name, actor=actor(request)
    )
    return selectors.project_view(project)


@router.get("/quotas", response=list[QuotaOut], auth=can("tenancy.view_capacityquota"))
def quotas_list(request):
    """Every quota with what its scope holds now."""
    return selectors.quota_views(holdings=holdings_load())


@router.put("/quotas", response=QuotaSetOut, auth=can("tenancy.change_capacityquota"))
def quota_set(request, payload: QuotaIn):
    """Set a scope's guarantee and limit, replacing what it had."""
    key = services.quota_set(
        scope=payload.scope,
        guarantee=payload.guarantee.dict(exclude_none=True) if payload.guarantee else None,
        limit=payload.limit.dict(exclude_none=True) if payload.limit else None,
        actor=actor(request),
    )
    return {"scope": key}


# `path:` so that a name written with its slashes (team:Acme/ml, or %2F) reaches the handler.
@router.delete(
    "/quotas/{path:scope}", response=QuotaClearOut, auth=can("tenancy.delete_capacityquota")
)
def quota_clear(request, scope: str):
    return {"removed": services.quota_clear(scope=scope, actor=actor(request))}


@router.get("/keys", response=list[KeyOut], auth=can("tenancy.view_apikey"))
def keys_list(request):
    """Every gateway key, with its prefix; never a secret."""
    return selectors.keys_list()


@router.post("/keys", response={201: KeyMadeOut}, auth=can("tenancy.add_apikey"))
def key_add(request, payload: KeyIn):
    """A key for a project; its secret is in this answer only."""
    key, secret = services.api_key_create(
        project=payload.project,
        name=payload.name,
        models=payload.models,
        limits=payload.limits.dict() if payload.limits else None,
        band=payload.band,
        actor=actor(request),
    )
    return Status(201, {"id": key.pk, "name": key.name, "prefix": key.prefix, "secret": secret})


@router.delete("/keys/{key_id}", response=KeyRevokedOut, auth=can("tenancy.change_apikey"))
def key_revoke(request, key_id: int):
    """Revoke a key: the gateway refuses it from then on."""
    return {"revoked": services.api_key_revoke(key_id=key_id, actor=actor(request)).pk}


@router.put("/bands", response=BandSetOut, auth=can("tenancy.change_apikey"))
def band_set(request, payload: BandIn):
    """A key's or a project's priority band under overload (docs/gateway.md, Priority)."""
    scope = band_services.band_set(scope=payload.scope, band=payload.band, actor=actor(request))
    return {"scope": scope, "band": payload.band.strip().lower()}


@router.get("/limits", response=list[LimitOut], auth=can("tenancy.view_scopelimit"))
def limits_list(request):
    """Every scope's requests and tokens per minute."""
    return selectors.limits_list()


@router.put("/limits", response=LimitSetOut, auth=can("tenancy.change_scopelimit"))
def limit_set(request, payload: LimitIn):
    """Set a scope's requests and tokens per minute, replacing what it had."""
    key = services.limit_set(
        scope=payload.scope,
        requests_per_minute=payload.requests_per_minute,
        tokens_per_minute=payload.tokens_per_minute,
        actor=actor(request),
    )
    return {"scope": key}


@router.delete(
    "/limits/{path:scope}", response=LimitClearOut, auth=can("tenancy.delete_scopelimit")
)
def limit_clear(request, scope: str):
    return {"removed": services.limit_clear(scope=scope, actor=actor(request))}


@router.get("/usage", response=UsageOut, auth=can("tenancy.view_usage"))
def usage_report(request, scope: str | None = None, since: str | None = None, by: str = "project"):
    """Requests, errors, tokens and average latency per project, key or model, and per model,
    since a time (ISO 8601) or a span back (`15m`, `24h`, `7d`; a day by default)."""
    return selectors.usage_report(
        scope=scope or None, since=selectors.usage_since(since, now=clock.now()), by=by
    )


@router.get(
    "/usage/requests/{request_id}", response=RequestLookupOut, auth=can("tenancy.view_usage")
)
def usage_request(request, request_id: str):
    """One request found by the id its caller was told (x-request-id): its key, model,
    endpoint, status, tokens, duration, replica and error; 404, saying how long records
    are kept, when it is not (or no longer) kept."""
    return selectors.request_records_find(
        request_id=request_id, keep_hours=settings.LLMGW.requests_keep_hours, now=clock.now()
    )


@router.get("/budgets", response=BudgetsOut, auth=can("tenancy.view_budget"))
def budgets_list(request):
    """Every budget with what its key or scope spent this UTC day and month."""
    return selectors.budgets_list(now=clock.now())


@router.put("/budgets", response=BudgetSetOut, auth=can("tenancy.change_budget"))
def budget_set(request, payload: BudgetIn):
    """Set a key's or scope's budgets, replacing what it had."""
    figures = payload.dict(exclude={"scope"})
    key = budget_services.budget_set(scope=payload.scope, actor=actor(request), **figures)
    return {"scope": key}


@router.delete("/budgets/{path:scope}", response=BudgetClearOut, auth=can("tenancy.delete_budget"))
def budget_clear(request, scope: str):
    return {"removed": budget_services.budget_clear(scope=scope, actor=actor(request))}


@router.get("/prices", response=list[PriceOut], auth=can("tenancy.view_modelprice"))
def prices_list(request):
    """Every model's price per million prompt and completion tokens."""
    return selectors.prices_list()


@router.put("/prices", response=PriceSetOut, auth=can("tenancy.change_modelprice"))
def price_set(request, payload: PriceIn):
    """Set a model's price, replacing what it had."""
    name = budget_services.price_set(
        model=payload.model,
        prompt_per_million=payload.prompt_per_million,
        completion_per_million=payload.completion_per_million,
        actor=actor(request),
    )
    return {"model": name}


@router.delete(
    "/prices/{path:model}", response=PriceClearOut, auth=can("tenancy.delete_modelprice")
)
def price_clear(request, model: str):
    return {"removed": budget_services.price_clear(model=model, actor=actor(request))}
