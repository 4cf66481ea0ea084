"""What a node may say it runs: which shards in its `register` are kept, adopted or stopped.

A node speaks for what the control plane placed on it, and for nothing else. A shard it
reports is kept when the control plane placed it there. Otherwise it is adopted only as a
control plane that lost its state (a restored backup, a new database) takes back what
still runs: soon after the control plane started, for a replica the database does not know
at all, of a model and profile the catalog has as reported, on GPUs of that node nobody
else holds, and at most a few a registration. Everything else is told to stop on that node
and changes nothing: never a replica another node runs, never a shard another holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .endpoints import endpoint_refusal
from .types import parse_shard_id, shard_id

KEEP, ADOPT, STOP = "keep", "adopt", "stop"
# States of a shard that runs: what a register may list and adoption may take.
RUNNING = frozenset({"starting", "ready"})


@dataclass(frozen=True)
class Claim:
    """A running shard as a node reported it in `register` (fleet/protocol.py RunningShard)."""

    shard_id: str
    replica_id: str
    model: str
    profile: str
    profile_fp: str = ""
    gpu_indices: tuple[int, ...] = ()
    endpoint: str = ""
    state: str = "ready"


@dataclass(frozen=True)
class Terms:
    """What the catalog says of a model's profile: its fingerprint, how many nodes a
    replica spans, and the GPUs a shard takes on each."""

    fingerprint: str
    nodes: int = 1
    gpus: int = 0


@dataclass(frozen=True)
class Ground:
    """What the control plane knows when node `node_id` registers, for the shards it
    reports (`elsewhere` and `replicas` need hold only those).

    - `placed`: the shards placed on this node, whatever their state;
    - `elsewhere`: shard id -> the other node it is placed on;
    - `replicas`: the replicas the database holds;
    - `catalog`: (model, profile) -> its Terms;
    - `gpus`: this node's GPU indices; `held`: those its placed shards still hold;
    - `address`: where its engines may be (its trusted address), or `address_refusal`,
      the sentence saying why it has none;
    - `adopting`: whether the control plane still takes back what it did not place;
      `most`: how many one registration may bring.
    """

    node_id: str
    placed: frozenset[str] = frozenset()
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    replicas: frozenset[str] = frozenset()
    catalog: Mapping[tuple[str, str], Terms] = field(default_factory=dict)
    gpus: frozenset[int] = frozenset()
    held: frozenset[int] = frozenset()
    address: str = ""
    address_refusal: str | None = None
    adopting: bool = True
    most: int = 8


@dataclass(frozen=True)
class Verdict:
    """What becomes of one reported shard: kept, adopted, or stopped with a reason (a
    short word for `llmgw_agent_refused_total{reason}`) and the sentence saying why."""

    shard_id: str
    action: str
    reason: str = ""
    why: str = ""


def adoption_window_open(
    *,
    now: datetime,
    last_pass_at: datetime | None,
    settled_from: datetime | None,
    served_since: datetime | None,
    window_s: float,
    gap_s: float,
) -> bool:
    """Whether the control plane takes back shards it did not place: within `window_s` of
    its start (`llmgw serve`'s, or the restart a pass settled for), or while no pass has
    run for `gap_s` or ever (a new or restored database). A control plane that ran all
    along lost nothing, and adopts nothing."""
    if last_pass_at is None or (now - last_pass_at).total_seconds() > gap_s:
        return True
    return any(
        since is not None and (now - since).total_seconds() < window_s
        for since in (settled_from, served_since)
    )


def judge(claims: Sequence[Claim], ground: Ground) -> list[Verdict]:
    """A verdict for each reported shard, in order: those placed on this node are kept,
    those that may be taken back adopted, the rest stopped. Pure: the caller writes."""
    verdicts: list[Verdict] = []
    held = set(ground.held)
    replicas: set[str] = set()
    adopted = 0
    for claim in claims:
        refusal = _endpoint(claim, ground)
        if refusal is not None:
            verdicts.append(Verdict(claim.shard_id, STOP, "endpoint", refusal))
            continue
        if claim.shard_id in ground.placed:
            verdicts.append(Verdict(claim.shard_id, KEEP))
            continue
        refused = _unplaced(claim, ground, held, replicas) or _late(ground, adopted)
        if refused is not None:
            verdicts.append(Verdict(claim.shard_id, STOP, *refused))
            continue
        verdicts.append(Verdict(claim.shard_id, ADOPT))
        held.update(claim.gpu_indices)
        replicas.add(claim.replica_id)
        adopted += 1
    return verdicts


def _endpoint(claim: Claim, ground: Ground) -> str | None:
    if not claim.endpoint:
        return None
    if ground.address_refusal is not None:
        return f"endpoint {claim.endpoint!r} refused: {ground.address_refusal}"
    return endpoint_refusal(claim.endpoint, ground.address)


def _unplaced(
    claim: Claim, ground: Ground, held: set[int], replicas: set[str]
) -> tuple[str, str] | None:
    """Why a shard the control plane did not place on this node may not be adopted, as
    (reason, sentence); None when it may."""
    node, shard = ground.node_id, claim.shard_id
    holder = ground.elsewhere.get(shard)
    if holder is not None:
        return "elsewhere", f"shard {shard} is placed on node {holder}, not on node {node}"
    if claim.replica_id in ground.replicas or claim.replica_id in replicas:
        return "not_placed", f"replica {claim.replica_id} has no shard {shard} on node {node}"
    if claim.state not in RUNNING:
        return "not_running", f"shard {shard} is {claim.state}, not running"
    replica, rank = parse_shard_id(shard)
    if (replica, rank) != (claim.replica_id, 0) or shard != shard_id(replica, rank):
        return "shard_id", f"shard id {shard} is not replica {claim.replica_id}'s first shard"
    terms = ground.catalog.get((claim.model, claim.profile))
    if terms is None:
        return (
            "catalog",
            f"shard {shard}'s model {claim.model} has no profile {claim.profile} in the catalog",
        )
    return _against_terms(claim, terms, ground, held)


def _against_terms(
    claim: Claim, terms: Terms, ground: Ground, held: set[int]
) -> tuple[str, str] | None:
    shard = claim.shard_id
    if claim.profile_fp != terms.fingerprint:
        return (
            "catalog",
            f"shard {shard} runs profile {claim.profile} of {claim.model} as "
            f"{claim.profile_fp or 'no fingerprint'}, not as the catalog has it "
            f"({terms.fingerprint})",
        )
    if terms.nodes > 1:
        return (
            "multi_node",
            f"shard {shard} belongs to a replica spanning {terms.nodes} nodes, which is "
            "adopted only as it was placed",
        )
    gpus = claim.gpu_indices
    if len(gpus) != terms.gpus or len(set(gpus)) != len(gpus):
        return (
            "gpus",
            f"shard {shard} names GPUs {list(gpus)}, where its profile takes {terms.gpus}",
        )
    strange = sorted(set(gpus) - ground.gpus)
    if strange:
        return (
            "gpus",
            f"shard {shard} names GPUs {strange} that node {ground.node_id} does not have",
        )
    taken = sorted(set(gpus) & held)
    if taken:
        return (
            "gpus",
            f"shard {shard} names GPUs {taken} that other shards on node {ground.node_id} hold",
        )
    return None


def _late(ground: Ground, adopted: int) -> tuple[str, str] | None:
    if not ground.adopting:
        return (
            "late",
            "the control plane takes back a shard it did not place only soon after it "
            "started (LLMGW_ADOPT_WINDOW_SECONDS)",
        )
    if adopted >= ground.most:
        return (
            "too_many",
            f"a registration may bring at most {ground.most} shards the control plane did "
            "not place (LLMGW_ADOPT_PER_REGISTER)",
        )
    return None
