"""The reconciler's facility step: every source's samples, each domain's condition stepped
by the rules (fleet/domain/conditions.py) and kept in its `DomainCondition` row.

Sources are read at most every OBSERVE_EVERY seconds (the agents report every ten): a
faster pass reuses the conditions as they stand. A source that fails, and a sources file
that cannot be read, are said in the log in a sentence and read as no data: the domains go
`unknown`, treated as `ok`. Missing data never stops placement.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.cache import cache

from ..domain.conditions import Domain, Sample, State, fresh, step
from ..domain.plan import Event
from ..domain.power import Metered, metered_fresh
from ..models import DomainCondition
from .agents import agents_samples
from .config import Config, ConfigError, config_load
from .prometheus import PrometheusSource
from .simulated import Replay, replay_load

OBSERVE_EVERY = 10.0
log = logging.getLogger("llmgw.facility")

_loaded: dict[str, tuple] = {}
_last: list[float] = []
# What is wrong with the sources now, in sentences, in the process that reads them (each is
# said in the log when it goes wrong, and published for the API: `failures_publish`).
FAILED: dict[str, str] = {}
# Since when each has been so (seconds), for people.
_FAILED_SINCE: dict[str, float] = {}
# Where the API reads the sources' failures: the cache, Redis when there is one (so a
# reconciler in another process is heard), else the serving process's own memory, where
# the embedded reconciler runs.
FAILURES_KEY = "llmgw-facility-sources-failed"
# Where the facility meter's last readings (a Prometheus `power_watts` signal) are kept for
# placement and `ctl facility list`, the same way; each reader keeps the fresh ones.
METERED_KEY = "llmgw-facility-metered"


def _stamp(path: Path) -> tuple:
    try:
        return (str(path), path.stat().st_mtime)
    except OSError:
        return (str(path), None)


def config_now() -> Config:
    """The sources file as it is now (read again when it changes); Config() with the cause
    said when there is none or it cannot be used."""
    path = settings.LLMGW.facility_sources
    if path is None:
        FAILED.pop("config", None)
        return Config()
    key = _stamp(path)
    if (hit := _loaded.get("config")) is None or hit[0] != key:
        try:
            made: Config | str = config_load(path)
        except ConfigError as exc:
            made = str(exc)
            log.error("facility sources not read: %s", exc, extra={"event": "facility_source"})
        _loaded["config"] = (
            key,
            made,
            PrometheusSource(made.prometheus, made.signals) if isinstance(made, Config) else None,
        )
    made = _loaded["config"][1]
    if isinstance(made, str):
        FAILED["config"] = made
        return Config()
    FAILED.pop("config", None)
    return made


def _replay(path: Path) -> Replay | None:
    key = _stamp(path)
    if (hit := _loaded.get("replay")) is None or hit[0] != key:
        try:
            made: Replay | str = replay_load(path)
        except ConfigError as exc:
            made = str(exc)
            log.error("facility replay not read: %s", exc, extra={"event": "facility_source"})
        _loaded["replay"] = (key, made)
    made = _loaded["replay"][1]
    if isinstance(made, str):
        FAILED["simulated"] = made
        return None
    FAILED.pop("simulated", None)
    return made


def samples_read(config: Config, now: float) -> list[Sample]:
    """Every configured source's samples."""
    out: list[Sample] = []
    if config.agents:
        out.extend(agents_samples(stale_after=config.agents_stale_after))
    prom: PrometheusSource | None = None
    for name in [k for k in FAILED if k.startswith("prometheus ")]:
        FAILED.pop(name)  # said again below while it still fails; gone with its signal
    if config.signals and (hit := _loaded.get("config")) is not None and hit[2] is not None:
        prom = hit[2]
        out.extend(prom.samples())
        FAILED.update({f"prometheus {n}": why for n, why in prom.failed.items()})
    # The meter's draws go to budgets, not conditions: kept for placement and the listing.
    cache.set(METERED_KEY, [tuple(m) for m in prom.power] if prom else [], timeout=None)
    if config.simulated is not None and (replay := _replay(config.simulated)) is not None:
        out.extend(replay.samples(now))
    return out


def metered_now(now: float) -> dict[Domain, float]:
    """Each domain's draw as the facility's meter last read it, fresh readings only
    (power.metered_fresh); empty with no `power_watts` signal."""
    found = cache.get(METERED_KEY) or []
    return metered_fresh([Metered((d[0], d[1]), w, at, stale) for d, w, at, stale in found], now)


