"""Tenancy reads: tokens, the tenancy tree, scope names, capacity quotas, scope limits, usage
reports, and budgets with their spend."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Count, Max, Q, Sum

from llmgw.core import clock
from llmgw.core.errors import Invalid, NotFound
from llmgw.core.ids import requests_named
from llmgw.core.secrets import digest

from .budgets import (
    ALLOWED,
    PERIODS,
    UNITS,
    Book,
    Budget,
    Price,
    Used,
    Verdict,
    spent_by_scope,
    unpriced,
    window,
)
from .models import (
    ApiKey,
    AuditEvent,
    Budget as BudgetRow,
    CapacityQuota,
    DailySpend,
    ModelPrice,
    Organization,
    PolicyRevision,
    Project,
    RequestRecord,
    ScopeLimit,
    Team,
    Token,
    Usage,
    UsageJournal,
)
from .quota import RESOURCES, ZERO, Holding, Policy, Quota, Resources
from .scopes import ScopeError, scope_resolve


def token_find(*, secret: str, kind: str) -> Token | None:
    """The live token of this kind whose secret this is, else None (never says which part was wrong)."""
    if not secret or len(secret) > 200:
        return None
    return Token.objects.filter(
        secret_hash=digest(secret), kind=kind, revoked_at__isnull=True
    ).first()


@dataclass(frozen=True)
class ScopeTree:
    """The tenancy tree read at one moment.

    `parents`: scope key (`team:7`) → the scopes above it, nearest first.
    `names`: scope key → how people write it (`team:Acme/ml`).
    """

    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)

    def path(self, key: str) -> str:
        """`Acme/ml` for `team:7`; the key itself for a scope that no longer exists."""
        name = self.names.get(key)
        return name.partition(":")[2] if name else key

    def display(self, key: str) -> str:
        """`Acme / ml`, as the quota list and pages show a scope."""
        name = self.names.get(key)
        return name.partition(":")[2].replace("/", " / ") if name else key


def scope_tree() -> ScopeTree:
    """Every organization, team and project with its parents and name: three queries."""
    parents: dict[str, tuple[str, ...]] = {}
    names: dict[str, str] = {}
    for org_id, org in Organization.objects.values_list("id", "name"):
        parents[f"org:{org_id}"] = ()
        names[f"org:{org_id}"] = f"org:{org}"
    for team_id, team, org_id, org in Team.objects.values_list("id", "name", "org_id", "org__name"):
        parents[f"team:{team_id}"] = (f"org:{org_id}",)
        names[f"team:{team_id}"] = f"team:{org}/{team}"
    for project_id, project, team_id, team, org_id, org in Project.objects.values_list(
        "id", "name", "team_id", "team__name", "team__org_id", "team__org__name"
    ):
        parents[f"project:{project_id}"] = (f"team:{team_id}", f"org:{org_id}")
        names[f"project:{project_id}"] = f"project:{org}/{team}/{project}"
    return ScopeTree(parents=parents, names=names)


def scope_named(key: str) -> str:
    """The name (`team:Acme/ml`) of the scope `key` (`team:7`), in one query; the key itself
    when it names nothing there is (a scope removed since)."""
    kind, _, raw = key.partition(":")
    if not raw.isdigit():
        return key
    pk = int(raw)
    if kind == "org":
        found = Organization.objects.filter(pk=pk).values_list("name").first()
    elif kind == "team":
        found = Team.objects.filter(pk=pk).values_list("org__name", "name").first()
    elif kind == "project":
        found = (
            Project.objects.filter(pk=pk)
            .values_list("team__org__name", "team__name", "name")
            .first()
        )
    else:
        found = None
    return f"{kind}:{'/'.join(found)}" if found else key


def scope_find(text: str, *, tree: ScopeTree | None = None) -> str:
    """The key (`team:7`) of the scope `text` names (`team:Acme/ml` or `team:7`); Invalid if none.

    Raises Invalid with the reason: not a scope name, no such scope, or several.
    """
    tree = tree or scope_tree()
    paths = {key: tree.path(key) for key in tree.names}
    try:
        return scope_resolve(text, paths)
    except ScopeError as exc:
        raise Invalid(str(exc)) from None


def _quota(row: CapacityQuota) -> Quota:
    return Quota(
        scope=row.scope,
        guarantee=Resources(**{r: getattr(row, f"guarantee_{r}") for r in RESOURCES}),
        limit=Resources(**{r: getattr(row, f"limit_{r}") for r in RESOURCES}),
        updated_by=row.updated_by,
        updated_at=row.updated_at,
    )


def quota_policy_load() -> Policy:
    """Every capacity quota with the tree it sits in, for the reconciler: four queries."""
    tree = scope_tree()
    quotas = [_quota(row) for row in CapacityQuota.objects.all()]
    return Policy.build(quotas, tree.parents, tree.names)


def quota_policy_revision() -> int:
    """The policy's change counter (a quota, or the tree, written): one small query."""
    return PolicyRevision.objects.filter(pk=1).values_list("value", flat=True).first() or 0


