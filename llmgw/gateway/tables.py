"""What the gateway routes by, in memory: keys, models, ready replicas and scope limits.

`build` is pure: rows in, `Tables` out. `Loader` reads the rows, but only when a
cheap fingerprint of each table says it changed (checked about once a second),
and keeps the last good tables when the database is away: inference goes on.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from catalog.domain import ModelSpec
from llmgw.secrets import engine_key

log = logging.getLogger("llmgw.gateway")


@dataclass(frozen=True, slots=True)
class Key:
    """A usable API key: who it belongs to, up the tree, and what it may do."""

    id: int
    name: str
    prefix: str
    project_id: int
    scopes: tuple[str, ...]  # its project, team and org: "project:3", "team:2", "org:1"
    models: frozenset[str] | None  # canonical names it may use; None is every model
    requests_per_minute: int | None
    tokens_per_minute: int | None


@dataclass(frozen=True, slots=True)
class Upstream:
    """A ready replica's engine: where to send a request and the key it wants."""

    replica_id: str
    model: str
    url: str
    authorization: str
    weight: int


@dataclass(frozen=True)
class Tables:
    keys: Mapping[str, Key] = field(default_factory=dict)  # by keyed digest of the secret
    names: Mapping[str, str] = field(default_factory=dict)  # name or alias -> model name
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    upstreams: Mapping[str, tuple[Upstream, ...]] = field(default_factory=dict)
    starting: Mapping[str, int] = field(default_factory=dict)  # pending or starting replicas
    limits: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    scope_names: Mapping[str, str] = field(default_factory=dict)  # "team:2" -> "team:Acme/ml"

    def resolve(self, name: str) -> ModelSpec | None:
        canonical = self.names.get(name)
        return self.models.get(canonical) if canonical else None


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: int
    name: str
    prefix: str
    digest: str
    project_id: int
    models: tuple[str, ...]
    requests_per_minute: int | None
    tokens_per_minute: int | None


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    id: str
    model: str
    profile: str
    state: str
    endpoint: str


def names_of(catalog: Mapping[str, ModelSpec]) -> dict[str, str]:
    """Every name and alias, to the model it names."""
    names = {}
    for spec in catalog.values():
        for n in (spec.name, *spec.aliases):
            names[n] = spec.name
    return names


def build_keys(
    rows: Iterable[KeyRow],
    chains: Mapping[int, tuple[str, ...]],
    names: Mapping[str, str],
) -> dict[str, Key]:
    """Unrevoked keys by digest; a key limited to models that are all gone may use none."""
    out = {}
    for r in rows:
        allowed = frozenset(names[m] for m in r.models if m in names) if r.models else None
        out[r.digest] = Key(
            id=r.id,
            name=r.name,
            prefix=r.prefix,
            project_id=r.project_id,
            scopes=chains.get(r.project_id, (f"project:{r.project_id}",)),
            models=allowed,
            requests_per_minute=r.requests_per_minute,
            tokens_per_minute=r.tokens_per_minute,
        )
    return out


def build_routes(
    rows: Iterable[ReplicaRow], catalog: Mapping[str, ModelSpec], secret: str
) -> tuple[dict[str, tuple[Upstream, ...]], dict[str, int]]:
    """Ready replicas with an endpoint, per model, weighted by their profile; and how many
    more are on their way (pending or starting), which a waiting request is told."""
    ready: dict[str, list[Upstream]] = defaultdict(list)
    starting: dict[str, int] = defaultdict(int)
    for r in rows:
        spec = catalog.get(r.model)
        if spec is None:
            continue
        if r.state in ("pending", "starting"):
            starting[r.model] += 1
        elif r.state == "ready" and r.endpoint:
            profile = spec.profile(r.profile)
            weight = profile.weight if profile is not None else 1
            if weight <= 0:
                continue  # a profile weighted 0 takes no traffic
            ready[r.model].append(
                Upstream(
                    replica_id=r.id,
                    model=r.model,
                    url=r.endpoint.rstrip("/"),
                    authorization=f"Bearer {engine_key(secret, r.id)}",
                    weight=weight,
                )
            )
    return {m: tuple(sorted(u, key=lambda x: x.replica_id)) for m, u in ready.items()}, dict(
        starting
    )


# The shell: reading the rows when they changed.