def _seconds(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def _when(at: float | None) -> datetime | None:
    return datetime.fromtimestamp(at, UTC) if at is not None else None


def state_of(row: DomainCondition) -> State:
    """A row as the rules' state."""
    return State(
        row.condition,
        _seconds(row.since),
        row.why or "no fresh reading",
        (_seconds(row.above_warm), _seconds(row.above_hot)),
        (_seconds(row.below_warm), _seconds(row.below_hot)),
    )


def _write(row: DomainCondition, s: State, read_at: float | None) -> None:
    row.condition, row.since, row.why = s.condition, _when(s.since), s.why[:300]
    row.above_warm, row.above_hot = _when(s.above[0]), _when(s.above[1])
    row.below_warm, row.below_hot = _when(s.below[0]), _when(s.below[1])
    row.read_at = _when(read_at)


FIELDS = [
    "condition",
    "since",
    "why",
    "above_warm",
    "above_hot",
    "below_warm",
    "below_hot",
    "read_at",
]


# A reading's time is kept to within READ_AT_STEP seconds: each domain's age moves with
# every heartbeat, and writing it every pass for hundreds of domains cost most of the step.
READ_AT_STEP = 30.0


def _floored(at: float | None) -> float | None:
    return None if at is None else at - at % READ_AT_STEP


def conditions_observe(*, now: datetime, force: bool = False) -> list[Event]:
    """Read the sources and step every domain's condition to `now`; return an event per
    domain whose condition changed. Skipped (returns []) within OBSERVE_EVERY seconds of the
    last, unless `force`. A domain whose state moved is written; one whose newest reading
    only got newer, in one update per READ_AT_STEP."""
    at = now.timestamp()
    if not force and _last and 0 <= at - _last[0] < OBSERVE_EVERY:
        return []
    _last[:] = [at]
    config = config_now()
    readings, newest = fresh(samples_read(config, at), at)
    rows: dict[Domain, DomainCondition] = {
        (r.kind, r.name): r for r in DomainCondition.objects.all()
    }
    new, changed, events = [], [], []
    aged: dict[float, list[int]] = {}
    for d in sorted(set(rows) | set(newest)):
        row = rows.get(d)
        before = state_of(row) if row is not None else State()
        after = step(before, readings.get(d), at, config.thresholds_of(d))
        was = _seconds(row.read_at) if row is not None else None
        read_at = _floored(newest[d]) if d in newest else was
        if row is None:
            row = DomainCondition(kind=d[0], name=d[1])
            _write(row, after, read_at)
            new.append(row)
        elif after != before:
            _write(row, after, read_at)
            changed.append(row)
        elif read_at is not None and read_at != was:
            aged.setdefault(read_at, []).append(row.pk)
        if after.condition != before.condition:
            events.append(_event(d, before, after))
    if new:
        DomainCondition.objects.bulk_create(new, ignore_conflicts=True)
    if changed:
        DomainCondition.objects.bulk_update(changed, FIELDS)
    for read_at, ids in aged.items():
        DomainCondition.objects.filter(pk__in=ids).update(read_at=_when(read_at))
    for e in events:
        log.info(e, extra={"event": e.kind, **e.fields})
    failures_publish(at)
    return events


def _source(key: str) -> str:
    """A failure's key as people name the source."""
    if key == "config":
        return "sources file"
    if key.startswith("prometheus "):
        return f"prometheus (signal {key.split(' ', 1)[1]})"
    return key


def failures_publish(now: float, broke: str | None = None) -> None:
    """Publish what is wrong with the sources now (`broke`: the whole step failed, why),
    for `ctl facility conditions` and its REST, with since when each has been so."""
    wrong = dict(FAILED)
    if broke is not None:
        wrong["pass"] = f"the facility step failed: {broke}"
    for key in [k for k in _FAILED_SINCE if k not in wrong]:
        _FAILED_SINCE.pop(key)
    out = []
    for key, why in sorted(wrong.items()):
        since = _FAILED_SINCE.setdefault(key, now)
        out.append({"source": _source(key), "why": why, "since": since})
    cache.set(FAILURES_KEY, {"at": now, "failed": out}, timeout=None)


def _event(d: Domain, before: State, after: State) -> Event:
    kind, name = d
    why = f" ({after.why})" if after.condition not in ("ok", "unknown") else ""
    text = f"{kind} {name} went from {before.condition} to {after.condition}{why}"
    if after.condition == "unknown":
        text += ": no fresh reading, treated as ok"
    return Event(
        text,
        "facility_condition",
        domain=f"{kind}:{name}",
        condition=after.condition,
        was=before.condition,
    )


def sheds_record(events: list, now: datetime) -> None:
    """When a replica was shed off a domain (or would have been, observe-only), or the domain
    was said to have nothing it could shed: each waits the shed interval before its next
    (fleet/domain/shedding.py)."""
    left = {
        tuple(d.split(":", 1))
        for e in events
        if isinstance(e, Event) and e.kind in ("facility_shed", "facility_shed_blocked")
        for d in e.fields.get("domains", ())
    }
    for kind, name in sorted(left):
        DomainCondition.objects.filter(kind=kind, name=name).update(shed_at=now)


def caches_clear() -> None:
    """Forget the sources file, the replay, the last answers and when sources were read."""
    _loaded.clear()
    _last.clear()
    FAILED.clear()
    _FAILED_SINCE.clear()
    cache.delete(FAILURES_KEY)
    cache.delete(METERED_KEY)
