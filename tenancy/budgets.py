"""Spend budgets (issue 39, item 5) as pure rules: what a key or scope may spend per day or
per month, in tokens or in cost, and whether it has.

A budget belongs to a key (`key:3`) or a scope of the tenancy tree (`project:12`,
`team:7`, `org:9`) and counts every request of the keys beneath it. Windows are UTC
calendar days and months. Tokens are prompt plus completion; cost is priced per model, per
million prompt and per million completion tokens, by the operator (a model without a price
costs nothing). No Django and no clock: tenancy.selectors hands in the spend, read where
usage already is, and the moment it was read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

PERIODS = ("day", "month")
UNITS = ("tokens", "cost")
# A budget this spent is warned about; one spent whole refuses.
WARN_AT = Decimal("0.8")
MILLION = Decimal(1_000_000)
ZERO = Decimal(0)


def window(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The UTC day or month `now` falls in: its start, and its end (the next one's start)."""
    now = now.astimezone(UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    if period != "month":
        raise ValueError(f"a budget's period is day or month, not {period!r}")
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start, start.replace(year=year, month=month)


def window_named(period: str, start: datetime) -> str:
    """`7 December` for a day, `December` for a month: the sentence gives the year in its
    reset time."""
    return f"{start.day} {start:%B}" if period == "day" else f"{start:%B}"


def figure(unit: str, value: Decimal | int) -> str:
    """`1,002,311` tokens; a cost to the cent, `1,250.50`."""
    if unit == "tokens":
        return f"{int(value):,}"
    return f"{Decimal(value):,.2f}"


@dataclass(frozen=True)
class Budget:
    """The most one scope may spend in one period, in one unit."""

    scope: str
    period: str
    unit: str
    amount: Decimal

    def words(self) -> str:
        """`1,000,000 tokens`; `100.00 in cost`."""
        return (
            f"{figure(self.unit, self.amount)} {'tokens' if self.unit == 'tokens' else 'in cost'}"
        )


@dataclass(frozen=True)
class Price:
    """What a model's tokens cost, per million prompt and per million completion tokens."""

    prompt: Decimal
    completion: Decimal

    def cost(self, prompt: int, completion: int) -> Decimal:
        return (prompt * self.prompt + completion * self.completion) / MILLION


@dataclass(frozen=True)
class Spent:
    """What a scope spent in a window: tokens, and cost by the prices."""

    tokens: int = 0
    cost: Decimal = ZERO

    def __add__(self, other: Spent) -> Spent:
        return Spent(self.tokens + other.tokens, self.cost + other.cost)

    def of(self, unit: str) -> Decimal:
        return Decimal(self.tokens) if unit == "tokens" else self.cost


@dataclass(frozen=True)
class Used:
    """Usage summed for one key and model over one window (`day` or `month`, each up to
    the moment it was read), as the usage rows hold it."""

    period: str
    key_id: int
    project_id: int
    model: str
    prompt: int
    completion: int


def spent_by_scope(
    used: Iterable[Used],
    chains: Mapping[int, tuple[str, ...]],
    prices: Mapping[str, Price],
) -> dict[tuple[str, str], Spent]:
    """(scope, period) → what it spent: each key's usage counted for the key and for every
    scope on its project's chain (`chains`: project id → its scope, team and org)."""
    out: dict[tuple[str, str], Spent] = {}
    for u in used:
        price = prices.get(u.model)
        spent = Spent(
            u.prompt + u.completion, price.cost(u.prompt, u.completion) if price else ZERO
        )
        for scope in (f"key:{u.key_id}", *chains.get(u.project_id, (f"project:{u.project_id}",))):
            out[(scope, u.period)] = out.get((scope, u.period), Spent()) + spent
    return out


def unpriced(used: Iterable[Used], prices: Mapping[str, Price]) -> list[str]:
    """The models used without a price, which cost budgets count as free."""
    return sorted({u.model for u in used if u.model not in prices})


@dataclass(frozen=True)
class Verdict:
    """What the budgets along a request's chain say.

    `allowed` False: `refusal` is the sentence for the 429 (`budget_exceeded`), `budget`
    the budget that refuses longest and `resets_at` when it allows again. `warnings` are
    sentences for the budgets spent past WARN_AT (and not whole), nearest scope first.
    """

    allowed: bool = True
    refusal: str = ""
    budget: Budget | None = None
    resets_at: datetime | None = None
    warnings: tuple[str, ...] = ()

    def retry_after(self, now: datetime) -> int:
        """Whole seconds until the refusing budget resets; 0 when allowed."""
        if self.resets_at is None:
            return 0
        return max(1, math.ceil((self.resets_at - now).total_seconds()))


ALLOWED = Verdict()


@dataclass(frozen=True)
class Book:
    """Every budget with what its scope spent, read at one moment (`read_at`).

    `budgets`: scope → its budgets; `spent`: (scope, period) → Spent in the window
    `read_at` falls in; `names`: scope → how people write it (`team:Acme/ml`).
    """

    budgets: Mapping[str, tuple[Budget, ...]] = field(default_factory=dict)
    spent: Mapping[tuple[str, str], Spent] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)
    read_at: datetime | None = None

    def spent_now(self, scope: str, period: str, now: datetime) -> Spent:
        """What the scope spent in the window `now` falls in: nothing yet when the window
        turned since the book was read."""
        if self.read_at is None or window(period, now) != window(period, self.read_at):
            return Spent()
        return self.spent.get((scope, period), Spent())

    def verdict(self, chain: Iterable[str], now: datetime) -> Verdict:
        """Refused when any budget along `chain` (`key:3`, `project:12`, `team:7`, `org:9`)
        is spent whole: by the one that resets last, as the request fits only then;
        otherwise allowed, with a warning for each budget spent past WARN_AT."""
        worst: tuple[datetime, Budget, Decimal] | None = None
        warnings = []
        for scope in chain:
            for b in self.budgets.get(scope, ()):
                spent = self.spent_now(scope, b.period, now).of(b.unit)
                start, end = window(b.period, now)
                if spent >= b.amount:
                    if worst is None or end > worst[0]:
                        worst = (end, b, spent)
                elif spent >= b.amount * WARN_AT:
                    warnings.append(self._warning(b, spent, start, end))
        if worst is None:
            return Verdict(warnings=tuple(warnings)) if warnings else ALLOWED
        end, b, spent = worst
        start = window(b.period, now)[0]
        return Verdict(
            allowed=False,
            refusal=(
                f"{self.names.get(b.scope, b.scope)} has spent {figure(b.unit, spent)} of its "
                f"{b.words()} for {window_named(b.period, start)}; it resets at {_at(end)}"
            ),
            budget=b,
            resets_at=end,
        )

    def warned(self, now: datetime) -> list[tuple[str, str, str, datetime, str]]:
        """Every budget spent past WARN_AT, whole or not, in the window `now` falls in:
        (scope, period, unit, the window's start, a sentence), for the event told once a
        window (the gateway's loader tells each as it first sees it)."""
        out = []
        for scope, budgets in self.budgets.items():
            for b in budgets:
                spent = self.spent_now(scope, b.period, now).of(b.unit)
                if spent >= b.amount * WARN_AT:
                    start, end = window(b.period, now)
                    said = (
                        f"{self.names.get(scope, scope)} passed {WARN_AT * 100:.0f} % of its "
                        f"{b.words()} for {window_named(b.period, start)}; it resets at {_at(end)}"
                    )
                    out.append((scope, b.period, b.unit, start, said))
        return out

    def _warning(self, b: Budget, spent: Decimal, start: datetime, end: datetime) -> str:
        share = math.floor(spent * 100 / b.amount)
        return (
            f"{self.names.get(b.scope, b.scope)} has spent {share} % of its {b.words()} for "
            f"{window_named(b.period, start)} ({figure(b.unit, spent)}); it resets at {_at(end)}"
        )


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"
