"""The console's charts: what each shows, read from Prometheus or this process's history,
drawn as SVG on the server.

A page names its charts (Chart: a title, a unit, its lines) and asks `drawn(charts,
window)`. With LLMGW_PROMETHEUS_URL set each line is a PromQL query over llmgw's own
series, as the seed's console reads Prometheus (llmgw/core/promql.py); otherwise it is a
series of the history `llmgw serve` keeps (llmgw/core/history.py). Either way a chart
of a window where nothing was measured says "no data", and a gap in what was measured
is a gap in its line, never a fall to zero. A Prometheus that does not answer is said on
the chart, with its cause.

The SVG is plain markup with classes (static/llmgw.css colours them, light or dark):
no script and no style attribute, so the Content-Security-Policy holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import cast
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from . import history, promql

# The window shown when none is asked: the second of the four (1 h at the default step).
_DEFAULT_LEVEL = 1
WIDTH, HEIGHT = 420, 130
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 6, 8, 8
_COLOURS = 8


@dataclass(frozen=True)
class Line:
    """One line of a chart: its label, the history's series in the chart's group, and how
    Prometheus gives it: a query of its own, or the chart's query's result whose labels
    match `match`."""

    label: str
    series: str
    promql: str = ""
    match: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    unit: str
    group: str
    lines: tuple[Line, ...]
    promql: str = ""  # one query for every line, told apart by their `match`
    top: float | None = None  # a fixed top of the scale (100 for a percentage)
    note: str = ""


@dataclass(frozen=True)
class Drawn:
    chart: Chart
    svg: SafeString
    legend: tuple[tuple[str, str, int], ...]  # label, latest reading, colour
    measured: bool
    said: str = ""  # why there is nothing to draw, when not for want of readings
    spans: tuple[str, str] = ("", "")


@dataclass(frozen=True)
class Windows:
    """The windows offered (one per ring, as `?window=` names them) and their lengths, the
    one shown, and a refusal of what was asked instead."""

    keys: tuple[str, ...]
    spans: tuple[float, ...]
    shown: str
    refused: str = ""

    @property
    def level(self) -> int:
        return self.keys.index(self.shown)


def _span_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def _spans() -> tuple[float, ...]:
    """Each window's length: Prometheus' fixed ones, or the history's rings."""
    if settings.LLMGW.prometheus_url:
        return (900.0, 3600.0, 21600.0, 86400.0)
    return history.HISTORY.spans()


def windows(asked: str | None) -> Windows:
    """The window a page's `?window=` asks for: one of the four, else the default and a
    sentence saying which may be asked."""
    spans = _spans()
    keys = tuple(_span_text(s) for s in spans)
    default = keys[_DEFAULT_LEVEL]
    if not asked or asked in keys:
        return Windows(keys, spans, asked or default)
    said = f"window must be one of {', '.join(keys)}, not {asked[:20]!r}; showing {default}."
    return Windows(keys, spans, default, said)


def drawn(charts: Sequence[Chart], window: str, now: float | None = None) -> list[Drawn]:
    """Each chart over `window` (one of windows()' keys; the default for any other),
    ending `now`."""
    now = time.time() if now is None else now
    shown = windows(window)
    level, span = shown.level, shown.spans[shown.level]
    url = settings.LLMGW.prometheus_url
    out = []
    for chart in charts:
        if url:
            try:
                times, values = promql.chart_read(url, chart, span, now)
            except promql.Unanswered as exc:
                out.append(_unanswered(chart, str(exc)))
                continue
            latest = None
        else:
            got = history.HISTORY.window(chart.group, level, now)
            times = got.times
            values = [got.series.get(line.series, (None,) * len(times)) for line in chart.lines]
            latest = _newest(chart, now) if level else None
        out.append(_drawn(chart, times, values, span, latest))
    return out


def _newest(chart: Chart, now: float) -> list[float | None]:
    """Each line's newest reading, from the finest ring: what a tile beside the chart says
    now, where a coarser window's last slot is a mean (42 % beside a tile's 100 %, or half a
    replica)."""
    return newest(chart.group, [line.series for line in chart.lines], now)


def newest(group: str, series: Sequence[str], now: float | None = None) -> list[float | None]:
    """The newest reading of each of a group's `series` in this process's history, as the
    charts' legends say it, so a tile can say the same; all None with Prometheus named (its
    charts read there) or before any was sampled."""
    if settings.LLMGW.prometheus_url:
        return [None] * len(series)
    got = history.HISTORY.window(group, 0, time.time() if now is None else now)
    return [_latest(got.series.get(name, ())) for name in series]


def _unanswered(chart: Chart, said: str) -> Drawn:
    return Drawn(chart, _svg_empty("Prometheus did not answer"), (), False, said)


