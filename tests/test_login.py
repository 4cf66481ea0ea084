"""Staff log in to the console; the page helper refuses everyone else."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory

from llmgw.pages import page, staff_required

pytestmark = pytest.mark.django_db


def test_the_login_page_asks_for_a_name_and_password(client):
    response = client.get("/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content and b"csrfmiddlewaretoken" in response.content


def test_a_staff_user_logs_in_and_out(client):
    get_user_model().objects.create_user("ops", password="pw-123456", is_staff=True)
    response = client.post("/login/", {"username": "ops", "password": "pw-123456"})
    assert response.status_code == 302
    assert client.session.get("_auth_user_id")
    client.post("/logout/")
    assert not client.session.get("_auth_user_id")


@staff_required
def _view(request):
    return HttpResponse("ok")


def test_staff_required_sends_strangers_to_log_in_and_refuses_non_staff():
    rf = RequestFactory()
    request = rf.get("/nodes/a")
    request.user = AnonymousUser()
    request.htmx = False
    response = _view(request)
    assert (response.status_code, response.url) == (302, "/login/?next=/nodes/a")

    request.htmx = True
    assert _view(request).headers["HX-Redirect"] == "/login/?next=/nodes/a"

    request.user = get_user_model().objects.create_user("viewer", password="x")
    with pytest.raises(PermissionDenied):
        _view(request)

    request.user = get_user_model().objects.create_user("ops", password="x", is_staff=True)
    assert _view(request).content == b"ok"


def test_a_page_varies_on_hx_request(rf):
    request = rf.get("/login/")
    request.htmx = False
    request.user = AnonymousUser()
    response = page(request, "registration/login.html", {"form": None})
    assert "HX-Request" in response["Vary"]
