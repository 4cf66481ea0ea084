"""How much a GGUF model needs to run under llama.cpp, where it fits, and the profile that
says so (domain.md, Mirror; interfaces.md, `GET /weights/{id}/plan`).

Pure: a `GgufInfo` (mirror.gguf) and the nodes' free room in, a `Plan` out.

Memory is weights + the f16 KV cache for the context pool + 1 GiB + weights/20,
rounded up to a whole GB. The KV cache holds a key and a value per layer, token
and KV head: block_count × ctx × head_count_kv × (key_length + value_length) ×
2 bytes, which is 2 × block_count × ctx × head_count_kv × head_size × 2 when
keys and values are the same size. It is counted for every layer at the whole
pool, so a model with sliding-window layers (Gemma 3) or per-layer head counts
(the largest is taken) is estimated high, never low.

GB here is GiB, 2³⁰ bytes, because that is what the catalog's `min_memory_gb`
is compared with: agents report memory in MiB and a node's `memory_gb` is
that over 1024 (fleet.selectors.state.node_views), so a profile asking 2 "GB" asks
2 GiB of a node.

Where it fits is placement's rule (fleet.domain.placement) for the llama.cpp
CPU profile the plan makes, on the free room placement counts (its NodeRoom):
a node's state, cordon, drain and engines in placement's own words, then free
memory and free cores, said with the figures ("cpu-1 has 12 GB free of 64 GB;
Gemma 3 270m needs 3 GB."). The profile is CPU-only, as the seed's serve made
it; a CPU profile may run on a GPU node's host memory.

On GPUs (`Plan.gpus`), llama.cpp with every layer offloaded (`-ngl 999`) holds the
file and the f16 cache for the pool in GPU memory, split by layers between the
GPUs it is given: per GPU class present, the fewest GPUs (1, 2, 4, 8 on one node)
whose memory at the same 0.9 headroom vLLM is given holds them (mirror.domain.gpus).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from catalog.domain import Profile, suggested_cores
from fleet.domain.placement import NodeRoom, could_ever_run, refuse
from mirror.gguf import GgufInfo

from .gpus import DEFAULT_UTILIZATION, GpuOption, gpu_options

GIB = 1 << 30
MIB = 1 << 20
# The seed's context pool (`ctl model serve --ctx-pool 16384`): four parallel slots of
# 4096. A model trained on less gets its trained context.
DEFAULT_CTX = 16384
F16_BYTES = 2
PROFILE_NAME = "cpu"


class SizingError(ValueError):
    """A plan that cannot be made as asked; the message is a sentence for an operator."""


@dataclass(frozen=True)
class Plan:
    """What one replica of a GGUF model needs, and where it fits now.

    `memory_gb` is whole GiB (see the module); `cpu_cores` the cores to reserve, 0
    when no node says how many it has. `fits` are node ids where a replica fits
    now; `blocked` a sentence with figures per node where it does not.
    """

    architecture: str
    name: str
    parameters: int
    quantization: str
    context_length: int
    ctx: int
    weights_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    memory_gb: int
    cpu_cores: int
    basis: str
    fits: tuple[str, ...] = ()
    blocked: tuple[str, ...] = ()
    gpus: tuple[GpuOption, ...] = ()
    # Where the owner's capacity limit stops a replica that fits (mirror.plans), or "".
    quota: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The `GET /weights/{id}/plan` answer (interfaces.md)."""
        return {
            "format": "gguf",
            "weights_bytes": self.weights_bytes,
            "kv_bytes_per_token": self.kv_cache_bytes // self.ctx,
            "gpu_memory_utilization": DEFAULT_UTILIZATION,
            "gpus": [g.as_dict() for g in self.gpus],
            "architecture": self.architecture,
            "parameters": self.parameters,
            "quantization": self.quantization,
            "context_length": self.context_length,
            "memory_gb": self.memory_gb,
            "cpu_cores": self.cpu_cores,
            "basis": self.basis,
            "fits": list(self.fits),
            "blocked": list(self.blocked),
            "quota": self.quota or None,
        }