def quota_views(*, holdings: Iterable[Holding], policy: Policy | None = None) -> list[dict]:
    """Every quota as `GET /quotas` shows it, with what its scope holds now, by name: of
    `policy` when given (one already read), else read now."""
    policy = policy if policy is not None else quota_policy_load()
    tree = ScopeTree(parents=dict(policy.parents), names=dict(policy.names))
    usage = policy.usage(holdings)
    out = []
    for q in policy.quotas.values():
        out.append(
            {
                "scope": q.scope,
                "name": tree.display(q.scope),
                "guarantee": q.guarantee.as_dict(),
                "limit": q.limit.as_dict(),
                "holds": usage.get(q.scope, ZERO).as_dict(),
                "updated_by": q.updated_by,
                "updated_at": q.updated_at,
            }
        )
    out.sort(key=lambda v: (tree.path(v["scope"]).casefold(), v["scope"]))
    return out


def org_view(org: Organization) -> dict:
    return {"id": org.pk, "name": org.name}


def team_view(team: Team) -> dict:
    """A team with its organization's name and its path, `Acme/ml`."""
    return {"id": team.pk, "name": team.name, "org": team.org.name, "path": str(team)}


def project_view(project: Project) -> dict:
    """A project with its team's path and its own, `Acme/ml/training`."""
    return {
        "id": project.pk,
        "name": project.name,
        "team": str(project.team),
        "path": str(project),
    }


def orgs_list() -> list[dict]:
    return [org_view(o) for o in Organization.objects.all()]


def teams_list() -> list[dict]:
    """Every team, by organization and name: one query."""
    return [team_view(t) for t in Team.objects.select_related("org")]


def projects_list() -> list[dict]:
    """Every project, by organization, team and name: one query."""
    return [project_view(p) for p in Project.objects.select_related("team__org")]


def key_view(key: ApiKey) -> dict:
    """A gateway key as the API lists it: never its secret or hash."""
    return {
        "id": key.pk,
        "name": key.name,
        "prefix": key.prefix,
        "project": str(key.project),
        "models": list(key.models_allowed or ()),
        "requests_per_minute": key.requests_per_minute,
        "tokens_per_minute": key.tokens_per_minute,
        "max_tokens": key.max_tokens,
        "band": key.band or key.project.band,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        "created_at": key.created_at.isoformat(),
        "created_by": key.created_by,
    }


def keys_list() -> list[dict]:
    """Every gateway key, newest first: one query."""
    return [key_view(k) for k in ApiKey.objects.select_related("project__team__org")]


def limits_list() -> list[dict]:
    """Every scope's request and token limits, named as the quota list names scopes, in path
    order: four queries whatever their number."""
    tree = scope_tree()
    out = [
        {
            "scope": row.scope,
            "name": tree.display(row.scope),
            "requests_per_minute": row.requests_per_minute,
            "tokens_per_minute": row.tokens_per_minute,
            "updated_by": row.updated_by,
            "updated_at": row.updated_at,
        }
        for row in ScopeLimit.objects.all()
    ]
    out.sort(key=lambda v: (tree.path(v["scope"]).casefold(), v["scope"]))
    return out


USAGE_GROUPINGS = ("project", "key", "model")
# How far back a report reaches when nobody says.
USAGE_DEFAULT_SPAN = timedelta(hours=24)
# Usage rows filtered to a scope by the column that holds that kind's ID.
_SCOPE_COLUMNS = {
    "org": "project__team__org_id",
    "team": "project__team_id",
    "project": "project_id",
}


def usage_since(text: str | None, *, now: datetime) -> datetime:
    """When a usage report starts: an ISO 8601 time or a span back from `now`
    (llmgw.core.clock.since), or a day before `now` when none is given."""
    if text is None or not text.strip():
        return now - USAGE_DEFAULT_SPAN
    return clock.since(text, now=now)


