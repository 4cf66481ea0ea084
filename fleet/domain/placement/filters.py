"""Placement's filters: each refusal a named function with its sentence, asked in a
declared order (`FILTERS`); the first that refuses a node speaks for it.

A filter takes a node's room and what is asked (`room.Ask`) and answers None when the
node may take a shard, else a `NodeRefusal`: placement's sentence with how close the
node came (refusals.py), for the one-line summary. The tiers are the order:

- `UNAVAILABLE_FILTERS`: the node takes nothing now (its state, an operator's order, this
  model already there). How close it came depends on whether it could run the profile
  otherwise (`unsuited`).
- `UNSUITED_FILTERS`: the node could not run the profile even empty and ready.
- `SHORT_FILTERS`: the node could, but has too little free now.

To add a refusal: write one function here, with its sentence and its `group` words,
and put it, as a `Filter` (with when it `applies`), in the tier it belongs to, where
it should speak if several refuse. What it reads that the node's room does not hold
goes into `Ask`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from catalog.domain import Profile

from ..power import Ledger
from ..refusals import SHORT, UNAVAILABLE, UNSUITED, NodeRefusal
from ..types import NodeView
from .room import Ask, NodeRoom


def _gb(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


@cache
def _said_of_class(one: str, many: str, gpu_class: str) -> tuple[str, str]:
    """A refusal's words for counting, made once per GPU class: a full fleet refuses
    thousands of nodes for the same reason."""
    return one.format(gpu_class), many.format(gpu_class)


# -- The node takes nothing now -------------------------------------------------------


def _unavailable(room: NodeRoom, ask: Ask, words: str, group: tuple[str, str]) -> NodeRefusal:
    """A refusal of a node that takes nothing now: close when it could run the profile
    otherwise, not when it could not."""
    node = room.node
    return NodeRefusal(f"node {node.id} {words}", node.id, _closeness(room, ask), group)


def _closeness(room: NodeRoom, ask: Ask) -> int:
    return UNAVAILABLE if unsuited(room, ask) is None else UNSUITED


def not_ready(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node not ready (joining, unreachable, lost) takes nothing."""
    state = room.node.state
    if state == "ready":
        return None
    return _unavailable(room, ask, f"is {state}", (f"is {state}", f"are {state}"))


