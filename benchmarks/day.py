"""A day of the console's history as its rings keep it (llmgw/core/history.py): the moments
to record so that every ring is full. Shared by benchmarks/history.py, which measures the
rings, and benchmarks/pages.py, which fills them behind the pages it times."""

from __future__ import annotations

DAY = 86400


def day_times(step: float, end: float) -> list[float]:
    """A day of steps, as the rings keep it: each ring's span recorded at its own slot."""
    spans = [(DAY, 96), (21600, 24), (3600, 4), (900, 1)]
    out: list[float] = []
    start = end - DAY
    for (span, multiple), (next_span, _) in zip(spans, [*spans[1:], (0, 0)], strict=True):
        t = max(start, end - span)
        stop = end - next_span
        while t < stop:
            out.append(t)
            t += step * multiple
        start = stop
    return out
