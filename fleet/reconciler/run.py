"""The reconciler's shell: take the pass lock, load, decide, apply in one transaction, dispatch.

The same `reconcile_once` runs from Celery beat (production) and from the loop
inside `llmgw serve` (embedded). One pass at a time across every process: on
PostgreSQL a session advisory lock taken on the pass's own connection, which the
server drops with the session when the process holding it dies (a worker killed
mid-pass stops nothing); on SQLite, which has none, a lease row with an expiry
taken by compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import threading
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, IntegrityError, close_old_connections, connection, transaction
from django.db.models import Q

from llmgw.core import clock, tracing
from llmgw.core.outage import Outage

from .. import event_log
from ..domain.passes import restart_at, settles
from ..domain.plan import Event
from ..domain.quiet import QuietModels
from ..domain.reconcile import decide
from ..facility.caps import caps_decide
from ..facility.observe import conditions_observe, failures_publish, sheds_record
from ..models import Lease
from ..nodes.dispatch import dispatch
from ..nodes.reclaim import weights_reclaim
from ..selectors.inputs import MEASUREMENTS, POLICY
from ..selectors.snapshot import snapshot_load
from ..services import plan_apply
from .wake import listen

log = logging.getLogger("llmgw.reconciler")

LEASE = "reconciler"
LEASE_SECONDS = 60
# The key of the advisory lock one pass holds on PostgreSQL: "llmgw.reconciler" as the
# first 8 bytes of its SHA-256, a signed 64-bit number (fixed: every process must agree).
ADVISORY_KEY = 0x39A4C2E0B5F1D733


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def lease_take(*, holder: str, now: datetime, seconds: float = LEASE_SECONDS) -> bool:
    """Take the reconciler lease if it is free, expired or ours; True when taken."""
    until = now + timedelta(seconds=seconds)
    taken = (
        Lease.objects.filter(pk=LEASE)
        .filter(Q(expires_at__lte=now) | Q(holder=holder) | Q(holder=""))
        .update(holder=holder, expires_at=until)
    )
    if taken:
        return True
    try:
        with transaction.atomic():
            Lease.objects.create(name=LEASE, holder=holder, expires_at=until)
        return True
    except IntegrityError:
        return False


def lease_release(*, holder: str) -> None:
    Lease.objects.filter(pk=LEASE, holder=holder).update(holder="")


def advisory_take() -> bool:
    """Take the pass's advisory lock on this connection's session, without waiting."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY])
        return bool(cursor.fetchone()[0])


