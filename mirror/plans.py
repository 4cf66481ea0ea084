"""Sizing weights the mirror holds: a GGUF file's header or a safetensors model's config.json
and headers, read from the blobs, placed against the fleet as it stands, and the model
made from it (llama.cpp for a GGUF, vLLM for safetensors); and the check the catalog asks
of a llama.cpp profile on mirror weights (issue 36, item 5)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from catalog import services as catalog_services
from catalog.domain import ModelSpec
from fleet.selectors.dry_runs import node_rooms_and_quota
from llmgw.core.errors import Conflict, Invalid, NotFound
from tenancy.selectors import scope_find

from . import store
from .domain.hf import HfError
from .domain.hf_sizing import HfPlan, check_utilization, hf_plan, serve_hf_model
from .domain.owner import with_owner_limit
from .domain.progress import READY
from .domain.sizing import Plan, SizingError, plan, serve_model
from .domain.sources import HF, LOCAL, parse_source
from .gguf import GgufError, read_gguf
from .models import WeightFile, Weights
from .safetensors import is_hf, read_hf

# What the serve body may set beside ModelIn's own fields (which override the model).
_NOT_OVERRIDES = (
    "weights",
    "name",
    "ctx",
    "file",
    "gpu_class",
    "gpu_memory_utilization",
    "cores",
    "memory_gb",
    "node_selector",
    "kv_cache_dtype",
)


def _weights(weights_id: int) -> tuple[Weights, list[WeightFile]]:
    weights = Weights.objects.prefetch_related("files").filter(pk=weights_id).first()
    if weights is None:
        raise NotFound(f"There are no weights {weights_id}.")
    return weights, list(weights.files.all())


def _ready(f: WeightFile, weights_id: int) -> None:
    if f.state != READY or not f.sha256:
        done = f"{f.bytes_done:,} of {f.size:,} bytes" if f.size else f"{f.bytes_done:,} bytes"
        raise Conflict(
            f"{f.path} of weights {weights_id} is {f.state} ({done}); it can be sized once ready."
        )


def _gguf(weights_id: int, weights: Weights, files: list[WeightFile], file: str | None):
    if file:
        chosen = [f for f in files if f.path == file]
        if not chosen:
            shown = ", ".join(f.path for f in files[:10])
            raise Invalid(f"Weights {weights_id} hold no file {file!r}; they hold {shown}.")
    else:
        chosen = [f for f in files if f.path.endswith(".gguf")] or files
        if len(chosen) > 1:
            shown = ", ".join(f.path for f in chosen[:10])
            raise Invalid(
                f"Weights {weights_id} hold {len(chosen)} GGUF files ({shown}); name one with file."
            )
    _ready(chosen[0], weights_id)
    return chosen[0]


def title_of(source: str) -> str:
    """How a safetensors model is called in sentences: its repository's or folder's name."""
    return source.rstrip("/").split("@")[0].rsplit("/", 1)[-1]


def weights_plan(
    *,
    weights_id: int,
    ctx: int | None,
    file: str | None,
    utilization: float | None = None,
    node_selector: Mapping[str, str] | None = None,
    owner: str = "",
    kv_cache_dtype: str | None = None,
) -> tuple[Plan | HfPlan, Weights, WeightFile | None]:
    """The plan for a GGUF file of some weights, or for the safetensors model they hold
    (config.json and *.safetensors, no file named); Invalid for files sizing cannot use or
    a context they cannot use, Conflict while a file needed is not yet fetched. With
    `owner`, where the owner's capacity limit would stop a replica that fits is said."""
    weights, files = _weights(weights_id)
    rooms, policy, usage = node_rooms_and_quota()
    try:
        if not file and is_hf([f.path for f in files]):
            for f in files:
                _ready(f, weights_id)
            model = read_hf({f.path: store.blob(f.sha256) for f in files})
            p = hf_plan(
                model,
                title=title_of(weights.source),
                ctx=ctx,
                rooms=rooms,
                utilization=check_utilization(utilization),
                source=vllm_source(weights),
                node_selector=node_selector,
                kv_cache_dtype=kv_cache_dtype,
            )
            return with_owner_limit(p, owner, policy, usage), weights, None
        f = _gguf(weights_id, weights, files, file)
        p = plan(read_gguf(store.blob(f.sha256)), ctx=ctx, nodes=rooms, node_selector=node_selector)
        return with_owner_limit(p, owner, policy, usage), weights, f
    except (GgufError, HfError, SizingError) as exc:
        raise Invalid(str(exc)) from None


