"""The nodes a profile over several nodes takes together: they must share a fabric.

Where the GPUs a shard would take report an NVLink domain (`GpuView.domain`: the
fabric manager's cluster UUID and clique), the node goes with the others of that
domain, and only while IMEX is up on it (`NodeView.imex`): a replica across trays
shares memory through it. Where they report none, the node goes by its hand-set
`llmgw.io/fabric` label, as before NVML said anything. A node whose shard would
span two domains goes with neither. Groups are tried domains first (by UUID, then
clique), then labels (by name); in each the nodes keep the order they were given.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..types import FABRIC_LABEL, NodeView
from .room import Ask, NodeRoom

Domain = tuple[str, int]
# A node whose shard's GPUs report different domains, or some a domain and some none.
SPLIT = ("", -1)


def domain_of(room: NodeRoom, ask: Ask) -> Domain | None:
    """The NVLink domain of the GPUs a shard would take here; None when they report
    none; SPLIT when they do not agree."""
    taken = set(room.gpus_for(ask.profile.gpu_class, ask.need))
    found = {g.domain for g in room.node.gpus if g.index in taken}
    if len(found) != 1:
        return SPLIT if found else None
    return found.pop()


def fabric_of(node: NodeView) -> str:
    """The fabric a node's shards of a multi-node replica go with, named as sentences name
    it: its NVLink domain where its GPUs report one ("domain ... clique 1"), else its
    label ("llmgw.io/fabric=ib-a"); "" for none, or GPUs in two domains. The preemption
    search makes room per fabric; placement then holds each shard to the exact rule."""
    found = {g.domain for g in node.gpus if g.domain is not None}
    if len(found) > 1:
        return ""
    if found:
        uuid, clique = found.pop()
        return f"domain {uuid} clique {clique}"
    label = node.labels.get(FABRIC_LABEL)
    return f"{FABRIC_LABEL}={label}" if label else ""


def _groups(eligible: list[NodeRoom], ask: Ask) -> tuple[dict, dict, dict]:
    """The eligible nodes by domain with IMEX up, those of each domain without it, and
    the nodes with no domain by their label."""
    up: dict[Domain, list[NodeRoom]] = defaultdict(list)
    down: dict[Domain, list[NodeRoom]] = defaultdict(list)
    labelled: dict[str, list[NodeRoom]] = defaultdict(list)
    for room in eligible:
        domain = domain_of(room, ask)
        if domain is None:
            if fabric := room.node.labels.get(FABRIC_LABEL):
                labelled[fabric].append(room)
        elif domain != SPLIT:
            (up if room.node.imex is True else down)[domain].append(room)
    return up, down, labelled


def fabric_group(eligible: list[NodeRoom], ask: Ask) -> list[NodeRoom] | None:
    """The first `nodes` of the profile, in the order given, of the first NVLink domain
    (IMEX up on each), else of the first labelled fabric, that has that many; None when
    none has."""
    count = ask.profile.nodes
    up, _, labelled = _groups(eligible, ask)
    for domain in sorted(up):
        if len(up[domain]) >= count:
            return up[domain][:count]
    for fabric in sorted(labelled):
        if len(labelled[fabric]) >= count:
            return labelled[fabric][:count]
    return None


def no_group_said(eligible: list[NodeRoom], ask: Ask, every: Iterable[NodeRoom]) -> list[str]:
    """Why no group had room: for NVLink domains, when any node's GPUs of the class
    report one (`every`: all the nodes, eligible or not), the domain that came closest
    with its figures; for labels, when no domain is known or some eligible node without
    one is labelled, the largest group as before."""
    up, down, labelled = _groups(eligible, ask)
    cls = ask.profile.gpu_class
    known = any(g.domain is not None for r in every for g in r.node.gpus if g.gpu_class == cls)
    said = [_domain_said(up, down, ask)] if known else []
    if not known or labelled:
        largest = max((len(rooms) for rooms in labelled.values()), default=0)
        said.append(
            f"no {FABRIC_LABEL} group has {ask.profile.nodes} eligible nodes "
            f"(the largest has {largest})"
        )
    return said


def _domain_said(up: dict, down: dict, ask: Ask) -> str:
    """The domain that came closest (most trays with IMEX up, then most free GPUs), in
    the figures an operator can check against the rack."""
    cls, count = ask.profile.gpu_class, ask.profile.nodes
    wanted = f"the replica needs {count * ask.need} on {count} trays"

    def free(rooms: list[NodeRoom]) -> int:
        return sum(len(r.free_gpus.get(cls, ())) for r in rooms)

    domains = sorted(
        up.keys() | down.keys(), key=lambda d: (-len(up.get(d, ())), -free(up.get(d, [])), d)
    )
    if not domains:
        return f"no NVLink domain has a tray that could take a shard; {wanted}"
    best = domains[0]
    rooms, without = up.get(best, []), len(down.get(best, ()))
    more = f" ({without} more without)" if without else ""
    return (
        f"domain {best[0]} clique {best[1]} has {free(rooms)} free GPUs on {len(rooms)} "
        f"trays with IMEX up{more}; {wanted}"
    )