def usage_report(*, scope: str | None, since: datetime, by: str) -> dict:
    """What the gateway recorded from `since` on, for the projects under `scope` (everywhere
    when None), summed per project, key or model and always per model, busiest first.

    Each row names its project (`scope` `project:12`, `name` `Acme / ml / training`) and, by
    key, the key (`ci (llmgw_key_ab…)`); `avg_latency_ms` is None for a row of no requests.
    One aggregate query, and three more for the tree when rows name projects or a scope is
    given. Raises Invalid for a scope that names none or several, or an unknown `by`.
    """
    if by not in USAGE_GROUPINGS:
        raise Invalid(f"by must be project, key or model, not {str(by)[:40]!r}.")
    tree = scope_tree() if scope or by != "model" else ScopeTree()
    rows = Usage.objects.filter(bucket__gte=since)
    key = None
    if scope:
        key = scope_find(scope, tree=tree)
        kind, _, scope_id = key.partition(":")
        rows = rows.filter(**{_SCOPE_COLUMNS[kind]: int(scope_id)})
    columns = {
        "project": ["project_id", "model"],
        "key": ["api_key_id", "api_key__name", "api_key__prefix", "project_id", "model"],
        "model": ["model"],
    }[by]
    # Named apart from the model's own columns, which an annotation may not shadow.
    sums = rows.values(*columns).annotate(
        n_requests=Sum("requests"),
        n_errors=Sum("errors"),
        n_prompt=Sum("prompt_tokens"),
        n_completion=Sum("completion_tokens"),
        n_latency=Sum("latency_ms_total"),
        n_estimated=Sum("estimated_tokens"),
    )
    out = [_usage_row(found, tree) for found in sums.order_by("-n_requests", *columns)]
    return {
        "scope": key,
        "name": tree.display(key) if key else None,
        "since": since,
        "by": by,
        "rows": out,
    }


def _usage_row(found: dict, tree: ScopeTree) -> dict:
    project = f"project:{found['project_id']}" if "project_id" in found else None
    requests = found["n_requests"] or 0
    return {
        "scope": project,
        "name": tree.display(project) if project else None,
        "key": f"{found['api_key__name']} ({found['api_key__prefix']}…)"
        if "api_key_id" in found
        else None,
        "key_id": found.get("api_key_id"),
        "model": found["model"],
        "requests": requests,
        "errors": found["n_errors"] or 0,
        "prompt_tokens": found["n_prompt"] or 0,
        "completion_tokens": found["n_completion"] or 0,
        "estimated_tokens": found["n_estimated"] or 0,
        "avg_latency_ms": round(found["n_latency"] / requests, 1) if requests else None,
    }


REQUESTS_FOUND_MOST = 20  # records of one id shown, the latest first


def request_records_find(*, request_id: str, keep_hours: float, now: datetime) -> dict:
    """The gateway's records of the request a caller was told `request_id` (several when
    it sent the same id again), the latest first, each naming its key and project; the id
    of an answer in the Responses or Messages API (resp_…, msg_…) finds its request too
    (llmgw/core/ids.py). Raises
    NotFound, saying how long records are kept (`keep_hours`), when none is: one past
    that is not shown, though the hourly expiry may not have deleted it yet."""
    kept = RequestRecord.objects.filter(
        request_id__in=requests_named(request_id), at__gt=now - timedelta(hours=keep_hours)
    )
    found = list(kept.order_by("-at", "-pk")[:REQUESTS_FOUND_MOST])
    if not found:
        raise NotFound(_not_kept(request_id, keep_hours))
    tree = scope_tree()
    keys = {
        pk: f"{name} ({prefix}…)"
        for pk, name, prefix in ApiKey.objects.filter(pk__in={r.key_id for r in found}).values_list(
            "pk", "name", "prefix"
        )
    }
    return {
        "request_id": request_id,
        "keep_hours": keep_hours,
        "records": [_request_view(r, tree, keys) for r in found],
    }


def _not_kept(request_id: str, keep_hours: float) -> str:
    if keep_hours <= 0:
        return (
            f"No request {request_id!r} is kept: the gateway keeps no request records "
            "(LLMGW_REQUESTS_KEEP_HOURS is 0). Search the servers' access logs for it."
        )
    return (
        f"No request {request_id!r} is kept. The gateway keeps each request's record for "
        f"{keep_hours:g} hours (LLMGW_REQUESTS_KEEP_HOURS) and writes it a few seconds after "
        "its answer; a request refused before its body was read (no key, a bad body) has "
        "none: search the servers' access logs for it."
    )


