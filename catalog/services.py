"""Catalog writes: every change to a model goes through one path that re-validates the catalog."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict, replace
from datetime import datetime

from django.db import transaction
from django.db.models import F

from fleet.services import model_forget
from llmgw.core.errors import Conflict, Invalid, NotFound
from mirror.selectors import model_sizing_refusal
from tenancy.selectors import scope_find
from tenancy.services import audit_record

from . import domain
from .adapter_files import adapter_facts, weights_architecture
from .domain import CLASSES, AdapterSpec, CatalogError, ModelSpec
from .models import Adapter, Measurement, Model, Profile as ProfileRow, Revision
from .selectors import adapters_load, catalog_load

log = logging.getLogger("llmgw.catalog")

DECLARED = (
    "model {name} is declared in the catalog file; edit that file and restart llmgw serve, "
    "since the file would undo a change made here on the next start"
)


def _write(spec: ModelSpec, *, actor: str, row: Model | None = None) -> Model:
    """Store a spec over `row` (or as a new row), profiles replaced in catalog order."""
    row = row or Model(name=spec.name)
    row.aliases = list(spec.aliases)
    row.description = spec.description
    row.source = spec.source
    row.min_replicas = spec.min_replicas
    row.max_replicas = spec.max_replicas
    row.idle_timeout_s = spec.idle_timeout_s
    row.target_waiting = spec.target_waiting
    row.kv_ceiling = spec.kv_ceiling
    row.capacity_class = spec.capacity_class
    row.owner = spec.owner
    row.fallbacks = list(spec.fallbacks)
    row.routing_profile = spec.routing_profile
    # Only the figures given, so a stored SLO reads as what the operator wrote.
    row.slo = {k: v for k, v in spec.slo.to_dict().items() if v is not None}
    row.context_length = spec.context_length
    row.max_output = spec.max_output
    row.declared = spec.declared
    row.updated_by = actor
    row.save()
    ProfileRow.objects.filter(model=row).delete()
    ProfileRow.objects.bulk_create(
        ProfileRow(
            model=row,
            position=i,
            name=p.name,
            engine=p.engine,
            gpu_class=p.gpu_class,
            tp=p.tp,
            pp=p.pp,
            nodes=p.nodes,
            gpus_per_node=p.gpus_per_node,
            args=list(p.args),
            env=dict(p.env),
            min_memory_gb=p.min_memory_gb,
            cpu_cores=p.cpu_cores,
            min_disk_gb=p.min_disk_gb,
            node_selector=dict(p.node_selector),
            weight=p.weight,
            priority=p.priority,
            startup_timeout_s=p.startup_timeout_s,
            routing=p.routing,
            power_watts=p.power_watts,
            adapter_slots=p.adapter_slots,
        )
        for i, p in enumerate(spec.profiles)
    )
    _bump()
    return row


# The largest whole number the database columns hold (Django's IntegerField, on every backend).
_INT_MAX = 2**31 - 1


def _storable(spec: ModelSpec) -> None:
    """Refuse figures no column can hold, which the database would answer with a crash."""
    where = f"model {spec.name}"
    figures = [
        (where, name, getattr(spec, field))
        for name, field in (
            ("min", "min_replicas"),
            ("max", "max_replicas"),
            ("idle_timeout", "idle_timeout_s"),
            ("context_length", "context_length"),
            ("max_output", "max_output"),
        )
    ]
    for p in spec.profiles:
        for field in (
            "tp",
            "pp",
            "nodes",
            "gpus_per_node",
            "cpu_cores",
            "weight",
            "priority",
            "startup_timeout_s",
            "min_memory_gb",
            "min_disk_gb",
            "power_watts",
        ):
            figures.append((f"{where}, profile {p.name}", field, getattr(p, field)))
    for place, name, value in figures:
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(f"{place}: {name} must be a finite number, not {value}.")
        if abs(value) > _INT_MAX:
            raise Invalid(f"{place}: {name} is too large ({value:g}); at most {_INT_MAX}.")
    texts = [(where, "source", spec.source, Model), (where, "owner", spec.owner, Model)]
    texts += [
        (f"{where}, profile {p.name}", "gpu_class", p.gpu_class, ProfileRow) for p in spec.profiles
    ]
    for place, name, value, row in texts:
        longest = row._meta.get_field(name).max_length
        if len(value) > longest:
            raise Invalid(f"{place}: {name} is longer than {longest} characters.")
    _no_nul(asdict(spec), where=where)


def _no_nul(value, *, where: str) -> None:
    """PostgreSQL cannot store a NUL character in text or JSON: refuse it as bad input."""
    if isinstance(value, str):
        if "\x00" in value:
            raise Invalid(f"{where}: text may not contain NUL characters.")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _no_nul(k, where=where)
            _no_nul(v, where=where)
    elif isinstance(value, list | tuple):
        for v in value:
            _no_nul(v, where=where)


def _owner_by_id(data: object) -> object:
    """`data` with its owner, given by scope name or ID as the owner endpoint takes it, as
    the scope's ID (how it is stored); Invalid naming the owner when no scope is found."""
    owner = data.get("owner") if isinstance(data, Mapping) else None
    if not (isinstance(owner, str) and owner.strip()):
        return data
    try:
        return {**data, "owner": scope_find(owner)}
    except Invalid as exc:
        raise Invalid(f"owner: {exc}") from None


