"""The capacity quota policy (domain.md, Tenancy: capacity quotas), as pure code.

A scope (organization, team or project) may be guaranteed, and limited to,
GPUs, CPU cores and memory. What a scope holds is what its own models'
replicas hold plus what everything beneath it holds. Holding more than its
guarantee is borrowing: allowed while the room is free, taken back when a
scope within its own guarantee needs it. No Django, no clock: the reconciler,
the API and the pages hand it frozen values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

RESOURCES = ("gpus", "cpu_cores", "memory_gb")


def _figure(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


@dataclass(frozen=True)
class Amount:
    """How much of each resource something holds or needs."""

    gpus: int = 0
    cpu_cores: int = 0
    memory_gb: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(
            self.gpus + other.gpus,
            self.cpu_cores + other.cpu_cores,
            self.memory_gb + other.memory_gb,
        )

    def __sub__(self, other: Amount) -> Amount:
        return Amount(
            self.gpus - other.gpus,
            self.cpu_cores - other.cpu_cores,
            self.memory_gb - other.memory_gb,
        )

    def as_dict(self) -> dict[str, float]:
        return {"gpus": self.gpus, "cpu_cores": self.cpu_cores, "memory_gb": self.memory_gb}

    def size_key(self) -> tuple:
        """For choosing the smaller of two: GPUs, then memory, then cores."""
        return (self.gpus, self.memory_gb, self.cpu_cores)


ZERO = Amount()


@dataclass(frozen=True)
class Resources:
    """Governed amounts: None is a resource not governed; zero is a limit of nothing."""

    gpus: int | None = None
    cpu_cores: int | None = None
    memory_gb: int | None = None

    def any(self) -> bool:
        return any(getattr(self, r) is not None for r in RESOURCES)

    def over(self, amount: Amount) -> str:
        """The first governed resource `amount` is above, with both figures; "" when none."""
        if self.gpus is not None and amount.gpus > self.gpus:
            return f"{amount.gpus} GPUs of {self.gpus}"
        if self.cpu_cores is not None and amount.cpu_cores > self.cpu_cores:
            return f"{amount.cpu_cores} cores of {self.cpu_cores}"
        if self.memory_gb is not None and amount.memory_gb > self.memory_gb + 1e-9:
            return f"{_figure(amount.memory_gb)} GB of memory of {self.memory_gb}"
        return ""

    def below(self, amount: Amount, taken: Amount) -> bool:
        """Whether taking `taken` away leaves `amount` below a governed figure it touches."""
        return any(
            (governed := getattr(self, r)) is not None
            and getattr(taken, r) > 0
            and getattr(amount, r) - getattr(taken, r) < governed - 1e-9
            for r in RESOURCES
        )

    def as_dict(self) -> dict[str, int]:
        return {r: getattr(self, r) for r in RESOURCES if getattr(self, r) is not None}


@dataclass(frozen=True)
class Quota:
    """One scope's guarantee and limit, with who set it last."""

    scope: str
    guarantee: Resources = Resources()
    limit: Resources = Resources()
    updated_by: str = ""
    updated_at: datetime | None = None


@dataclass(frozen=True)
class Holding:
    """One replica's hold on the cluster: for whom, how much, its class rank and age."""

    replica: str
    owner: str
    amount: Amount
    since: datetime
    rank: int = 2


@dataclass(frozen=True)
class Policy:
    """The quotas and the tree they sit in, read at one moment.

    `parents` maps a scope (`team:ID`) to the scopes above it, nearest first;
    `names` maps a scope to how people write it (`team:Acme/ml`), for sentences.
    """

    quotas: Mapping[str, Quota] = field(default_factory=dict)
    parents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        quotas: Iterable[Quota],
        parents: Mapping[str, Iterable[str]],
        names: Mapping[str, str] | None = None,
    ) -> Policy:
        return cls(
            quotas={q.scope: q for q in quotas},
            parents={k: tuple(v) for k, v in parents.items()},
            names=dict(names or {}),
        )

    def name(self, scope: str) -> str:
        return self.names.get(scope, scope)

    def chain(self, owner: str) -> tuple[str, ...]:
        """An owner and every scope above it, nearest first; nothing for a shared model."""
        if not owner:
            return ()
        return (owner, *self.parents.get(owner, ()))

    def governing(self, owner: str) -> list[Quota]:
        """The quotas along an owner's chain, nearest first."""
        return [self.quotas[s] for s in self.chain(owner) if s in self.quotas]

    def has_guarantee(self, owner: str) -> bool:
        return any(q.guarantee.any() for q in self.governing(owner))

    def usage(self, holdings: Iterable[Holding]) -> dict[str, Amount]:
        """What every scope holds: its own models' replicas and everything beneath it."""
        out: dict[str, Amount] = {}
        for h in holdings:
            for s in self.chain(h.owner):
                out[s] = out.get(s, ZERO) + h.amount
        return out

    def borrowed(self, holdings: Iterable[Holding]) -> set[str]:
        """The replicas held beyond a guarantee (domain.md, Borrowed).

        Per scope with a guarantee, bottom-up: its replicas highest class first,
        then oldest; each that takes the running sum past the guarantee is
        borrowed. Replicas already borrowed lower down come last, so a parent's
        overage falls first on the children over their own guarantees. An owner
        with no guarantee along its chain (a shared model too) borrows all it holds.
        """
        guaranteed = {s for s, q in self.quotas.items() if q.guarantee.any()}
        out: set[str] = set()
        # One sweep: each holding to the guaranteed scopes along its owner's chain.
        under: dict[str, list[Holding]] = {}
        chains: dict[str, tuple[str, ...]] = {}
        for h in holdings:
            chain = chains.get(h.owner)
            if chain is None:
                chain = chains[h.owner] = tuple(s for s in self.chain(h.owner) if s in guaranteed)
            if not chain:
                out.add(h.replica)
            for scope in chain:
                under.setdefault(scope, []).append(h)
        depth = {s: len(self.chain(s)) for s in under}
        for scope in sorted(under, key=lambda s: (-depth[s], s)):
            guarantee = self.quotas[scope].guarantee
            mine = under[scope]
            mine.sort(key=lambda h: (h.replica in out, -h.rank, h.since, h.replica))
            total = ZERO
            for h in mine:
                total = total + h.amount
                if guarantee.over(total):
                    out.add(h.replica)
        return out

    def within_guarantee(self, owner: str, usage: Mapping[str, Amount], need: Amount) -> bool:
        """Whether an owner, with `need` added, stays within every guarantee along its chain,
        and has at least one: such an owner may take back what others borrowed."""
        found = False
        for q in self.governing(owner):
            if not q.guarantee.any():
                continue
            found = True
            if q.guarantee.over(usage.get(q.scope, ZERO) + need):
                return False
        return found

    def drops_below_guarantee(self, owner: str, usage: Mapping[str, Amount], taken: Amount) -> bool:
        """Whether taking `taken` from an owner leaves a scope on its chain below its guarantee."""
        return any(
            q.guarantee.below(usage.get(q.scope, ZERO), taken) for q in self.governing(owner)
        )

    def at_limit(self, owner: str, usage: Mapping[str, Amount], need: Amount) -> str:
        """Which limit along an owner's chain `need` would pass, in a sentence; "" when none.

        Exactly at the limit is allowed.
        """
        for q in self.governing(owner):
            if not q.limit.any():
                continue
            over = q.limit.over(usage.get(q.scope, ZERO) + need)
            if over:
                return f"{self.name(q.scope)} is at its capacity limit ({over})"
        return ""
