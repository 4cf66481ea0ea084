"""Usage per key, project and model in one-minute buckets, written in batches.

The request path adds to a tally in memory; every few seconds the tallies are
added to the `Usage` rows with one statement (an upsert that adds, so several
gateway processes can write the same bucket), and the replicas used since are
marked used. When the write fails the tallies are kept for the next try.

Each request's own record (who asked what, how it was answered: tenancy
`RequestRecord`, found by its x-request-id) is noted as a tuple and written with
the tallies of the same batch, in their transaction.

Where `llmgw serve` keeps a journal (`journal`), the book also writes there, as
they happen, the requests it begins and ends and the events streams pass on, and
the boundary of each batch it takes, so that what a killed process had in memory
is settled on the next start.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from datetime import datetime

from llmgw.gateway.journal import COMPACT_BYTES, FIGURES, Journal, Tallies, begun, ended

log = logging.getLogger("llmgw.gateway")

MAX_KEPT = 200_000  # tallies kept while the database is away; beyond, the oldest go


class UsageBook:
    """What the request path adds to; only ever touched on the event loop."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.tallies: Tallies = {}
        self.used: set[str] = set()
        self.journal = journal
        self.batch = 0  # the number of the last batch taken, which its journal line names
        # Requests begun and not ended, by their id in the journal: a stream's events are
        # read from it once a second (`progress`).
        self.open: dict[int, object] = {}
        self._told: dict[int, int] = {}  # the events last written, per stream
        self._ids = itertools.count(1)
        # Each request's record (`note`), written with the tallies; none noted when the
        # records are not kept (LLMGW_REQUESTS_KEEP_HOURS=0).
        self.keep_records = True
        self.records: list[tuple] = []

    def begin(self, req, now: float) -> None:
        """A request let in: it gets an id here, and its line in the journal."""
        rid = req.rid = next(self._ids)
        self.open[rid] = req
        if self.journal is not None:
            key = req.key
            self.journal.write(
                begun(rid, now, key.id, key.project_id, req.model, req.estimate, req.reserved)
            )

    def record(
        self,
        *,
        key_id: int,
        project_id: int,
        model: str,
        prompt: int,
        completion: int,
        error: bool,
        latency_ms: float,
        now: float,
        estimated: int = 0,
        request: int = 0,
    ) -> None:
        """A request ended (`request`, its id, 0 for one that never began): its figures
        added to its tally, and written to the journal."""
        k = (int(now // 60), key_id, project_id, model)
        t = self.tallies.get(k)
        if t is None:
            t = self.tallies[k] = [0] * FIGURES
        figures = (1, int(error), prompt, completion, round(latency_ms), estimated)
        for i, x in enumerate(figures):
            t[i] += x
        if request:
            self.open.pop(request, None)
            self._told.pop(request, None)
        if self.journal is not None:
            self.journal.write(ended(request, k, figures))

    def note(self, record: tuple) -> None:
        """A request's record (tenancy/services `request_records_add` reads its fields),
        kept for the next batch."""
        if self.keep_records:
            self.records.append(record)

    def progress(self) -> None:
        """Write the events each stream in flight passed on, for those that passed more since
        the last time: one write, about once a second."""
        if self.journal is None:
            return
        lines = []
        for rid, req in self.open.items():
            events = req.events
            if events and self._told.get(rid) != events:
                self._told[rid] = events
                lines.append(f"p\t{rid}\t{events}\n")
        if lines:
            self.journal.write("".join(lines))

    def take(self) -> tuple[Tallies, set[str]]:
        """What to write now; with tallies, a batch, whose boundary the journal is told."""
        tallies, used = self.tallies, self.used
        self.tallies, self.used = {}, set()
        if tallies and self.journal is not None:
            self.batch += 1
            self.journal.write(f"b\t{self.batch}\n")
        return tallies, used

    def records_take(self) -> list[tuple]:
        """The requests' records to write with the tallies `take` answers."""
        records, self.records = self.records, []
        return records

    def give_back(self, tallies: Tallies, used: set[str], records: Sequence[tuple] = ()) -> None:
        """A batch that could not be written, merged back under what came since."""
        self.records[:0] = records[-MAX_KEPT:]
        del self.records[:-MAX_KEPT]
        for k, v in tallies.items():
            t = self.tallies.setdefault(k, [0] * FIGURES)
            for i, x in enumerate(v):
                t[i] += x
        self.used |= used
        if len(self.tallies) > MAX_KEPT:
            for k in sorted(self.tallies)[: len(self.tallies) - MAX_KEPT]:
                del self.tallies[k]
            log.warning("usage kept in memory passed %d rows; the oldest were dropped", MAX_KEPT)

    def written(self, batch: int) -> None:
        """Batch `batch` is in the database. A journal grown large is rewritten to hold only
        what the database does not: the boundary, what ended since the batch was taken, and
        the requests in flight."""
        journal = self.journal
        if journal is None or journal.size < COMPACT_BYTES:
            return
        lines = [f"b\t{batch}\n"]
        lines += (ended(0, k, v) for k, v in self.tallies.items())
        for rid, req in self.open.items():
            key = req.key
            lines.append(
                begun(
                    rid, req.admitted, key.id, key.project_id, req.model, req.estimate, req.reserved
                )
            )
            if req.events:
                lines.append(f"p\t{rid}\t{req.events}\n")
        journal.rewrite("".join(lines))

    def close(self, *, written: bool) -> str | None:
        """The process is ending: its journal closed, and removed when all it held is in the
        database (`written`: the last batch was, and no request is left in flight).
        Answers the name of a journal removed."""
        journal = self.journal
        if journal is None:
            return None
        self.journal = None
        gone = written and not self.open
        journal.close(remove=gone)
        return journal.name if gone else None

    @property
    def journal_name(self) -> str | None:
        return self.journal.name if self.journal is not None else None


def usage_write(
    *,
    tallies: Tallies,
    used: set[str],
    now: datetime,
    journal: str | None = None,
    batch: int = 0,
    records: Sequence[tuple] = (),
) -> None:
    """Mark the replicas used, then add the tallies to their rows in one transaction
    (tenancy/services.py `usage_add`, which drops rows of keys deleted meanwhile), with,
    for a process keeping a journal, the number of the batch they are, and the requests'
    records; then the records past their keeping deleted (at most hourly)."""
    from fleet.services import replicas_used_mark
    from tenancy.services.usage import usage_add

    # Replica use first and on its own: usage that cannot be written must not make busy
    # on-demand replicas look idle.
    if used:
        replicas_used_mark(replica_ids=used, now=now)
    if tallies or records:
        usage_add(tallies=tallies, journal=journal, batch=batch, records=records)
    _records_expire(now)


def _records_expire(now: datetime) -> None:
    """Records past LLMGW_REQUESTS_KEEP_HOURS deleted, at most hourly; the usage is written
    by then, so a failure here is logged, never given back to be written twice."""
    from django.conf import settings

    from tenancy.services.usage import request_records_expire

    try:
        request_records_expire(now=now, keep_hours=settings.LLMGW.requests_keep_hours)
    except Exception:  # noqa: BLE001 - tried again within the hour
        log.warning("could not delete the request records past their keeping", exc_info=True)
