"""Catalog reads: rows into the frozen specs the rules take. The models as the API and
the pages list them, with what the fleet knows of each, are in `listings`."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from llmgw.core import reads

from ..domain import AdapterSpec, ModelSpec, Profile, Slo
from ..models import Adapter, Measurement, Model, Profile as ProfileRow, Revision


def profile_from_row(row: ProfileRow) -> Profile:
    return Profile(
        name=row.name,
        engine=row.engine,
        gpu_class=row.gpu_class,
        tp=row.tp,
        pp=row.pp,
        nodes=row.nodes,
        gpus_per_node=row.gpus_per_node,
        args=tuple(row.args or ()),
        env=dict(row.env or {}),
        min_memory_gb=row.min_memory_gb,
        cpu_cores=row.cpu_cores,
        min_disk_gb=row.min_disk_gb,
        node_selector=dict(row.node_selector or {}),
        weight=row.weight,
        priority=row.priority,
        startup_timeout_s=row.startup_timeout_s,
        routing=row.routing,
        power_watts=row.power_watts,
        adapter_slots=row.adapter_slots,
    )


def spec_from_row(row: Model) -> ModelSpec:
    return ModelSpec(
        name=row.name,
        profiles=tuple(profile_from_row(p) for p in row.profiles.all()),
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        idle_timeout_s=row.idle_timeout_s,
        capacity_class=row.capacity_class,
        owner=row.owner,
        source=row.source,
        aliases=tuple(row.aliases or ()),
        fallbacks=tuple(row.fallbacks or ()),
        description=row.description,
        routing_profile=row.routing_profile,
        declared=row.declared,
        slo=Slo(
            ttft_p95_ms=(row.slo or {}).get("ttft_p95_ms"),
            tpot_p95_ms=(row.slo or {}).get("tpot_p95_ms"),
        ),
        context_length=row.context_length,
        max_output=row.max_output,
        target_waiting=row.target_waiting,
        kv_ceiling=row.kv_ceiling,
    )


# The catalog changes rarely and is read by every reconciler pass: kept per process and
# read again when the database says it changed (a model written, added or removed).
_cache: dict = {"version": None, "catalog": {}, "adapters": {}}  # version None: never read yet


def _catalog_version() -> tuple[int, int]:
    """The catalog's change counter and how many models it has, in one small query (the
    count too: a database emptied or rolled back counts its revisions again from 0)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT value FROM {Revision._meta.db_table} WHERE id = 1),"
            f" (SELECT COUNT(*) FROM {Model._meta.db_table})"
        )
        revision, models = cursor.fetchone()
    return revision or 0, models


def catalog_load() -> dict[str, ModelSpec]:
    """Every model with its profiles: one small query when unchanged, four when changed
    (none more inside llmgw.core.reads.once_each, once read)."""
    return dict(reads.once("catalog", _catalog_read)[0])


def adapters_load() -> dict[str, AdapterSpec]:
    """Every LoRA adapter by name, kept with the models (each adapter's write bumps the
    catalog's revision): one small query when unchanged."""
    return dict(reads.once("catalog", _catalog_read)[1])


def catalog_and_adapters() -> tuple[dict[str, ModelSpec], dict[str, AdapterSpec]]:
    """The models and the adapters, from one look at the revision."""
    models, adapters = reads.once("catalog", _catalog_read)
    return dict(models), dict(adapters)


def _catalog_read() -> tuple[dict[str, ModelSpec], dict[str, AdapterSpec]]:
    key = _catalog_version()
    if _cache["version"] != key:
        rows = Model.objects.prefetch_related("profiles").order_by("name")
        _cache["catalog"] = {row.name: spec_from_row(row) for row in rows}
        adapters = Adapter.objects.select_related("base").order_by("name")
        _cache["adapters"] = {row.name: adapter_from_row(row) for row in adapters}
        _cache["version"] = key
    return _cache["catalog"], _cache["adapters"]


def adapter_from_row(row: Adapter) -> AdapterSpec:
    return AdapterSpec(
        name=row.name,
        base=row.base.name,
        source=row.source,
        format=row.format,
        rank=row.rank,
        owner=row.owner,
        aliases=tuple(row.aliases or ()),
        description=row.description,
        declared=row.declared,
    )


def adapter_called(name: str) -> str | None:
    """The name of the adapter called `name`, by its name or an alias; None when none is."""
    adapters = adapters_load()
    if name in adapters:
        return name
    owners = [a.name for a in adapters.values() if name in a.aliases]
    return owners[0] if len(owners) == 1 else None


def model_called(name: str) -> str | None:
    """The name of the model called `name`, by its name or one of its aliases (as the gateway
    answers to either); None when no model is."""
    catalog = catalog_load()
    if name in catalog:
        return name
    owners = [spec.name for spec in catalog.values() if name in spec.aliases]
    return owners[0] if len(owners) == 1 else None


def model_sources(*, names: Iterable[str] | None = None) -> dict[str, str]:
    """Each model's source by its name, for the models that name one: of `names` when given
    (a list, or a query of names asked in the same query). One query, uncached: the
    mirror and the fleet's weights checks read the rows as they are now."""
    rows = Model.objects.exclude(source="")
    if names is not None:
        rows = rows.filter(name__in=names)
    return dict(rows.values_list("name", "source"))


def measurements_revision() -> int:
    """The measurements' change counter (one saved or deleted): one small query."""
    return Revision.objects.filter(pk=1).values_list("measurements", flat=True).first() or 0


def measurements_load() -> dict[tuple[str, str], tuple[int, float, float | None, float | None]]:
    """(model, profile) → (max_concurrency, tok_per_sec, watts or None, power_share or
    None) of every measurement: one query."""
    rows = Measurement.objects.values_list(
        "model__name", "profile", "max_concurrency", "tok_per_sec", "watts", "power_share"
    )
    return {(m, p): (c, t, w, s) for m, p, c, t, w, s in rows}


def measurements_list() -> list[dict]:
    """Every measurement as `GET /capacity` shows it, by model and profile: one query."""
    return [
        measurement_view(row)
        for row in Measurement.objects.select_related("model").order_by("model__name", "profile")
    ]


def measurement_view(row: Measurement) -> dict:
    return {
        "model": row.model.name,
        "profile": row.profile,
        "max_concurrency": row.max_concurrency,
        "tok_per_sec": row.tok_per_sec,
        "ttft_p95_ms": row.ttft_p95_ms,
        "tpot_p95_ms": row.tpot_p95_ms,
        "watts": row.watts,
        "power_share": row.power_share,
        "measured_at": row.measured_at,
        "measured_by": row.measured_by,
    }
