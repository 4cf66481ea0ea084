"""The plan for a safetensors model under vLLM, and the model `POST /models/serve` makes of
it (issue 36, item 2; interfaces.md, `GET /weights/{id}/plan`).

Pure: an `HfModel` (mirror.domain.hf) and the nodes' free room in, an `HfPlan` out: the
model's figures, and per GPU class present the smallest tensor-parallel size that holds
the weights and one sequence of the asked context (mirror.domain.gpus). The profile it
makes is vLLM's, with the tp the plan chose (the agent passes it as
`--tensor-parallel-size`, and the model's name as `--served-model-name`), `--max-model-len`
and `--gpu-memory-utilization`; one per GPU class that fits, the classes that fit now first,
then the fewest GPUs; placement takes the first that fits when it places.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleet.domain.placement import NodeRoom

from .gpus import DEFAULT_UTILIZATION, GIB, GpuOption, gpu_options
from .hf import HfError, HfModel, cached_in
from .sizing import SizingError, _count, option_for, served_model

# What a vLLM replica is asked for by default: 32,768 tokens a sequence, or the trained
# context when it is shorter.
DEFAULT_GPU_CTX = 32768


@dataclass(frozen=True)
class HfPlan:
    """A safetensors model's figures and where it fits on GPUs (`gpus`, one per class)."""

    model: HfModel
    title: str
    ctx: int
    utilization: float
    gpus: tuple[GpuOption, ...]
    basis: str
    kv_cache_dtype: str | None = None

    @property
    def fitting(self) -> list[GpuOption]:
        """Options that hold a sequence: those that fit now first, then the fewest GPUs."""
        fit = [o for o in self.gpus if o.chosen is not None]
        # `chosen` is never None in `fit`; mypy does not carry that into the lambda.
        return sorted(fit, key=lambda o: (not o.fits, o.chosen.tp, o.gpu_class))  # type: ignore[union-attr]

    def as_dict(self) -> dict[str, Any]:
        """The `GET /weights/{id}/plan` answer: the GGUF plan's fields (memory and cores
        None: a GPU profile reserves neither), and the GPU figures beside them."""
        m = self.model
        best = self.fitting[:1]
        return {
            "format": "safetensors",
            "architecture": m.architecture,
            "parameters": m.parameters,
            "quantization": m.quantization or "+".join(m.bytes_by_dtype),
            "context_length": m.context_length,
            "ctx": self.ctx,
            "memory_gb": None,
            "cpu_cores": None,
            "basis": self.basis,
            "fits": list(best[0].fits) if best else [],
            "blocked": [o.said for o in self.gpus if o.chosen is None]
            + [b for o in best for b in o.blocked],
            "weights_bytes": m.weights_bytes,
            "bytes_by_dtype": dict(m.bytes_by_dtype),
            "kv_bytes_per_token": m.kv_per_token,
            "gpu_memory_utilization": self.utilization,
            "gpus": [o.as_dict() for o in self.gpus],
            "quota": next((o.quota for o in best if o.quota), None),
        }


def choose_gpu_ctx(model: HfModel, ctx: int | None, title: str) -> int:
    """`ctx` if given, else the trained context capped at DEFAULT_GPU_CTX; SizingError for
    one that is not a positive number or is above the trained context."""
    if ctx is None:
        return min(model.context_length, DEFAULT_GPU_CTX)
    if isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1:
        raise SizingError(f"The context must be a positive number of tokens, not {ctx!r}.")
    if ctx > model.context_length:
        raise SizingError(
            f"{title} was trained on {model.context_length:,} tokens of context; "
            f"a context of {ctx:,} is more than it can use."
        )
    return ctx


def check_utilization(value: object) -> float:
    """The memory utilisation asked, between 0 and 1; SizingError with a sentence otherwise."""
    if value is None:
        return DEFAULT_UTILIZATION
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise SizingError(
            f"gpu_memory_utilization must be a fraction above 0 and at most 1, not {value!r}."
        )
    return float(value)


