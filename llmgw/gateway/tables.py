"""What the gateway routes by, in memory: keys, models, ready replicas and scope limits.

`build` is pure: rows in, `Tables` out. `Loader` reads the rows, but only when a
cheap fingerprint of each table says it changed (checked about once a second),
and keeps the last good tables when the database is away: inference goes on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta

from catalog.domain import ADAPTER_FORMATS, AdapterSpec, ModelSpec, adapter_as_model
from llmgw.core.secrets import engine_key
from tenancy.bands import DEFAULT as DEFAULT_BAND
from tenancy.budgets import Book

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
    max_tokens: int | None = None  # the most one request may ask for
    band: str = DEFAULT_BAND  # its priority under overload (llmgw/gateway/bands.py)
    # The LoRA adapters it may use: its scopes' own, of those its models allow.
    adapters: frozenset[str] = frozenset()

    def chain(self) -> tuple[str, ...]:
        """Itself and its scopes up the tree, as budgets are kept: `key:3`, `project:12`…"""
        return (f"key:{self.id}", *self.scopes)


@dataclass(frozen=True, slots=True)
class Upstream:
    """A ready replica's engine: where to send a request and the key it wants."""

    replica_id: str
    model: str
    url: str
    authorization: str
    weight: int
    routing: str = "least_loaded"  # its profile's (catalog.domain.Profile.routes_by)
    engine: str = ""  # its profile's: which APIs it serves itself (dialect_serve)
    adapter_slots: int = 0  # its profile's: LoRA adapters it holds at once


@dataclass(frozen=True)
class Tables:
    keys: Mapping[str, Key] = field(default_factory=dict)  # by keyed digest of the secret
    names: Mapping[str, str] = field(default_factory=dict)  # name or alias -> model name
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    upstreams: Mapping[str, tuple[Upstream, ...]] = field(default_factory=dict)
    starting: Mapping[str, int] = field(default_factory=dict)  # pending or starting replicas
    limits: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    scope_names: Mapping[str, str] = field(default_factory=dict)  # "team:2" -> "team:Acme/ml"
    created: Mapping[str, int] = field(default_factory=dict)  # model -> its row's Unix time
    # Every budget with what its scope spent, read every BOOK_EVERY seconds; a new read
    # alone is no change the runtime is told of beyond the tables themselves.
    budgets: Book = field(default_factory=Book, compare=False)
    # LoRA adapters by name; each is in `models` too, as its base under its own name.
    adapters: Mapping[str, AdapterSpec] = field(default_factory=dict)

    def resolve(self, name: str) -> ModelSpec | None:
        canonical = self.names.get(name)
        return self.models.get(canonical) if canonical else None

    def allows(self, key: Key, name: str) -> bool:
        """Whether `key` may use the model or adapter called `name` (canonical): an adapter
        only by its owner's keys, a model by any key its list does not leave it out of."""
        if name in self.adapters:
            return name in key.adapters
        return key.models is None or name in key.models


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
    max_tokens: int | None = None
    band: str = DEFAULT_BAND  # its own, or else its project's


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    id: str
    model: str
    profile: str
    state: str
    endpoint: str
    state_since: object = None  # a datetime; only the loader reads it
    unhealthy: bool = False  # a gateway could not reach it, or its node went unheard


ACTIVE = ("pending", "starting", "ready")


def _created() -> dict[str, int]:
    """When each model and adapter was added to the catalog, in Unix seconds (`/v1/models`'
    `created`)."""
    from catalog.models import Adapter, Model

    rows = [*Model.objects.values_list("name", "created_at")]
    rows += Adapter.objects.values_list("name", "created_at")
    return {name: int(at.timestamp()) for name, at in rows}


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
    adapters: Mapping[str, AdapterSpec] | None = None,
) -> dict[str, Key]:
    """Unrevoked keys by digest; a key limited to models that are all gone may use none.
    An adapter is usable by the keys of its owner's scope (and below), when their list of
    models, if any, names it."""
    out = {}
    owned: dict[str, set[str]] = defaultdict(set)
    for a in (adapters or {}).values():
        owned[a.owner].add(a.name)
    for r in rows:
        allowed = frozenset(names[m] for m in r.models if m in names) if r.models else None
        scopes = chains.get(r.project_id, (f"project:{r.project_id}",))
        usable = frozenset(n for s in scopes for n in owned.get(s, ()))
        out[r.digest] = Key(
            id=r.id,
            name=r.name,
            prefix=r.prefix,
            project_id=r.project_id,
            scopes=scopes,
            adapters=usable if allowed is None else usable & allowed,
            models=allowed,
            requests_per_minute=r.requests_per_minute,
            tokens_per_minute=r.tokens_per_minute,
            max_tokens=r.max_tokens,
            band=r.band,
        )
    return out


