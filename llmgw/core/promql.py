"""Reading the console's charts from Prometheus (LLMGW_PROMETHEUS_URL): range queries of
PromQL over the series llmgw publishes on /metrics, as the seed's console does.

A chart's window is read as 60 points (its span over 60), and `$rate` in a query is the
range its rates are taken over: twice the step, at least a minute, so a 15 s scrape
gives each rate four samples. Prometheus' own answer is checked: a failure, a timeout
or an answer that is not a matrix raises Unanswered with the cause in a sentence, which
the chart shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import httpx

from .history import POINTS

TIMEOUT_S = 5.0


class Unanswered(Exception):
    """Prometheus gave no usable answer; the text says why. `unreachable`: it did not
    answer at all (a timeout, no connection), rather than refusing one query."""

    def __init__(self, text: str, unreachable: bool = False):
        super().__init__(text)
        self.unreachable = unreachable


def quoted(value: str) -> str:
    """`value` as a PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _rate_range(step: float) -> str:
    return f"{int(max(60.0, 2 * step))}s"


def query_range(url: str, query: str, start: float, end: float, step: float) -> list[dict]:
    """The matrix Prometheus answers for `query` from `start` to `end` every `step`."""
    query = query.replace("$rate", _rate_range(step))
    params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    data = _data(url, "query_range", params, TIMEOUT_S, query)
    if data.get("resultType") != "matrix":
        raise Unanswered(f"Prometheus at {url} answered no matrix for {query!r}.")
    result = data.get("result")
    if not isinstance(result, list):
        raise Unanswered(f"Prometheus at {url} answered no series for {query!r}.")
    return result


def _number(text: Any) -> float | None:
    try:
        value = float(text)  # Prometheus sends numbers as strings, "NaN" and "+Inf" too
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def aligned(series: dict, times: Sequence[float], step: float) -> tuple[float | None, ...]:
    """A series' values at `times` (the nearest sample within half a step), None elsewhere."""
    start = times[0]
    out: list[float | None] = [None] * len(times)
    for pair in series.get("values") or ():
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            continue
        at = _number(pair[0])
        if at is None:
            continue
        i = round((at - start) / step)
        if 0 <= i < len(times):
            out[i] = _number(pair[1])
    return tuple(out)


def chart_read(
    url: str, chart: Any, span: float, now: float
) -> tuple[tuple[float, ...], list[tuple[float | None, ...]]]:
    """A chart's lines (llmgw.core.charts.Chart) over the `span` seconds up to `now`, at
    60 points."""
    step = span / POINTS
    end = now  # the last point is now, as the history's open slot is
    times = tuple(end - step * (POINTS - 1 - i) for i in range(POINTS))
    start = times[0]
    shared = query_range(url, chart.promql, start, end, step) if chart.promql else []
    values = []
    for line in chart.lines:
        if line.promql:
            found = query_range(url, line.promql, start, end, step)
        else:
            wanted = dict(line.match)
            found = [
                s
                for s in shared
                if all((s.get("metric") or {}).get(k) == v for k, v in wanted.items())
            ]
        values.append(aligned(found[0], times, step) if found else (None,) * POINTS)
    return times, values


def query_instant(url: str, query: str, timeout: float = TIMEOUT_S) -> list[dict]:
    """The series of the instant vector Prometheus answers for `query` now."""
    data = _data(url, "query", {"query": query}, timeout, query)
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise Unanswered(f"Prometheus at {url} answered no instant vector for {query!r}.")
    return data["result"]


def _data(url: str, path: str, params: dict, timeout: float, query: str) -> dict:
    """The `data` of Prometheus' successful answer at /api/v1/`path`; Unanswered with the
    cause in a sentence (`unreachable` when it did not answer at all); {} when it gave no
    data object."""
    try:
        answer = httpx.get(url.rstrip("/") + "/api/v1/" + path, params=params, timeout=timeout)
    except httpx.TimeoutException:
        raise Unanswered(
            f"Prometheus at {url} did not answer within {timeout:g} s.", True
        ) from None
    except httpx.HTTPError as exc:
        raise Unanswered(f"Prometheus at {url} could not be reached: {exc}.", True) from None
    try:
        body = answer.json()
    except ValueError:
        raise Unanswered(
            f"Prometheus at {url} answered {answer.status_code} with something other than JSON."
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise Unanswered(f"Prometheus at {url} refused {query!r} ({answer.status_code}): {error}.")
    data = body.get("data")
    return data if isinstance(data, dict) else {}  # no data: each caller says what it wanted
