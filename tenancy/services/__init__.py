"""Tenancy writes: tokens, the tenancy tree, capacity quotas, scope limits, budgets, model
prices, usage and the audit trail; the console playground's key is in `playground`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from catalog.selectors import adapters_load, catalog_load
from llmgw.core.errors import Conflict, Invalid, NotFound
from llmgw.core.secrets import digest, keyed_digest, new_secret

from ..bands import BANDS
from ..models import (
    ApiKey,
    AuditEvent,
    Budget,
    CapacityQuota,
    Organization,
    PolicyRevision,
    Project,
    ScopeLimit,
    Team,
    Token,
)
from ..quota import RESOURCES, Resources
from ..scopes import KEY_RE
from ..selectors import ScopeTree, scope_find, scope_tree

log = logging.getLogger("llmgw.tenancy")

NAME_LENGTH = 100
# The largest figure the quota columns hold (PositiveIntegerField, on every backend).
_INT_MAX = 2**31 - 1


def token_create(*, name: str, kind: str = Token.ADMIN) -> tuple[Token, str]:
    """Store a new token's hash and return it with the secret, which is not kept anywhere."""
    if not name.strip():
        raise ValueError("A token needs a name.")
    if len(name.strip()) > Token._meta.get_field("name").max_length:
        raise ValueError("A token's name is at most 100 characters long.")
    secret = new_secret("llmgw_agt_" if kind == Token.AGENT else "llmgw_adm_")
    token = Token.objects.create(
        name=name.strip(), kind=kind, prefix=secret[:14], secret_hash=digest(secret)
    )
    return token, secret


def token_revoke(*, token: Token) -> None:
    Token.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())


def audit_record(*, actor: str, action: str, target: str, detail: dict | None = None) -> None:
    """Write who changed what, inside the caller's transaction when there is one; an actor
    that came with an admin token (llmgw.core.api.Actor) records that token beside it."""
    AuditEvent.objects.create(
        actor=actor[:150],
        token=getattr(actor, "token", "")[:130],
        action=action,
        target=target[:200],
        detail=detail or {},
    )


def policy_revision_bump() -> None:
    """Say that what the quota policy is built from changed: a quota, or the tenancy tree
    (a name or a parent). Call it in the writer's transaction, once per write, so the
    reconciler and every dry run read the policy again only when this counter moved."""
    if not PolicyRevision.objects.filter(pk=1).update(value=F("value") + 1):
        PolicyRevision.objects.get_or_create(pk=1, defaults={"value": 1})


def tree_name(value: object, *, what: str) -> str:
    """A name for the tenancy tree, stripped; Invalid with the reason when it cannot be one."""
    name = value.strip() if isinstance(value, str) else ""
    if not name:
        raise Invalid(f"{what} needs a name.")
    if len(name) > NAME_LENGTH:
        raise Invalid(f"{what}'s name is at most {NAME_LENGTH} characters long.")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise Invalid(f"{what}'s name may not contain control characters such as NUL.")
    if "/" in name:
        # The separator of paths such as Acme/ml: a name holding one could not be told apart.
        raise Invalid(f"{what}'s name may not contain '/', which separates Acme/ml/training.")
    if name.isdigit():
        raise Invalid(f"{what}'s name may not be digits alone, which would read as an ID.")
    return name


def _unique(rows, name: str, *, what: str) -> None:
    """Names are compared without case, as scope names are: Acme and acme would be one path."""
    taken = rows.filter(name__iexact=name).values_list("name", flat=True).first()
    if taken is not None:
        raise Conflict(f"there is already {what} named {taken}.")


def _found(rows, key: str):
    """The row a resolved scope key names; Invalid if it was removed since it was resolved."""
    found = rows.filter(pk=int(key.partition(":")[2])).first()
    if found is None:
        raise Invalid(f"{key} no longer exists.")
    return found


def _named(text: object, kind: str) -> str:
    """`Acme`, `org:Acme` or an ID, as the scope name `org:Acme`."""
    text = str(text).strip() if isinstance(text, str | int) and not isinstance(text, bool) else ""
    if not text:
        raise Invalid(f"Give the {kind} by its name or ID.")
    return text if text.lower().startswith(f"{kind}:") else f"{kind}:{text}"


