"""A facility domain's thermal condition (docs/facility.md, "Conditions"): `ok`, `warm`,
`hot` or `unknown`, from its readings against thresholds, with hysteresis and hold times.

Pure: readings, thresholds, the previous state and `now` (seconds) in, the next state out.
A domain is a rack, PDU, row, room or zone, named by the nodes' location labels or by a
source's label (`kind`, `name`). A PDU's phase ("r12-a/L2", `llmgw.io/pdu-phase`) can be
held, but has no condition of its own: it is in its PDU's air, so its nodes stand by their
PDU's condition (they are in both).

- The signals, strongest first: thermal throttling (a share of the domain's GPUs holding
  their clocks down for heat makes it `hot`, any one `warm`), a cooling unit in alarm
  (`hot`), the inlet air against the warm and hot thresholds, and a GPU near its slowdown
  temperature (`warm`). Throttling is the fact that a GPU's measured capacity no longer
  holds; a temperature is a proxy.
- Hold times: a condition is entered only after the readings have pointed at it (or past it)
  for `enter_s` (2 min), and left only after they have stayed below it for `leave_s` (5 min),
  so a single reading neither starts nor ends anything.
- Hysteresis: a temperature counts as below a threshold the domain is already at only once
  it is `band_c` under it, so a sensor hovering at the threshold does not flap.
- Missing data: a reading past its staleness limit is absent (the sources drop it); a domain
  with none is `unknown`, which placement treats as `ok` and people are told is unknown.
  Missing data never refuses anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from llmgw.core.config import Shedding

from .power import RACK_LABEL, ZONE_LABEL, domain_said, pdus_of, phases_of

OK, WARM, HOT, UNKNOWN = "ok", "warm", "hot", "unknown"
CONDITIONS = (OK, WARM, HOT, UNKNOWN)
LEVELS = {OK: 0, WARM: 1, HOT: 2, UNKNOWN: 0}
NAMES = {0: OK, 1: WARM, 2: HOT}
KINDS = ("rack", "pdu", "row", "room", "zone")
# What an operator can hold: those, and a PDU's phase (its breakers trip per phase).
HELD_KINDS = ("rack", "pdu", "phase", "row", "room", "zone")
ROW_LABEL = "llmgw.io/row"
ROOM_LABEL = "llmgw.io/room"
# What holds a GPU's clocks down for heat (the agent's throttle reasons, docs/sensors.md);
# a power cap or a power brake is not the room being too warm.
THERMAL = frozenset({"sw_thermal", "hw_thermal"})

Domain = tuple[str, str]  # (kind, name): ("rack", "r12-07")


@dataclass(frozen=True)
class Thresholds:
    """When a domain is warm or hot, and how long the readings must say so."""

    warm_inlet_c: float = 27.0  # ASHRAE's recommended inlet ceiling
    hot_inlet_c: float = 32.0
    band_c: float = 1.0
    gpu_near_slowdown_c: float = 85.0
    hot_throttled_share: float = 0.25
    enter_s: float = 120.0
    leave_s: float = 300.0

    def refusal(self) -> str | None:
        """Why these thresholds cannot be used, in a sentence; None when they can."""
        if not self.warm_inlet_c < self.hot_inlet_c:
            return (
                f"the warm inlet threshold ({self.warm_inlet_c:g} °C) must be below the hot "
                f"one ({self.hot_inlet_c:g} °C)."
            )
        if self.band_c < 0 or self.enter_s < 0 or self.leave_s < 0:
            return "the band and the hold times cannot be negative."
        if not 0 < self.hot_throttled_share <= 1:
            return f"the hot throttled share must be above 0 and at most 1, not {self.hot_throttled_share:g}."
        return None


@dataclass(frozen=True)
class Readings:
    """A domain's fresh readings, merged from every source; None (or 0 GPUs) where nothing
    fresh said. `gpus` counts the GPUs that reported, `throttled` those thermally throttled."""

    inlet_c: float | None = None
    cooling_alarm: bool | None = None
    gpus: int = 0
    throttled: int = 0
    hottest_gpu_c: float | None = None

    @property
    def empty(self) -> bool:
        return self.inlet_c is None and self.cooling_alarm is None and not self.gpus

    def merged(self, other: Readings) -> Readings:
        """Both sources' readings: the hotter inlet, an alarm if either says so, the GPUs of
        both."""
        return Readings(
            inlet_c=_most(self.inlet_c, other.inlet_c),
            cooling_alarm=(
                None
                if self.cooling_alarm is None and other.cooling_alarm is None
                else bool(self.cooling_alarm or other.cooling_alarm)
            ),
            gpus=self.gpus + other.gpus,
            throttled=self.throttled + other.throttled,
            hottest_gpu_c=_most(self.hottest_gpu_c, other.hottest_gpu_c),
        )


def _most(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _temp(c: float) -> str:
    return f"{c:g}" if c == int(c) else f"{c:.1f}"


def signals(r: Readings, t: Thresholds, level: int) -> tuple[int, str]:
    """The level the readings point at now (0 ok, 1 warm, 2 hot) and what says so, strongest
    signal first. `level` is the domain's condition now: a temperature must fall `band_c`
    under a threshold it is at to count as below it (hysteresis)."""

    def over(value: float | None, threshold: float, at: int) -> bool:
        if value is None:
            return False
        return value >= (threshold - t.band_c if level >= at else threshold)

    found: list[tuple[int, str]] = []
    if r.throttled:
        share = r.throttled / r.gpus if r.gpus else 1.0
        hot = share >= t.hot_throttled_share
        found.append((2 if hot else 1, f"{r.throttled} of {r.gpus} GPUs thermally throttled"))
    if r.cooling_alarm:
        found.append((2, "a cooling unit in alarm"))
    if over(r.inlet_c, t.hot_inlet_c, 2):
        found.append((2, f"inlet {_temp(r.inlet_c or 0)} °C"))
    elif over(r.inlet_c, t.warm_inlet_c, 1):
        found.append((1, f"inlet {_temp(r.inlet_c or 0)} °C"))
    if over(r.hottest_gpu_c, t.gpu_near_slowdown_c, 1):
        found.append((1, f"a GPU at {_temp(r.hottest_gpu_c or 0)} °C"))
    if not found:
        if r.inlet_c is not None:
            return 0, f"inlet {_temp(r.inlet_c)} °C"
        return 0, f"{r.gpus} GPUs reporting, none throttled" if r.gpus else "no alarm"
    top = max(f[0] for f in found)
    # The strongest level first, and within it the order above (throttling first).
    return top, ", ".join(w for lv, w in found if lv == top)


@dataclass(frozen=True)
class State:
    """A domain's condition and the timers its hold times run on (seconds, as `now`).

    `above[i]`: since when the readings have pointed at level i+1 (warm, hot) or past it;
    `below[i]`: since when they have pointed under it. None: not so now."""

    condition: str = UNKNOWN
    since: float | None = None
    why: str = "no fresh reading"
    above: tuple[float | None, float | None] = (None, None)
    below: tuple[float | None, float | None] = (None, None)

    @property
    def level(self) -> int:
        return LEVELS[self.condition]


def step(state: State, readings: Readings | None, now: float, t: Thresholds) -> State:
    """The domain's state after readings at `now`: every transition of the table in
    docs/facility.md, with its hold times."""
    if readings is None or readings.empty:
        if state.condition == UNKNOWN:
            return state
        return State(UNKNOWN, now, "no fresh reading")
    level, why = signals(readings, t, state.level)
    above = tuple(
        (a if a is not None else now) if level >= i + 1 else None for i, a in enumerate(state.above)
    )
    below = tuple(
        (b if b is not None else now) if level < i + 1 else None for i, b in enumerate(state.below)
    )
    held = State(state.condition, state.since, why, above, below)  # type: ignore[arg-type]
    new = _next_level(held, level, now, t)
    if new is None or (NAMES[new] == state.condition):
        return held
    return replace(held, condition=NAMES[new], since=now)


def _next_level(s: State, level: int, now: float, t: Thresholds) -> int | None:
    """The level the state moves to now, or None to stay."""
    ups = [
        i + 1
        for i, a in enumerate(s.above)
        if i + 1 > s.level and a is not None and now - a >= t.enter_s
    ]
    if ups:
        return max(ups)
    if s.condition == UNKNOWN:
        # Back from no data: ok at once (unknown was already placed as ok); warm or hot only
        # after their hold time, as from ok.
        return 0 if level == 0 else None
    cur = s.level
    if cur and (b := s.below[cur - 1]) is not None and now - b >= t.leave_s:
        kept = [
            i + 1
            for i in range(cur - 1)
            if not ((b2 := s.below[i]) is not None and now - b2 >= t.leave_s)
        ]
        return max(kept, default=0)
    return None


def said(domain: Domain, state: State, now: float) -> str:
    """The domain's condition in a sentence: "rack r12-07 is hot (inlet 31 °C for 6 min)"."""
    kind, name = domain
    if kind == "phase":
        pdu = name.rpartition("/")[0]
        return f"{domain_said(domain)} has no condition of its own: it takes pdu {pdu}'s"
    if state.condition == UNKNOWN:
        return f"{kind} {name}'s condition is unknown (no fresh reading), treated as ok"
    if state.condition == OK:
        return f"{kind} {name} is ok"
    held = f" for {duration_said(now - state.since)}" if state.since is not None else ""
    return f"{kind} {name} is {state.condition} ({state.why}{held})"


