"""Room kept for a model while its victims free it (domain.md, Preemption).

Which reservations still hold (`live_reservations`), what they come to once
the model is placed there (`reserved_amount`), a placement into that very room
once it is free (`place_kept`), and a trial copy of some nodes' room with
replicas stopped and room already being freed counted as gone (`freed_trial`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from catalog.domain import Profile
from tenancy.quota import ZERO, Amount

from ..placement import Inventory, Placement
from ..types import ModelState, ReplicaView, Reservation


def live_reservations(
    states: Mapping[str, ModelState], now: datetime
) -> dict[str, tuple[Reservation, ...]]:
    """Per model, the room kept for it whose hold has not ended."""
    return {
        name: s.reserved
        for name, s in states.items()
        if s.reserved and s.reserved_until and now < s.reserved_until
    }


def reserved_amount(room: Iterable[Reservation]) -> Amount:
    """What room kept for a model comes to, once it is placed there."""
    total = ZERO
    for r in room:
        total = total + Amount(len(r.gpu_indices), r.cpu_cores or 0, r.memory_gb or 0.0)
    return total


def freed_trial(
    inv: Inventory,
    nodes: Iterable[str],
    release: Iterable[ReplicaView],
    freeing: Iterable[ReplicaView],
    promised: Mapping[str, Sequence[Reservation]],
) -> Inventory:
    """A copy of these nodes' room with `release` stopped and the room `freeing` is
    already being freed counted as gone too; what of that room is kept for the model it is
    being freed for (`promised`, as `inv.reserved` keeps it now) stays that model's."""
    gone = {r.id: r for r in (*release, *freeing)}
    trial = inv.trial(nodes, gone.values())
    if not freeing:
        return trial
    for model, kept in inv.reserved.items():
        whole = {r.node_id: r for r in promised.get(model, ())}
        for k in kept:
            r = whole.get(k.node_id)
            if r is None or k.node_id not in trial.rooms or not gone.keys() & set(r.victims):
                continue
            # The part its victims held, free in the trial, is kept for it again.
            trial.keep(
                model,
                [
                    Reservation(
                        k.node_id,
                        r.gpu_indices,
                        max((r.memory_gb or 0.0) - (k.memory_gb or 0.0), 0.0),
                        max((r.cpu_cores or 0) - (k.cpu_cores or 0), 0),
                    )
                ],
            )
    return trial


def place_kept(
    inv: Inventory, profiles: Sequence[Profile], room: Sequence[Reservation], source: str = ""
) -> Placement | None:
    """A placement into the room kept for a model, on the very GPUs kept, once that room is
    free; None while it is not (its victims still hold it) or when it no longer fits there."""
    if not room:
        return None
    gpus: dict[str, set[int]] = {}
    for r in room:
        gpus.setdefault(r.node_id, set()).update(r.gpu_indices)
    trial = inv.trial(gpus)
    if len(trial.rooms) != len(gpus):
        return None
    for node, kept in gpus.items():
        here = trial.rooms[node]
        if kept:
            here.free_gpus = {c: [i for i in ids if i in kept] for c, ids in here.free_gpus.items()}
    placed = trial.place(profiles, weights_source=source)
    return placed if isinstance(placed, Placement) else None
