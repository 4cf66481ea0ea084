"""What each engine uses of the node: CPU cores and resident memory, from /proc.

An engine runs in a session and process group of its own (the supervisor
starts it with ``start_new_session``), so its use is that of every process
whose session or group is the engine's pid: vLLM's workers count with the
server that forked them. The control plane reads ``rss_bytes`` as a
replica's measured memory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that say whose a process is and what it used."""

    pid: int
    pgrp: int
    session: int
    ticks: int  # utime + stime, in clock ticks
    start: int  # starttime: with the pid, tells one process from a later one given its pid


def parse_stat(pid: int, text: str) -> ProcStat | None:
    """``/proc/<pid>/stat``'s text, or None when it does not parse."""
    # The command name is in parentheses and may hold spaces and ")".
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20:
        return None
    try:
        # fields[0] is the state, the stat's third field.
        pgrp, session = int(fields[2]), int(fields[3])
        utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])
    except ValueError:
        return None
    return ProcStat(pid=pid, pgrp=pgrp, session=session, ticks=utime + stime, start=start)


@dataclass(frozen=True)
class _Seen:
    leader: int
    at: float
    ticks: dict[tuple[int, int], int]


class ShardUseSampler:
    """Samples each engine process group's CPU and resident memory.

    ``cpu_cores`` is the CPU time the group used since the last sample over
    the wall time between them, so a shard's first sample has none.
    ``rss_bytes`` sums the members' resident pages: pages they share are
    counted once per process, which errs high, the safe side for memory.
    CPU used by a process in the moments before it exited is not seen.
    """

    def __init__(
        self,
        *,
        proc_root: str | Path = "/proc",
        clock: Callable[[], float] = time.monotonic,
        ticks_per_s: int | None = None,
        page_size: int | None = None,
    ) -> None:
        self.proc_root = Path(proc_root)
        self._clock = clock
        self._hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
        self._page = page_size or os.sysconf("SC_PAGE_SIZE")
        self._prev: dict[str, _Seen] = {}
        self._lock = threading.Lock()

    def sample(self, leaders: Mapping[str, int]) -> dict[str, dict[str, Any]]:
        """``{shard_id: {cpu_cores, rss_bytes}}`` for engines whose pid is in ``leaders``.

        A shard whose processes are all gone is left out, and so is a figure
        that cannot be read.
        """
        with self._lock:
            now = self._clock()
            members = self.members(set(leaders.values())) if leaders else {}
            out: dict[str, dict[str, Any]] = {}
            seen: dict[str, _Seen] = {}
            for shard_id, leader in leaders.items():
                procs = members.get(leader)
                if not procs:
                    continue
                ticks = {(p.pid, p.start): p.ticks for p in procs}
                seen[shard_id] = _Seen(leader=leader, at=now, ticks=ticks)
                use: dict[str, Any] = {}
                prev = self._prev.get(shard_id)
                if prev is not None and prev.leader == leader and now > prev.at:
                    # A process not seen last time started since: all its
                    # time was used in between.
                    used = sum(max(t - prev.ticks.get(k, 0), 0) for k, t in ticks.items())
                    use["cpu_cores"] = round(used / self._hz / (now - prev.at), 3)
                rss = self._rss(p.pid for p in procs)
                if rss is not None:
                    use["rss_bytes"] = rss
                if use:
                    out[shard_id] = use
            self._prev = seen
            return out

    def members(self, leaders: set[int]) -> dict[int, list[ProcStat]]:
        """Every process in one of ``leaders``' sessions or groups, by leader."""
        found: dict[int, list[ProcStat]] = {}
        try:
            entries = list(os.scandir(self.proc_root))
        except OSError:
            return found
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                text = Path(entry.path, "stat").read_text()
            except OSError:
                continue  # exited while we looked
            st = parse_stat(int(entry.name), text)
            if st is None:
                continue
            leader = st.session if st.session in leaders else st.pgrp
            if leader in leaders:
                found.setdefault(leader, []).append(st)
        return found

    def _rss(self, pids: Iterable[int]) -> int | None:
        total, read = 0, False
        for pid in pids:
            try:
                fields = (self.proc_root / str(pid) / "statm").read_text().split()
                total += int(fields[1]) * self._page
            except (OSError, IndexError, ValueError):
                continue
            read = True
        return total if read else None
