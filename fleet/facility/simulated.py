"""A thermal event replayed from a file of timed readings (docs/facility.md, "Rehearsing a
thermal event"): for tests, and for rehearsing one on a cluster with no facility data.

```yaml
start: 2026-12-07T10:00:00Z     # optional: else when the file was last written
readings:
  - at: 0s
    rack/r12-07: {inlet_c: 24}
  - at: 2m
    rack/r12-07: {inlet_c: 29, gpus: 8, throttled: 1}
  - at: 10m
    rack/r12-07: null            # the sensor goes silent: unknown
```

At each moment a domain reads its latest entry at or before it, as if reported then, so an
entry holds until the next; `null` is no reading. Before `start` nothing is read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path

import yaml

from ..domain.conditions import Domain, Readings, Sample
from .config import ConfigError, domain_key, duration

READING_FIELDS = {f.name for f in fields(Readings)}


@dataclass(frozen=True)
class Replay:
    """The entries of a replay, by seconds after `start`."""

    start: float
    entries: tuple[tuple[float, Domain, Readings | None], ...]

    def samples(self, now: float) -> list[Sample]:
        """Each domain's latest entry at or before `now`, as a sample taken now."""
        latest: dict[Domain, Readings | None] = {}
        for at, domain, readings in self.entries:
            if self.start + at <= now:
                latest[domain] = readings
        return [Sample(d, r, now, 0.0) for d, r in latest.items() if r is not None]


def _readings(raw: object, what: str) -> Readings | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or (unknown := set(raw) - READING_FIELDS):
        said = ", ".join(sorted(unknown)) if isinstance(raw, dict) else repr(raw)
        raise ConfigError(f"{what}: {said} is not a reading ({', '.join(sorted(READING_FIELDS))}).")
    try:
        return Readings(**raw)
    except TypeError as exc:
        raise ConfigError(f"{what}: {exc}.") from None


def replay_load(path: Path) -> Replay:
    """The replay file at `path`; ConfigError with the cause when it cannot be one."""
    try:
        doc = yaml.safe_load(path.read_text())
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise ConfigError(
            f"the simulated facility file {path} cannot be read: {exc.strerror}."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"the simulated facility file {path} is not YAML: {exc}.") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("readings"), list):
        raise ConfigError(f"the simulated facility file {path} needs a list of readings.")
    start = doc.get("start")
    if isinstance(start, str):
        start = datetime.fromisoformat(start)
    begin = start.timestamp() if isinstance(start, datetime) else mtime
    entries = []
    for i, entry in enumerate(doc["readings"]):
        what = f"{path.name}: readings[{i}]"
        if not isinstance(entry, dict) or "at" not in entry:
            raise ConfigError(f"{what} needs an at: (a time after the start, such as 2m).")
        at = duration(entry["at"], f"{what}.at")
        for key, raw in entry.items():
            if key != "at":
                entries.append((at, domain_key(key, what), _readings(raw, f"{what}.{key}")))
    return Replay(begin, tuple(sorted(entries, key=lambda e: e[0])))
