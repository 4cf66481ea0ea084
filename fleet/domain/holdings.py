"""What each replica holds of the cluster, for the quota policy (tenancy/quota.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from catalog.domain import ModelSpec, Profile
from tenancy.quota import ZERO, Amount, Holding

from .placement import Placement
from .types import HOLDING, ReplicaView


def placement_amount(placement: Placement) -> Amount:
    """What a placement would hold once started."""
    total = ZERO
    for s in placement.shards:
        total = total + Amount(len(s.gpu_indices), s.cpu_cores or 0, s.memory_gb or 0.0)
    return total


def profile_amount(profile: Profile) -> Amount:
    """What one replica of a profile holds, before there is a placement."""
    return Amount(
        profile.gpus_on_each_node * profile.nodes,
        (profile.reserved_cores or 0) * profile.nodes,
        (profile.min_memory_gb or 0.0) * profile.nodes,
    )


def holdings(replicas: Iterable[ReplicaView], models: Mapping[str, ModelSpec]) -> list[Holding]:
    """Every replica holding room, with its model's owner and class; unknown models own nothing."""
    out = []
    for r in replicas:
        if r.state not in HOLDING:
            continue
        spec = models.get(r.model)
        out.append(
            Holding(
                replica=r.id,
                owner=spec.owner if spec else "",
                amount=r.amount,
                since=r.created_at,
                rank=spec.class_rank if spec else 1,
            )
        )
    return out
