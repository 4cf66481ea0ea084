"""Where a model's weights and KV cache fit on the fleet's GPUs (issue 36, item 2).

Pure: what the model needs (`Need`), the asked context, the nodes' free room as placement
counts it (its NodeRoom) in; per GPU class present, a `GpuOption` out: the smallest
tensor-parallel size (1, 2, 4, 8) at which the weights' share plus the KV cache for one
sequence of the asked context fit under the memory utilisation, how many such sequences
fit, and a sentence with the figures either way. The size goes past one node's GPUs only
where nodes of that class share a fabric (`llmgw.io/fabric`), which is where placement
runs multi-node replicas.

Each GPU holds weights / tp and its share of the cache (`Need.kv_share`). What is left is
before what activations, CUDA graphs and NCCL take (vLLM measures those when it starts):
an option that leaves little is said with its figures rather than trusted. A GPU's memory
is the least any GPU of the class reported, else what the class's name says (`-80g`).
Sizes are said in GiB (MiB under one), as they are counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from catalog.domain import Profile
from fleet.domain.placement import Inventory, NodeRoom, Placement
from fleet.domain.types import FABRIC_LABEL

GIB = 1 << 30
TP_SIZES = (1, 2, 4, 8)
# The engines whose replica may span nodes joined by a fabric (llama.cpp runs on one node).
MULTI_NODE_ENGINES = frozenset({"vllm"})
DEFAULT_UTILIZATION = 0.9


class Need(Protocol):
    """What a model needs of GPUs: its weights, its cache, and which tp sizes it allows."""

    @property
    def weights_bytes(self) -> int: ...

    @property
    def kv_per_token(self) -> int: ...

    def kv_cache_bytes(self, ctx: int) -> int: ...

    def kv_share(self, tp: int) -> float: ...

    @property
    def attention_heads(self) -> int: ...


@dataclass(frozen=True)
class Try:
    """One tensor-parallel size tried: what each GPU has left and what that holds."""

    tp: int
    nodes: int
    left_bytes: float
    tokens: int
    sequences: int

    def said(self, ctx: int) -> str:
        if self.left_bytes <= 0:
            return f"tp {self.tp} leaves nothing for the KV cache"
        left = f"tp {self.tp} leaves about {size_said(self.left_bytes)} a GPU"
        if self.sequences < 1:
            return f"{left}, some {self.tokens:,} tokens of KV cache, below the {ctx:,} asked"
        many = "sequence" if self.sequences == 1 else "sequences"
        return f"{left}, {self.sequences:,} {many} of {ctx:,}"


@dataclass(frozen=True)
class GpuOption:
    """A GPU class's answer: `chosen` is the Try that fits (None: nothing does); `fits` the
    node ids a replica of it goes to now, `blocked` placement's sentences where it does not."""

    gpu_class: str
    gpu_memory_bytes: float
    utilization: float
    tries: tuple[Try, ...]
    said: str
    chosen: Try | None = None
    fits: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    quota: str = ""

    @property
    def tp(self) -> int | None:
        return self.chosen.tp if self.chosen else None

    def as_dict(self) -> dict[str, Any]:
        c = self.chosen
        return {
            "gpu_class": self.gpu_class,
            "gpu_memory_gb": round(self.gpu_memory_bytes / GIB, 1),
            "gpu_memory_utilization": self.utilization,
            "tp": c.tp if c else None,
            "nodes": c.nodes if c else None,
            "sequences": c.sequences if c else None,
            "kv_tokens": c.tokens if c else None,
            "free_per_gpu_gb": round(c.left_bytes / GIB, 1) if c else None,
            "said": self.said,
            "fits": list(self.fits),
            "blocked": list(self.blocked),
            "quota": self.quota or None,
        }


@dataclass(frozen=True)
class Fleet:
    """A GPU class as the fleet has it: most GPUs on one node, least memory a GPU, and the
    most nodes of it one fabric joins (1 where none does)."""

    gpu_class: str
    per_node: int
    memory_bytes: float
    joined: int = 1
    nodes: tuple[str, ...] = field(default=())


def classes(rooms: Iterable[NodeRoom]) -> list[Fleet]:
    """The GPU classes present among the nodes, by name."""
    per_node: dict[str, int] = {}
    memory: dict[str, float] = {}
    fabric: dict[tuple[str, str], int] = {}
    nodes: dict[str, list[str]] = {}
    for room in rooms:
        node = room.node
        for cls, count in node.gpu_totals.items():
            per_node[cls] = max(per_node.get(cls, 0), count)
            nodes.setdefault(cls, []).append(node.id)
            reported = [g.memory_mb for g in node.gpus if g.gpu_class == cls and g.memory_mb]
            if reported:
                memory[cls] = min(memory.get(cls, math.inf), min(reported) * (1 << 20))
            if f := node.labels.get(FABRIC_LABEL):
                fabric[cls, f] = fabric.get((cls, f), 0) + 1
    out = []
    for cls in sorted(per_node):
        size = memory.get(cls) or _named_bytes(cls)
        if not size:
            continue
        joined = max((n for (c, _), n in fabric.items() if c == cls), default=1)
        out.append(Fleet(cls, per_node[cls], size, joined, tuple(sorted(nodes[cls]))))
    return out