def vllm_source(weights: Weights) -> str:
    """A vLLM model's source: the mirror's weights themselves, so each node is sent every
    file of the folder from the mirror (an offline cluster never asks the hub); Invalid for
    a single file over https."""
    source = parse_source(weights.source)
    if source.kind in (HF, LOCAL):
        return weights.source
    raise Invalid(
        f"Weights {weights.pk} ({weights.source}) are not a whole repository or folder; "
        "vLLM serves a safetensors model from hf://ORG/REPO or a folder."
    )


def parse_selector(text: str | None) -> dict[str, str]:
    """`key=value,key=value` as labels; Invalid with a sentence for anything else."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise Invalid(f"A node selector is key=value, separated by commas; not {part!r}.")
        out[key.strip()] = value.strip()
    return out


def _figure(data: Mapping[str, Any], key: str, kinds: tuple[type, ...], said: str) -> Any:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise Invalid(f"{key} must be {said}.")
    return value


def model_serve(*, data: Mapping[str, Any], actor: str) -> tuple[ModelSpec, str]:
    """Add a model sized by the plan of its weights (POST /models/serve): llama.cpp for a
    GGUF file, vLLM for a safetensors model. `cores`, `memory_gb` and `node_selector` go on
    every profile; ModelIn's own fields replace what they name. Returns the model and, for
    an `owner` whose capacity limit stops the replica the plan fits, the sentence saying so
    ("" otherwise): the model is added all the same, to run once the limit allows."""
    if not isinstance(data, Mapping):
        raise Invalid("The body must be an object with weights and name.")
    weights_id, name = data.get("weights"), data.get("name")
    if isinstance(weights_id, bool) or not isinstance(weights_id, int):
        raise Invalid("weights must be the id of weights in the mirror (llmgw ctl weights list).")
    if not isinstance(name, str) or not name.strip():
        raise Invalid("name is needed: what the model is called in the catalog and the gateway.")
    ctx = _figure(data, "ctx", (int,), "a whole number of tokens")
    file = _figure(data, "file", (str,), "a path within the weights")
    gpu_class = _figure(data, "gpu_class", (str,), "a GPU class (llmgw ctl nodes)")
    util = _figure(data, "gpu_memory_utilization", (int, float), "a fraction such as 0.9")
    cores = _figure(data, "cores", (int,), "a whole number of cores")
    memory = _figure(data, "memory_gb", (int, float), "a number of GB")
    selector = _figure(data, "node_selector", (dict,), "an object of label: value")
    cache = _figure(data, "kv_cache_dtype", (str,), "auto or fp8")
    if selector and not all(isinstance(v, str) for v in selector.values()):
        raise Invalid("node_selector must be an object of label: value, each a string.")
    owner = data.get("owner") if isinstance(data.get("owner"), str) else ""
    if owner:
        try:
            owner = scope_find(owner)
        except Invalid as exc:
            raise Invalid(f"owner: {exc}") from None
    p, weights, f = weights_plan(
        weights_id=weights_id,
        ctx=ctx,
        file=file,
        utilization=util,
        node_selector=selector,
        owner=owner,
        kv_cache_dtype=cache,
    )
    profile: dict[str, Any] = {}
    if cores is not None:
        profile["cpu_cores"] = cores
    if memory is not None:
        profile["min_memory_gb"] = memory
    if selector:
        profile["node_selector"] = selector
    overrides = {k: v for k, v in data.items() if k not in _NOT_OVERRIDES}
    try:
        if isinstance(p, HfPlan):
            model = serve_hf_model(
                p,
                name=name.strip(),
                source=vllm_source(weights),
                gpu_class=gpu_class,
                profile_overrides=profile,
                overrides=overrides,
            )
        else:
            single = len(weights.files.all()) == 1
            source = weights.source if single else f"{weights.source.rstrip('/')}/{f.path}"
            model = serve_model(
                p,
                name=name.strip(),
                source=source,
                gpu_class=gpu_class,
                profile_overrides=profile,
                overrides=overrides,
            )
    except SizingError as exc:
        raise Invalid(str(exc)) from None
    spec = catalog_services.model_add(data=model, actor=actor)
    if gpu_class:
        return spec, next((o.quota for o in p.gpus if o.gpu_class == gpu_class), "")
    if isinstance(p, HfPlan):
        return spec, next((o.quota for o in p.fitting[:1]), "")
    return spec, p.quota