def hf_plan(
    model: HfModel,
    *,
    title: str,
    ctx: int | None,
    rooms: Iterable[NodeRoom],
    utilization: float | None = None,
    source: str = "",
    node_selector: Mapping[str, str] | None = None,
    kv_cache_dtype: str | None = None,
) -> HfPlan:
    """Size `model` for sequences of `ctx` tokens on every GPU class among `rooms`, its KV
    cache in `kv_cache_dtype` (vLLM's flag; None: the model's 16-bit dtype). SizingError
    for a context, utilisation or cache dtype it cannot use."""
    try:
        model = cached_in(model, kv_cache_dtype)
    except HfError as exc:
        raise SizingError(str(exc)) from None
    ctx = choose_gpu_ctx(model, ctx, title)
    util = check_utilization(utilization)
    options = gpu_options(
        model,
        ctx=ctx,
        rooms=rooms,
        utilization=util,
        title=title,
        engine="vllm",
        source=source,
        node_selector=dict(node_selector or {}),
    )
    basis = _basis(model, title, ctx)
    return HfPlan(model, title, ctx, util, tuple(options), basis, kv_cache_dtype)


def vllm_profile(option: GpuOption, plan: HfPlan) -> dict[str, Any]:
    """The catalog profile (ProfileIn's shape) of one option that fits: its class and tp,
    `--max-model-len` and `--gpu-memory-utilization`."""
    c = option.chosen
    assert c is not None
    profile: dict[str, Any] = {
        "name": option.gpu_class,
        "engine": "vllm",
        "gpu_class": option.gpu_class,
        "tp": c.tp,
        # The agent renders --tensor-parallel-size from tp and --served-model-name from the
        # model's name (fleet.agent.engines): written here too, a tp changed later would be
        # contradicted by a stale flag on GPUs placed for the new one.
        "args": [
            "--max-model-len",
            str(plan.ctx),
            "--gpu-memory-utilization",
            f"{plan.utilization:g}",
        ]
        + (["--kv-cache-dtype", plan.kv_cache_dtype] if plan.kv_cache_dtype else []),
    }
    if c.nodes > 1:
        profile.update(nodes=c.nodes, gpus_per_node=c.tp // c.nodes)
    return profile


def serve_hf_model(
    plan: HfPlan,
    *,
    name: str,
    source: str,
    gpu_class: str | None = None,
    profile_overrides: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The model `POST /models/serve` adds (ModelIn's shape): a vLLM profile per GPU class
    that fits (or only `gpu_class`), with `profile_overrides` (cpu_cores, min_memory_gb,
    node_selector) on each and `overrides` (ModelIn fields) replacing what they name.
    SizingError when no class fits, with each class's sentence."""
    options: Sequence[GpuOption] = plan.fitting
    if gpu_class:
        options = (option_for(plan.gpus, gpu_class),)
    if not options:
        if not plan.gpus:
            raise SizingError(f"{plan.title} needs GPUs, and no node of the fleet has any.")
        raise SizingError(" ".join(o.said for o in plan.gpus))
    profiles = [{**vllm_profile(o, plan), **(profile_overrides or {})} for o in options]
    described = f"{plan.title}, {_count(plan.model.parameters)} parameters"
    return served_model(name, source, described, plan.ctx, profiles, overrides)


def _basis(m: HfModel, title: str, ctx: int) -> str:
    dtypes = ", ".join(f"{_gib(n)} {d}" for d, n in m.bytes_by_dtype.items())
    if m.mla:
        per_layer = f"{m.kv_per_layer // m.kv_bytes} latent values × {_bytes_each(m)}"
    else:
        heads = "KV head" if m.kv_heads == 1 else "KV heads"
        per_layer = f"{m.kv_heads} {heads} × {m.head_dim} × 2 (key and value) × {_bytes_each(m)}"
    said = "".join(f"; {s}" for s in m.said)
    return (
        f"{title} ({m.architecture}, {_count(m.parameters)} parameters): {_gib(m.weights_bytes)} "
        f"of weights ({dtypes}); KV cache {m.kv_per_token:,} bytes a token ({m.layers} layers × "
        f"{per_layer}){said}, {_gib(m.kv_cache_bytes(ctx))} for a sequence of {ctx:,}; "
        f"trained on {m.context_length:,} tokens."
    )


def _bytes_each(m: HfModel) -> str:
    return "1 byte (FP8 cache)" if m.kv_bytes == 1 else f"{m.kv_bytes} bytes"


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"
