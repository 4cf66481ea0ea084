"""The gateway's series on `/metrics`: requests, errors, tokens and latency by model.

Kept by prometheus_client in a registry of their own, per process: with several
`llmgw serve` servers, Prometheus scrapes each (the `instance` label tells
them apart) and sums; the workers of one server are summed by the server
(llmgw/core/worker_series.py). `model` is always a catalog name (never what a caller
typed), or "" for a request that named no model the gateway knows, so the
label cannot grow without bound.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from tenancy.budgets import Book

REGISTRY = CollectorRegistry(auto_describe=True)

# Added latency is a millisecond or two, generation seconds to minutes.
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

REQUESTS = Counter(
    "llmgw_gateway_requests",
    "Requests answered by the gateway, by model and HTTP status.",
    ["model", "code"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "llmgw_gateway_errors",
    "Requests that failed, by model and why: auth, limit, unknown_model, not_allowed, "
    "bad_request, no_replica, loading, upstream, upstream_status, stream_cut, client_gone, "
    "shutdown, internal, budget (a spend budget spent whole), overloaded (a priority band "
    "displaced under overload).",
    ["model", "reason"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "llmgw_gateway_tokens",
    "Tokens the engines reported in their usage, by model and kind (prompt, completion, "
    "cached: the prompt tokens an engine found in its cache; estimated: the prompt and "
    "completion tokens counted without an engine's figures, for requests cut first).",
    ["model", "kind"],
    registry=REGISTRY,
)
ROUTED = Counter(
    "llmgw_gateway_routed",
    "Requests sent to a replica, by model and how it was chosen: prefix (the first in "
    "the order of the prompt's prefix), imbalance (a later one: those before were too busy), "
    "least_loaded, "
    "round_robin, suspect (only replicas refusing connections were left).",
    ["model", "how"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "llmgw_gateway_request_duration_seconds",
    "From the request's arrival to its last byte, by model.",
    ["model"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
FIRST_TOKEN = Histogram(
    "llmgw_gateway_time_to_first_token_seconds",
    "From a streamed request's arrival to its first byte from the engine, by model.",
    ["model"],
    buckets=_SECONDS,
    registry=REGISTRY,
)
RUNNING = Gauge(
    "llmgw_gateway_requests_running",
    "Requests sent to an engine and not yet answered, by model.",
    ["model"],
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
WAITING = Gauge(
    "llmgw_gateway_requests_waiting",
    "Requests waiting at the gateway for a replica to be ready, by model.",
    ["model"],
    registry=REGISTRY,
    multiprocess_mode="livesum",
)

DISPLACED = Counter(
    "llmgw_gateway_displaced",
    "Requests refused while their model's waiting work was past its bound, by model and the "
    "priority band refused (docs/gateway.md, Priority).",
    ["model", "band"],
    registry=REGISTRY,
)
BUDGET_SPENT = Gauge(
    "llmgw_gateway_budget_spent",
    "What each budgeted key or scope spent this UTC day or month, as the gateway last read "
    "it (every 2 s), by scope, period (day, month) and unit (tokens, cost).",
    ["scope", "period", "unit"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
BUDGET_AMOUNT = Gauge(
    "llmgw_gateway_budget",
    "Each budget's figure, by scope, period and unit: llmgw_gateway_budget_spent over it is "
    "the share spent.",
    ["scope", "period", "unit"],
    registry=REGISTRY,
    multiprocess_mode="livemax",
)


class ModelSeries:
    """One model's children, looked up once rather than on every request."""

    __slots__ = (
        "model",
        "duration",
        "first_token",
        "prompt",
        "completion",
        "_cached",
        "_estimated",
        "_codes",
        "_routed",
    )

    def __init__(self, model: str) -> None:
        self.model = model
        self.duration = DURATION.labels(model)
        self.first_token = FIRST_TOKEN.labels(model)
        self.prompt = TOKENS.labels(model, "prompt")
        self.completion = TOKENS.labels(model, "completion")
        # Made on the first cached token: a model whose engines never report any says
        # nothing, not 0.
        self._cached = None
        self._estimated = None
        self._codes: dict[int, object] = {}
        self._routed: dict[str, object] = {}

    def answered(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = REQUESTS.labels(self.model, str(code))
        child.inc()

    def cached(self, tokens: int) -> None:
        if self._cached is None:
            self._cached = TOKENS.labels(self.model, "cached")
        self._cached.inc(tokens)

    def estimated(self, tokens: int) -> None:
        if self._estimated is None:
            self._estimated = TOKENS.labels(self.model, "estimated")
        self._estimated.inc(tokens)

    def routed(self, how: str) -> None:
        child = self._routed.get(how)
        if child is None:
            child = self._routed[how] = ROUTED.labels(self.model, how)
        child.inc()

    def failed(self, reason: str) -> None:
        ERRORS.labels(self.model, reason).inc()


_series: dict[str, ModelSeries] = {}


def series(model: str) -> ModelSeries:
    s = _series.get(model)
    if s is None:
        s = _series[model] = ModelSeries(model)
    return s


def load_gauges(counts: dict[str, tuple[int, int]]) -> None:
    for model, (running, waiting) in counts.items():
        RUNNING.labels(model).set(running)
        WAITING.labels(model).set(waiting)


def budget_gauges(book: Book, now: datetime) -> None:
    """Every budget and what its scope spent in the window `now` falls in, as `book` says."""
    for scope, budgets in book.budgets.items():
        name = book.names.get(scope, scope)
        for b in budgets:
            spent = book.spent_now(scope, b.period, now).of(b.unit)
            BUDGET_SPENT.labels(name, b.period, b.unit).set(float(spent))
            BUDGET_AMOUNT.labels(name, b.period, b.unit).set(float(b.amount))


class _Spoken:
    """The registry's families that have a sample: nothing said of a gateway never used."""

    def collect(self):
        return (family for family in REGISTRY.collect() if family.samples)


def gateway_text() -> str:
    return generate_latest(_Spoken()).decode()
