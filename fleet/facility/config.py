"""The facility sources file (LLMGW_FACILITY_SOURCES): YAML, in the seed design's shape.

```yaml
facility:
  thresholds: {warm_inlet_c: 27, hot_inlet_c: 32}   # every domain's, these by default
  domains:                                           # a domain's own, over those
    rack/r12-07: {warm_inlet_c: 25}
  agents: {stale_after: 1m}                          # the nodes' sensors (on by default)
  prometheus: http://monitoring:9090
  signals:
    inlet_temp_c:
      query: max by (rack) (dcim_rack_inlet_temperature_celsius)
      domain_label: rack
      stale_after: 2m
    cooling_alarm: {query: max by (row) (crac_alarm), domain_label: row}
    power_watts:                                     # or a PDU's phases: named r12-a/L2
      query: sum by (pdu, phase) (pdu_phase_power_watts)
      domain_kind: phase
      domain_label: pdu
      phase_label: phase
  simulated: {file: thermal-event.yml}
```

Read once per process; anything wrong stops it with the cause in a sentence
(`ConfigError`), as the other settings do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..domain.conditions import KINDS, Domain, Thresholds

# What each Prometheus signal is read as (conditions.Readings); power_watts is a domain's
# draw as the facility meters it, read by budgets (power.Metered), not by conditions.
SIGNALS = {
    "inlet_temp_c": "inlet_c",
    "cooling_alarm": "cooling_alarm",
    "gpu_temp_c": "hottest_gpu_c",
    "power_watts": "power_w",
}
DEFAULT_STALE_S = 120.0
# What only a meter reads: a PDU's phase has no temperature or alarm of its own (it is in
# its PDU's air), so only power_watts may name one.
PHASE = "phase"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\Z")
_UNIT = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class ConfigError(Exception):
    """The sources file cannot be used; the text says why."""


@dataclass(frozen=True)
class Signal:
    """One configured instant query: its label names the domain (of kind `kind`). A
    `power_watts` signal of kind phase names each phase by two labels, its PDU's
    (`domain_label`) and the phase's (`phase_label`): "r12-a/L2"."""

    name: str
    query: str
    domain_label: str
    kind: str
    stale_after: float = DEFAULT_STALE_S
    phase_label: str = ""


@dataclass(frozen=True)
class Config:
    """Thresholds, and where readings come from."""

    thresholds: Thresholds = Thresholds()
    domains: dict[Domain, Thresholds] = field(default_factory=dict)
    agents: bool = True
    agents_stale_after: float = 60.0
    prometheus: str = ""
    signals: tuple[Signal, ...] = ()
    simulated: Path | None = None

    def thresholds_of(self, domain: Domain) -> Thresholds:
        return self.domains.get(domain, self.thresholds)