def _latest(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def figure(value: float | None, unit: str) -> str:
    """A reading as the chart says it: 83 %, 412 W, 420 ms, 1.2k /s, 0.005 /s; a dash for
    none."""
    if value is None:
        return "–"
    if unit == "s" and 0 < abs(value) < 1:
        return figure(value * 1000, "ms")
    magnitude = abs(value)
    if magnitude >= 10_000:
        text = f"{value / 1000:.0f}k"
    elif magnitude >= 1000:
        text = f"{value / 1000:.1f}k"
    elif magnitude >= 100 or value == int(value):
        text = f"{value:.0f}"
    elif magnitude >= 10:
        text = f"{value:.1f}"
    elif magnitude >= 0.1:
        text = f"{value:.2f}"
    else:
        text = f"{value:.2g}"
    return f"{text} {unit}".strip() if unit else text


def _nice_top(value: float) -> float:
    """A round top for the scale at or above `value`: 1, 2, 2.5 or 5 times a power of 10."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return step * power
    return 10 * power


def _drawn(
    chart: Chart,
    times: Sequence[float],
    values: Sequence[Sequence[float | None]],
    span: float,
    latest: Sequence[float | None] | None = None,
) -> Drawn:
    """The chart drawn; its legend says each line's newest reading (`latest`, when given,
    else the last slot of the window's)."""
    measured = [v for line in values for v in line if v is not None]
    newest = [_latest(v) for v in values] if latest is None else latest
    legend = tuple(
        (
            line.label,
            figure(newest[i] if newest[i] is not None else _latest(v), chart.unit),
            i % _COLOURS,
        )
        for i, (line, v) in enumerate(zip(chart.lines, values, strict=True))
        if any(x is not None for x in v)
    )
    spans = (f"−{_span_text(span)}", "now")
    if not measured:
        return Drawn(chart, _svg_empty("no data"), (), False, spans=spans)
    top = chart.top if chart.top is not None else _nice_top(max(max(measured), 0.0))
    return Drawn(chart, _svg(chart, times, values, top), legend, True, spans=spans)


def _frame(label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(label)}">'
        f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{WIDTH - _LEFT - _RIGHT}" '
        f'height="{HEIGHT - _TOP - _BOTTOM}"/>'
    )


def _svg_empty(text: str) -> SafeString:
    return mark_safe(
        _frame(text) + f'<text class="nodata" x="{(WIDTH + _LEFT) / 2:.0f}" '
        f'y="{HEIGHT / 2:.0f}">{escape(text)}</text></svg>'
    )


def _runs(series: Sequence[float | None]) -> Iterator[list[tuple[int, float]]]:
    """Each run of slots in a row that measured something: [(slot, reading), ...]."""
    for measured, run in groupby(enumerate(series), key=lambda slot: slot[1] is not None):
        if measured:  # so no reading in the run is None
            yield cast(list[tuple[int, float]], list(run))


def _svg(
    chart: Chart, times: Sequence[float], values: Sequence[Sequence[float | None]], top: float
) -> SafeString:
    plot_w = WIDTH - _LEFT - _RIGHT
    plot_h = HEIGHT - _TOP - _BOTTOM
    n = max(len(times) - 1, 1)

    def point(i: int, v: float) -> tuple[str, str]:
        x = _LEFT + plot_w * i / n
        y = _TOP + plot_h * (1 - min(max(v, 0.0), top) / top)
        return f"{x:.1f}", f"{y:.1f}"

    parts = [_frame(chart.title)]
    for fraction in (0.0, 0.5, 1.0):
        gy = _TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{gy:.1f}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{_LEFT - 4}" y="{gy + 4:.1f}">'
            f"{escape(figure(top * fraction, chart.unit))}</text>"
        )
    for index, (line, series) in enumerate(zip(chart.lines, values, strict=True)):
        colour = index % _COLOURS
        said = escape(f"{line.label}: {figure(_latest(series), chart.unit)}")
        segments = []
        for run in _runs(series):
            points = [point(i, v) for i, v in run]
            if len(points) == 1:  # a reading alone between gaps: a dot
                ((cx, cy),) = points
                parts.append(
                    f'<circle class="dot c{colour}" cx="{cx}" cy="{cy}" r="2">'
                    f"<title>{said}</title></circle>"
                )
            else:
                segments.append("M" + " L".join(f"{x} {y}" for x, y in points))
        if segments:
            parts.append(
                f'<path class="series c{colour}" d="{" ".join(segments)}">'
                f"<title>{said}</title></path>"
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))


def charts_context(request: HttpRequest, charts: Sequence[Chart], now: float | None = None) -> dict:
    """What templates/charts.html needs: the charts drawn over the window the request's
    `?window=` asks for, a link per window keeping the page's other parameters, and the
    address its refresh asks (the same window, only the charts)."""
    shown = windows(request.GET.get("window"))
    rest = {k: v for k, v in request.GET.items() if k not in ("window", "fragment")}

    def link(**extra: str) -> str:
        return "?" + urlencode(rest | extra)

    return {
        "charts": drawn(charts, shown.shown, now),
        "windows": shown,
        "window_links": [
            (k, link(window=k), link(window=k, fragment="charts")) for k in shown.keys
        ],
        "charts_refresh": link(window=shown.shown, fragment="charts"),
    }