def size_on(
    need: Need,
    cls: Fleet,
    *,
    ctx: int,
    utilization: float,
    title: str,
    multi_node: bool = True,
) -> GpuOption:
    """The smallest tp at which one sequence of `ctx` fits on GPUs of `cls`, with a sentence;
    within one node when the engine cannot span nodes (`multi_node` false: llama.cpp)."""
    reach = cls.joined if multi_node else 1
    usable = utilization * cls.memory_bytes
    tries: list[Try] = []
    limits: list[str] = []
    for tp in TP_SIZES:
        nodes = 1 if tp <= cls.per_node else math.ceil(tp / cls.per_node)
        if nodes > reach:
            limits.append(_reach(cls, tp, multi_node))
            break
        if need.attention_heads % tp:
            limits.append(f"tp {tp} does not divide its {need.attention_heads} attention heads")
            continue
        share = need.kv_share(tp)
        left = usable - need.weights_bytes / tp
        per_token = need.kv_per_token * share
        sequence = need.kv_cache_bytes(ctx) * share
        tokens = int(left // per_token) if left > 0 and per_token else 0
        sequences = int(left // sequence) if left > 0 and sequence else 0
        tries.append(Try(tp, nodes, left, tokens, sequences))
        if sequences >= 1:
            break
    chosen = tries[-1] if tries and tries[-1].sequences >= 1 else None
    parts = [t.said(ctx) for t in tries]
    if chosen is None:
        parts += limits[-1:]
    head = (
        f"{title} needs {size_said(need.weights_bytes)} of weights; on {cls.gpu_class} "
        f"({size_said(cls.memory_bytes)} a GPU) at {utilization:g} utilisation, "
    )
    return GpuOption(
        gpu_class=cls.gpu_class,
        gpu_memory_bytes=cls.memory_bytes,
        utilization=utilization,
        tries=tuple(tries),
        said=head + "; ".join(parts) + ".",
        chosen=chosen,
    )


def gpu_profile(option: GpuOption, *, engine: str, name: str = "", **kw: Any) -> Profile | None:
    """The profile placement is asked about for an option that fits (None for one that
    does not): its class and tp, over as many nodes as the tp needs."""
    c = option.chosen
    if c is None:
        return None
    return Profile(
        name=name or option.gpu_class,
        engine=engine,
        gpu_class=option.gpu_class,
        tp=c.tp,
        nodes=c.nodes,
        gpus_per_node=c.tp // c.nodes if c.nodes > 1 else None,
        **kw,
    )


def where(
    option: GpuOption, profile: Profile | None, rooms: Mapping[str, NodeRoom], source: str
) -> GpuOption:
    """The option with where a replica of `profile` goes now, in placement's own words."""
    if profile is None:
        return option
    trial = Inventory.of_rooms({n: r.copy() for n, r in rooms.items()})
    placed = trial.place([profile], weights_source=source)
    if isinstance(placed, Placement):
        return replace(option, fits=tuple(s.node_id for s in placed.shards))
    reasons = [r for _, rs in placed.reasons for r in rs]
    return replace(option, blocked=tuple(f"{r}." for r in reasons))


def gpu_options(
    need: Need,
    *,
    ctx: int,
    rooms: Iterable[NodeRoom],
    utilization: float,
    title: str,
    engine: str,
    source: str = "",
    **profile_kw: Any,
) -> list[GpuOption]:
    """Every GPU class present, sized (`size_on`) and placed (`where`)."""
    by_id = {r.node.id: r for r in rooms}
    out = []
    for cls in classes(by_id.values()):
        option = size_on(
            need,
            cls,
            ctx=ctx,
            utilization=utilization,
            title=title,
            multi_node=engine in MULTI_NODE_ENGINES,
        )
        profile = gpu_profile(option, engine=engine, **profile_kw)
        out.append(where(option, profile, by_id, source))
    return out


def _reach(cls: Fleet, tp: int, multi_node: bool) -> str:
    if not multi_node:
        return f"a node has at most {cls.per_node} {cls.gpu_class} GPUs, and llama.cpp runs on one"
    if cls.joined > 1:
        return (
            f"tp {tp} needs {math.ceil(tp / cls.per_node)} nodes of {cls.per_node} "
            f"{cls.gpu_class} GPUs, and one fabric joins at most {cls.joined}"
        )
    return (
        f"a node has at most {cls.per_node} {cls.gpu_class} GPUs and no fabric "
        f"({FABRIC_LABEL}) joins such nodes for tp {tp}"
    )


def _named_bytes(gpu_class: str) -> float:
    """`h100-80g` → 80 GiB: what the class's name says, where no GPU reported its memory."""
    tail = gpu_class.rsplit("-", 1)[-1]
    if tail.endswith("g") and tail[:-1].isdigit():
        return int(tail[:-1]) * GIB
    return 0.0


def size_said(n: float) -> str:
    """Bytes as GiB (whole from 100), MiB under one GiB, KiB under one MiB: the units said,
    never MB for MiB."""
    gib = n / GIB
    if gib >= 100:
        return f"{gib:,.0f} GiB"
    if gib >= 1:
        return f"{gib:.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):,.0f} MiB"
    return f"{n / 1024:,.0f} KiB"