def _validated(catalog: dict[str, ModelSpec], spec: ModelSpec) -> None:
    _storable(spec)
    try:
        domain.validate_catalog({**catalog, spec.name: spec}.values())
        domain.validate_adapters({**catalog, spec.name: spec}, adapters_load().values())
    except CatalogError as exc:
        raise Invalid(str(exc)) from None


def _runtime_spec(name: str) -> tuple[dict[str, ModelSpec], ModelSpec]:
    catalog = catalog_load()
    spec = catalog.get(name)
    if spec is None:
        raise NotFound(f"There is no model {name!r}.")
    if spec.declared:
        # Bad input rather than a clash: the caller can fix it, in the file.
        raise Invalid(DECLARED.format(name=name))
    return catalog, spec


def _parsed(data: Mapping) -> tuple[Mapping, ModelSpec]:
    """A model as POST /models and PUT /models/{name} take it: the data as stored in the
    audit record (its owner by ID) and the spec; Invalid with the reason."""
    # Before parsing: fields kept only in the audit record must be storable too.
    _no_nul(data, where="the model")
    data = _owner_by_id(data)
    try:
        spec = domain.parse_model(data)
        domain.new_model_warnings_as_errors(spec)
    except CatalogError as exc:
        raise Invalid(str(exc)) from None
    if why := model_sizing_refusal(spec):
        raise Invalid(why)
    return data, spec


def model_replace(*, name: str, data: Mapping, actor: str) -> tuple[ModelSpec, bool]:
    """Replace a runtime model with a whole new definition (PUT /models/{name}); returns the
    spec and whether its replicas must roll: its source or a profile's fingerprint changed.
    Invalid with the reason, NotFound for no such model, Invalid for a declared one."""
    if isinstance(data, Mapping) and data.get("name", name) != name:
        raise Invalid(
            f"The body names model {data.get('name')!r}, not {name!r}; a model is not renamed."
        )
    data, spec = _parsed({**data, "name": name} if isinstance(data, Mapping) else data)
    old = {}

    def change(current: ModelSpec) -> ModelSpec:
        old["spec"] = current
        return spec

    new = model_update(
        name=name, actor=actor, action="model.update", detail=dict(data), change=change
    )
    was = old["spec"]
    rolls = was.source != new.source or {p.name: p.fingerprint() for p in was.profiles} != {
        p.name: p.fingerprint() for p in new.profiles
    }
    return new, rolls


def model_add(*, data: Mapping, actor: str) -> ModelSpec:
    """Add a runtime model; raises Invalid with the reason, Conflict when the name is taken."""
    data, spec = _parsed(data)
    with transaction.atomic():
        catalog = catalog_load()
        if spec.name in catalog:
            raise Conflict(f"A model named {spec.name} already exists.")
        _validated(catalog, spec)
        _write(spec, actor=actor)
        audit_record(actor=actor, action="model.add", target=spec.name, detail=dict(data))
    return spec


