"""`/metrics`: the fleet's gauges in Prometheus' text format, read from the database per scrape.

Every figure is read from one snapshot of the database when Prometheus asks
(style.md: gauges about the fleet are read by a collector at scrape time), so
any `llmgw serve` process behind a balancer answers the same: nothing about
the fleet is kept in this process but label text and registered GPUs, both
keyed by what the database says they are made of.

The text is rendered straight from that snapshot with the label text cached:
prometheus_client's own exposition spends about 10 µs a sample, a second at
100,000 series. `FleetCollector` hands the same families to a prometheus_client
registry for anyone who wants them there, and the tests hold the two to the
same text.

What a node did not measure has no series at all — a zero would read as a
machine at 0 °C drawing nothing — and readings from a node not heard from for
as long as it takes to call it unreachable are not published.

The metrics are described, and a scrape's series written, in fleet/metrics/series.py;
the nodes' and GPUs' families are read in fleet/metrics/by_node.py, the models' and the
reconciler's in fleet/metrics/by_model.py. Here: one consistent read of them all, with the
last good scrape while the database is away; fleet/metrics/view.py serves it.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from catalog.selectors import catalog_load
from llmgw.core import clock
from llmgw.core.outage import Outage

from ..selectors.facility import facility_domains, held_of_rows
from ..selectors.installs import install_rows
from .by_model import model_series as _models, quota_series, reconciler_series
from .by_node import held_read, node_caches_clear, node_caches_trim, node_series
from .conditions import condition_series
from .series import Scrape, series_cache_trim, series_caches_clear

_lock = threading.Lock()


def caches_clear() -> None:
    """Forget cached label text and GPUs (tests reuse node ids across databases)."""
    with _lock:
        series_caches_clear()
        node_caches_clear()


@contextmanager
def _snapshot():
    """One consistent read of the database, taking no lock a writer waits for.

    PostgreSQL: a repeatable-read, read-only transaction. SQLite: a plain (deferred) BEGIN,
    which in WAL mode reads one snapshot; Django's own atomic() would BEGIN IMMEDIATE here
    (settings.py) and hold the write lock for the whole scrape, keeping the heartbeats'
    write-behind and the reconciler waiting. Inside a caller's transaction, that one.
    """
    if connection.in_atomic_block:
        yield
    elif connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield
    elif connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            try:
                yield
            finally:
                cursor.execute("ROLLBACK")  # it wrote nothing
    else:
        with transaction.atomic():
            yield


def _scrape(now: datetime) -> Scrape:
    scrape = Scrape()
    with _snapshot():
        held = held_read()
        catalog = catalog_load()
        node_series(scrape, now, settings.LLMGW.timings.unreachable, held.gpus, held.spanning)
        _models(scrape, now, catalog)
        quota_series(scrape, catalog, held.models)
        reconciler_series(scrape, now)
        for d in facility_domains(held_of_rows(held.shards, catalog), now=now):
            if d.budget_w is not None:
                scrape.add("llmgw_domain_power_budget_watts", (d.kind, d.name), d.budget_w)
            if d.limit_w is not None:
                scrape.add("llmgw_domain_power_limit_watts", (d.kind, d.name), d.limit_w)
            if d.known:  # GPUs that report no power at all are no reading of 0 W
                scrape.add("llmgw_domain_power_held_watts", (d.kind, d.name), d.estimated_w)
                scrape.add("llmgw_domain_reserved_watts", (d.kind, d.name), d.reserved_w)
            if d.measured_w is not None:
                scrape.add("llmgw_domain_measured_watts", (d.kind, d.name), d.measured_w)
        condition_series(scrape, now)
        for node_id, engine, version, state in install_rows():
            scrape.add("llmgw_node_engine_install", (engine, node_id, state, version), 1)
    series_cache_trim(scrape.series())
    node_caches_trim()
    return scrape


@contextmanager
def _quiet_gc():
    """No cyclic garbage collection while a scrape allocates its few hundred thousand objects,
    none of them in cycles: the collector walking them cost as much as the scrape itself."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fleet_scrape(*, now: datetime | None = None) -> Scrape:
    """Every fleet series, from one snapshot of the database (repeatable read on PostgreSQL).

    A fixed number of queries, however many nodes, GPUs and models there are.
    """
    with _lock, _quiet_gc():
        return _scrape(now or clock.now())


def fleet_text(*, now: datetime | None = None) -> str:
    """`fleet_scrape(...).text()`, in one go."""
    with _lock, _quiet_gc():
        return _scrape(now or clock.now()).text()


class FleetCollector(Collector):
    """The fleet's series for a prometheus_client registry, from one scrape per collect()."""

    def collect(self) -> Iterator[Metric]:
        yield from fleet_scrape().families()


_last_good = {"text": ""}
_scrape_outage = Outage(
    "reading the fleet's metrics from the database", logging.getLogger("llmgw.metrics")
)
DATABASE_DOWN = (
    "# HELP llmgw_database_up Whether this process could read the fleet from the database "
    "for this scrape; while 0 the fleet's series are those of its last good scrape.\n"
    "# TYPE llmgw_database_up gauge\nllmgw_database_up 0.0\n"
)


def fleet_or_last() -> str:
    """The fleet's series; while the database is away, the last good ones and
    llmgw_database_up 0, so a scrape answers and says what it is (never an HTML 500)."""
    try:
        text = fleet_text()
    except (OperationalError, InterfaceError) as exc:
        _scrape_outage.failed(exc)
        return _last_good["text"] + DATABASE_DOWN
    _scrape_outage.worked()
    _last_good["text"] = text
    return text
