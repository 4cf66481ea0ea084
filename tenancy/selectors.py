"""Tenancy reads: tokens, the tenancy tree, scope names and capacity quotas."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from llmgw.errors import Invalid
from llmgw.secrets import digest

from .models import ApiKey, CapacityQuota, Organization, Project, Team, Token
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


def quota_views(*, holdings: Iterable[Holding]) -> list[dict]:
    """Every quota as `GET /quotas` shows it, with what its scope holds now, by name."""
    policy = quota_policy_load()
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
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        "created_at": key.created_at.isoformat(),
        "created_by": key.created_by,
    }


def keys_list() -> list[dict]:
    """Every gateway key, newest first: one query."""
    return [key_view(k) for k in ApiKey.objects.select_related("project__team__org")]
