"""What the fleet and the gateway measured over the last day, kept in this process for the
console's charts when no Prometheus is named (LLMGW_PROMETHEUS_URL).

Every `step` seconds (LLMGW_HISTORY_STEP_SECONDS, 15) `llmgw serve` asks the samplers
its rooms registered (fleet: nodes, GPUs, replicas; the gateway: requests, tokens,
latency) for a reading of every group they know, and records them. A group is one
node, one model, the fleet: a fixed list of series (its Schema), written together.

Four rings of 60 slots keep each series, as a round-robin database does: one slot per
step (15 min at 15 s), per 4 steps (1 h), per 24 (6 h) and per 96 (24 h). A coarser
slot is the mean of the finer slots it covers, made when it closes; the one still open
is worked out when read, so every chart ends now. Nodes' series are percentages,
degrees and watts, kept as one byte each (Schema.scales: a reading times its scale,
255 for nothing measured), which is what keeps a day of 5,000 nodes of 8 GPUs near
40 MB; the fleet's and the models' are few and kept as 32-bit floats.

A slot nothing was measured in is absent, never zero: a chart draws a gap there, and
says "no data" when the whole window is empty. A group nobody gave a reading of for a
whole day is forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .outage import Outage

log = logging.getLogger("llmgw.history")

POINTS = 60
# Each ring's slot, in steps: 15 min, 1 h, 6 h and 24 h of 60 slots at the default step.
MULTIPLES = (1, 4, 24, 96)
ABSENT = 255  # a byte series' slot with nothing measured
_BYTE_TOP = 254


@dataclass(frozen=True)
class Schema:
    """A group's series, in order. `scales` given: each kept as one byte, a reading times
    its scale rounded and held to 0–254 (2 keeps a percentage to half a point, 0.2 watts
    to 5 W); not given: 32-bit floats, any figure."""

    names: tuple[str, ...]
    scales: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.scales is not None and len(self.scales) != len(self.names):
            raise ValueError("a schema needs one scale per series")

    @property
    def compact(self) -> bool:
        return self.scales is not None


# What a sampler gives per group: its schema and a reading per series (None: not measured).
Reading = tuple[Schema, Sequence[float | None]]
Sampler = Callable[[float], Mapping[str, Reading]]


class _Block:
    """Every group of one schema, in one array: (groups, rings, series, slots). A record
    writes, and a closing slot averages, every group of a block at once."""

    def __init__(self, schema: Schema, levels: int) -> None:
        self.schema = schema
        self.empty = ABSENT if schema.compact else np.nan
        dtype = np.uint8 if schema.compact else np.float32
        self.data = np.full((0, levels, len(schema.names), POINTS), self.empty, dtype=dtype)
        self.names: list[str | None] = []  # each row's group; None: free
        self.given = np.zeros(0)  # when each row was last given a reading
        self.free: list[int] = []
        self.index = {name: i for i, name in enumerate(schema.names)}
        self._scales = np.array(schema.scales) if schema.compact else None

    def add(self, name: str, t: float) -> int:
        if not self.free:
            old = len(self.names)
            grown = old + max(16, old // 16)
            data = np.full((grown, *self.data.shape[1:]), self.empty, dtype=self.data.dtype)
            data[:old] = self.data
            self.data = data
            self.given = np.concatenate([self.given, np.full(grown - old, np.inf)])
            self.names.extend([None] * (grown - old))
            self.free = list(range(grown - 1, old - 1, -1))
        row = self.free.pop()
        self.data[row] = self.empty
        self.names[row] = name
        self.given[row] = t
        return row

    def remove(self, row: int) -> None:
        self.names[row] = None
        self.data[row] = self.empty
        self.given[row] = np.inf  # never stale: nothing to forget
        self.free.append(row)

    def encoded(self, values: list[Sequence[float | None]]) -> np.ndarray:
        """Readings (groups × series) as stored."""
        raw = np.array(
            [[math.nan if v is None else v for v in row] for row in values], dtype=np.float64
        )
        if self._scales is None:
            return raw.astype(np.float32)
        scaled = np.rint(raw * self._scales)
        return np.where(np.isnan(scaled), ABSENT, np.clip(scaled, 0, _BYTE_TOP)).astype(np.uint8)

    def decoded(self, stored: np.ndarray) -> np.ndarray:
        """One group's stored slots (series × slots) back to readings, NaN where absent."""
        if self._scales is None:
            return stored.astype(np.float64)
        out = stored.astype(np.float64)
        out[stored == ABSENT] = math.nan
        return out / self._scales[:, None]

    def mean(self, stored: np.ndarray) -> np.ndarray:
        """The mean over the last axis (slots, stored form) of what was measured, stored."""
        values = stored.astype(np.float32)
        if self._scales is not None:
            values[stored == ABSENT] = np.nan
        counted = (~np.isnan(values)).sum(axis=-1)
        sums = np.nansum(values, axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(counted > 0, sums / np.maximum(counted, 1), np.nan)
        if self._scales is None:
            return mean.astype(np.float32)
        return np.where(np.isnan(mean), ABSENT, np.rint(mean)).astype(np.uint8)


@dataclass(frozen=True)
class Window:
    """One ring read for a chart: the slots' start times (Unix seconds, oldest first), the
    slot's length, and per series its readings (None where nothing was measured)."""

    times: tuple[float, ...]
    step: float
    series: Mapping[str, tuple[float | None, ...]]


class History:
    """The rings of every group, written by `record` and read by `window`; thread-safe
    (the sampler writes from a thread of its own while pages read)."""

    def __init__(self, step: float = 15.0, multiples: Sequence[int] = MULTIPLES) -> None:
        if step <= 0:
            raise ValueError("a history's step must be more than 0 seconds")
        self.step = float(step)
        self.multiples = tuple(multiples)
        self._lock = threading.Lock()
        self.clear()

    def spans(self) -> tuple[float, ...]:
        """How far back each ring reaches, in seconds."""
        return tuple(self.step * m * POINTS for m in self.multiples)

    def _slot(self, level: int, t: float) -> int:
        return int(t // (self.step * self.multiples[level]))

    def record(self, t: float, readings: Mapping[str, Reading]) -> None:
        """Record what was measured at `t` (Unix seconds). A group known before and not in
        `readings` is recorded as not measured; one not given for a whole day is dropped."""
        with self._lock:
            given: dict[int, tuple[_Block, list[int], list]] = {}
            for name, (schema, values) in readings.items():
                where = self._where.get(name)
                if where is not None and where[0].schema != schema:
                    # A node whose GPUs changed starts a new history.
                    where[0].remove(where[1])
                    where = None
                if where is None:
                    block = self._blocks.get(schema)
                    if block is None:
                        block = self._blocks[schema] = _Block(schema, len(self.multiples))
                    where = self._where[name] = (block, block.add(name, t))
                block, row = where
                _, rows, rows_values = given.setdefault(id(block), (block, [], []))
                rows.append(row)
                rows_values.append(values)
            for level in range(1, len(self.multiples)):
                self._close(level, self._slot(level, t))
            slot = self._slot(0, t)
            position = slot % POINTS
            self._stamps[0, position] = slot
            self._open[0] = slot
            longest = self.spans()[-1]
            for block in self._blocks.values():
                block.data[:, 0, :, position] = block.empty
                if id(block) in given:
                    _, rows, rows_values = given[id(block)]
                    block.data[rows, 0, :, position] = block.encoded(rows_values)
                    block.given[rows] = t
                for stale in np.flatnonzero(block.given < t - longest):
                    gone = block.names[stale]
                    if gone is not None:
                        del self._where[gone]
                        block.remove(int(stale))

    def _close(self, level: int, current: int) -> None:
        """Close ring `level`'s open slot once time has moved past it: its value is the
        mean of the finer ring's slots it covers."""
        open_slot = self._open[level]
        self._open[level] = current
        if open_slot is None or open_slot == current:
            return
        positions = self._covered(level - 1, level, open_slot)
        position = open_slot % POINTS
        self._stamps[level, position] = open_slot
        for block in self._blocks.values():
            if positions:
                block.data[:, level, :, position] = block.mean(
                    block.data[:, level - 1][..., positions]
                )
            else:
                block.data[:, level, :, position] = block.empty

    def _covered(self, finer: int, level: int, slot: int) -> list[int]:
        """The positions in ring `finer` of the slots that slot `slot` of ring `level`
        covers and that hold what they should (not a lap older)."""
        ratio = self.multiples[level] // self.multiples[finer]
        first = slot * ratio
        return [
            s % POINTS for s in range(first, first + ratio) if self._stamps[finer, s % POINTS] == s
        ]

    def _open_values(self, block: _Block, row: int, level: int) -> np.ndarray:
        """Ring `level`'s open slot of one group, worked out from the finer ring (stored)."""
        slot = self._open[level]
        if level == 0 or slot is None:
            return block.data[row, 0][:, (slot or 0) % POINTS]
        positions = self._covered(level - 1, level, slot)
        finer = [block.data[row, level - 1][:, positions]] if positions else []
        if level - 1 > 0 and self._open[level - 1] is not None:
            finer.append(self._open_values(block, row, level - 1)[:, None])
        if not finer:
            return np.full(len(block.schema.names), block.empty, dtype=block.data.dtype)
        return block.mean(np.concatenate(finer, axis=1))

    def window(self, name: str, level: int, now: float) -> Window:
        """Ring `level` of group `name` up to `now`: 60 slots, the last one open."""
        step = self.step * self.multiples[level]
        last = self._slot(level, now)
        slots = range(last - POINTS + 1, last + 1)
        times = tuple(s * step for s in slots)
        with self._lock:
            where = self._where.get(name)
            if where is None:
                return Window(times, step, {})
            block, row = where
            stored = np.full((len(block.schema.names), POINTS), block.empty, dtype=block.data.dtype)
            for i, s in enumerate(slots):
                if s == self._open[level]:
                    stored[:, i] = self._open_values(block, row, level)
                elif self._stamps[level, s % POINTS] == s:
                    stored[:, i] = block.data[row, level][:, s % POINTS]
            values = block.decoded(stored)
            names = block.schema.names
        return Window(
            times,
            step,
            {
                n: tuple(None if math.isnan(v) else float(v) for v in values[i])
                for i, n in enumerate(names)
            },
        )

    def names(self) -> list[str]:
        with self._lock:
            return list(self._where)

    def nbytes(self) -> int:
        """The rings' bytes (what grows with the fleet), for the benchmark."""
        with self._lock:
            return sum(b.data.nbytes for b in self._blocks.values()) + self._stamps.nbytes

    def clear(self, step: float | None = None) -> None:
        """Forget everything; with `step`, start over with slots of that many seconds."""
        if step is not None and step <= 0:
            raise ValueError("a history's step must be more than 0 seconds")
        with self._lock:
            self._blocks: dict[Schema, _Block] = {}
            self._where: dict[str, tuple[_Block, int]] = {}
            # Per ring, the slot number each position last held (-1: none yet), shared by
            # every group: each record writes every group, given a reading or not.
            self._stamps = np.full((len(self.multiples), POINTS), -1, dtype=np.int64)
            self._open: list[int | None] = [None] * len(self.multiples)
            if step is not None:
                self.step = float(step)


_samplers: dict[str, Sampler] = {}
HISTORY = History()


def sampler(name: str, read: Sampler) -> None:
    """Register `read(now)` as the sampler `name` (the last registration stands): each
    step it is asked for the readings of every group it knows."""
    _samplers[name] = read


_outages: dict[str, Outage] = {}


def sample(now: float | None = None, history: History | None = None) -> None:
    """Ask every sampler once and record what they said. A sampler that fails has its
    groups recorded as not measured, the others' kept; the log says so when it starts
    failing and when it works again, not every step (a database outage)."""
    now = time.time() if now is None else now
    readings: dict[str, Reading] = {}
    for name, read in list(_samplers.items()):
        outage = _outages.get(name)
        if outage is None:
            outage = _outages[name] = Outage(f"reading the {name}'s history", log)
        try:
            readings.update(read(now))
        except Exception as exc:  # a sampler's fault must not stop the others' history
            outage.failed(exc)
        else:
            outage.worked()
    (history or HISTORY).record(now, readings)


async def run_forever() -> None:
    """Sample every step, on a thread of its own (samplers read the database), until
    cancelled."""
    from llmgw.core.db import database_call

    step = HISTORY.step
    while True:
        started = time.monotonic()
        try:
            await database_call(sample)()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("the history's sample failed: %s", exc)
        await asyncio.sleep(max(0.0, step - (time.monotonic() - started)))