def duration_said(seconds: float) -> str:
    if seconds < 90:
        return f"{max(int(seconds), 0)} s"
    if seconds < 2 * 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def domains_of(labels: Mapping[str, str]) -> tuple[Domain, ...]:
    """Every domain a node's labels put it in: its rack, PDUs, their phases (to be held;
    none has a condition), row, room and zone."""
    out: list[Domain] = []
    for kind, label in (("rack", RACK_LABEL), ("row", ROW_LABEL), ("room", ROOM_LABEL)):
        if value := (labels.get(label) or "").strip():
            out.append((kind, value))
    out.extend(("pdu", p) for p in pdus_of(labels))
    out.extend(("phase", p) for p in phases_of(labels))
    if zone := (labels.get(ZONE_LABEL) or "").strip():
        out.append(("zone", zone))
    return tuple(out)


@dataclass(frozen=True)
class Hold:
    """An operator's hold on a domain: no new placements in it, whatever its condition."""

    kind: str
    name: str
    reason: str = ""
    by: str = ""


@dataclass(frozen=True)
class Standing:
    """Why a node may not take new work, or is to be placed after others, for its domains'
    conditions and holds; what placement reads (`Facility.of`)."""

    level: int  # the worst condition among its domains: 0 ok or unknown, 1 warm, 2 hot
    said: str  # that domain in a sentence
    held: str = ""  # a hold on one of its domains, in a sentence ("" none)