@dataclass(frozen=True)
class GgufOnGpus:
    """A GGUF file as mirror.domain.gpus sizes it: llama.cpp splits layers, so the file and
    the cache are shared evenly between the GPUs, at any count."""

    info: GgufInfo
    attention_heads: int = 1

    @property
    def weights_bytes(self) -> int:
        return self.info.size_bytes

    @property
    def kv_per_token(self) -> int:
        return kv_cache_bytes(self.info, 1)

    def kv_cache_bytes(self, ctx: int) -> int:
        return kv_cache_bytes(self.info, ctx)

    def kv_share(self, tp: int) -> float:
        return 1 / tp


def kv_cache_bytes(info: GgufInfo, ctx: int) -> int:
    """The f16 KV cache for `ctx` tokens: a key and a value per layer, token and KV head."""
    return (
        info.block_count
        * ctx
        * info.head_count_kv
        * (info.key_length + info.value_length)
        * F16_BYTES
    )


def choose_ctx(info: GgufInfo, ctx: int | None = None) -> int:
    """The context pool: `ctx` if given, else the trained context capped at DEFAULT_CTX.
    Raise SizingError when `ctx` is not a positive number or is above the trained context."""
    if ctx is None:
        return min(info.context_length, DEFAULT_CTX)
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise SizingError(f"The context must be a positive number of tokens, not {ctx!r}.")
    if ctx > info.context_length:
        raise SizingError(
            f"{_title(info)} was trained on {info.context_length:,} tokens of context; "
            f"a context of {ctx:,} is more than it can use."
        )
    return ctx