def not_approved(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node an operator has not approved yet takes nothing."""
    if room.node.approved:
        return None
    words = f"awaits an operator's approval (llmgw ctl node approve {room.node.id})"
    return _unavailable(
        room, ask, words, ("awaits an operator's approval", "await an operator's approval")
    )


def address_not_approved(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node whose address is not approved takes nothing; the sentence is the node's own."""
    node = room.node
    if not node.address_refusal:
        return None
    return NodeRefusal(
        node.address_refusal,
        node.id,
        _closeness(room, ask),
        ("has an address not approved", "have addresses not approved"),
    )


def draining(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node being drained takes nothing new."""
    if not room.node.draining:
        return None
    return _unavailable(room, ask, "is draining", ("is draining", "are draining"))


def cordoned(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A cordoned node takes nothing new."""
    if not room.node.cordoned:
        return None
    return _unavailable(room, ask, "is cordoned", ("is cordoned", "are cordoned"))


def in_a_hot_or_held_domain(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node in a domain an operator holds takes nothing new; nor, as a cordon would, one in
    a hot domain while conditions are enforced (observe-only says it would have refused:
    `Inventory._placed`). Automatic and reversible: the domain cools, the node takes work."""
    standing = ask.standing.get(room.node.id) if ask.standing else None
    if standing is None:
        return None
    if standing.held:
        words = ("is in a held domain", "are in a held domain")
        return NodeRefusal(
            f"node {room.node.id}: {standing.held}", room.node.id, UNAVAILABLE, words
        )
    if ask.enforce and standing.level >= 2:
        words = ("is in a hot domain", "are in a hot domain")
        return NodeRefusal(
            f"node {room.node.id}: {standing.said}", room.node.id, UNAVAILABLE, words
        )
    return None


def runs_the_model(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A node that already runs a replica of the model is avoided (`place_spread` gives
    that up when it is the only obstacle)."""
    if room.node.id not in ask.avoid:
        return None
    return _unavailable(
        room,
        ask,
        "already runs a replica of this model",
        ("already runs a replica of this model", "already run a replica of this model"),
    )


# -- The node could not run the profile even empty and ready ---------------------------


def lacks_label(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """The profile's node selector: every label it names, with its value."""
    node = room.node
    for key, value in ask.profile.node_selector.items():
        if node.labels.get(key) != value:
            words = f"lacks the label {key}={value}"
            return NodeRefusal(
                f"node {node.id} {words}",
                node.id,
                UNSUITED,
                (words, f"lack the label {key}={value}"),
            )
    return None


def lacks_engine(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """The profile's engine, installed or installable (`engine_refusal`)."""
    return engine_refusal(room.node, ask.profile.engine)


def lacks_gpu_class(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A GPU profile needs a node with GPUs of its class at all."""
    node, cls = room.node, ask.profile.gpu_class
    if not ask.need or node.gpu_totals.get(cls, 0) != 0:
        return None
    return NodeRefusal(
        f"node {node.id} has no {cls} GPUs",
        node.id,
        UNSUITED,
        _said_of_class("has no {} GPUs", "have no {} GPUs", cls),
    )


# -- The node could, but has too little free now ---------------------------------------


def _short(
    node: NodeView, words: str, group: tuple[str, str], kind: str, missing: float
) -> NodeRefusal:
    return NodeRefusal(f"node {node.id} {words}", node.id, SHORT, group, kind, missing)


MOST_NAMED = 3


def gpus_out_of_service(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """GPUs with a problem (an Xid that needs a reset, uncorrected ECC errors, a fabric
    registration not completed: fabric.py) or cordoned by an operator take no new
    replicas. When they are what leaves the node short (in service, and held by no
    replica, they would make up the need), the refusal names them and why; else
    `short_of_gpus` speaks."""
    need, node, cls = ask.need, room.node, ask.profile.gpu_class
    free = len(room.free_gpus.get(cls, ()))
    if not need or free >= need:
        return None
    out = [
        g
        for g in node.gpus
        if g.gpu_class == cls and g.out_of_service and g.index not in room.taken
    ]
    if free + len(out) < need:
        return None
    said = [g.problem or f"GPU {g.index} of node {node.id} is cordoned" for g in out]
    if len(said) > MOST_NAMED:
        said = [*said[:MOST_NAMED], f"and {len(said) - MOST_NAMED} more"]
    total = node.gpu_totals.get(cls, 0)
    return _short(
        node,
        f"has {free} free {cls} GPUs of {total}, needs {need}: {'; '.join(said)}",
        ("has GPUs out of service", "have GPUs out of service"),
        "gpus",
        need - free,
    )


def short_of_gpus(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """Too few free GPUs of the class (held by replicas, or by other processes)."""
    need, node, cls = ask.need, room.node, ask.profile.gpu_class
    if not need:
        return None
    free = len(room.free_gpus.get(cls, ()))
    if free >= need:
        return None
    total = node.gpu_totals.get(cls, 0)
    held = sum(1 for g in node.gpus if g.held and g.gpu_class == cls)
    others = f" ({held} held by other processes)" if held else ""
    return _short(
        node,
        f"has {free} free {cls} GPUs of {total}, needs {need}{others}",
        _said_of_class("has too few free {} GPUs", "have too few free {} GPUs", cls),
        "gpus",
        need - free,
    )


def short_of_memory(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """Too little free memory; a node that reports none constrains nothing."""
    wanted, free, node = ask.profile.min_memory_gb, room.memory_free, room.node
    if wanted is None or free is None or free >= wanted:
        return None
    assert node.memory_gb is not None  # memory_free is None without it (room.py)
    return _short(
        node,
        f"has {_gb(node.memory_gb)} GB of memory with {_gb(max(free, 0))} GB free, needs {_gb(wanted)}",
        ("has too little free memory", "have too little free memory"),
        "memory",
        wanted - max(free, 0),
    )


def short_of_cores(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """Too few free CPU cores; a node that reports none constrains nothing."""
    cores, free, node = ask.profile.reserved_cores, room.cores_free, room.node
    if not cores or free is None or free >= cores:
        return None
    return _short(
        node,
        f"has {node.cpu_count} CPUs with {max(free, 0)} free, needs {cores}",
        ("has too few free CPUs", "have too few free CPUs"),
        "cores",
        cores - max(free, 0),
    )


def _disk_short(node: NodeView, profile: Profile, source: str) -> bool:
    """Whether the node's free disk is below the profile's, unless it holds the weights."""
    return (
        profile.min_disk_gb is not None
        and node.disk_free_gb is not None
        and not (source and source in node.weights)
        and node.disk_free_gb < profile.min_disk_gb
    )


def short_of_disk(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """Too little free disk for the weights, unless the node already holds them."""
    node, profile = room.node, ask.profile
    if not _disk_short(node, profile, ask.source):
        return None
    wanted, free = profile.min_disk_gb, node.disk_free_gb
    assert wanted is not None and free is not None  # else the disk is not short
    return _short(
        node,
        f"has {_gb(free)} GB of disk free, needs {_gb(wanted)}",
        ("has too little free disk", "have too little free disk"),
        "disk",
        wanted - free,
    )


def over_power_budget(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """A shard that would take its rack or PDU past a power budget's limit, or lands in
    one already over it (power.py)."""
    if ask.ledger is None:
        return None
    profile = ask.profile
    indices = room.gpus_for(profile.gpu_class, ask.need) if ask.need else ()
    over = ask.ledger.refusal(room.node.id, indices, profile.reserved_cores, profile.shard_power_w)
    if over is None:
        return None
    node_id = room.node.id
    return NodeRefusal(
        over, node_id, SHORT, ("is at a power budget", "are at a power budget"), "power"
    )


@dataclass(frozen=True)
class Filter:
    """A refusal: `refuse` answers its sentence for one node, or None; `applies` says, once
    per ask, whether it could refuse any node at all (one that could not, a memory filter
    for a profile that asks for no memory, is not asked of every node). `applies` is only
    a shortcut, for fleets of thousands of nodes: `refuse` still answers None itself
    where it does not apply."""

    refuse: Callable[[NodeRoom, Ask], NodeRefusal | None]
    applies: Callable[[Ask], bool] = lambda ask: True


UNAVAILABLE_FILTERS: tuple[Filter, ...] = (
    Filter(not_ready),
    Filter(not_approved),
    Filter(address_not_approved),
    Filter(draining),
    Filter(cordoned),
    Filter(in_a_hot_or_held_domain, lambda ask: bool(ask.standing)),
    Filter(runs_the_model, lambda ask: bool(ask.avoid)),
)
UNSUITED_FILTERS: tuple[Filter, ...] = (
    Filter(lacks_label, lambda ask: bool(ask.profile.node_selector)),
    Filter(lacks_engine),
    Filter(lacks_gpu_class, lambda ask: bool(ask.need)),
)
SHORT_FILTERS: tuple[Filter, ...] = (
    Filter(gpus_out_of_service, lambda ask: bool(ask.need)),
    Filter(short_of_gpus, lambda ask: bool(ask.need)),
    Filter(short_of_memory, lambda ask: ask.profile.min_memory_gb is not None),
    Filter(short_of_cores, lambda ask: bool(ask.profile.reserved_cores)),
    Filter(short_of_disk, lambda ask: ask.profile.min_disk_gb is not None),
    Filter(over_power_budget, lambda ask: ask.ledger is not None),
)
FILTERS: tuple[Filter, ...] = (*UNAVAILABLE_FILTERS, *UNSUITED_FILTERS, *SHORT_FILTERS)


def judge(ask: Ask) -> Callable[[NodeRoom], NodeRefusal | None]:
    """Why a node is refused for this ask: the first of `FILTERS` that refuses it, None when
    none does. The filters that apply are chosen once, not per node."""
    asked = tuple(f.refuse for f in FILTERS if f.applies(ask))

    def refused(room: NodeRoom) -> NodeRefusal | None:
        for refuse in asked:
            if (why := refuse(room, ask)) is not None:
                return why
        return None

    return refused


def unsuited(room: NodeRoom, ask: Ask) -> NodeRefusal | None:
    """Why the node could not run the profile even empty and ready; None when it could."""
    for f in UNSUITED_FILTERS:
        if (why := f.refuse(room, ask)) is not None:
            return why
    return None


def refuse(
    room: NodeRoom,
    profile: Profile,
    avoid: frozenset[str],
    source: str,
    ledger: Ledger | None = None,
) -> NodeRefusal | None:
    """Why this node cannot take a shard of this profile now, in a sentence; None when it can.
    With `ledger`, a shard that would take its rack or PDU past a power budget is refused.
    The sentence carries how close the node came (refusals.py), for the one-line summary."""
    return judge(Ask(profile, avoid, source, ledger))(room)


def engine_refusal(node: NodeView, engine: str) -> NodeRefusal | None:
    """Why the node cannot run ``engine``, in a sentence; None when it has it or can install it.

    An engine it lacks is installable when the mirror holds a build for the node's
    platform, unless installing that very version failed there (the agent keeps the
    failure until it restarts; a newer build is tried afresh).
    """
    if node.engines is None or engine in node.engines:
        return None
    offered = node.installable.get(engine)
    tried = node.install_of(engine)
    if tried is not None and tried.state == "failed" and offered in (None, tried.version):
        return NodeRefusal(
            f"node {node.id} could not install {engine} {tried.version}: {tried.detail}",
            node.id,
            UNSUITED,
            (f"could not install {engine}", f"could not install {engine}"),
        )
    if offered is not None:
        return None
    return NodeRefusal(
        f"node {node.id} has no {engine} engine installed",
        node.id,
        UNSUITED,
        (f"has no {engine} engine installed", f"have no {engine} engine installed"),
    )


def could_ever_run(node: NodeView, profile: Profile, source: str = "") -> bool:
    """Whether the node could take a shard of this profile if nothing ran on it: the right
    state, labels, engine, GPU class and size. Preemption looks for victims only there."""
    if node.state != "ready" or not node.approved or node.address_refusal:
        return False
    if node.draining or node.cordoned or unsuited(NodeRoom(node), Ask(profile)) is not None:
        return False
    need = profile.gpus_on_each_node
    usable = sum(1 for g in node.gpus if g.free_to_place and g.gpu_class == profile.gpu_class)
    if need and usable < need:
        return False
    if profile.min_memory_gb and node.memory_gb and node.memory_gb < profile.min_memory_gb:
        return False
    cores = profile.reserved_cores
    if cores and node.cpu_count and node.cpu_count < cores:
        return False
    return not _disk_short(node, profile, source)