def model_update(*, name: str, actor: str, action: str, detail: dict, change) -> ModelSpec:
    """Apply `change(spec) -> spec` to a runtime model after re-validating the whole catalog."""
    with transaction.atomic():
        catalog, spec = _runtime_spec(name)
        try:
            new = change(spec)
        except CatalogError as exc:
            raise Invalid(str(exc)) from None
        _validated(catalog, new)
        _write(new, actor=actor, row=Model.objects.get(name=name))
        audit_record(actor=actor, action=action, target=name, detail=detail)
    return new


def model_scale(*, name: str, actor: str, scaling: Mapping) -> ModelSpec:
    """Set min, max and idle timeout, and the autoscaler's target_waiting and kv_ceiling;
    max left out follows min; max < min is refused; a threshold left out is kept."""

    def change(spec: ModelSpec) -> ModelSpec:
        lo, hi, idle = domain.parse_scaling(
            scaling,
            where=f"model {name}",
            current=(spec.min_replicas, spec.max_replicas, spec.idle_timeout_s),
        )
        waiting, ceiling = domain.parse_pressure(scaling, where=f"model {name}")
        return replace(
            spec,
            min_replicas=lo,
            max_replicas=hi,
            idle_timeout_s=idle,
            target_waiting=waiting if "target_waiting" in scaling else spec.target_waiting,
            kv_ceiling=ceiling if "kv_ceiling" in scaling else spec.kv_ceiling,
        )

    return model_update(
        name=name, actor=actor, action="model.scale", detail=dict(scaling), change=change
    )


def model_class_set(*, name: str, capacity_class: str, actor: str) -> ModelSpec:
    """Set a runtime model's class; "" returns it to the default its scaling implies."""

    def change(spec: ModelSpec) -> ModelSpec:
        if capacity_class not in ("", *CLASSES):
            raise CatalogError(
                f"model {name}: class must be one of {', '.join(CLASSES)}, "
                f'or "" for the default, not {capacity_class!r}.'
            )
        return replace(spec, capacity_class=capacity_class)

    spec = model_update(
        name=name,
        actor=actor,
        action="model.class",
        detail={"class": capacity_class},
        change=change,
    )
    log.info("model %s is %s, set by %s", name, spec.effective_class, actor)
    return spec


def model_owner_set(*, name: str, owner: str, actor: str) -> ModelSpec:
    """Set whose quota a runtime model counts against: a scope by name or ID, "" for shared.

    Stored as its key (`team:7`); Invalid when the name is not a scope, names
    none, or could be several.
    """

    def change(spec: ModelSpec) -> ModelSpec:
        return replace(spec, owner=scope_find(owner) if owner.strip() else "")

    spec = model_update(
        name=name, actor=actor, action="model.owner", detail={"owner": owner}, change=change
    )
    log.info("model %s counts against %s, set by %s", name, spec.owner or "nobody", actor)
    return spec


def model_resources_set(
    *,
    name: str,
    memory_gb: float,
    cpu_cores: int | None = None,
    profile: str | None = None,
    actor: str,
) -> ModelSpec:
    """Set the memory (and cores, when given) one profile, or every profile, reserves.

    `cpu_cores` 0 reserves none; left out, each profile keeps what it had. Only
    CPU-only profiles reserve cores (Profile.reserved_cores), so cores on a GPU
    profile are kept but reserve nothing. Running replicas keep the figures they
    were started with until they are restarted.
    """
    if memory_gb < 0 or (cpu_cores or 0) < 0:
        raise Invalid("memory and cores cannot be negative")
    if not math.isfinite(memory_gb):
        raise Invalid(f"memory_gb must be a finite number, not {memory_gb}.")
    if memory_gb == 0:
        raise Invalid("memory_gb must be more than 0: it is the host memory a replica needs.")
    cores = cpu_cores or None

    def change(spec: ModelSpec) -> ModelSpec:
        if profile is not None and spec.profile(profile) is None:
            raise CatalogError(f'model {name} has no profile "{profile}"')
        return replace(
            spec,
            profiles=tuple(
                replace(
                    p,
                    min_memory_gb=float(memory_gb),
                    cpu_cores=p.cpu_cores if cpu_cores is None else cores,
                )
                if profile is None or p.name == profile
                else p
                for p in spec.profiles
            ),
        )

    given = {"profile": profile, "memory_gb": memory_gb, "cpu_cores": cpu_cores}
    spec = model_update(
        name=name,
        actor=actor,
        action="model.resources",
        detail={k: v for k, v in given.items() if v is not None},
        change=change,
    )
    log.info(
        "model %s reserves %s, set by %s",
        name,
        "; ".join(
            f"{p.name}: {p.min_memory_gb:g} GB, {p.cpu_cores or 0} cores"
            for p in spec.profiles
            if profile is None or p.name == profile
        ),
        actor,
    )
    return spec


