"""Models over REST: list, get, add, remove, scale, restart, retry, explain."""

from __future__ import annotations

import json

from ninja import Router, Status

from fleet import selectors as fleet_selectors, services as fleet_services
from llmgw import clock
from llmgw.api import actor
from llmgw.errors import Invalid

from . import services
from .schemas import ExplainOut, ModelIn, ModelOut, ScaleIn, inline_schema

router = Router(tags=["models"])


def _not_json(constant: str):
    # Python's json reads NaN and Infinity, which JSON has not; a figure of either breaks every rule.
    raise ValueError(f"{constant} is not JSON")


def _view(name: str) -> dict:
    return fleet_selectors.model_views(name=name)[0]


@router.get("/models", response=list[ModelOut], by_alias=True)
def models_list(request):
    return fleet_selectors.model_views()


@router.get("/models/{name}", response=ModelOut, by_alias=True)
def model_get(request, name: str):
    return _view(name)


# Documented, not parsed, by ModelIn: parse_model judges the body, as it judges the catalog file.
_MODEL_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": inline_schema(ModelIn)}},
    }
}


@router.post("/models", response={201: ModelOut}, by_alias=True, openapi_extra=_MODEL_BODY)
def model_add(request):
    """Add a runtime model (domain.md's field names); 400 with the reason, 409 when it exists."""
    try:
        data = json.loads(request.body or b"null", parse_constant=_not_json)
    except (ValueError, RecursionError):  # RecursionError: arrays nested thousands deep
        raise Invalid("The body is not valid JSON.") from None
    spec = services.model_add(data=data, actor=actor(request))
    return Status(201, _view(spec.name))


@router.delete("/models/{name}", response={200: dict})
def model_remove(request, name: str):
    services.model_remove(name=name, actor=actor(request))
    return {"detail": f"model {name} removed: its replicas stop on the next pass"}


@router.post("/models/{name}/scale", response=ModelOut, by_alias=True)
def model_scale(request, name: str, payload: ScaleIn):
    given = {k: v for k, v in payload.dict().items() if v is not None}
    if not given:
        raise Invalid("Give min, max or idle_timeout.")
    services.model_scale(name=name, actor=actor(request), scaling=given)
    return _view(name)


@router.post("/models/{name}/restart", response=dict)
def model_restart(request, name: str):
    return {
        "detail": fleet_services.model_restart(name=name, actor=actor(request), now=clock.now())
    }


@router.post("/models/{name}/retry", response=dict)
def model_retry(request, name: str):
    return {"detail": fleet_services.model_retry(name=name, actor=actor(request))}


@router.get("/models/{name}/explain", response=ExplainOut)
def model_explain(request, name: str):
    return fleet_selectors.model_explain(name=name)
