"""Builders for the shell's tests: their clock, agent frames, catalog entries, and nodes
registered for real."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from catalog.domain import ModelSpec, parse_model
from catalog.services import model_add
from fleet.models import Node
from fleet.nodes.dispatch import Command
from fleet.nodes.identity import AgentCredential
from fleet.nodes.registration import node_register
from fleet.protocol import Register

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}
L4 = {"name": "NVIDIA L4", "memory_total_mb": 23034}
# The moment a test's fleet starts: passes and heartbeats are given times after it.
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A moment `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def register_frame(
    node_id: str = "gpu-a",
    *,
    gpus: tuple[dict, ...] = (H100, H100),
    memory_total_mb: int = 256 * 1024,
    cpu_count: int = 32,
    labels: dict | None = None,
    shards: tuple[dict, ...] = (),
) -> dict:
    """What `llmgw agent` sends first, for a node with these GPUs."""
    return {
        "type": "register",
        "node_id": node_id,
        "hostname": f"{node_id}.lab",
        "mgmt_addr": "10.0.0.7",
        "labels": labels or {},
        "agent_version": "0.11.0",
        "memory_total_mb": memory_total_mb,
        "cpu_count": cpu_count,
        "gpus": [{"index": i, "uuid": f"GPU-{node_id}-{i}", **g} for i, g in enumerate(gpus)],
        "engines": {"sim": "0.11.0", "vllm": "0.6.3"},
        "engines_probed": True,
        "disk": {"free_gb": 500.0, "total_gb": 1000.0},
        "weights": [],
        "shards": list(shards),
    }


def running_shard(replica_id: str, model: str | dict, profile: str, *, port: int = 20000) -> dict:
    """A shard as an agent reports it in `register` after a control plane restart: of the
    model named, or of the model `model` describes (gpu_model, cpu_model), with the
    fingerprint its profile has in the catalog."""
    fp = ""
    if isinstance(model, dict):
        fp = parse_model(model).profile(profile).fingerprint()
        model = model["name"]
    return {
        "shard_id": f"{replica_id}-0",
        "replica_id": replica_id,
        "model": model,
        "profile": profile,
        "profile_fp": fp,
        "gpu_indices": [0],
        "endpoint": f"http://10.0.0.7:{port}",
        "state": "ready",
    }


def agent_credential(node_id: str) -> AgentCredential:
    """What the consumer would have authenticated: the node's own credential once it has one,
    else a join token (whose registration issues it one)."""
    if Node.objects.filter(pk=node_id, credential_hash__isnull=False).exists():
        return AgentCredential(node_id=node_id)
    return AgentCredential(join_token="test-join")


def node_add(node_id: str, *, now: datetime, seen_addr: str = "10.0.0.7", **frame) -> list[Command]:
    """Register a node through the service the consumer calls, its connection coming from
    `seen_addr` (the address register_frame declares); returns the commands for it."""
    return node_register(
        msg=Register.model_validate(register_frame(node_id, **frame)),
        session=f"session-{node_id}",
        now=now,
        credential=agent_credential(node_id),
        seen_addr=seen_addr,
    ).commands


def gpu_model(name: str = "llama", *, gpu_class: str = "h100-80g", **extra) -> dict:
    return {
        "name": name,
        "source": f"hf://acme/{name}",
        "profiles": [{"name": "gpu", "engine": "sim", "gpu_class": gpu_class}],
        **extra,
    }


def cpu_model(
    name: str = "tiny", *, cores: int = 2, memory_gb: float = 4, selector=None, **extra
) -> dict:
    profile = {"name": "cpu", "engine": "sim", "cpu_cores": cores, "min_memory_gb": memory_gb}
    if selector:
        profile["node_selector"] = selector
    return {"name": name, "source": f"hf://acme/{name}", "profiles": [profile], **extra}


def model_added(data: dict) -> ModelSpec:
    return model_add(data=data, actor="test")
