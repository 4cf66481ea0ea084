"""Sizing weights the mirror holds: a GGUF file's header or a safetensors model's config.json
and headers, read from the blobs, placed against the fleet as it stands. The model made
from a plan (llama.cpp for a GGUF, vLLM for safetensors) is added by
mirror.services.model_serve."""

from __future__ import annotations

from collections.abc import Mapping

from fleet.selectors.dry_runs import node_rooms_and_quota
from llmgw.core.errors import Conflict, Invalid, NotFound

from . import store
from .domain.hf import HfError
from .domain.hf_sizing import HfPlan, check_utilization, hf_plan
from .domain.owner import with_owner_limit
from .domain.progress import READY
from .domain.sizing import Plan, SizingError, plan
from .domain.sources import HF, LOCAL, parse_source
from .gguf import GgufError, read_gguf
from .models import WeightFile, Weights
from .safetensors import is_hf, read_hf


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
