"""The catalog's models as `GET /models`, the model pages, ctl and the status page show
them: each spec with what the fleet knows of it (its replicas counted, its state, its
failures, why it is not placed), read through fleet's selectors.
"""

from __future__ import annotations

from collections import defaultdict

from fleet.domain.reconcile import desired_replicas
from fleet.domain.types import ModelState as ModelStateView
from fleet.selectors.listings import (
    counted_as,
    failure_shown,
    held_for_shown,
    measured_memory,
    model_status,
    placement_explained,
    ready_node_sizes,
    replica_states,
)
from fleet.selectors.routing import adapters_held
from fleet.selectors.state import model_states, replica_views
from llmgw.core import clock
from llmgw.core.errors import NotFound
from mirror.selectors import adapters_mirror_said

from ..domain import reservation_warnings, suggested_cores
from . import adapters_load, catalog_and_adapters, catalog_load


def model_views(*, name: str | None = None) -> list[dict]:
    """Models as the API shows them, with what runs of each (a fixed number of queries)."""
    catalog, every_adapter = catalog_and_adapters()
    adapters = every_adapter.values()
    if name is not None:
        if name not in catalog:
            raise NotFound(f"There is no model {name!r}.")
        catalog = {name: catalog[name]}
    states = model_states(name=name)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    replicas = replica_views(model=name)
    for r in replicas:
        counts[r.model][counted_as(r)] += 1
    one = states.get(name) if name is not None else None
    if one is not None and one.held_for and one.held_for not in states:
        # Whether it is still held depends on the model it gave room to.
        states = {**states, **model_states(name=one.held_for)}
        for state in replica_states(one.held_for):
            counts[one.held_for][state] += 1
    measured = measured_memory(replicas, catalog)
    cpu_nodes = (
        ready_node_sizes()
        if any(p.cpu_only for spec in catalog.values() for p in spec.profiles)
        else []
    )
    out = []
    for spec in catalog.values():
        state = states.get(spec.name)
        # Before its first pass a model wants what its scaling says, not nothing.
        desired = (
            state.desired
            if state
            else desired_replicas(spec, ModelStateView(model=spec.name), clock.now())
        )
        c = counts[spec.name]
        status, reason = model_status(
            spec, state, desired, c["ready"], c["pending"] + c["starting"]
        )
        first = spec.profiles[0]
        out.append(
            {
                "name": spec.name,
                "aliases": list(spec.aliases),
                "description": spec.description,
                "source": spec.source,
                "ready": c["ready"],
                # Serving still, but on their way out: not among the ready.
                "retiring": c["retiring"],
                "desired": desired,
                "min": spec.min_replicas,
                "max": spec.max_replicas,
                "idle_timeout": spec.idle_timeout_s,
                "target_waiting": spec.target_waiting,
                "kv_ceiling": spec.kv_ceiling,
                "on_demand": spec.on_demand,
                "status": status,
                "reason": reason,
                "class": spec.effective_class,
                "owner": spec.owner,
                "memory_gb": first.min_memory_gb,
                "cpu_cores": first.reserved_cores,
                "suggested_cores": (
                    suggested_cores(first.min_memory_gb, cpu_nodes) or None
                    if first.cpu_only
                    else None
                ),
                "measured_memory_gb": measured.get(spec.name),
                "warnings": reservation_warnings(spec, measured.get(spec.name)),
                "preempted": state.preempted if state else 0,
                "held_for": held_for_shown(state, counts, states),
                "unplaceable": bool(state and state.unplaceable),
                "parked": bool(state and state.parked_since),
                "failures": state.failures if state else 0,
                "last_failure": failure_shown(state),
                "profiles": [p.to_dict() | {"fingerprint": p.fingerprint()} for p in spec.profiles],
                "fallbacks": list(spec.fallbacks),
                "routing_profile": spec.routing_profile,
                "declared": spec.declared,
                "slo": spec.slo.to_dict(),
                "context_length": spec.context_length,
                "max_output": spec.max_output,
                "adapters": sorted(a.name for a in adapters if a.base == spec.name),
            }
        )
    return out


def adapter_views(*, name: str | None = None, base: str | None = None) -> list[dict]:
    """Adapters as the API, ctl and the model page show them (every one, `name`, or those of
    `base`), each with the ready replicas holding it now as their engines said, and how far
    the mirror got with its weights (None for a path on the nodes)."""
    every = adapters_load()
    if name is not None:
        if name not in every:
            raise NotFound(f"There is no adapter {name!r}.")
        chosen = [every[name]]
    else:
        chosen = [a for a in every.values() if base is None or a.base == base]
    if not chosen:
        return []
    bases = {a.base for a in chosen}
    held = adapters_held(model=next(iter(bases)) if len(bases) == 1 else None)
    mirror = adapters_mirror_said([a.source for a in chosen])
    return [
        {
            "name": a.name,
            "base": a.base,
            "aliases": list(a.aliases),
            "description": a.description,
            "source": a.source,
            "format": a.format,
            "rank": a.rank,
            "owner": a.owner,
            "held_by": sorted(r for r, names in held.items() if a.name in names),
            "mirror": mirror[a.source],
        }
        for a in chosen
    ]


def model_explain(*, name: str, view: dict | None = None) -> dict:
    """Why the model's last placement failed, per profile and node (`view`: its
    model_views entry, when the caller has read it already)."""
    view = view if view is not None else model_views(name=name)[0]
    said = placement_explained(name=name, spec=catalog_load().get(name))
    return {
        "model": name,
        "unplaceable": view["unplaceable"],
        "status": view["status"],
        "reason": view["reason"],
        "explanation": said["explanation"],
        "last_failure": view["last_failure"],
        "installing": said["installing"],
    }
