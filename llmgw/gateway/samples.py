"""The gateway's readings for the console's history (llmgw/core/history.py): per model
and in all, requests, completion tokens and errors a second, and the time to first token
at the 95th percentile, each over the step since the last reading.

Read from the counters `/metrics` publishes, summed over the server's workers when it
runs several (llmgw/core/worker_series.py), so every worker's history says the same.
A rate needs two readings: the first after a start, and any where a counter went back,
gives none. A percentile needs a streamed request in the step; none, and there is no
reading (a step with no request is not one of zero seconds).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

from prometheus_client import CollectorRegistry, multiprocess

from llmgw.core import worker_series
from llmgw.core.history import Reading
from llmgw.core.traffic import GATEWAY, MODEL

from .metrics import REGISTRY


class Totals:
    __slots__ = ("requests", "tokens", "errors", "buckets")

    def __init__(self) -> None:
        self.requests = self.tokens = self.errors = 0.0
        self.buckets: dict[float, float] = defaultdict(float)  # le → cumulative count


def _families():
    path = worker_series.folder()
    if path is None:
        return REGISTRY.collect()
    registry = CollectorRegistry(auto_describe=False)
    multiprocess.MultiProcessCollector(registry, path)
    return registry.collect()


def totals() -> dict[str, Totals]:
    """Every model's counters as they stand (the "" model: requests naming none known)."""
    out: dict[str, Totals] = defaultdict(Totals)
    for family in _families():
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            if sample.name == "llmgw_gateway_requests_total":
                out[model].requests += sample.value
            elif sample.name == "llmgw_gateway_errors_total":
                out[model].errors += sample.value
            elif sample.name == "llmgw_gateway_tokens_total":
                if sample.labels.get("kind") == "completion":
                    out[model].tokens += sample.value
            elif sample.name == "llmgw_gateway_time_to_first_token_seconds_bucket":
                out[model].buckets[float(sample.labels["le"])] += sample.value
    return out


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of what a histogram counted between two readings (cumulative counts
    by upper bound), interpolated in its bucket as Prometheus' histogram_quantile does."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0 or any(c < 0 for c in counts):
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bound: that bound is all that is known
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None


class Rates:
    """Readings from the change in the counters since the last call."""

    def __init__(self, read: Callable[[], dict[str, Totals]] | None = None) -> None:
        self._read = read or totals
        self._last: tuple[float, dict[str, Totals]] | None = None

    def __call__(self, now: float) -> dict[str, Reading]:
        current = self._read()
        last, self._last = self._last, (now, current)
        readings: dict[str, Reading] = {}
        if last is None or now <= last[0]:
            return readings
        seconds = now - last[0]
        before = last[1]
        summed = [0.0, 0.0, 0.0]
        gone = False
        for model, t in current.items():
            b = before.get(model, Totals())
            deltas = (t.requests - b.requests, t.tokens - b.tokens, t.errors - b.errors)
            if any(d < 0 for d in deltas):
                gone = True  # a counter went back: no rate this step
                continue
            rates = [d / seconds for d in deltas]
            summed = [s + r for s, r in zip(summed, rates, strict=True)]
            if model:
                ttft = quantile(0.95, b.buckets, t.buckets)
                readings[f"model:{model}"] = (MODEL, [rates[0], rates[1], ttft, rates[2]])
        if not gone:
            readings["gateway"] = (GATEWAY, summed)
        return readings
