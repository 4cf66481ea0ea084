"""Weights over REST: add by source, list, show, retry, remove, size (interfaces.md,
Weights); and engine builds: upload, list, remove. A model served from weights (POST
/models/serve) is added by catalog's API, which answers with the model."""

from __future__ import annotations

from ninja import Query, Router, Status

from llmgw.core import clock
from llmgw.core.api import actor
from llmgw.core.errors import Invalid, NotFound
from tenancy.auth import can
from tenancy.selectors import scope_find

from . import builds as engines, plans, selectors, services
from .schemas import EngineBuildOut, PlanOut, PlanQuery, WeightsIn, WeightsOut

router = Router(tags=["weights"])


def _view(weights_id: int) -> dict:
    found = selectors.weights_views(weights_id=weights_id)
    if not found:
        raise NotFound(f"There are no weights {weights_id}.")
    return found[0]


@router.post(
    "/weights", response={200: WeightsOut, 201: WeightsOut}, auth=can("mirror.add_weights")
)
def weights_add(request, payload: WeightsIn):
    """Add weights by source; 201 at once while the download runs behind, 200 if already added."""
    weights, created = services.weights_add(
        source=payload.source, sha256=payload.sha256, actor=actor(request), now=clock.now()
    )
    return Status(201 if created else 200, _view(weights.pk))


@router.get("/weights", response=list[WeightsOut], auth=can("mirror.view_weights"))
def weights_list(request):
    return selectors.weights_views()


@router.get("/weights/{weights_id}", response=WeightsOut, auth=can("mirror.view_weights"))
def weights_get(request, weights_id: int):
    return _view(weights_id)


@router.post("/weights/{weights_id}/retry", response=WeightsOut, auth=can("mirror.change_weights"))
def weights_retry(request, weights_id: int):
    """Try a failed weights' files again from their first try."""
    _view(weights_id)
    services.weights_retry(weights_id=weights_id)
    services.wake_worker()
    return _view(weights_id)


@router.delete("/weights/{weights_id}", response={204: None}, auth=can("mirror.delete_weights"))
def weights_remove(request, weights_id: int):
    """Delete weights nothing uses; 409 naming the models that do."""
    services.weights_remove(
        weights_id=weights_id, using=selectors.weights_using(weights_id=weights_id)
    )
    return Status(204, None)


@router.get("/weights/{weights_id}/plan", response=PlanOut, auth=can("mirror.view_weights"))
def weights_plan(request, weights_id: int, query: Query[PlanQuery]):
    """What a GGUF file (llama.cpp) or a safetensors model (vLLM) of these weights needs, and
    where it fits now: on CPU and per GPU class present, with the owner's limit if asked."""
    plan, _, _ = plans.weights_plan(
        weights_id=weights_id,
        ctx=query.ctx,
        file=query.file,
        utilization=query.gpu_memory_utilization,
        node_selector=plans.parse_selector(query.selector),
        owner=scope_find(query.owner) if query.owner else "",
        kv_cache_dtype=query.kv_cache_dtype,
    )
    return {**plan.as_dict(), "ctx": plan.ctx}


@router.get(
    "/engines", response=list[EngineBuildOut], tags=["engines"], auth=can("mirror.view_enginebuild")
)
def engines_list(request):
    """Engine builds the mirror holds, which nodes lacking the engine install."""
    return engines.engine_builds_list()


@router.post(
    "/engines",
    response={200: EngineBuildOut, 201: EngineBuildOut},
    tags=["engines"],
    auth=can("mirror.push_enginebuild"),
)
def engines_add(request):
    """Upload a build: multipart, the binary as ``file``, with ``engine``, ``version`` and
    optionally ``platform`` (default: the control plane's own) and ``sha256`` (checked).
    A release (engine ``llmgw``) is its wheel, under its own file name."""
    upload = request.FILES.get("file")
    if upload is None:
        raise Invalid(
            "Send the binary as a multipart upload: a file field `file`, with the fields "
            "`engine` and `version` (llmgw ctl engines add --file PATH --engine llamacpp)."
        )
    fields = {k: request.POST.get(k, "") for k in ("engine", "version", "platform", "sha256")}
    with upload.open("rb") as data:
        build, created = engines.engine_build_add(
            data=data, filename=upload.name, actor=actor(request), now=clock.now(), **fields
        )
    return Status(201 if created else 200, _engine_view(build.pk))


def _engine_view(build_id: int) -> dict:
    return next(b for b in engines.engine_builds_list() if b["id"] == build_id)


@router.delete(
    "/engines/{build_id}",
    response={204: None},
    tags=["engines"],
    auth=can("mirror.delete_enginebuild"),
)
def engines_remove(request, build_id: int):
    """Forget a build; nodes that installed it keep their copy."""
    engines.engine_build_remove(build_id=build_id)
    return Status(204, None)
