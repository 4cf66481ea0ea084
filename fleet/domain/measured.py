"""Measured capacity (domain.md): profile order and scaling from what `ctl bench --save` found."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from catalog.domain import ModelSpec, Profile
from llmgw.core.config import Timings

from .capped import Caps, Counted, capped, counted, said
from .types import Load, Measured, ModelState, ReplicaView

# How full, of their measured capacity, the replicas left after a scale-down may be: below
# one so that the load that was there a minute ago does not put them straight back over.
SCALE_DOWN_HEADROOM = 0.7
# Requests waiting per ready replica that count as busy, for a model that sets no
# `target_waiting`.
SCALE_UP_WAITING = 1.0


def per_unit(profile: Profile, measured: Measured) -> float:
    """Tokens per second per GPU, or per core for a CPU profile (one core if none declared)."""
    units = profile.gpus_on_each_node * profile.nodes
    if not units:
        units = max(profile.cpu_cores or 1, 1) * profile.nodes
    return measured.tok_per_sec / units


def per_watt(profile: Profile, measured: Measured) -> float | None:
    """Tokens per second per watt: over what the replica was measured to draw, else its
    profile's declared `power_watts`; None when neither is known."""
    watts = measured.watts or profile.power_watts
    return measured.tok_per_sec / watts if watts else None


def ordered_profiles(
    model: ModelSpec, measurements: Mapping[tuple[str, str], Measured]
) -> list[Profile]:
    """By priority; among equal priorities the one measured to serve the most per watt
    first when every measured profile's draw is known (a rack's power is what runs out
    first), else the most per GPU (or core); unmeasured ones keep catalog order behind
    measured ones."""
    measured = {p.name: m for p in model.profiles if (m := measurements.get((model.name, p.name)))}
    by_watt = bool(measured) and all(
        per_watt(p, measured[p.name]) is not None for p in model.profiles if p.name in measured
    )

    def served(p: Profile, m: Measured) -> float:
        return (per_watt(p, m) or 0.0) if by_watt else per_unit(p, m)

    def key(p: Profile) -> tuple:
        m = measured.get(p.name)
        return (-p.priority, 0 if m else 1, -served(p, m) if m else 0.0)

    return sorted(model.profiles, key=key)


def measured_for(
    model: ModelSpec,
    running_profiles: Iterable[str],
    measurements: Mapping[tuple[str, str], Measured],
) -> tuple[Measured, str] | None:
    """The measurement that sizes a model: that of the profile its replicas run on, or, with
    none running, of the first profile placement would try that was measured."""
    for name in running_profiles:
        if (m := measurements.get((model.name, name))) is not None:
            return m, name
    for p in ordered_profiles(model, measurements):
        if (m := measurements.get((model.name, p.name))) is not None:
            return m, p.name
    return None


def combined_load(engines: Load | None, gateway: Load | None) -> Load | None:
    """One model's demand from what its engines and the gateway each said.

    The gateway's requests in flight include those queued inside the engines, so the two
    are not added: running is what the engines run when they said, else what the gateway
    has in flight; waiting adds what waits at the gateway for a replica to what waits in
    the engines. Neither said anything: unknown (None), which is not idle.
    """
    if engines is None:
        return gateway
    if gateway is None:
        return engines
    return Load(
        running=engines.running,
        waiting=engines.waiting + gateway.waiting,
        kv_cache=engines.kv_cache,
    )


def counted_ready(
    ready: Sequence[ReplicaView], caps: Caps, measured: Measured | None
) -> Counted | None:
    """What a model's ready replicas count for at their GPUs' power limits (capped.py);
    None when none is known to be capped, and each counts what was measured."""
    if measured is None or not caps.shares:
        return None
    held = [
        c
        for r in ready
        if (c := capped(caps, [(s.node_id, s.gpu_indices) for s in r.shards], measured.power_share))
    ]
    return counted(len(ready), held) if held else None