def _request_view(r: RequestRecord, tree: ScopeTree, keys: dict[int, str]) -> dict:
    project = f"project:{r.project_id}"
    return {
        "request_id": r.request_id,
        "at": r.at,
        "key_id": r.key_id,
        "key": keys.get(r.key_id),  # None: deleted since
        "scope": project,
        "name": tree.display(project),
        "model": r.model,
        "endpoint": r.endpoint,
        "status": r.status,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "duration_ms": r.duration_ms,
        "replica": r.replica,
        "error": r.error,
    }


def usage_journal_state(*, name: str) -> tuple[int, bool]:
    """Of a gateway process's usage journal: the last batch the Usage rows hold (0 for none),
    and whether it was settled."""
    row = UsageJournal.objects.filter(name=name).values_list("batch", "settled").first()
    return row if row is not None else (0, False)


def keys_print() -> tuple:
    """A print of the keys and the scopes' limits that moves when any of them changes: the
    gateway reads them again only then (or every so often)."""
    keys = ApiKey.objects.aggregate(
        n=Count("id"), top=Max("id"), revoked=Count("revoked_at"), last=Max("revoked_at")
    )
    limits = ScopeLimit.objects.aggregate(n=Count("id"), last=Max("updated_at"))
    return (*keys.values(), *limits.values())


def key_rows() -> list[tuple]:
    """Every key not revoked, as the gateway admits by: (id, name, prefix, secret hash,
    project id, models allowed, requests per minute, tokens per minute, max tokens, band:
    its own, or else its project's)."""
    return [
        (i, n, pre, d, p, tuple(m or ()), rpm, tpm, cap, band or project_band)
        for i, n, pre, d, p, m, rpm, tpm, cap, band, project_band in ApiKey.objects.filter(
            revoked_at__isnull=True
        ).values_list(
            "id",
            "name",
            "prefix",
            "secret_hash",
            "project_id",
            "models_allowed",
            "requests_per_minute",
            "tokens_per_minute",
            "max_tokens",
            "band",
            "project__band",
        )
    ]


def scope_limits() -> dict[str, tuple[int | None, int | None]]:
    """scope -> (requests per minute, tokens per minute), for every scope that limits either."""
    return {
        s: (rpm, tpm)
        for s, rpm, tpm in ScopeLimit.objects.values_list(
            "scope", "requests_per_minute", "tokens_per_minute"
        )
        if rpm is not None or tpm is not None
    }


def audit_rows(
    *,
    prefix: str = "",
    target: str | None = None,
    since: datetime | None = None,
    before: datetime | None = None,
    limit: int,
) -> list[tuple]:
    """Who changed what, newest first: (id, at, actor, action, target, detail), the actions
    starting with `prefix` (`model.`, `node.`), about `target` when given, at `since` or
    later and before `before`."""
    rows = AuditEvent.objects.all()
    if prefix:
        rows = rows.filter(action__startswith=prefix)
    if target is not None:
        rows = rows.filter(target=target)
    if since is not None:
        rows = rows.filter(at__gte=since)
    if before is not None:
        rows = rows.filter(at__lt=before)
    fields = ("id", "at", "actor", "action", "target", "detail")
    return list(rows.order_by("-at", "-id").values_list(*fields)[:limit])


# Spend budgets (tenancy/budgets.py): what each budgeted key and scope spent, read from the
# days' sums added with the usage rows, so every gateway process and server counts the same
# and a restart loses none.

# Usage rows under a budget's scope, by the column that holds its kind's ID.
_BUDGET_COLUMNS = {"key": "api_key_id", **_SCOPE_COLUMNS}
# Past this many budgets the spend is summed over every key rather than an OR of them all.
_BUDGETS_FILTERED = 50


def _budgets(rows) -> list[Budget]:
    """The Budget rows as the rules take them: one per figure set."""
    out = []
    for row in rows:
        for unit in UNITS:
            for period in PERIODS:
                amount = getattr(row, f"{unit}_per_{period}")
                if amount is not None:
                    out.append(Budget(row.scope, period, unit, Decimal(amount)))
    return out


def prices_load() -> dict[str, Price]:
    """model name → its price: one query."""
    return {
        m: Price(Decimal(p), Decimal(c))
        for m, p, c in ModelPrice.objects.values_list(
            "model", "prompt_per_million", "completion_per_million"
        )
    }