def duration(value: Any, what: str) -> float:
    """ "2m", "30s", "1h" or a number of seconds, in seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    m = _DURATION.match(str(value).strip()) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{what} must be a duration such as 90s, 2m or 1h, not {value!r}.")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _thresholds(raw: Any, base: Thresholds, what: str) -> Thresholds:
    if not isinstance(raw, dict):
        raise ConfigError(f"{what} must be a mapping of thresholds, not {raw!r}.")
    known = {f.name for f in fields(Thresholds)}
    if unknown := sorted(set(raw) - known):
        raise ConfigError(
            f"{what}: {', '.join(unknown)} is not a threshold ({', '.join(sorted(known))})."
        )
    values = {}
    for k, v in raw.items():
        if k in ("enter_s", "leave_s"):
            values[k] = duration(v, f"{what}.{k}")
        elif isinstance(v, int | float) and not isinstance(v, bool):
            values[k] = float(v)
        else:
            raise ConfigError(f"{what}.{k} must be a number, not {v!r}.")
    made = Thresholds(**{**base.__dict__, **values})
    if why := made.refusal():
        raise ConfigError(f"{what}: {why}")
    return made


def domain_key(text: Any, what: str) -> Domain:
    """ "rack/r12-07" as ("rack", "r12-07")."""
    kind, _, name = str(text).partition("/")
    if kind not in KINDS or not name:
        raise ConfigError(
            f"{what}: {text!r} is not a domain: KIND/NAME, KIND one of {', '.join(KINDS)}."
        )
    return kind, name


def _signal(name: str, raw: Any) -> Signal:
    what = f"facility.signals.{name}"
    if name not in SIGNALS:
        raise ConfigError(f"{what}: not a signal llmgw reads ({', '.join(SIGNALS)}).")
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("query"), str)
        or not raw["query"].strip()
    ):
        raise ConfigError(f"{what} needs a query.")
    label = raw.get("domain_label")
    kind = raw.get("domain_kind", label)
    phase_label = _phase_label(name, raw, kind, label, what)
    if not isinstance(label, str) or not label or kind not in (*KINDS, PHASE):
        raise ConfigError(
            f"{what} needs a domain_label naming a {', '.join(KINDS)} (or a domain_kind that is one)."
        )
    stale = duration(raw.get("stale_after", DEFAULT_STALE_S), f"{what}.stale_after")
    return Signal(name, raw["query"], label, kind, stale, phase_label)


def _phase_label(name: str, raw: dict, kind: object, label: object, what: str) -> str:
    """The label naming a phase signal's phases ("" for a signal of another kind); ConfigError
    where a signal that cannot read phases names one, or one that does names none."""
    phase_label = raw.get("phase_label")
    if kind != PHASE:
        if phase_label is not None:
            raise ConfigError(
                f"{what}: phase_label names a phase's label, for domain_kind: phase alone."
            )
        return ""
    if SIGNALS[name] != "power_w":
        raise ConfigError(
            f"{what}: a phase has no temperature or alarm of its own (it takes its PDU's "
            "condition): only power_watts reads one."
        )
    if not isinstance(phase_label, str) or not phase_label:
        raise ConfigError(
            f"{what} reads phases: it needs a phase_label, the label naming each phase "
            "(domain_label names its PDU)."
        )
    if phase_label == label:
        raise ConfigError(
            f"{what}: its phase_label and domain_label are one label ({label}): the phase's "
            "is another."
        )
    return phase_label


def config_load(path: Path) -> Config:
    """The sources file at `path`, checked; ConfigError with the cause otherwise."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(
            f"LLMGW_FACILITY_SOURCES: {path} cannot be read: {exc.strerror}."
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"LLMGW_FACILITY_SOURCES: {path} is not YAML: {exc}.") from None
    raw = doc.get("facility") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        raise ConfigError(f"LLMGW_FACILITY_SOURCES: {path} has no facility: mapping.")
    return config_of(raw, path.parent)


def config_of(raw: dict, here: Path) -> Config:
    """The `facility:` mapping as a Config; relative files are read from `here`."""
    known = {"source", "thresholds", "domains", "agents", "prometheus", "signals", "simulated"}
    if unknown := sorted(set(raw) - known):
        raise ConfigError(
            f"facility: {', '.join(unknown)} is not a setting ({', '.join(sorted(known))})."
        )
    base = _thresholds(raw.get("thresholds") or {}, Thresholds(), "facility.thresholds")
    domains = {
        domain_key(k, "facility.domains"): _thresholds(v, base, f"facility.domains.{k}")
        for k, v in (raw.get("domains") or {}).items()
    }
    agents = raw.get("agents", {})
    if agents is False:
        agents_on, agents_stale = False, 60.0
    elif isinstance(agents, dict):
        agents_on = True
        agents_stale = duration(agents.get("stale_after", 60), "facility.agents.stale_after")
    else:
        raise ConfigError("facility.agents must be false or a mapping with stale_after.")
    prom = raw.get("prometheus") or ""
    if prom and (not isinstance(prom, str) or not prom.startswith(("http://", "https://"))):
        raise ConfigError(f"facility.prometheus must be an http(s) URL, not {prom!r}.")
    signals = tuple(_signal(n, v) for n, v in (raw.get("signals") or {}).items())
    if signals and not prom:
        raise ConfigError(
            "facility.signals are queries of Prometheus: name it in facility.prometheus."
        )
    simulated = None
    if (sim := raw.get("simulated")) is not None:
        file = sim.get("file") if isinstance(sim, dict) else sim
        if not isinstance(file, str) or not file:
            raise ConfigError("facility.simulated needs a file of timed readings.")
        simulated = (here / file) if not Path(file).is_absolute() else Path(file)
    return Config(base, domains, agents_on, agents_stale, prom, signals, simulated)
