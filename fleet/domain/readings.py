"""What a replica's engine says of itself (issue 36: the engines' own signals).

The agent reads each engine's metrics (fleet/agent/engines.py) and reports, per shard,
the requests it runs and queues, its KV cache's use and its prefix cache's hit rate. A
figure an engine does not report is absent (None), never 0: a llama-server reports no KV
use, and an idle engine has no hit rate. Pure: the selectors read the figures, the
gateway, the autoscaler, the pages and `/metrics` read the `Reading`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reading:
    """One replica's engine, as it last said: requests running and waiting, the share of its
    KV cache in use, and prompt tokens found in its prefix cache over those looked up."""

    running: int | None = None
    waiting: int | None = None
    kv_cache: float | None = None
    prefix_hit_rate: float | None = None
    # The LoRA adapters its engine holds, by name, with llama-server's index of each (None
    # for vLLM); None when it did not say, () when it holds none.
    adapters: tuple[tuple[str, int | None], ...] | None = None
    # How many requests its engine runs at once, as the agent read it from the engine's
    # command; None where the command left it to the engine's default.
    slots: int | None = None
    # The adapters whose files its agent is fetching for it to load: (name, bytes done, of
    # total or None); () when it fetches none.
    fetching: tuple[tuple[str, int, int | None], ...] = ()

    def holds(self, adapter: str) -> bool:
        return self.adapters is not None and any(n == adapter for n, _ in self.adapters)

    def engine_id(self, adapter: str) -> int | None:
        """llama-server's index of `adapter`; None when it has none or does not hold it."""
        return next((i for n, i in self.adapters or () if n == adapter), None)

    def fetched(self, adapter: str) -> tuple[int, int | None] | None:
        """How far the fetch of `adapter`'s files got (bytes done, of total); None when its
        agent is not fetching them."""
        return next(((d, t) for n, d, t in self.fetching if n == adapter), None)

    @property
    def queued(self) -> int:
        """Requests it holds, running or waiting, as far as it said (0 where it did not)."""
        return (self.running or 0) + (self.waiting or 0)


def replica_reading(shards: Iterable[Mapping]) -> Reading | None:
    """A replica's reading from what its shards' engines reported (a shard's figures as the
    agent sends them: `running`, `waiting`, `kv_cache`, `prefix_hit_rate`). Requests are
    summed over the shards that said, the KV use is the fullest, the hit rate the first
    said (only the shard serving HTTP has one). None when no shard said anything."""
    running = waiting = kv = rate = slots = None
    adapters: tuple[tuple[str, int | None], ...] | None = None
    fetching: tuple[tuple[str, int, int | None], ...] = ()
    said = False
    for figures in shards:
        if not isinstance(figures, Mapping):
            continue
        said = True
        if (r := _count(figures.get("running"))) is not None:
            running = (running or 0) + r
        if (w := _count(figures.get("waiting"))) is not None:
            waiting = (waiting or 0) + w
        if (k := _share(figures.get("kv_cache"))) is not None:
            kv = k if kv is None else max(kv, k)
        if rate is None:
            rate = _share(figures.get("prefix_hit_rate"))
        if adapters is None:
            adapters = _adapters(figures.get("adapters"))
        fetching += _fetching(figures.get("adapters_fetching"))
        if slots is None and (n := _count(figures.get("slots"))):
            slots = n  # the shard serving HTTP: one engine's slots, not a sum
    if not said:
        return None
    return Reading(
        running=running,
        waiting=waiting,
        kv_cache=kv,
        prefix_hit_rate=rate,
        adapters=adapters,
        slots=slots,
        fetching=fetching,
    )


def _adapters(value: object) -> tuple[tuple[str, int | None], ...] | None:
    """The adapters a shard said its engine holds (`[{"name", "engine_id"}]`); None when it
    said nothing of them."""
    if not isinstance(value, list):
        return None
    out = []
    for a in value:
        if isinstance(a, Mapping) and isinstance(name := a.get("name"), str):
            i = a.get("engine_id")
            out.append((name, i if isinstance(i, int) and not isinstance(i, bool) else None))
    return tuple(out)


def _fetching(value: object) -> tuple[tuple[str, int, int | None], ...]:
    """The adapters a shard said its agent fetches (`[{"name", "done", "total"}]`), each
    with its bytes done and total (None where not said or not a count); () for none."""
    if not isinstance(value, list):
        return ()
    return tuple(
        (name, done, _bytes(f.get("total")))
        for f in value
        if isinstance(f, Mapping)
        and isinstance(name := f.get("name"), str)
        and (done := _bytes(f.get("done"))) is not None
    )


def _bytes(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return int(value)


def _share(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return None
    return float(value)