def _used(budgets: list[Budget], now: datetime) -> list[Used]:
    """Usage this UTC month and this UTC day, per key and model, of the keys under the
    budgets' scopes, from the days' sums kept beside the usage rows: one aggregate query."""
    month, day = window("month", now)[0].date(), window("day", now)[0].date()
    rows = DailySpend.objects.filter(day__gte=month, day__lte=day)
    scopes = {b.scope for b in budgets}
    if len(scopes) <= _BUDGETS_FILTERED:
        under = Q()
        for scope in scopes:
            kind, _, raw = scope.partition(":")
            under |= Q(**{_BUDGET_COLUMNS[kind]: int(raw)})
        rows = rows.filter(under)
    today = Q(day=day)
    sums = rows.values("api_key_id", "project_id", "model").annotate(
        m_prompt=Sum("prompt_tokens"),
        m_completion=Sum("completion_tokens"),
        d_prompt=Sum("prompt_tokens", filter=today),
        d_completion=Sum("completion_tokens", filter=today),
    )
    out = []
    for s in sums.order_by():
        common = (s["api_key_id"], s["project_id"], s["model"])
        out.append(Used("month", *common, s["m_prompt"] or 0, s["m_completion"] or 0))
        if s["d_prompt"] or s["d_completion"]:
            out.append(Used("day", *common, s["d_prompt"] or 0, s["d_completion"] or 0))
    return out


def _budget_names(tree: ScopeTree, scopes: Iterable[str]) -> dict[str, str]:
    """Every scope's name, and each budgeted key's: `key:ci (llmgw_key_ab…)`."""
    ids = [int(s.partition(":")[2]) for s in scopes if s.startswith("key:")]
    names = dict(tree.names)
    for pk, name, prefix in ApiKey.objects.filter(pk__in=ids).values_list("pk", "name", "prefix"):
        names[f"key:{pk}"] = f"key:{name} ({prefix}…)"
    return names


def _book(rows, now: datetime) -> tuple[Book, list[Used], ScopeTree]:
    budgets = _budgets(rows)
    tree = scope_tree()
    chains = {
        int(s.partition(":")[2]): (s, *up)
        for s, up in tree.parents.items()
        if s.startswith("project:")
    }
    used = _used(budgets, now) if budgets else []
    by_scope: dict[str, tuple[Budget, ...]] = {}
    for b in budgets:
        by_scope[b.scope] = (*by_scope.get(b.scope, ()), b)
    book = Book(
        budgets=by_scope,
        spent=spent_by_scope(used, chains, prices_load()) if used else {},
        names=_budget_names(tree, by_scope),
        read_at=now,
    )
    return book, used, tree


def budget_book(*, now: datetime) -> Book:
    """Every budget with what its scope spent this UTC day and month, as of `now`: for the
    gateway to keep in memory, read again every few seconds, and judge each request by
    (`Book.verdict`). At most seven queries however many budgets there are."""
    return _book(BudgetRow.objects.all(), now)[0]


def budget_verdict(*, chain: Iterable[str], now: datetime) -> Verdict:
    """What the budgets of `chain` (`key:3`, `project:12`, `team:7`, `org:9`, as the gateway
    holds a key's chain) say of one more request now: budgets.Verdict."""
    chain = tuple(chain)
    rows = BudgetRow.objects.filter(scope__in=chain)
    if not rows.exists():
        return ALLOWED
    return _book(rows, now)[0].verdict(chain, now)


def budgets_list(*, now: datetime) -> dict:
    """Every budget as `GET /budgets` shows it: its figures, what its scope spent this UTC day
    and month and when each resets, in path order; and the models used this month without a
    price, which cost budgets count as free."""
    rows = list(BudgetRow.objects.all())
    book, used, tree = _book(rows, now)
    resets = {p: window(p, now)[1] for p in PERIODS}
    out = []
    for row in rows:
        spent = {p: book.spent_now(row.scope, p, now) for p in PERIODS}
        out.append(
            {
                "scope": row.scope,
                "name": tree.display(row.scope)
                if row.scope in tree.names
                else book.names.get(row.scope, row.scope),
                **{f"{u}_per_{p}": getattr(row, f"{u}_per_{p}") for u in UNITS for p in PERIODS},
                "spent": {p: {"tokens": s.tokens, "cost": s.cost} for p, s in spent.items()},
                "resets_at": resets,
                "updated_by": row.updated_by,
                "updated_at": row.updated_at,
            }
        )
    out.sort(key=lambda v: (tree.path(v["scope"]).casefold(), v["scope"]))
    return {"budgets": out, "unpriced": unpriced(used, prices_load()), "read_at": now}


def prices_list() -> list[dict]:
    """Every model's price, by model name."""
    return list(
        ModelPrice.objects.values(
            "model", "prompt_per_million", "completion_per_million", "updated_by", "updated_at"
        )
    )
