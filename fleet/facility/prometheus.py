"""Facility readings from Prometheus: each configured signal an instant query, each series
of its answer a domain, named by the signal's label (config.Signal). `power_watts` is each
domain's draw as the facility meters it (`PrometheusSource.power`), for budgets, not
conditions; it may name a PDU's phases, each by its PDU's label and its phase's
("r12-a/L2").

Prometheus answers an instant query at the time it is asked, and leaves out a series it has
not scraped within its lookback (5 min) or whose target is down: such a domain has no
reading. When Prometheus cannot answer, the last answer is kept and ages: past its
`stale_after` it is absent, and the domain is unknown (treated as ok). What went wrong is
kept in a sentence (`PrometheusSource.failed`), for the log and `ctl facility`.
"""

from __future__ import annotations

import logging
import math

from llmgw.core.promql import Unanswered, query_instant

from ..domain.conditions import Readings, Sample
from ..domain.power import Metered, phase_name_refusal
from .config import SIGNALS, Signal

TIMEOUT_S = 2.0
log = logging.getLogger("llmgw.facility")


def instant(url: str, query: str) -> list[tuple[dict, float, float]]:
    """Prometheus' answer to an instant query: (labels, time, value) per series; a value
    that is not a finite number is left out."""
    out = []
    for series in query_instant(url, query, TIMEOUT_S):
        pair = series.get("value") if isinstance(series, dict) else None
        labels = series.get("metric") or {} if isinstance(series, dict) else None
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(labels, dict):
            continue  # not a sample: skipped, the others kept
        try:
            at, value = float(pair[0]), float(pair[1])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            out.append((labels, at, value))
    return out


def domain_of(signal: Signal, labels: dict) -> tuple[str, str] | None:
    """The domain a series of the signal's answer names: its `domain_label`'s value, or for a
    phase signal its PDU and phase ("r12-a/L2"); None where the series names none a node's
    labels could (a label missing, or a phase no llmgw.io/pdu-phase could carry)."""
    name = str(labels.get(signal.domain_label) or "")
    if signal.phase_label:
        # Stripped as a node's llmgw.io/pdu-phase is (power.phases_of): the same phase.
        name = f"{name.strip()}/{str(labels.get(signal.phase_label) or '').strip()}"
        if phase_name_refusal(name):
            return None
    return (signal.kind, name) if name else None


def _readings(signal: Signal, value: float) -> Readings | None:
    field = SIGNALS[signal.name]
    if field == "inlet_c":
        return Readings(inlet_c=value) if -50 < value < 100 else None
    if field == "cooling_alarm":
        return Readings(cooling_alarm=value > 0)
    if field == "hottest_gpu_c":
        return Readings(gpus=1, hottest_gpu_c=value) if 0 < value < 200 else None
    return None


class PrometheusSource:
    """The configured signals, asked of Prometheus; the last good answer of each kept."""

    def __init__(self, url: str, signals: tuple[Signal, ...]):
        self.url, self.signals = url, signals
        self.last: dict[str, list[Sample]] = {}
        self.failed: dict[str, str] = {}
        # The `power_watts` signal's last good answer: each domain's draw as metered.
        self.power: list[Metered] = []

    def samples(self) -> list[Sample]:
        """Every signal's samples: this answer's, or the last one's where Prometheus gave
        none. Once it cannot be reached, the other signals are not asked this time (a pass
        waits on them)."""
        out: list[Sample] = []
        gone: Unanswered | None = None
        for signal in self.signals:
            try:
                if gone is not None:
                    raise gone
                answer = instant(self.url, signal.query)
            except Unanswered as exc:
                if exc.unreachable:
                    gone = exc
                if self.failed.get(signal.name) != str(exc):
                    log.warning(
                        "facility signal %s: %s",
                        signal.name,
                        exc,
                        extra={"event": "facility_source"},
                    )
                self.failed[signal.name] = str(exc)
            else:
                self.failed.pop(signal.name, None)
                if SIGNALS[signal.name] == "power_w":
                    self.power = [
                        Metered(domain, value, at, signal.stale_after)
                        for labels, at, value in answer
                        if (domain := domain_of(signal, labels)) is not None and value > 0
                    ]
                    continue
                self.last[signal.name] = [
                    Sample(
                        (signal.kind, str(labels[signal.domain_label])), r, at, signal.stale_after
                    )
                    for labels, at, value in answer
                    if labels.get(signal.domain_label)
                    and (r := _readings(signal, value)) is not None
                ]
            out.extend(self.last.get(signal.name, ()))
        return out