def org_create(*, name: str, actor: str) -> Organization:
    """Add an organization; Invalid for a bad name, Conflict when the name is taken."""
    name = tree_name(name, what="An organization")
    try:
        with transaction.atomic():
            _unique(Organization.objects.all(), name, what="an organization")
            org = Organization.objects.create(name=name)
            audit_record(
                actor=actor, action="org.add", target=f"org:{org.pk}", detail={"name": name}
            )
            policy_revision_bump()
    except IntegrityError:  # added by someone else between the check and the write
        raise Conflict(f"there is already an organization named {name}.") from None
    log.info("organization %s (org:%s) added by %s", name, org.pk, actor)
    return org


def team_create(*, org: str | int, name: str, actor: str) -> Team:
    """Add a team to an organization named by name or ID; Invalid, or Conflict when taken."""
    name = tree_name(name, what="A team")
    try:
        with transaction.atomic():
            parent = _found(Organization.objects, scope_find(_named(org, "org")))
            _unique(parent.teams.all(), name, what=f"a team in {parent.name}")
            team = Team.objects.create(org=parent, name=name)
            audit_record(
                actor=actor,
                action="team.add",
                target=f"team:{team.pk}",
                detail={"org": f"org:{parent.pk}", "name": name},
            )
            policy_revision_bump()
    except IntegrityError:
        raise Conflict(f"there is already a team named {name} there.") from None
    log.info("team %s/%s (team:%s) added by %s", parent.name, name, team.pk, actor)
    return team


def project_create(*, team: str | int, name: str, actor: str) -> Project:
    """Add a project to a team named `Acme/ml` or by ID; Invalid, or Conflict when taken."""
    name = tree_name(name, what="A project")
    try:
        with transaction.atomic():
            parent = _found(Team.objects.select_related("org"), scope_find(_named(team, "team")))
            _unique(parent.projects.all(), name, what=f"a project in {parent}")
            project = Project.objects.create(team=parent, name=name)
            audit_record(
                actor=actor,
                action="project.add",
                target=f"project:{project.pk}",
                detail={"team": f"team:{parent.pk}", "name": name},
            )
            policy_revision_bump()
    except IntegrityError:
        raise Conflict(f"there is already a project named {name} there.") from None
    log.info("project %s/%s (project:%s) added by %s", parent, name, project.pk, actor)
    return project


# What each kind of the tree is called, its rows, and (for a row) its siblings, said as
# create says them.
_KINDS = {
    "org": (
        "An organization",
        lambda: Organization.objects,
        lambda row: (Organization.objects.all(), "an organization"),
    ),
    "team": (
        "A team",
        lambda: Team.objects.select_related("org"),
        lambda row: (row.org.teams.all(), f"a team in {row.org.name}"),
    ),
    "project": (
        "A project",
        lambda: Project.objects.select_related("team__org"),
        lambda row: (row.team.projects.all(), f"a project in {row.team}"),
    ),
}


def tree_rename(*, kind: str, scope: str | int, name: str, actor: str):
    """Rename an org, team or project named by its path or ID (`Acme/ml`, `team:7`, 7).
    Keys, quotas, limits and usage follow: they hold its ID. Invalid for a bad name or
    none such; Conflict when a sibling has the name."""
    what, rows, siblings = _KINDS[kind]
    name = tree_name(name, what=what)
    try:
        with transaction.atomic():
            row = _found(rows(), scope_find(_named(scope, kind)))
            old = row.name
            if old != name:
                others, among = siblings(row)
                _unique(others.exclude(pk=row.pk), name, what=among)
                row.name = name
                row.save(update_fields=["name"])
                audit_record(
                    actor=actor,
                    action=f"{kind}.rename",
                    target=f"{kind}:{row.pk}",
                    detail={"name": name, "was": old},
                )
                policy_revision_bump()
    except IntegrityError:
        raise Conflict(f"there is already {what.lower()} named {name} there.") from None
    if old != name:
        log.info("%s:%s renamed from %s to %s by %s", kind, row.pk, old, name, actor)
    return row


