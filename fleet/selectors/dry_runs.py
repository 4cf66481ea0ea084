"""What would happen now, changing nothing: headroom, a target's replicas, a preemption, the room on each node (reads only)."""

from __future__ import annotations

from django.conf import settings

from catalog.domain import MAX_REPLICAS, ModelSpec
from llmgw.core import clock, reads
from llmgw.core.errors import Invalid, NotFound
from tenancy.quota import Policy

from ..domain.capacity import (
    NotMeasured,
    capped_said,
    headroom,
    preemption_dry_run,
    replicas_needed,
    running_capped,
    standing,
    target,
)
from ..domain.defrag import defrag_dry_run
from ..domain.types import ACTIVE, Snapshot
from .inputs import MEASUREMENTS, POLICY
from .snapshot import snapshot_load


def _standing_snapshot() -> Snapshot:
    """The fleet as it stands, with quotas and measurements as they stand now: the cached
    ones while their revisions say they have not changed, read again once they have.
    Several dry runs a page asks inside llmgw.core.reads.once_each (a model's: headroom
    and the preemption dry run) answer from one reading."""
    return reads.once(
        "standing snapshot",
        lambda: snapshot_load(
            settling=False,
            silence_floor=None,
            policy=POLICY.get(),
            measurements=MEASUREMENTS.get(),
        ),
    )


def _spec(snap: Snapshot, name: str) -> ModelSpec:
    spec = snap.models.get(name)
    if spec is None:
        raise NotFound(f"There is no model {name!r}.")
    return spec


def model_headroom(*, name: str, limit: int) -> dict:
    """How many more replicas of a model fit now, and why not one more (changing nothing)."""
    snap = _standing_snapshot()
    spec = _spec(snap, name)
    now = clock.now()
    st = standing(snap, now, settings.LLMGW.timings)
    st.inv.unreserve(name)
    room = headroom(
        spec,
        st.inv,
        st.live.get(name, 0),
        limit,
        snap.policy,
        st.ctx.usage,
        snap.measurements,
        snap.caps,
    )
    # Counted as ctl models counts them: a retiring replica is not one of those running.
    room.retiring = sum(
        1 for r in snap.replicas if r.model == name and r.state in ACTIVE and r.retiring
    )
    return room.as_dict()


def model_target(*, name: str, tokens_per_sec: float) -> dict:
    """Replicas a throughput needs, from the model's measurement, and whether they fit."""
    snap = _standing_snapshot()
    spec = _spec(snap, name)
    st = standing(snap, clock.now(), settings.LLMGW.timings)
    st.inv.unreserve(name)
    active = [r for r in snap.replicas if r.model == name and r.state in ACTIVE]
    running = [r.profile for r in active]
    live = [r for r in active if not r.retiring]  # those `current` counts
    try:
        sized = replicas_needed(spec, tokens_per_sec, running, snap.measurements, live, snap.caps)
    except NotMeasured as exc:
        raise Invalid(str(exc)) from None
    if sized[0] > MAX_REPLICAS:
        raise Invalid(
            f"{tokens_per_sec:g} tokens/s would need {sized[0]} replicas of {name} at "
            f"{sized[1].tok_per_sec:g} each; a model may ask for at most {MAX_REPLICAS}."
        )
    current = st.live.get(name, 0)
    room = headroom(
        spec,
        st.inv,
        current,
        max(sized[0] - current, 0),
        snap.policy,
        st.ctx.usage,
        snap.measurements,
        snap.caps,
    )
    held = running_capped(live, snap.caps, sized[1])
    return target(spec, tokens_per_sec, sized, room, capped_said(tokens_per_sec, sized, held))


def model_preemption(*, name: str) -> dict:
    """The preemption dry run: what would be stopped for one more replica, and what may not."""
    snap = _standing_snapshot()
    return preemption_dry_run(_spec(snap, name), snap, clock.now(), settings.LLMGW.timings)


def model_defrag(*, name: str) -> dict:
    """The defragmentation dry run: which replicas would move to free an NVLink domain for
    one replica of a model over several trays, and why none can (docs/fabric.md)."""
    snap = _standing_snapshot()
    return defrag_dry_run(_spec(snap, name), snap, clock.now(), settings.LLMGW.timings)


def node_rooms() -> list:
    """Each node's free room as placement counts it now (for sizing what would fit where)."""
    st = standing(_standing_snapshot(), clock.now(), settings.LLMGW.timings)
    return list(st.inv.rooms.values())


def node_rooms_and_quota() -> tuple[list, Policy, dict]:
    """Each node's free room (as `node_rooms`), with the quota policy and what each scope
    holds now: for saying where an owner's limit would stop a replica that fits."""
    snap = _standing_snapshot()
    st = standing(snap, clock.now(), settings.LLMGW.timings)
    return list(st.inv.rooms.values()), snap.policy, dict(st.ctx.usage)
