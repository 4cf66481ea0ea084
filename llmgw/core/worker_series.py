"""The series each process counts for itself (the gateway's requests, tokens and latency,
the agents' refusals), summed over the workers of one `llmgw serve --workers N`.

A scrape reaches one worker. So that it reads the whole server, the first process gives
its workers a folder of their own (FOLDER_ENV, prometheus_client's multiprocess mode):
each worker's values then live in memory-mapped files there, and `/metrics` sums them.
A worker that dies keeps its counts in the sum (counters never go back), and its
gauges (requests running, waiting) leave it. One process, no folder: each registry is
read as it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric

FOLDER_ENV = "PROMETHEUS_MULTIPROC_DIR"


def folder() -> str | None:
    """This process's shared folder: set when it is one of several workers."""
    return os.environ.get(FOLDER_ENV) or None


def made() -> str:
    """A new, empty folder for one server's workers (the first process makes it)."""
    return tempfile.mkdtemp(prefix="llmgw-series-")


def worker_gone(path: str, pid: int) -> None:
    """A worker `pid` ended: its gauges no longer count; its counters stay in the sum."""
    multiprocess.mark_process_dead(pid, path)


def removed(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class _Said:
    """The summed families that say something: a counter that counted, a gauge or
    histogram with a sample, as each registry shows on its own."""

    def __init__(self, path: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(self.registry, path)

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.type == "counter":
                if any(s.value for s in family.samples):
                    yield family
            elif family.samples:
                yield family


def summed_text() -> str | None:
    """Every worker's own series summed, in Prometheus' text format; None when this
    process is not one of several workers."""
    path = folder()
    if path is None:
        return None
    return generate_latest(_Said(path)).decode()