def _resources(given: Mapping | None, *, what: str) -> Resources:
    """GPUs, cores and memory GB, each a whole number of at least zero, or left out."""
    given = given or {}
    unknown = sorted(set(given) - set(RESOURCES), key=str)
    if unknown:
        raise Invalid(
            f"{what}: unknown resource {unknown[0]!r}; it takes gpus, cpu_cores and memory_gb."
        )
    figures = {}
    for r in RESOURCES:
        value = given.get(r)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(f"{what}: {r} must be a whole number, not {value!r}.")
        if value < 0:
            raise Invalid("a quota cannot be negative")
        if value > _INT_MAX:
            raise Invalid(f"{what}: {r} is too large ({value}); at most {_INT_MAX}.")
        figures[r] = value
    return Resources(**figures)


def _described(guarantee: Resources, limit: Resources) -> str:
    def one(res: Resources) -> str:
        return ", ".join(f"{k} {v}" for k, v in res.as_dict().items()) or "none"

    return f"guarantee {one(guarantee)}; limit {one(limit)}"


def quota_set(*, scope: str, guarantee: Mapping | None, limit: Mapping | None, actor: str) -> str:
    """Set a scope's guarantee and limit, replacing what it had; return its key (`team:7`).

    The scope is named by path or ID. Raises Invalid when neither a guarantee nor
    a limit is given, for a negative figure, or a guarantee above its limit.
    """
    wanted, most = _resources(guarantee, what="guarantee"), _resources(limit, what="limit")
    if not wanted.any() and not most.any():
        raise Invalid("a quota needs a guarantee or a limit; to remove one, DELETE it")
    for r in RESOURCES:
        g, lim = getattr(wanted, r), getattr(most, r)
        if g is not None and lim is not None and g > lim:
            raise Invalid(f"the guarantee of {r} ({g}) is above its limit ({lim}).")
    with transaction.atomic():
        tree = scope_tree()
        key = scope_find(scope, tree=tree)
        old = CapacityQuota.objects.filter(scope=key).first()
        before = _described(_row_resources(old, "guarantee"), _row_resources(old, "limit"))
        CapacityQuota.objects.update_or_create(
            scope=key,
            defaults={
                **{f"guarantee_{r}": getattr(wanted, r) for r in RESOURCES},
                **{f"limit_{r}": getattr(most, r) for r in RESOURCES},
                "updated_by": actor,
            },
        )
        audit_record(
            actor=actor,
            action="quota.set",
            target=key,
            detail={"guarantee": wanted.as_dict(), "limit": most.as_dict()},
        )
        policy_revision_bump()
    log.info(
        "quota of %s (%s) set by %s: %s (was %s)",
        _written(tree, key),
        key,
        actor,
        _described(wanted, most),
        before if old else "no quota",
        extra={
            "event": "quota",
            "scope": key,
            "guarantee": wanted.as_dict(),
            "limit": most.as_dict(),
            "actor": actor,
        },
    )
    return key


def _row_resources(row: CapacityQuota | None, side: str) -> Resources:
    if row is None:
        return Resources()
    return Resources(**{r: getattr(row, f"{side}_{r}") for r in RESOURCES})


def _stored_scope(scope: object, tree: ScopeTree, rows) -> str:
    """The scope's key; or, for a scope since deleted, its key as stored in `rows`' table."""
    try:
        return scope_find(scope, tree=tree)
    except Invalid:
        # Only a stored key is looked up as it is (PostgreSQL refuses a NUL in a query).
        if (
            not isinstance(scope, str)
            or not KEY_RE.match(scope.strip())
            or not rows.objects.filter(scope=scope.strip()).exists()
        ):
            raise
        return scope.strip()


def quota_clear(*, scope: str, actor: str) -> str:
    """Remove a scope's quota; return its key. NotFound when it has none.

    A quota whose scope was since deleted can still be removed by its key (`org:9`).
    """
    return _scoped_clear(
        CapacityQuota,
        find=lambda tree: _stored_scope(scope, tree, CapacityQuota),
        actor=actor,
        event="quota",
        lacks="capacity quota",
        noun="quota",
        was=lambda old: _described(_row_resources(old, "guarantee"), _row_resources(old, "limit")),
        extra={"guarantee": {}, "limit": {}},
        policy=True,
    )