def measurement_save(
    *,
    model: str,
    profile: str,
    max_concurrency: int,
    tok_per_sec: float,
    ttft_p95_ms: float | None = None,
    tpot_p95_ms: float | None = None,
    watts: float | None = None,
    power_share: float | None = None,
    actor: str,
    now: datetime,
) -> Measurement:
    """Store what a benchmark found for a model on a profile, replacing any earlier one.

    A measurement is not a catalog change, so declared models may be measured.
    Raises NotFound for an unknown model, Invalid for an unknown profile or a
    figure out of range. `power_share`: the share of their default power limit its GPUs
    were held to while measured (None: at their default), so that it is not scaled again.
    """
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int):
        raise Invalid(f"max_concurrency must be a whole number, not {max_concurrency!r}.")
    if not 1 <= max_concurrency <= _INT_MAX:
        raise Invalid(f"max_concurrency must be from 1 to {_INT_MAX}, not {max_concurrency}.")
    for key, value in (
        ("tok_per_sec", tok_per_sec),
        ("ttft_p95_ms", ttft_p95_ms),
        ("tpot_p95_ms", tpot_p95_ms),
        ("watts", watts),
    ):
        if value is None and key != "tok_per_sec":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Invalid(f"{key} must be a number, not {value!r}.")
        if not math.isfinite(value) or value <= 0:
            raise Invalid(f"{key} must be a finite number above 0, not {value}.")
    if power_share is not None and (
        isinstance(power_share, bool)
        or not isinstance(power_share, int | float)
        or not 0 < power_share <= 1
    ):
        raise Invalid(
            "power_share must be a share above 0 and at most 1 (0.8: its GPUs were held to "
            f"80 % of their default power limit), not {power_share!r}."
        )
    with transaction.atomic():
        row = Model.objects.filter(name=model).first()
        if row is None:
            raise NotFound(f"There is no model {model!r}.")
        if not row.profiles.filter(name=profile).exists():
            raise Invalid(f'model {model} has no profile "{profile}"')
        measured, _ = Measurement.objects.update_or_create(
            model=row,
            profile=profile,
            defaults={
                "max_concurrency": max_concurrency,
                "tok_per_sec": float(tok_per_sec),
                "ttft_p95_ms": ttft_p95_ms,
                "tpot_p95_ms": tpot_p95_ms,
                "watts": watts,
                "power_share": None if power_share is None else float(power_share),
                "measured_at": now,
                "measured_by": actor[:150],
            },
        )
        audit_record(
            actor=actor,
            action="model.measure",
            target=f"{model}/{profile}",
            detail={
                "max_concurrency": max_concurrency,
                "tok_per_sec": float(tok_per_sec),
                **({"watts": float(watts)} if watts is not None else {}),
                **({"power_share": float(power_share)} if power_share is not None else {}),
            },
        )
        measurements_revision_bump()
    log.info(
        "model %s on %s measured by %s: %d at once, %g tokens/s",
        model,
        profile,
        actor,
        max_concurrency,
        tok_per_sec,
    )
    return measured


def model_remove(*, name: str, actor: str) -> None:
    """Remove a runtime model and its failures and parking; its replicas stop on the next pass."""
    with transaction.atomic():
        catalog, _ = _runtime_spec(name)
        users = sorted(m.name for m in catalog.values() if name in m.fallbacks)
        if users:
            raise Conflict(
                f"model {name} is a fallback of {', '.join(users)}; remove it there first."
            )
        _delete(name)
        audit_record(actor=actor, action="model.remove", target=name)


