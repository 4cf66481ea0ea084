"""Sizing weights the mirror holds: a GGUF file's header read from the blob, placed against
the fleet as it stands, and the llama.cpp model made from it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from catalog import services as catalog_services
from catalog.domain import ModelSpec
from fleet.dry_runs import node_rooms
from llmgw.core.errors import Conflict, Invalid, NotFound

from . import store
from .domain.progress import READY
from .domain.sizing import Plan, SizingError, plan, serve_model
from .gguf import GgufError, read_gguf
from .models import WeightFile, Weights

# What the serve body may set beside weights, name, ctx and file: ModelIn's own fields.
_NOT_OVERRIDES = ("weights", "name", "ctx", "file")


def _gguf(weights_id: int, file: str | None) -> tuple[Weights, WeightFile]:
    weights = Weights.objects.prefetch_related("files").filter(pk=weights_id).first()
    if weights is None:
        raise NotFound(f"There are no weights {weights_id}.")
    files = list(weights.files.all())
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
    f = chosen[0]
    if f.state != READY or not f.sha256:
        done = f"{f.bytes_done:,} of {f.size:,} bytes" if f.size else f"{f.bytes_done:,} bytes"
        raise Conflict(
            f"{f.path} of weights {weights_id} is {f.state} ({done}); it can be sized once ready."
        )
    return weights, f


def weights_plan(
    *, weights_id: int, ctx: int | None, file: str | None
) -> tuple[Plan, Weights, WeightFile]:
    """The plan for a GGUF file of some weights; Invalid for a file that is not GGUF or a
    context it cannot use, Conflict while the file is not yet fetched."""
    weights, f = _gguf(weights_id, file)
    try:
        info = read_gguf(store.blob(f.sha256))
        return plan(info, ctx=ctx, nodes=node_rooms()), weights, f
    except (GgufError, SizingError) as exc:
        raise Invalid(str(exc)) from None


def model_serve(*, data: Mapping[str, Any], actor: str) -> ModelSpec:
    """Add a llama.cpp model sized by the plan of its weights (POST /models/serve)."""
    if not isinstance(data, Mapping):
        raise Invalid("The body must be an object with weights and name.")
    weights_id, name, ctx, file = (data.get(k) for k in _NOT_OVERRIDES)
    if isinstance(weights_id, bool) or not isinstance(weights_id, int):
        raise Invalid("weights must be the id of weights in the mirror (llmgw ctl weights list).")
    if not isinstance(name, str) or not name.strip():
        raise Invalid("name is needed: what the model is called in the catalog and the gateway.")
    if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int)):
        raise Invalid("ctx must be a whole number of tokens.")
    if file is not None and not isinstance(file, str):
        raise Invalid("file must be a path within the weights.")
    p, weights, f = weights_plan(weights_id=weights_id, ctx=ctx, file=file)
    single = weights.files.count() == 1
    source = weights.source if single else f"{weights.source.rstrip('/')}/{f.path}"
    overrides = {k: v for k, v in data.items() if k not in _NOT_OVERRIDES}
    return catalog_services.model_add(
        data=serve_model(p, name=name.strip(), source=source, overrides=overrides), actor=actor
    )
