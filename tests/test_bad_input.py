"""Bad input from outside never reaches a 500: odd paths, unknown fragments, control
characters in what agents send. Each through the real application."""

from __future__ import annotations

import pytest
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from llmgw.asgi import application

HX = {"HTTP_HX_REQUEST": "true"}
PAGES = (
    "/",
    "/nodes/gpu-a",
    "/replicas/r-1/log",
    "/models",
    "/models/llama",
    "/quotas",
    "/scopes",
    "/mirror",
    "/login/",
)


async def get(path: str) -> tuple[int, bytes]:
    """GET `path` as daphne hands it to the application (decoded, dots and all): the status
    and the whole body, however many parts it came in."""
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start = await app.receive_output(5)
    body = b""
    while True:
        part = await app.receive_output(5)
        body += part.get("body", b"")
        if not part.get("more_body"):
            return start["status"], body


@pytest.fixture
def staff(staff: Client) -> Client:
    """The shared staff client (tests/conftest.py), answered with the 500 page a browser
    gets rather than the exception raised."""
    staff.raise_request_exception = False
    return staff


@pytest.mark.django_db
@pytest.mark.parametrize("path", PAGES)
def test_an_unknown_fragment_of_any_page_is_never_a_server_error(staff, path):
    for headers in ({}, HX):
        response = staff.get(path, {"fragment": "no-such-part"}, **headers)

        assert response.status_code in (200, 404), (path, headers, response.status_code)


@pytest.mark.parametrize(
    "path",
    [
        "/static/../llmgw/settings.py",
        "/static/../../../../etc/passwd",
        "/static/htmx-LICENSE/../../llmgw/settings.py",
        "/static//etc/passwd",
    ],
)
async def test_a_static_path_out_of_the_static_folders_is_refused_not_a_server_error(path):
    status, body = await get(path)

    assert status in (400, 404)
    assert b"SECRET_KEY" not in body and b"root:" not in body


async def test_a_static_file_is_still_served():
    status, body = await get("/static/llmgw.css")

    assert status == 200
    assert b"llmgw console" in body


# A lone UTF-16 surrogate: JSON can escape one ("\ud800"), no UTF-8 can carry it.
S = "\ud800"


def _profile(**extra) -> dict:
    return {"name": "gpu", "engine": "vllm", "gpu_class": "h100-80g", **extra}


def _model(**extra) -> dict:
    return {"name": "qwen", "profiles": [_profile()], **extra}


SURROGATES = {
    "an organization's name": ("POST", "/orgs", {"name": f"Acme{S}"}, "name"),
    "a team's name": ("POST", "/teams", {"org": "Acme", "name": S}, "name"),
    "a team's organization": ("POST", "/teams", {"org": S, "name": "ml"}, "org"),
    "a project's name": ("POST", "/projects", {"team": "Acme/ml", "name": S}, "name"),
    "a key's name": ("POST", "/keys", {"project": "Acme/ml/chat", "name": S}, "name"),
    "a key's model": (
        "POST",
        "/keys",
        {"project": "Acme/ml/chat", "name": "k", "models": ["llama", S]},
        "models[1]",
    ),
    "a quota's scope": ("PUT", "/quotas", {"scope": S, "limit": {"gpus": 1}}, "scope"),
    "a limit's scope": ("PUT", "/limits", {"scope": S, "requests_per_minute": 1}, "scope"),
    "a budget's scope": ("PUT", "/budgets", {"scope": S, "tokens_per_day": 1}, "scope"),
    "a budget's cost": (
        "PUT",
        "/budgets",
        {"scope": "org:Acme", "cost_per_day": S},
        "cost_per_day",
    ),
    "a price's model": (
        "PUT",
        "/prices",
        {"model": S, "prompt_per_million": 1, "completion_per_million": 1},
        "model",
    ),
    "a price": (
        "PUT",
        "/prices",
        {"model": "llama", "prompt_per_million": S, "completion_per_million": 1},
        "prompt_per_million",
    ),
    "the weights' source": ("POST", "/weights", {"source": f"org/{S}"}, "source"),
    "a model's name": ("POST", "/models", _model(name=S), "name"),
    "a model's source": ("POST", "/models", _model(source=f"org/x{S}"), "source"),
    "a model's description": ("POST", "/models", _model(description=S), "description"),
    "a profile's name": (
        "POST",
        "/models",
        _model(profiles=[_profile(name=S)]),
        "profiles[0].name",
    ),
    "a profile's argument": (
        "POST",
        "/models",
        _model(profiles=[_profile(args=["--max-model-len", f"4096{S}"])]),
        "profiles[0].args[1]",
    ),
    "a profile's environment value": (
        "POST",
        "/models",
        _model(profiles=[_profile(env={"HF_HOME": S})]),
        "profiles[0].env.HF_HOME",
    ),
    "a profile's environment name": (
        "POST",
        "/models",
        _model(profiles=[_profile(env={f"A{S}": "1"})]),
        "profiles[0].env",
    ),
    "a replaced model's argument": (
        "PUT",
        "/models/llama",
        _model(name="llama", profiles=[_profile(args=[S])]),
        "profiles[0].args[0]",
    ),
    "a model served from weights": ("POST", "/models/serve", {"weights": 1, "name": S}, "name"),
    "a model's owner": ("POST", "/models/llama/owner", {"owner": S}, "owner"),
    "a model's class": ("POST", "/models/llama/class", {"class": S}, "class"),
    "a measured profile": (
        "PUT",
        "/models/llama/capacity",
        {"profile": S, "max_concurrency": 1, "tok_per_sec": 1},
        "profile",
    ),
}


def _stored() -> dict:
    from catalog.models import Model, Profile
    from mirror.models import Weights
    from tenancy.models import ApiKey, AuditEvent, CapacityQuota, Organization, Project, Team

    return {
        m.__name__: list(m.objects.values_list("pk", flat=True).order_by("pk"))
        for m in (Organization, Team, Project, ApiKey, CapacityQuota, Model, Profile, Weights)
    } | {"audit": AuditEvent.objects.count()}


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path", "body", "field"), SURROGATES.values(), ids=SURROGATES)
def test_a_lone_surrogate_anywhere_in_the_api_is_a_400_naming_the_field_and_stores_nothing(
    api, method, path, body, field
):
    import json

    from tenancy.services import org_create, project_create, team_create
    from tests.helpers import detail

    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    project_create(team="Acme/ml", name="chat", actor="t")
    api.call("POST", "/models", _model(name="llama"))
    before = _stored()

    response = api.call(method, path, json.dumps(body))

    assert response.status_code == 400, response.content
    sentence = detail(response)
    assert sentence.startswith(f"{field}: ") or f" {field}:" in sentence, sentence
    assert "surrogate" in sentence
    assert _stored() == before
