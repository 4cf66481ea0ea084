"""Models over REST: list, get, add, remove, scale, class, owner, resources, restart, retry,
explain, and what was measured of them."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from ninja import Router, Status

from fleet import services as fleet_services
from llmgw.core import clock
from llmgw.core.api import actor, json_body
from llmgw.core.errors import Invalid
from llmgw.core.permissions import refusal
from mirror import services as mirror_services
from tenancy.auth import can

from . import selectors, services
from .schemas import (
    AdapterIn,
    AdapterOut,
    CapacityIn,
    ClassIn,
    ClassOut,
    ExplainOut,
    MeasurementOut,
    ModelIn,
    ModelOut,
    OwnerIn,
    OwnerOut,
    ResourcesIn,
    ScaleIn,
    inline_schema,
)
from .selectors import listings

router = Router(tags=["models"])


def _refusal(request, perm: str) -> str:
    """The sentence saying a staff session may not do what `perm` allows, "" when it may;
    an admin token may do all."""
    user = request.auth
    return refusal(user, perm) if isinstance(user, AbstractBaseUser) else ""


def _view(name: str) -> dict:
    return listings.model_views(name=name)[0]


@router.get("/models", response=list[ModelOut], by_alias=True, auth=can("catalog.view_model"))
def models_list(request, name: str | None = None):
    """Every model; with `name`, the one called so by its name or an alias, else none: how
    `llmgw ctl` finds a model by alias without asking for a path that is not there."""
    if name is None:
        return listings.model_views()
    called = selectors.model_called(name)
    return listings.model_views(name=called) if called else []


# Before /models/{name}, whose path would take /models/serve first.
@router.post(
    "/models/serve",
    response={201: ModelOut},
    by_alias=True,
    tags=["weights"],
    auth=can("catalog.add_model"),
)
def model_serve(request):
    """Add a model sized by its weights' plan (llama.cpp for GGUF, vLLM for safetensors):
    {"weights", "name", "ctx"?, "file"?, "gpu_class"?, "gpu_memory_utilization"?, "cores"?,
    "memory_gb"?, "node_selector"?, "kv_cache_dtype"?, ...ModelIn fields to override}."""
    spec, _ = mirror_services.model_serve(data=json_body(request), actor=actor(request))
    return Status(201, _view(spec.name))


@router.get("/models/{name}", response=ModelOut, by_alias=True, auth=can("catalog.view_model"))
def model_get(request, name: str):
    return _view(name)


# Documented, not parsed, by ModelIn: parse_model judges the body, as it judges the catalog file.
_MODEL_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": inline_schema(ModelIn)}},
    }
}


@router.post(
    "/models",
    response={201: ModelOut},
    by_alias=True,
    openapi_extra=_MODEL_BODY,
    auth=can("catalog.add_model"),
)
def model_add(request):
    """Add a runtime model (domain.md's field names); 400 with the reason, 409 when it exists."""
    spec = services.model_add(data=json_body(request), actor=actor(request))
    return Status(201, _view(spec.name))


@router.put(
    "/models/{name}",
    response=ModelOut,
    by_alias=True,
    openapi_extra=_MODEL_BODY,
    auth=can("catalog.change_model"),
)
def model_replace(request, name: str):
    """Replace a runtime model's definition; when its source or a profile changed, its
    replicas roll, one at a time (as `restart`)."""
    spec, rolls = services.model_replace(name=name, data=json_body(request), actor=actor(request))
    if rolls:
        fleet_services.model_restart(name=spec.name, actor=actor(request), now=clock.now())
    return _view(spec.name)


@router.delete("/models/{name}", response={200: dict}, auth=can("catalog.delete_model"))
def model_remove(request, name: str):
    services.model_remove(name=name, actor=actor(request))
    return {"detail": f"model {name} removed: its replicas stop on the next pass"}


@router.post(
    "/models/{name}/scale", response=ModelOut, by_alias=True, auth=can("catalog.change_model")
)
def model_scale(request, name: str, payload: ScaleIn):
    given = {k: v for k, v in payload.dict().items() if v is not None}
    if not given:
        raise Invalid("Give min, max, idle_timeout, target_waiting or kv_ceiling.")
    services.model_scale(name=name, actor=actor(request), scaling=given)
    return _view(name)


@router.post(
    "/models/{name}/class", response=ClassOut, by_alias=True, auth=can("catalog.change_model")
)
def model_class(request, name: str, payload: ClassIn):
    """Set the class; "" returns to the default. Answers the effective class."""
    spec = services.model_class_set(name=name, capacity_class=payload.class_, actor=actor(request))
    return {"model": spec.name, "class_": spec.effective_class}


@router.post("/models/{name}/owner", response=OwnerOut, auth=can("catalog.change_model"))
def model_owner(request, name: str, payload: OwnerIn):
    """Set whose quota it counts against, by scope name or ID; "" for shared."""
    spec = services.model_owner_set(name=name, owner=payload.owner, actor=actor(request))
    return {"model": spec.name, "owner": spec.owner}


@router.post(
    "/models/{name}/resources", response=ModelOut, by_alias=True, auth=can("catalog.change_model")
)
def model_resources(request, name: str, payload: ResourcesIn):
    """Set what one profile, or every profile, reserves; running replicas keep the old figures."""
    services.model_resources_set(
        name=name,
        profile=payload.profile,
        memory_gb=payload.memory_gb,
        cpu_cores=payload.cpu_cores,
        actor=actor(request),
    )
    return _view(name)


@router.put(
    "/models/{name}/capacity", response=MeasurementOut, auth=can("catalog.change_measurement")
)
def model_capacity(request, name: str, payload: CapacityIn):
    """Store a measurement for a profile, replacing the one before."""
    measured = services.measurement_save(
        model=name, **payload.dict(), actor=actor(request), now=clock.now()
    )
    return selectors.measurement_view(measured)


@router.get("/capacity", response=list[MeasurementOut], auth=can("catalog.view_measurement"))
def capacity_list(request):
    return selectors.measurements_list()


@router.post("/models/{name}/restart", response=dict, auth=can("fleet.change_replica"))
def model_restart(request, name: str):
    return {
        "detail": fleet_services.model_restart(name=name, actor=actor(request), now=clock.now())
    }


@router.post("/models/{name}/retry", response=dict, auth=can("fleet.change_replica"))
def model_retry(request, name: str):
    return {"detail": fleet_services.model_retry(name=name, actor=actor(request))}


@router.get("/models/{name}/explain", response=ExplainOut, auth=can("catalog.view_model"))
def model_explain(request, name: str):
    return listings.model_explain(name=name)


@router.get(
    "/adapters", response=list[AdapterOut], tags=["adapters"], auth=can("catalog.view_adapter")
)
def adapters_list(request, base: str | None = None):
    """Every LoRA adapter, or those served on `base`, with the replicas holding each."""
    return listings.adapter_views(base=base)


@router.get(
    "/adapters/{name}", response=AdapterOut, tags=["adapters"], auth=can("catalog.view_adapter")
)
def adapter_get(request, name: str):
    return listings.adapter_views(name=name)[0]


@router.post(
    "/adapters",
    response={201: AdapterOut},
    tags=["adapters"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline_schema(AdapterIn)}},
        }
    },
    auth=can("catalog.add_adapter"),
)
def adapter_add(request):
    """Add a LoRA adapter on a base model (docs/adapters.md), its hf:// or https source added
    to the mirror; 400 with the reason, 409 when the name is taken, 403 for a session that
    may not add weights when they would be added."""
    spec = mirror_services.adapter_add(
        data=json_body(request),
        actor=actor(request),
        now=clock.now(),
        mirror_refusal=_refusal(request, "mirror.add_weights"),
    )
    return Status(201, listings.adapter_views(name=spec.name)[0])


@router.delete(
    "/adapters/{name}", response={200: dict}, tags=["adapters"], auth=can("catalog.delete_adapter")
)
def adapter_remove(request, name: str):
    services.adapter_remove(name=name, actor=actor(request))
    return {
        "detail": f"adapter {name} removed: replicas holding it unload it when the slot is needed"
    }
