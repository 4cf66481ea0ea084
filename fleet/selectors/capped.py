"""The GPUs held below their default power limit, from the nodes' latest heartbeats, for the
reconciler's snapshot and the dry runs: a replica on them counts less than was measured
(fleet/domain/capped.py, docs/facility.md "What a capped replica counts")."""

from __future__ import annotations

from collections.abc import Mapping

from django.conf import settings
from django.db.models.fields.json import KeyTransform

from ..domain.capped import Caps, gpu_share
from ..domain.types import NodeView
from ..models import Node
from .facility import _CHUNK, _reading


def shares_of(reported) -> dict[int, float]:
    """A heartbeat's `load.gpus` as the share of its default power limit each GPU held
    below it is held to, by index; a GPU at its default or not saying both is left out."""
    out: dict[int, float] = {}
    for g in reported if isinstance(reported, list) else ():
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            continue
        share = gpu_share(_reading(g.get("power_limit_w")), _reading(g.get("power_default_w")))
        if share is not None and share < 1.0:
            out[g["index"]] = share
    return out


def caps_load(nodes: Mapping[str, NodeView], measured: bool) -> Caps:
    """Per node with GPUs, its GPUs held below their default: one query, and none when
    nothing is measured (there is no measured figure to count less of) or no node has GPUs."""
    exponent = settings.LLMGW.power_cap_exponent
    with_gpus = sorted(n for n, v in nodes.items() if v.gpus)
    if not measured or not with_gpus or exponent == 0:
        return Caps(exponent=exponent)
    rows = Node.objects.annotate(gpu_load=KeyTransform("gpus", "load")).order_by()
    if len(with_gpus) <= _CHUNK:
        rows = rows.filter(pk__in=with_gpus)
    shares = {
        node_id: found
        for node_id, reported in rows.values_list("id", "gpu_load")
        if (found := shares_of(reported))
    }
    return Caps(shares, exponent)