def build_routes(
    rows: Iterable[ReplicaRow], spec: ModelSpec | None, key_of: Callable[[str], str]
) -> tuple[tuple[Upstream, ...], int]:
    """One model's ready replicas with an endpoint, weighted by their profile, and how many
    more are on their way (pending or starting), which a waiting request is told."""
    if spec is None:
        return (), 0
    ready, starting = [], 0
    for r in rows:
        if r.state in ("pending", "starting"):
            starting += 1
        elif r.state == "ready" and r.endpoint and not r.unhealthy:
            profile = spec.profile(r.profile)
            weight = profile.weight if profile is not None else 1
            routing = profile.routes_by if profile is not None else "least_loaded"
            engine = profile.engine if profile is not None else ""
            slots = profile.adapter_slots if profile is not None else 0
            if weight > 0:  # a profile weighted 0 takes no traffic
                ready.append(
                    Upstream(
                        replica_id=r.id,
                        model=r.model,
                        url=r.endpoint.rstrip("/"),
                        authorization=f"Bearer {key_of(r.id)}",
                        weight=weight,
                        routing=routing,
                        engine=engine,
                        adapter_slots=slots,
                    )
                )
    return tuple(sorted(ready, key=lambda u: u.replica_id)), starting


def with_adapters(
    models: Mapping[str, ModelSpec],
    adapters: Mapping[str, AdapterSpec],
    upstreams: Mapping[str, tuple[Upstream, ...]],
    starting: Mapping[str, int],
) -> tuple[dict, dict, dict, dict]:
    """Models, names, upstreams and starting counts with each adapter routed as a model of
    its own: its base's spec under its name, its base's ready replicas that can hold it
    (an engine that loads its format, adapter slots) under its name, which of them hold it
    now being the engines' word at request time (`llmgw.gateway.adapters`)."""
    models, ups, coming = dict(models), dict(upstreams), dict(starting)
    for a in adapters.values():
        base = models.get(a.base)
        if base is None:
            continue
        models[a.name] = adapter_as_model(a, base)
        able = tuple(
            replace(u, model=a.name)
            for u in upstreams.get(a.base, ())
            if u.adapter_slots > 0 and a.format in ADAPTER_FORMATS.get(u.engine, ())
        )
        if able:
            ups[a.name] = able
        if starting.get(a.base):
            coming[a.name] = starting[a.base]
    return models, names_of(models), ups, coming


# The shell: reading the rows when they changed.