def _over_measured(
    in_flight: int, ready: int, measured: Measured, counts: Counted | None
) -> list[str]:
    """Why more are in flight than the ready replicas were measured to serve within the SLO,
    at their power limits; with, where a cap is what made them too many, a sentence per
    capped replica. Empty when they are not too many."""
    replicas = max(ready, 1)
    if counts is None or not ready:
        if in_flight <= measured.max_concurrency * replicas:
            return []
        return [
            f"{in_flight} in flight, above the {measured.max_concurrency} a replica was measured "
            "to serve within its SLO"
        ]
    # Whole requests: 8 × 0.8747 serves 6 at once, and the sentence says the 6 compared.
    held = math.floor(measured.max_concurrency * counts.replicas + 1e-9)
    if in_flight <= held:
        return []
    out = [
        f"{in_flight} in flight, above the {held:,} its ready replicas serve within its SLO "
        f"at their power limits ({measured.max_concurrency} a replica was measured to serve)"
    ]
    if in_flight <= measured.max_concurrency * replicas:
        out += dict.fromkeys(
            said(c, measured.tok_per_sec, measured.power_share) for c in counts.capped
        )
    return out


def busy_because(
    model: ModelSpec,
    load: Load,
    ready: int,
    measured: Measured | None,
    counts: Counted | None = None,
) -> str | None:
    """Why a model's replicas are busy, in words with the figures, or None when they are
    not: requests waiting per ready replica at or above its `target_waiting` [1], its
    engines' KV caches above its `kv_ceiling` on average (when it sets one), or more
    requests running and waiting than were measured to meet its SLO, a replica on GPUs
    held below their default power counting less than measured (`counts`, capped.py)."""
    replicas = max(ready, 1)
    counts_said = f"{load.waiting} waiting and {load.running} running on {ready} ready"
    target = model.target_waiting or SCALE_UP_WAITING
    reasons = []
    if load.waiting / replicas >= target:
        reasons.append(
            f"{counts_said}, {load.waiting / replicas:g} a replica (its target {target:g})"
        )
    ceiling, kv = model.kv_ceiling, load.kv_cache
    if ceiling is not None and kv is not None and kv > ceiling:
        reasons.append(
            f"its engines' KV caches {kv:.0%} full on average, above its ceiling of {ceiling:.0%}"
        )
    if measured is not None:
        reasons += _over_measured(load.running + load.waiting, ready, measured, counts)
    if not reasons:
        return None
    if not reasons[0].startswith(counts_said):
        reasons.insert(0, counts_said)
    return "; ".join(reasons)


def autoscale(
    model: ModelSpec,
    state: ModelState,
    load: Load | None,
    ready: int,
    measured: Measured | None,
    now: datetime,
    t: Timings,
    counts: Counted | None = None,
) -> tuple[ModelState, str]:
    """One step of scaling from load: the new state (extra replicas and the busy and quiet
    clocks) and a sentence when the extra count changed.

    Busy when `busy_because` says why (requests waiting, KV caches full, more in flight
    than measured); held busy for `scale_up_after`, one more replica. Quiet when
    nothing waits and the replicas left would stay within 70% of what they were measured
    to hold; held quiet for `scale_down_after`, one fewer. No figures at all is unknown,
    not quiet: nothing changes. `counts`: what the ready replicas count for at their GPUs'
    power limits (counted_ready), None when each counts what was measured.
    """
    room = model.max_replicas - model.min_replicas
    if model.on_demand or room <= 0 or load is None:
        if state.busy_since or state.quiet_since or state.extra > max(room, 0):
            return replace(
                state, busy_since=None, quiet_since=None, extra=max(min(state.extra, room), 0)
            ), ""
        return state, ""
    busy = busy_because(model, load, ready, measured, counts)
    fewer = counts.fewer if counts is not None else max(ready - 1, 0)
    fits_in_fewer = measured is None or load.running <= SCALE_DOWN_HEADROOM * (
        measured.max_concurrency * fewer
    )
    extra = min(state.extra, room)
    if busy is not None:
        since = state.busy_since or now
        if extra < room and (now - since).total_seconds() >= t.scale_up_after:
            why = f"model {model.name} scales up to {model.min_replicas + extra + 1}: {busy}"
            return replace(state, extra=extra + 1, busy_since=now, quiet_since=None), why
        return replace(state, extra=extra, busy_since=since, quiet_since=None), ""
    if load.waiting == 0 and extra > 0 and fits_in_fewer:
        since = state.quiet_since or now
        if (now - since).total_seconds() >= t.scale_down_after:
            why = (
                f"model {model.name} scales down to {model.min_replicas + extra - 1}: "
                f"nothing waiting, {load.running} running on {ready} ready"
            )
            return replace(state, extra=extra - 1, quiet_since=now, busy_since=None), why
        return replace(state, extra=extra, quiet_since=since, busy_since=None), ""
    if state.busy_since or state.quiet_since or extra != state.extra:
        return replace(state, extra=extra, busy_since=None, quiet_since=None), ""
    return state, ""
