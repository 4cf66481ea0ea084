"""The REST API's door: a call with no credentials is told it needs a token, whatever its
method, and a change made with an admin token records that token beside any name it claims."""

import pytest
from django.test import Client

from fleet.models import Node
from llmgw.core import clock
from tenancy.models import AuditEvent, Token
from tests.helpers import detail

pytestmark = pytest.mark.django_db

TOKEN_NEEDED = "An admin token is needed: Authorization: Bearer <token> (llmgw createtoken NAME)."


def node_add(node_id: str, *, now) -> Node:
    """A node as its registration left it: all the API's node calls need."""
    return Node.objects.create(id=node_id, state_since=now, registered_at=now, last_seen=now)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/nodes"),
        ("post", "/api/v1/nodes/gpu-a/cordon"),
        ("put", "/api/v1/quotas"),
        ("delete", "/api/v1/keys/1"),
        ("post", "/api/v1/orgs"),
    ],
)
def test_a_call_with_no_token_and_no_session_is_told_a_token_is_needed(method, path):
    node_add("gpu-a", now=clock.now())
    # As curl or a script sends it: no cookie, no CSRF token, no Authorization header.
    body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
    response = getattr(Client(enforce_csrf_checks=True), method)(path, **body)

    assert response.status_code == 401
    assert detail(response) == TOKEN_NEEDED
    assert not Node.objects.get(pk="gpu-a").cordoned


def test_a_wrong_token_on_a_change_is_told_a_token_is_needed_too():
    node_add("gpu-a", now=clock.now())
    response = Client(enforce_csrf_checks=True).post(
        "/api/v1/nodes/gpu-a/cordon", HTTP_AUTHORIZATION="Bearer llmgw_adm_not-a-token"
    )

    assert response.status_code == 401
    assert detail(response) == TOKEN_NEEDED


def test_a_claimed_actor_is_recorded_beside_the_token_that_made_the_call(api, admin_token):
    node_add("gpu-a", now=clock.now())
    token = Token.objects.get(name="ops")

    api.call("POST", "/nodes/gpu-a/cordon", HTTP_X_LLMGW_ACTOR="alice")

    event = AuditEvent.objects.get()
    assert event.actor == "alice"
    assert event.token == f"ops ({token.prefix}…)"
    assert token.prefix == admin_token[:14]


def test_a_token_acting_as_itself_is_recorded_too_and_a_session_records_no_token(
    api, django_user_model
):
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/nodes/gpu-a/cordon")
    browser = Client()
    browser.force_login(django_user_model.objects.create_superuser("dan", password="x"))
    browser.post("/api/v1/nodes/gpu-a/uncordon")

    events = AuditEvent.objects.order_by("pk")
    prefix = Token.objects.get(name="ops").prefix
    assert [(e.actor, e.token) for e in events] == [("ops", f"ops ({prefix}…)"), ("dan", "")]


def test_the_admin_lists_the_token_beside_the_actor(api, django_user_model):
    node_add("gpu-a", now=clock.now())
    api.call("POST", "/nodes/gpu-a/cordon", HTTP_X_LLMGW_ACTOR="alice")
    browser = Client()
    browser.force_login(django_user_model.objects.create_superuser("root", password="x"))

    page = browser.get("/admin/tenancy/auditevent/").content.decode()

    prefix = Token.objects.get(name="ops").prefix
    assert "alice" in page and f"ops ({prefix}…)" in page