@dataclass(frozen=True)
class Facility:
    """The conditions and holds a pass decides on, and whether conditions are enforced.

    `enforce` False is observe-only: a hot domain refuses nothing and a warm one is not
    scored down; placement says what it would have done. Holds are an operator's order and
    are always enforced."""

    states: Mapping[Domain, State] = field(default_factory=dict)
    holds: tuple[Hold, ...] = ()
    enforce: bool = False
    now: float = 0.0
    # Shedding (shedding.py): which hot domains have load moved off, and when each last had.
    shed: Shedding = Shedding()
    shed_at: Mapping[Domain, float] = field(default_factory=dict)

    def standing(self, labels: Mapping[str, str]) -> Standing | None:
        """A node's standing from its labels; None when it is in no warm, hot or held domain."""
        mine = domains_of(labels)
        held = {(h.kind, h.name): h for h in self.holds}
        hold = next((held[d] for d in mine if d in held), None)
        worst: tuple[int, Domain] | None = None
        for d in mine:
            s = self.states.get(d)
            if s is not None and s.level and (worst is None or s.level > worst[0]):
                worst = (s.level, d)
        if worst is None and hold is None:
            return None
        held_said = ""
        if hold is not None:
            why = f": {hold.reason}" if hold.reason else ""
            where = domain_said((hold.kind, hold.name))
            held_said = f"{where} is held by {hold.by or 'an operator'}{why}"
        if worst is None:
            return Standing(0, "", held_said)
        return Standing(worst[0], said(worst[1], self.states[worst[1]], self.now), held_said)

    def of(self, nodes: Mapping[str, Mapping[str, str]]) -> dict[str, Standing]:
        """Per node (keyed by id, its labels), its standing, for the nodes that have one."""
        return {n: s for n, ls in nodes.items() if (s := self.standing(ls)) is not None}


def gpu_readings(gpus: Iterable[Mapping]) -> Readings:
    """A node's GPUs as readings: how many reported, how many are thermally throttled, the
    hottest. A GPU that said nothing of heat is not counted."""
    n = throttled = 0
    hottest: float | None = None
    for g in gpus:
        if not isinstance(g, Mapping):
            continue
        temp = g.get("temp_c")
        reasons = g.get("throttle") or ()
        has_temp = isinstance(temp, int | float) and not isinstance(temp, bool) and 0 < temp < 200
        if not has_temp and not reasons:
            continue
        n += 1
        if isinstance(reasons, list | tuple) and THERMAL.intersection(reasons):
            throttled += 1
        if has_temp:
            hottest = _most(hottest, float(temp))  # type: ignore[arg-type]
    return Readings(gpus=n, throttled=throttled, hottest_gpu_c=hottest)


@dataclass(frozen=True)
class Sample:
    """One source's readings of one domain, taken at `at` (seconds), and how long they stay
    fresh: past `stale_after` they are absent."""

    domain: Domain
    readings: Readings
    at: float
    stale_after: float


def fresh(
    samples: Iterable[Sample], now: float
) -> tuple[dict[Domain, Readings], dict[Domain, float]]:
    """Per domain, its fresh readings merged (a stale sample is absent), and when its newest
    sample was taken, fresh or not (for the readings' age)."""
    readings: dict[Domain, Readings] = {}
    newest: dict[Domain, float] = {}
    for s in samples:
        newest[s.domain] = max(newest.get(s.domain, s.at), s.at)
        if now - s.at > s.stale_after or s.readings.empty:
            continue
        d = s.domain
        readings[d] = readings[d].merged(s.readings) if d in readings else s.readings
    return readings, newest