def advisory_release() -> None:
    """Let the lock go; a connection that broke meanwhile took it with its session."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])
    except DatabaseError:
        log.warning(
            "could not release the reconciler's lock: its connection is gone, and it with it"
        )


def _advisory() -> bool:
    return connection.vendor == "postgresql"


@contextlib.contextmanager
def pass_lock(*, holder: str, now: datetime):
    """Yield True while this process may run the pass, False when another one is."""
    if _advisory():
        if not advisory_take():
            yield False
            return
        try:
            # Who runs it, for llmgw_leader; the lock, not this row, keeps others out.
            Lease.objects.update_or_create(
                name=LEASE,
                defaults={"holder": holder, "expires_at": now + timedelta(seconds=LEASE_SECONDS)},
            )
            yield True
        finally:
            with contextlib.suppress(DatabaseError):
                lease_release(holder=holder)
            advisory_release()
        return
    if not lease_take(holder=holder, now=now):
        yield False
        return
    try:
        yield True
    finally:
        lease_release(holder=holder)


def served_record(*, now: datetime) -> None:
    """`llmgw serve` started: the reconciler settles from now, whichever process runs it."""
    if not Lease.objects.filter(pk=LEASE).update(served_since=now):
        with contextlib.suppress(IntegrityError), transaction.atomic():
            Lease.objects.create(name=LEASE, expires_at=now, served_since=now)


def _settle_window(now: datetime, fresh_start: bool) -> tuple[bool, datetime | None]:
    """Whether this pass settles, and since when silence counts (fleet/domain/passes.py)."""
    t = settings.LLMGW.timings
    lease = Lease.objects.get(pk=LEASE)
    began = restart_at(
        now=now,
        last_pass_at=lease.last_pass_at,
        served_since=lease.served_since,
        settled_from=lease.settled_from,
        fresh_start=fresh_start,
        t=t,
    )
    if began is not None:
        lease.settled_from = began
        lease.settle_until = began + timedelta(seconds=t.settle)
        gap = (
            f"no pass for {(now - lease.last_pass_at).total_seconds():.0f} s"
            if lease.last_pass_at is not None and began == now and not fresh_start
            else "the control plane started"
        )
        log.info(
            "reconciler settles (%s): no placement for %s s while agents report", gap, t.settle
        )
    lease.last_pass_at = now
    lease.save(update_fields=["settle_until", "settled_from", "last_pass_at"])
    return settles(now=now, settled_from=lease.settled_from, t=t), lease.settled_from


# Quotas and measurements (POLICY, MEASUREMENTS) are read again at a pass only when their
# revision moved, the last good ones kept while the database is away: fleet/selectors/inputs.py.

# The models whose last step did nothing, kept from pass to pass: one whose inputs are the
# same is not looked at again (fleet/domain/quiet.py). Keyed by what the step reads, so a
# pass run meanwhile by another process changes nothing.
QUIET = QuietModels()


class WarmFreeze:
    """Moves what passes keep between them (the snapshot's rows, the quiet models) out of
    the cyclic collector's sight once a fleet of some size is loaded, and again each time
    it has grown by a quarter: otherwise every full collection walks all of it, 25–40 ms
    a pass on average at 5,000 nodes (docs/benchmarks.md). What is freed later is still
    freed by its reference count."""

    SMALLEST = 1000  # nodes and replicas: below this a collection costs little
    GROWTH = 1.25

    def __init__(self) -> None:
        self.size = 0

    def after(self, size: int) -> None:
        if size >= self.SMALLEST and size > self.size * self.GROWTH:
            gc.collect()
            gc.freeze()
            self.size = size


FREEZE = WarmFreeze()


def reconcile_once(*, now: datetime | None = None, fresh_start: bool = False) -> dict:
    """Run one pass; return what it did: `{"ran", "events", "starts", "stops", ...}`.
    With tracing on, in a span of its own, each decision an event on it."""
    now = now or clock.now()
    with tracing.span("llmgw.reconciler.pass") as span:
        with pass_lock(holder=_holder(), now=now) as mine:
            if not mine:
                tracing.said(span, **{"llmgw.ran": False})
                return {"ran": False, "detail": "another reconciler pass is running", "events": []}
            done = _pass(now, fresh_start)
        if span is not None:
            tracing.said(
                span,
                **{"llmgw.ran": True, "llmgw.settling": done["settling"]},
                **{f"llmgw.{k}": done[k] for k in ("starts", "stops", "drains", "forgets")},
            )
            for line in done["events"]:
                span.add_event("decision", {"message": line})
        return done


def _pass(now: datetime, fresh_start: bool) -> dict:
    """The pass itself, under the lock."""
    settling, floor = _settle_window(now, fresh_start)
    event_log.record(_conditions(now), now=now)
    snap = snapshot_load(
        settling=settling,
        silence_floor=floor,
        policy=POLICY.get(),
        measurements=MEASUREMENTS.get(),
        with_weights=True,
        now=now,
    )
    plan = decide(snap, now, settings.LLMGW.timings, quiet=QUIET)
    FREEZE.after(len(snap.nodes) + len(snap.replicas))
    if not plan.empty or any(
        (was := snap.states.get(n)) is not s and was != s for n, s in plan.states.items()
    ):
        with transaction.atomic():
            commands = plan_apply(
                plan=plan, now=now, before={"catalog": snap.models, "states": snap.states}
            )
            transaction.on_commit(lambda: dispatch(commands))
    dispatch(weights_reclaim(now=now))
    sheds_record(plan.events, now)
    # Decisions say so in decide, with their figures; stops and drains carry their reason.
    said = set(plan.events)
    events = list(
        dict.fromkeys(
            [
                *plan.events,
                *(d.reason for d in plan.drains if d.reason not in said),
                *(s.reason for s in plan.stops),
            ]
        )
    )
    for line in events:
        fields = {"event": line.kind, **line.fields} if isinstance(line, Event) else {}
        log.info(line, extra=fields)
    event_log.record(_happened(plan, snap), now=now)
    event_log.expire(now=now, keep_days=settings.LLMGW.events_keep_days)
    events = [str(line) for line in events]
    return {
        "ran": True,
        "settling": settling,
        "events": events,
        "starts": len(plan.starts),
        "stops": len(plan.stops),
        "drains": len(plan.drains),
        "forgets": len(plan.forgets),
    }


def _conditions(now: datetime) -> list[Event]:
    """The facility's step, which never stops a pass: what it cannot do is said, and the
    conditions stay as they were (missing data never blocks placement)."""
    try:
        events = conditions_observe(now=now)
        commands, capped = caps_decide(events, now)
        dispatch(commands)
        return [*events, *capped]
    except Exception as exc:  # any failure of the sources: said, and the pass goes on
        log.exception("facility conditions not observed this pass: %s", exc)
        failures_publish(now.timestamp(), broke=str(exc))
        return []


def _happened(plan, snap) -> list[Event | str]:
    """The pass's decisions as the event log keeps them: each event, and each drain and
    stop with its reason, under its replica's model."""
    happened = list(plan.events)
    if not (plan.drains or plan.stops):
        return happened
    said = set(plan.events)
    models = {r.id: r.model for r in snap.replicas}
    for kind, actions in (("drain", plan.drains), ("stop", plan.stops)):
        for a in actions:
            if a.reason not in said:
                model = models.get(a.replica_id, "")
                happened.append(Event(a.reason, kind, model=model, replica=a.replica_id))
    return happened


def _embedded_pass(*, fresh_start: bool) -> None:
    # Celery does this around every task; here the pool thread keeps its connection between
    # passes, and one broken by a database restart must be dropped, not used forever.
    close_old_connections()
    try:
        reconcile_once(fresh_start=fresh_start)
    finally:
        close_old_connections()


async def run_forever(interval: float) -> None:
    """The embedded reconciler: a loop on the serving process's own event loop.

    The pass itself runs in a thread (it uses the ORM); the commands it sends
    are handed back to this loop by async_to_sync, where the in-memory channel
    layer lives. `fleet.reconciler.wake.wake()` cuts the wait between passes short.
    """
    event = listen()
    first = True
    # A database outage fails every pass: said when it starts and when it ends.
    outage = Outage(f"the reconciler's pass (tried every {interval:g} s)", log)
    while True:
        try:
            await sync_to_async(_embedded_pass, thread_sensitive=False)(fresh_start=first)
            first = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage.failed(exc)
        else:
            outage.worked()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=interval)
        event.clear()