def _delete(name: str) -> None:
    """Forget a model and the controller's memory of it, so one added again starts afresh.
    Conflict while adapters are served on it: they would be left with no base."""
    adapters = sorted(a.name for a in adapters_load().values() if a.base == name)
    if adapters:
        raise Conflict(
            f"model {name} is the base of adapter{'s' if len(adapters) > 1 else ''} "
            f"{', '.join(adapters)}; remove {'them' if len(adapters) > 1 else 'it'} first."
        )
    _, deleted = Model.objects.filter(name=name).delete()
    model_forget(name=name)
    _bump()
    if deleted.get(Measurement._meta.label):  # its measurements went with it
        measurements_revision_bump()


def _bump() -> None:
    """Tell every process's catalog cache that the catalog changed (in the caller's transaction)."""
    if not Revision.objects.filter(pk=1).update(value=F("value") + 1):
        Revision.objects.get_or_create(pk=1, defaults={"value": 1})


def measurements_revision_bump() -> None:
    """Say that the measurements changed (one saved, or a model's removed with it), in the
    caller's transaction, so the reconciler reads them again only when this counter moved."""
    if not Revision.objects.filter(pk=1).update(measurements=F("measurements") + 1):
        Revision.objects.get_or_create(pk=1, defaults={"measurements": 1})


def declared_sync(*, specs: list[ModelSpec]) -> list[str]:
    """Make the declared models exactly those of the catalog file; return what changed."""
    changes = []
    with transaction.atomic():
        catalog = catalog_load()
        runtime = {n: s for n, s in catalog.items() if not s.declared}
        for spec in specs:
            try:
                _storable(spec)
            except Invalid as exc:
                raise Invalid(f"The catalog file cannot be loaded: {exc}") from None
        try:
            domain.validate_catalog(
                [*specs, *(s for n, s in runtime.items() if n not in {x.name for x in specs})]
            )
        except CatalogError as exc:
            raise Invalid(f"The catalog file cannot be loaded: {exc}") from None
        for spec in specs:
            spec = replace(spec, declared=True)
            if catalog.get(spec.name) != spec:
                _write(spec, actor="catalog file", row=Model.objects.filter(name=spec.name).first())
                changes.append(
                    f"model {spec.name} {'updated' if spec.name in catalog else 'added'} from the catalog file"
                )
        wanted = {s.name for s in specs}
        for name, spec in catalog.items():
            if spec.declared and name not in wanted:
                try:
                    _delete(name)
                except Conflict as exc:  # adapters on it: said as the file's fault
                    raise Invalid(f"The catalog file cannot be loaded: {exc}") from None
                changes.append(f"model {name} removed: it is no longer in the catalog file")
    for line in changes:
        log.info(line)
    return changes


def adapter_add(*, data: Mapping, actor: str, mirrored: Mapping | None = None) -> AdapterSpec:
    """Add a LoRA adapter on a model of the catalog (docs/adapters.md); its owner by scope name
    or ID, stored as the scope's ID. Invalid with the reason (a base unknown or whose engines
    cannot serve it, a rank above its bound, an architecture its files say differs), Conflict
    when the name is taken; nothing stored then. `mirrored` (the weights the mirror holds
    of its source, and whether this add put them there) is kept in the audit record."""
    data, spec = _adapter_parsed(data)
    with transaction.atomic():
        catalog, adapters = catalog_load(), adapters_load()
        _adapter_new(spec, catalog, adapters)
        _adapter_write(spec, actor=actor)
        _bump()
        detail = {**data, "mirror": dict(mirrored)} if mirrored else dict(data)
        audit_record(actor=actor, action="adapter.add", target=spec.name, detail=detail)
    log.info("adapter %s added on %s for %s by %s", spec.name, spec.base, spec.owner, actor)
    return spec


def adapter_check(*, data: Mapping) -> AdapterSpec:
    """What `adapter_add` would store, refused as it would be, with nothing written: asked
    before the mirror is asked for its weights, so bad input costs no download."""
    _, spec = _adapter_parsed(data)
    _adapter_new(spec, catalog_load(), adapters_load())
    return spec


def _adapter_parsed(data: Mapping) -> tuple[Mapping, AdapterSpec]:
    _no_nul(data, where="the adapter")
    data = _owner_by_id(data)
    try:
        spec = domain.parse_adapter(data)
    except CatalogError as exc:
        raise Invalid(str(exc)) from None
    for name, value, longest in (("source", spec.source, 500), ("owner", spec.owner, 40)):
        if len(value) > longest:
            raise Invalid(f"adapter {spec.name}: {name} is longer than {longest} characters.")
    return data, spec