def _scoped_clear(
    rows: type[CapacityQuota] | type[ScopeLimit] | type[Budget],
    *,
    find: Callable[[ScopeTree], str],
    actor: str,
    event: str,
    lacks: str,
    noun: str,
    was: Callable[[Any], str] | None = None,
    extra: Mapping[str, object] | None = None,
    policy: bool = False,
) -> str:
    """Delete the row of `rows` at the scope `find` names in the tree, audited as
    `<event>.clear` by `actor` in one transaction (and the policy revision bumped where
    `policy`), then logged as "<noun> of <scope> removed by <actor>", with what it `was`.
    Returns the scope's key; NotFound ("... has no <lacks>.") when it has no such row."""
    with transaction.atomic():
        tree = scope_tree()
        key = find(tree)
        old = rows.objects.filter(scope=key).first()
        if old is None:
            raise NotFound(f"{_written(tree, key)} has no {lacks}.")
        old.delete()
        audit_record(actor=actor, action=f"{event}.clear", target=key)
        if policy:
            policy_revision_bump()
    said = f"{noun} of %s (%s) removed by %s" + (" (was %s)" if was else "")
    log.info(
        said,
        _written(tree, key),
        key,
        actor,
        *([was(old)] if was else []),
        extra={"event": event, "scope": key, **(extra or {}), "actor": actor},
    )
    return key


def _written(tree: ScopeTree, key: str) -> str:
    return tree.names.get(key, key)


# A gateway key's secret starts so; its first KEY_PREFIX_LENGTH characters name it in lists.
KEY_SECRET_PREFIX = "llmgw_key_"
KEY_PREFIX_LENGTH = 14
_LIMITS = ("requests_per_minute", "tokens_per_minute")
# A key's limits add a cap on what one request may ask for.
_KEY_LIMITS = (*_LIMITS, "max_tokens")
# Far above any real limit, and within what the columns hold.
_LIMIT_MOST = 2**31 - 1


def api_key_models(models: object) -> list[str]:
    """The models a key may use, checked against the catalog; [] is every model."""
    if models is None:
        return []
    if not isinstance(models, list | tuple) or not all(isinstance(m, str) for m in models):
        raise Invalid(
            "models must be a list of model names; left out, the key may use every model."
        )
    known = catalog_load()
    names = {n for spec in known.values() for n in (spec.name, *spec.aliases)}
    # A key may be limited to adapters too (docs/adapters.md).
    names |= {n for a in adapters_load().values() for n in (a.name, *a.aliases)}
    unknown = sorted(set(models) - names)
    if unknown:
        raise Invalid(f"there is no model {unknown[0]!r}; a key may be limited to existing models.")
    return list(dict.fromkeys(models))


def limit_figures(
    limits: Mapping | None, fields: tuple[str, ...] = _LIMITS
) -> dict[str, int | None]:
    """Requests and tokens per minute (and, for a key, `max_tokens`), each a whole number
    from 1 or left out (None: not limited), as keys and scopes take them; Invalid with the
    reason otherwise.

    Zero is refused rather than read as "nothing at all": it would refuse every request
    with a Retry-After that never comes true; revoking the keys says that plainly.
    """
    given = dict(limits or {})
    unknown = sorted(set(given) - set(fields), key=str)
    if unknown:
        raise Invalid(f"limits has an unknown field {unknown[0]!r}; it takes {', '.join(fields)}.")
    out: dict[str, int | None] = {}
    for name in fields:
        value = given.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _LIMIT_MOST
        ):
            raise Invalid(f"{name} must be a whole number from 1 to {_LIMIT_MOST}, not {value!r}.")
        out[name] = value
    return out


def api_key_create(
    *,
    project: str | int,
    name: object,
    models: object = None,
    limits: Mapping | None = None,
    band: object = "",
    actor: str,
) -> tuple[ApiKey, str]:
    """Make a gateway key for a project (by path `Acme/ml/training` or ID); return it with its
    secret, which is stored nowhere: only a prefix and a keyed hash of it are kept. Its band
    (`low`, `normal`, `high`) left empty is its project's."""
    from django.conf import settings

    name = tree_name(name, what="an API key")
    band = band_checked(band, blank=True)
    allowed = api_key_models(models)
    figures = limit_figures(limits, _KEY_LIMITS)
    with transaction.atomic():
        key_scope = scope_find(f"project:{project}".strip())
        row = Project.objects.get(pk=int(key_scope.partition(":")[2]))
        secret = new_secret(KEY_SECRET_PREFIX)
        key = ApiKey.objects.create(
            project=row,
            name=name,
            prefix=secret[:KEY_PREFIX_LENGTH],
            secret_hash=keyed_digest(settings.SECRET_KEY, secret),
            models_allowed=allowed,
            created_by=actor[:150],
            band=band,
            **figures,
        )
        detail = {"project": key_scope, "name": name, "models": allowed, **figures}
        audit_record(
            actor=actor,
            action="key.add",
            target=f"key:{key.pk}",
            detail={**detail, "band": band} if band else detail,
        )
    log.info(
        "API key %s (%s…) for %s made by %s",
        name,
        key.prefix,
        row,
        actor,
        extra={"event": "key", "key": key.pk, "project": key_scope, "actor": actor},
    )
    return key, secret