class Loader:
    """Reads the tables' rows from the database when their fingerprints change.

    Call `refresh()` from a worker thread (it uses the ORM); it answers new Tables when
    anything changed and None otherwise, and raises DatabaseError when the database is
    away (the caller keeps what it has).
    """

    KEYS_EVERY = 5  # refreshes: keys' model lists change without moving the fingerprint

    def __init__(self) -> None:
        self.tables = Tables()
        self._prints: dict[str, object] = {}
        self._count = 0
        self._catalog: dict[str, ModelSpec] = {}

    def refresh(self) -> Tables | None:
        from django.conf import settings

        from catalog.selectors import catalog_load

        self._count += 1
        catalog = catalog_load()
        catalog_changed = catalog != self._catalog
        self._catalog = catalog
        names = names_of(catalog) if catalog_changed else dict(self.tables.names)
        keys_print = self._keys_print()
        keys_due = self._count % self.KEYS_EVERY == 0
        replicas_print = self._replicas_print()
        tables = self.tables
        changed = False
        if catalog_changed or keys_due or keys_print != self._prints.get("keys"):
            keys, limits, scope_names = self._keys(names)
            if (
                keys != tables.keys
                or limits != tables.limits
                or scope_names != tables.scope_names
                or catalog_changed
            ):
                tables = Tables(
                    keys=keys,
                    names=names,
                    models=catalog,
                    upstreams=tables.upstreams,
                    starting=tables.starting,
                    limits=limits,
                    scope_names=scope_names,
                )
                changed = True
            self._prints["keys"] = keys_print
        if catalog_changed or replicas_print != self._prints.get("replicas"):
            upstreams, starting = build_routes(self._replicas(), catalog, settings.SECRET_KEY)
            if upstreams != tables.upstreams or starting != tables.starting:
                tables = Tables(
                    keys=tables.keys,
                    names=names,
                    models=catalog,
                    upstreams=upstreams,
                    starting=starting,
                    limits=tables.limits,
                    scope_names=tables.scope_names,
                )
                changed = True
            self._prints["replicas"] = replicas_print
        if changed:
            self.tables = tables
            return tables
        return None

    @staticmethod
    def _keys_print() -> tuple:
        from django.db.models import Count, Max

        from tenancy.models import ApiKey, ScopeLimit

        keys = ApiKey.objects.aggregate(
            n=Count("id"), top=Max("id"), revoked=Count("revoked_at"), last=Max("revoked_at")
        )
        limits = ScopeLimit.objects.aggregate(n=Count("id"), last=Max("updated_at"))
        return (*keys.values(), *limits.values())

    @staticmethod
    def _replicas_print() -> tuple:
        from django.db.models import Count, Max

        from fleet.models import Replica, Shard

        by_state = Replica.objects.values_list("state").annotate(Count("id"), Max("state_since"))
        endpoints = Shard.objects.filter(rank=0).exclude(endpoint="").count()
        return (tuple(sorted(by_state)), endpoints)

    @staticmethod
    def _keys(names: Mapping[str, str]) -> tuple[dict[str, Key], dict, dict[str, str]]:
        from tenancy.models import ApiKey, ScopeLimit
        from tenancy.selectors import scope_tree

        tree = scope_tree()
        chains = {
            int(s.partition(":")[2]): (s, *up)
            for s, up in tree.parents.items()
            if s.startswith("project:")
        }
        rows = [
            KeyRow(i, n, pre, d, p, tuple(m or ()), rpm, tpm)
            for i, n, pre, d, p, m, rpm, tpm in ApiKey.objects.filter(
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
            )
        ]
        limits = {
            s: (rpm, tpm)
            for s, rpm, tpm in ScopeLimit.objects.values_list(
                "scope", "requests_per_minute", "tokens_per_minute"
            )
            if rpm is not None or tpm is not None
        }
        return build_keys(rows, chains, names), limits, dict(tree.names)

    @staticmethod
    def _replicas() -> list[ReplicaRow]:
        from fleet.models import Shard

        rows = Shard.objects.filter(
            rank=0, replica__state__in=("pending", "starting", "ready")
        ).values_list(
            "replica_id", "replica__model", "replica__profile", "replica__state", "endpoint"
        )
        return [ReplicaRow(*r) for r in rows]