class Loader:
    """Reads the tables' rows from the database when their fingerprints change.

    Call `refresh()` from a worker thread (it uses the ORM); it answers new Tables when
    anything changed and None otherwise, and raises DatabaseError when the database is
    away (the caller keeps what it has).

    Replicas are read by what changed: when the count or latest change of the active
    ones (pending, starting, ready) moved, those whose state changed since the last read
    (less a margin for passes that commit late); all of them when that does not account
    for the change, and every FULL_EVERY seconds in any case. Only the models whose
    replicas changed are routed again. Keys and limits, a few thousand
    rows, are read whole when they change.
    """

    KEYS_EVERY = 5  # refreshes: keys' model lists change without moving the fingerprint
    FULL_EVERY = 60.0
    BOOK_EVERY = 2.0  # seconds between reads of the budgets' spend (tenancy's budget_book)
    MARGIN = timedelta(seconds=10)

    def __init__(self) -> None:
        self.tables = Tables()
        self._prints: dict[str, object] = {}
        self._count = 0
        self._catalog: dict[str, ModelSpec] = {}
        self._adapters: dict[str, AdapterSpec] = {}
        # The models' own routes, before the adapters are routed on them.
        self._upstreams: dict[str, tuple[Upstream, ...]] = {}
        self._starting: dict[str, int] = {}
        self._rows: dict[str, ReplicaRow] = {}
        self._by_model: dict[str, set[str]] = defaultdict(set)
        self._read_at = None  # when replicas were last read, by this machine's clock
        self._full_at = float("-inf")
        self._engine_keys: dict[str, str] = {}
        self._book_at = float("-inf")
        self._warned: set[tuple] = set()  # budgets told of at WARN_AT, in their window

    def refresh(self) -> Tables | None:
        from catalog.selectors import catalog_and_adapters
        from tenancy.selectors import keys_print

        self._count += 1
        catalog, adapters = catalog_and_adapters()
        catalog_changed = catalog != self._catalog or adapters != self._adapters
        self._catalog, self._adapters = catalog, adapters
        tables = self.tables
        if catalog_changed:
            models, names, _, _ = with_adapters(catalog, adapters, {}, {})
        else:
            models, names = tables.models, tables.names
        keys_seen = keys_print()
        if (
            catalog_changed
            or self._count % self.KEYS_EVERY == 0
            or keys_seen != self._prints.get("keys")
        ):
            keys, limits, scope_names = self._keys(names, adapters)
            tables = replace(tables, keys=keys, limits=limits, scope_names=scope_names)
            self._prints["keys"] = keys_seen
        changed = self._replica_changes()
        if catalog_changed:
            changed = set(self._by_model) | set(self._upstreams) | set(self._starting)
        if changed:
            upstreams, starting = dict(self._upstreams), dict(self._starting)
            for m in changed:
                rows = (self._rows[r] for r in self._by_model.get(m, ()))
                ups, coming = build_routes(rows, catalog.get(m), self._engine_key)
                upstreams.pop(m, None)
                starting.pop(m, None)
                if ups:
                    upstreams[m] = ups
                if coming:
                    starting[m] = coming
            self._upstreams, self._starting = upstreams, starting
        if changed or catalog_changed:
            # Each adapter routed on its base's replicas, under its own name.
            _, _, upstreams, starting = with_adapters(
                catalog, adapters, self._upstreams, self._starting
            )
            tables = replace(tables, upstreams=upstreams, starting=starting)
        tables = replace(tables, names=names, models=models, adapters=adapters)
        if catalog_changed:
            tables = replace(tables, created=_created())
        book = self._book()
        if book is not None:
            tables = replace(tables, budgets=book)
        elif tables == self.tables:
            return None
        self.tables = tables
        return tables

    def _book(self) -> Book | None:
        """The budgets read again when BOOK_EVERY has passed (None otherwise); each budget
        newly past WARN_AT in its window told once (tenancy's `budget_warnings_record`)."""
        if time.monotonic() - self._book_at < self.BOOK_EVERY:
            return None
        from django.utils import timezone

        from llmgw.gateway.metrics import budget_gauges
        from tenancy.selectors import budget_book
        from tenancy.services.budgets import budget_warnings_record

        now = timezone.now()
        book = budget_book(now=now)
        self._book_at = time.monotonic()
        budget_gauges(book, now)
        new = [w for w in book.warned(now) if w[:4] not in self._warned]
        if new:
            budget_warnings_record(warnings=new)
            self._warned.update(w[:4] for w in new)
        return book

    def _engine_key(self, replica_id: str) -> str:
        key = self._engine_keys.get(replica_id)
        if key is None:
            from django.conf import settings

            key = self._engine_keys[replica_id] = engine_key(settings.SECRET_KEY, replica_id)
        return key

    def _replica_changes(self) -> set[str]:
        """The models whose active replicas changed since the last look."""
        from django.utils import timezone

        from fleet.selectors.routing import replicas_print

        counts = tuple(c for c in replicas_print() if c[0] in ACTIVE)
        if counts == self._prints.get("replicas"):
            return set()
        self._prints["replicas"] = counts
        active = sum(n for _, n, _ in counts)
        read_at = timezone.now()
        if self._read_at is None or time.monotonic() - self._full_at > self.FULL_EVERY:
            return self._reload(read_at)
        changed: set[str] = set()
        for r in self._replica_rows(since=self._read_at - self.MARGIN):
            old = self._rows.get(r.id)
            if r.state in ACTIVE:
                if old != r:
                    self._put(r)
                    changed.add(r.model)
            elif old is not None:
                self._drop(old)
                changed.add(r.model)
        if not changed or len(self._rows) != active:
            # Something moved that the times did not show (a row gone, a clock behind):
            # read them all.
            return changed | self._reload(read_at)
        self._read_at = read_at
        return changed

    def _reload(self, read_at) -> set[str]:
        before = set(self._by_model)
        self._rows, self._by_model = {}, defaultdict(set)
        for r in self._replica_rows(since=None):
            self._put(r)
        self._read_at = read_at
        self._full_at = time.monotonic()
        alive = {r.id for r in self._rows.values()}
        self._engine_keys = {k: v for k, v in self._engine_keys.items() if k in alive}
        return before | set(self._by_model)

    def _put(self, r: ReplicaRow) -> None:
        old = self._rows.get(r.id)
        if old is not None and old.model != r.model:
            self._by_model[old.model].discard(r.id)
        self._rows[r.id] = r
        self._by_model[r.model].add(r.id)

    def _drop(self, r: ReplicaRow) -> None:
        del self._rows[r.id]
        ids = self._by_model.get(r.model)
        if ids is not None:
            ids.discard(r.id)
            if not ids:
                del self._by_model[r.model]

    @staticmethod
    def _keys(
        names: Mapping[str, str], adapters: Mapping[str, AdapterSpec]
    ) -> tuple[dict[str, Key], dict, dict[str, str]]:
        from tenancy.selectors import key_rows, scope_limits, scope_tree

        tree = scope_tree()
        chains = {
            int(s.partition(":")[2]): (s, *up)
            for s, up in tree.parents.items()
            if s.startswith("project:")
        }
        rows = [KeyRow(*row) for row in key_rows()]
        return build_keys(rows, chains, names, adapters), scope_limits(), dict(tree.names)

    @staticmethod
    def _replica_rows(*, since) -> list[ReplicaRow]:
        from fleet.selectors.routing import routing_rows

        return [ReplicaRow(*row) for row in routing_rows(since=since)]