def _adapter_new(
    spec: AdapterSpec, catalog: dict[str, ModelSpec], adapters: dict[str, AdapterSpec]
) -> None:
    if spec.name in adapters:
        raise Conflict(f"An adapter named {spec.name} already exists.")
    _adapter_checked(spec, catalog, [*adapters.values(), spec])


def _adapter_checked(
    spec: AdapterSpec, catalog: dict[str, ModelSpec], every: list[AdapterSpec]
) -> None:
    """Invalid with the reason when `spec` cannot be served on its base, or its names clash
    among the catalog's models and `every` adapter."""
    base = catalog.get(spec.base)
    why = domain.adapter_refusal(
        spec,
        base,
        facts=adapter_facts(spec.source, spec.format),
        base_architecture=weights_architecture(base.source) if base else None,
    )
    if why:
        raise Invalid(why)
    try:
        domain.validate_adapters(catalog, every)
    except CatalogError as exc:
        raise Invalid(str(exc)) from None


def _adapter_write(spec: AdapterSpec, *, actor: str) -> None:
    Adapter.objects.update_or_create(
        name=spec.name,
        defaults={
            "base": Model.objects.get(name=spec.base),
            "aliases": list(spec.aliases),
            "description": spec.description,
            "source": spec.source,
            "format": spec.format,
            "rank": spec.rank,
            "owner": spec.owner,
            "declared": spec.declared,
            "updated_by": actor[:150],
        },
    )


def declared_adapters_prune(*, keep: set[str]) -> list[str]:
    """Remove the declared adapters the catalog file no longer lists, before its models are
    synced (a model left out may be the base of one); return what changed."""
    with transaction.atomic():
        gone = [a.name for a in adapters_load().values() if a.declared and a.name not in keep]
        if gone:
            Adapter.objects.filter(name__in=gone).delete()
            _bump()
    changes = [f"adapter {n} removed: it is no longer in the catalog file" for n in gone]
    for line in changes:
        log.info(line)
    return changes


def declared_adapters_sync(*, specs: list[AdapterSpec]) -> list[str]:
    """Make the declared adapters exactly those of the catalog file (after its models);
    return what changed. Invalid, nothing changed, for one its base cannot serve."""
    changes = []
    with transaction.atomic():
        catalog, adapters = catalog_load(), adapters_load()
        wanted = {s.name for s in specs}
        kept = [a for a in adapters.values() if a.name not in wanted]
        for spec in specs:
            if spec.name in adapters and not adapters[spec.name].declared:
                raise Invalid(
                    f"The catalog file cannot be loaded: adapter {spec.name} was added through "
                    "the API; remove it there first."
                )
            try:
                _adapter_checked(spec, catalog, [*kept, *specs])
            except Invalid as exc:
                raise Invalid(f"The catalog file cannot be loaded: {exc}") from None
        for spec in specs:
            if adapters.get(spec.name) != spec:
                _adapter_write(spec, actor="catalog file")
                changes.append(
                    f"adapter {spec.name} {'updated' if spec.name in adapters else 'added'} "
                    "from the catalog file"
                )
        for a in kept:
            if a.declared:
                Adapter.objects.filter(name=a.name).delete()
                changes.append(f"adapter {a.name} removed: it is no longer in the catalog file")
        if changes:
            _bump()
    for line in changes:
        log.info(line)
    return changes


def adapter_remove(*, name: str, actor: str) -> AdapterSpec:
    """Remove an adapter; the replicas holding it unload it when they need the slot.
    NotFound when there is none by that name."""
    with transaction.atomic():
        spec = adapters_load().get(name)
        if spec is None:
            raise NotFound(f"There is no adapter {name!r}.")
        if spec.declared:
            raise Invalid(
                f"adapter {name} is declared in the catalog file; edit that file and restart "
                "llmgw serve"
            )
        Adapter.objects.filter(name=name).delete()
        _bump()
        audit_record(actor=actor, action="adapter.remove", target=name)
    return spec