def api_key_revoke(*, key_id: int, actor: str) -> ApiKey:
    """Revoke a key: the gateway refuses it from then on. NotFound for no such key; revoking
    a revoked key changes nothing."""
    with transaction.atomic():
        key = ApiKey.objects.filter(pk=key_id).first()
        if key is None:
            raise NotFound(f"There is no API key {key_id}.")
        # Compare-and-set: a key revoked meanwhile is not revoked (or recorded) twice.
        if ApiKey.objects.filter(pk=key_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        ):
            audit_record(actor=actor, action="key.revoke", target=f"key:{key_id}")
            log.info("API key %s (%s…) revoked by %s", key.name, key.prefix, actor)
        key.refresh_from_db()
    return key


def _limits_described(figures: Mapping[str, int | None] | None) -> str:
    """`60 requests/min, tokens not limited`; `no limits` for a scope without a row."""
    if figures is None:
        return "no limits"
    rpm, tpm = figures.get("requests_per_minute"), figures.get("tokens_per_minute")
    return ", ".join(
        [
            "requests not limited" if rpm is None else f"{rpm} requests/min",
            "tokens not limited" if tpm is None else f"{tpm} tokens/min",
        ]
    )


def _limit_row_figures(row: ScopeLimit | None) -> dict[str, int | None] | None:
    if row is None:
        return None
    return {name: getattr(row, name) for name in _LIMITS}


def limit_set(
    *,
    scope: str,
    requests_per_minute: object = None,
    tokens_per_minute: object = None,
    actor: str,
) -> str:
    """Set a scope's requests and tokens per minute, replacing what it had; return its key
    (`team:7`). A figure left out (None) is not limited.

    The scope is named by path or ID. Raises Invalid when neither figure is given, for a
    figure that is not a whole number from 1, or a scope that names none or several.
    """
    figures = limit_figures(
        {"requests_per_minute": requests_per_minute, "tokens_per_minute": tokens_per_minute}
    )
    if all(v is None for v in figures.values()):
        raise Invalid(
            "a limit needs requests_per_minute or tokens_per_minute; to remove one, DELETE it"
        )
    with transaction.atomic():
        tree = scope_tree()
        key = scope_find(scope, tree=tree)
        before = _limit_row_figures(ScopeLimit.objects.filter(scope=key).first())
        ScopeLimit.objects.update_or_create(
            scope=key, defaults={**figures, "updated_by": actor[:150]}
        )
        audit_record(actor=actor, action="limit.set", target=key, detail=figures)
    log.info(
        "limits of %s (%s) set by %s: %s (was %s)",
        _written(tree, key),
        key,
        actor,
        _limits_described(figures),
        _limits_described(before),
        extra={"event": "limit", "scope": key, **figures, "actor": actor},
    )
    return key


def limit_clear(*, scope: str, actor: str) -> str:
    """Remove a scope's request and token limits; return its key. NotFound when it has none.

    A limit whose scope was since deleted can still be removed by its key (`org:9`).
    """
    return _scoped_clear(
        ScopeLimit,
        find=lambda tree: _stored_scope(scope, tree, ScopeLimit),
        actor=actor,
        event="limit",
        lacks="request limits",
        noun="limits",
        was=lambda old: _limits_described(_limit_row_figures(old)),
    )


def band_checked(band: object, *, blank: bool = False) -> str:
    """`band` as stored: one of BANDS, or empty (its project's) where `blank` allows."""
    text = band.strip().lower() if isinstance(band, str) else band
    if (blank and text in ("", None)) or text in BANDS:
        return text or ""
    allowed = ", ".join(BANDS) + (", or empty for its project's" if blank else "")
    raise Invalid(f"a band is {allowed}; not {str(band)[:40]!r}.")