def plan(
    info: GgufInfo,
    *,
    ctx: int | None = None,
    nodes: Iterable[NodeRoom],
    cores: int | None = None,
    node_selector: Mapping[str, str] | None = None,
) -> Plan:
    """Size a replica of the model in `info` for a context pool of `ctx` tokens (see
    `choose_ctx`) and say where it fits among `nodes`.

    `nodes` is each node's free room as placement counts it: `Inventory.rooms.values()`
    of the fleet as it stands (fleet.domain.capacity.standing). `cores` overrides the
    suggested cores: half the smallest CPU count among ready nodes with the memory for
    it (catalog.domain.suggested_cores). Raises SizingError for a context it cannot use.
    """
    ctx = choose_ctx(info, ctx)
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 0):
        raise SizingError(f"The cores must be a whole number, 0 or more, not {cores!r}.")
    weights = info.size_bytes
    kv = kv_cache_bytes(info, ctx)
    overhead = GIB + weights // 20
    total = weights + kv + overhead
    memory_gb = -(-total // GIB)  # whole GiB, rounded up, in integers: exact at any size
    rooms = sorted(nodes, key=lambda r: r.node.id)
    selector = dict(node_selector or {})
    if cores is None:
        sized = _profile(memory_gb, 0, ctx)
        cores = suggested_cores(
            memory_gb,
            [(r.node.memory_gb, r.node.cpu_count) for r in rooms if could_ever_run(r.node, sized)],
        )
    fits, blocked = [], []
    for room in rooms:
        why = _refuse(room, memory_gb, cores, ctx, _title(info), selector)
        if why is None:
            fits.append(room.node.id)
        else:
            blocked.append(why)
    return Plan(
        architecture=info.architecture,
        name=info.name,
        parameters=info.parameters,
        quantization=info.quantization,
        context_length=info.context_length,
        ctx=ctx,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        overhead_bytes=overhead,
        memory_gb=memory_gb,
        cpu_cores=cores,
        basis=_basis(info, ctx, weights, kv, overhead, memory_gb),
        fits=tuple(fits),
        blocked=tuple(blocked),
        gpus=tuple(
            gpu_options(
                GgufOnGpus(info),
                ctx=ctx,
                rooms=rooms,
                utilization=DEFAULT_UTILIZATION,
                title=_title(info),
                engine="llamacpp",
                node_selector=selector,
            )
        ),
    )


def llamacpp_profile(plan: Plan, *, name: str = PROFILE_NAME) -> dict[str, Any]:
    """The catalog profile (ProfileIn's shape) for a replica sized by `plan`: llama.cpp on
    CPU, `--ctx-size` the plan's context pool, its memory and cores reserved (no cores
    when the plan found none to suggest, which reserves nothing)."""
    profile: dict[str, Any] = {
        "name": name,
        "engine": "llamacpp",
        "args": ["--ctx-size", str(plan.ctx)],
        "min_memory_gb": plan.memory_gb,
    }
    if plan.cpu_cores:
        profile["cpu_cores"] = plan.cpu_cores
    return profile


def option_for(options: Iterable[GpuOption], gpu_class: str) -> GpuOption:
    """The option for GPUs of `gpu_class` that fits; SizingError with its sentence when it
    does not, or with the classes there are when the fleet has none of that class."""
    options = tuple(options)
    option = next((o for o in options if o.gpu_class == gpu_class), None)
    if option is None:
        present = ", ".join(o.gpu_class for o in options) or "none"
        raise SizingError(f"The fleet has no {gpu_class} GPUs; it has {present}.")
    if option.chosen is None:
        raise SizingError(option.said)
    return option


def llamacpp_gpu_profile(plan: Plan, gpu_class: str) -> dict[str, Any]:
    """The catalog profile for llama.cpp on GPUs of `gpu_class` (the agent offloads every
    layer, `--n-gpu-layers 999`), on as many GPUs as the plan found it needs there;
    SizingError as `option_for` says."""
    option = option_for(plan.gpus, gpu_class)
    assert option.chosen is not None
    return {
        "name": gpu_class,
        "engine": "llamacpp",
        "gpu_class": gpu_class,
        "tp": option.chosen.tp,
        # The agent offloads every layer of a shard given GPUs (--n-gpu-layers 999).
        "args": ["--ctx-size", str(plan.ctx)],
    }


def serve_model(
    plan: Plan,
    *,
    name: str,
    source: str,
    gpu_class: str | None = None,
    profile_overrides: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The model `POST /models/serve` adds (ModelIn's shape, for catalog.domain.parse_model):
    one llama.cpp profile sized by `plan` (on CPU, or on `gpu_class` GPUs), a chat model
    whose requests may use the whole context pool, with `profile_overrides` (cpu_cores,
    min_memory_gb, node_selector) on the profile and `overrides` (ModelIn fields)
    replacing what they name."""
    profile = llamacpp_gpu_profile(plan, gpu_class) if gpu_class else llamacpp_profile(plan)
    described = ", ".join(
        p for p in (plan.name, plan.quantization, _count(plan.parameters) + " parameters") if p
    )
    profiles = [{**profile, **(profile_overrides or {})}]
    return served_model(name, source, described, plan.ctx, profiles, overrides)


def served_model(
    name: str,
    source: str,
    description: str,
    ctx: int,
    profiles: list[dict[str, Any]],
    overrides: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """ModelIn's shape for a model serve adds: a chat model whose requests may use the whole
    context it was sized for, with `overrides` (ModelIn fields) replacing what they name."""
    data: dict[str, Any] = {
        "name": name,
        "source": source,
        "description": description,
        "routing_profile": "chat",
        "context_length": ctx,
        "profiles": profiles,
    }
    data.update(overrides or {})
    return data


def _profile(
    memory_gb: int, cores: int, ctx: int, selector: Mapping[str, str] | None = None
) -> Profile:
    """The profile placement would be asked about; 0 leaves memory or cores out."""
    return Profile(
        name=PROFILE_NAME,
        engine="llamacpp",
        args=("--ctx-size", str(ctx)),
        min_memory_gb=float(memory_gb) or None,
        cpu_cores=cores or None,
        node_selector=dict(selector or {}),
    )


def _refuse(
    room: NodeRoom,
    memory_gb: int,
    cores: int,
    ctx: int,
    title: str,
    selector: Mapping[str, str] | None = None,
) -> str | None:
    """Placement's refusal of the profile, with memory and cores said as the plan's."""
    # State, cordon, drain, labels and engine are placement's own sentences; memory and
    # cores are the same tests as placement's, worded with the model and units.
    if why := refuse(room, _profile(0, 0, ctx, selector), frozenset(), ""):
        return f"{why}."
    node = room.node
    free = room.memory_free
    if free is not None and free < memory_gb:
        return (
            f"{node.id} has {_gb(max(free, 0))} GB free of {_gb(node.memory_gb or 0)} GB; "
            f"{title} needs {memory_gb} GB."
        )
    if cores and room.cores_free is not None and room.cores_free < cores:
        return (
            f"{node.id} has {max(room.cores_free, 0)} of {node.cpu_count} CPUs free; "
            f"{title} needs {cores} cores."
        )
    return None


def _gb(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.1f}"


def _basis(info: GgufInfo, ctx: int, weights: int, kv: int, overhead: int, memory_gb: int) -> str:
    heads = "KV head" if info.head_count_kv == 1 else "KV heads"
    kv_sentence = (
        f"{_mib(kv)} of f16 KV cache ({info.block_count} layers × {ctx:,} tokens × "
        f"{info.head_count_kv} {heads} × ({info.key_length} key + {info.value_length} value) "
        "× 2 bytes)"
    )
    per_layer = ""
    if info.head_count_kv_per_layer and len(set(info.head_count_kv_per_layer)) > 1:
        per_layer = (
            f"; its layers have {min(info.head_count_kv_per_layer)} to "
            f"{info.head_count_kv} KV heads, and the largest is counted for every layer"
        )
    total = weights + kv + overhead
    return (
        f"{_title(info)} ({info.architecture}, {info.quantization}, "
        f"{_count(info.parameters)} parameters): {_mib(weights)} of weights + {kv_sentence} "
        f"+ 1 GiB + {_mib(weights // 20)} (weights/20) = {total / GIB:.2f} GiB, "
        f"rounded up to {memory_gb} GB{per_layer}."
    )


def _title(info: GgufInfo) -> str:
    return info.name or info.filename


def _mib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= 10 * GIB else f"{math.ceil(n / MIB):,} MiB"


def _count(n: int) -> str:
    """268098176 as 268M, 8030261248 as 8.0B: how model cards say it."""
    if n >= 10**9:
        return f"{n / 10**9:.1f}B"
    if n >= 10**6:
        return f"{n / 10**6:.0f}M"
    return f"{n:,}"


# llama-server's own default when a profile gives no --ctx-size.
LLAMACPP_DEFAULT_CTX = 4096


def profile_ctx(args: Iterable[str]) -> int | None:
    """The context pool a llama.cpp profile's arguments ask (`--ctx-size N`, `-c N`,
    `--ctx-size=N`); None when they do not say, or say it as something not a number."""
    args = list(args)
    for i, a in enumerate(args):
        value = None
        if a in ("--ctx-size", "-c") and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith("--ctx-size="):
            value = a.split("=", 1)[1]
        if value is not None:
            return int(value) if value.isdigit() else None
    return None


def profile_refusal(info: GgufInfo, profile: Profile, *, model: str) -> str | None:
    """Why a llama.cpp profile on this GGUF file cannot run as declared, in the sentences
    the plan and serve use; None when it can. Its context must be within the trained one
    (0 is llama.cpp's "the trained context"), and a CPU profile must reserve the memory
    the plan estimates for that context."""
    where = f"model {model}, profile {profile.name}"
    asked = profile_ctx(profile.args)
    ctx = info.context_length if asked == 0 else asked
    if ctx is None:
        ctx = min(info.context_length, LLAMACPP_DEFAULT_CTX)
    try:
        p = plan(info, ctx=ctx, nodes=())
    except SizingError as exc:
        return f"{where}: {exc}"
    reserved = profile.min_memory_gb
    if profile.cpu_only and reserved is not None and reserved < p.memory_gb:
        return (
            f"{where}: it reserves {reserved:g} GB, and {_title(info)} needs {p.memory_gb} GB at a "
            f"context of {ctx:,}: {p.basis} Reserve {p.memory_gb} GB or lower --ctx-size."
        )
    return None
