"""Staff log in to the console; the page helper refuses everyone else."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory

from llmgw.core.pages import page, staff_required

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


@pytest.fixture
def throttle(settings, monkeypatch):
    """Three failures lock a name (five an address) for ten minutes; the clock moves by hand."""
    from dataclasses import replace

    from django.core.cache import cache

    from llmgw.core import clock, config

    cache.clear()
    settings.LLMGW = replace(
        settings.LLMGW,
        login=config.LoginThrottle(failures=3, address_failures=5, window=300, lockout=600),
    )
    moments = {"now": clock.now()}
    monkeypatch.setattr(clock, "now", lambda: moments["now"])
    yield moments
    cache.clear()


def attempt(client, name: str, password: str, address: str = "10.0.0.1"):
    return client.post("/login/", {"username": name, "password": password}, REMOTE_ADDR=address)


@pytest.fixture
def ops(db):
    return get_user_model().objects.create_user("ops", password="pw-123456", is_staff=True)


def test_failed_logins_for_a_name_lock_it_for_a_while_even_with_the_right_password(
    client, ops, throttle
):
    for _ in range(3):
        assert attempt(client, "ops", "wrong").status_code == 200

    refused = attempt(client, "ops", "pw-123456")

    assert refused.status_code == 429
    assert "Too many failed logins as ops: try again in 10 minutes." in refused.content.decode()
    assert not client.session.get("_auth_user_id")


def test_the_lock_ends_after_its_time_and_a_login_then_succeeds(client, ops, throttle):
    from datetime import timedelta

    for _ in range(3):
        attempt(client, "ops", "wrong")
    throttle["now"] += timedelta(seconds=599)
    assert "try again in 1 minute." in attempt(client, "ops", "pw-123456").content.decode()

    throttle["now"] += timedelta(seconds=2)
    assert attempt(client, "ops", "pw-123456").status_code == 302
    assert client.session.get("_auth_user_id")


def test_failures_in_different_windows_do_not_add_up(client, ops, throttle):
    from datetime import timedelta

    attempt(client, "ops", "wrong")
    attempt(client, "ops", "wrong")
    throttle["now"] += timedelta(seconds=300)
    attempt(client, "ops", "wrong")

    assert attempt(client, "ops", "pw-123456").status_code == 302


def test_the_name_is_locked_whatever_its_case_and_another_name_is_not(client, ops, throttle):
    get_user_model().objects.create_user("dan", password="pw-654321", is_staff=True)
    for name in ("ops", "OPS", "Ops"):
        attempt(client, name, "wrong")

    assert attempt(client, "ops", "pw-123456", address="10.9.9.9").status_code == 429
    assert attempt(client, "dan", "pw-654321", address="10.9.9.9").status_code == 302


def test_failures_from_one_address_lock_it_for_every_name(client, ops, throttle):
    for i in range(5):
        attempt(client, f"guess{i}", "wrong", address="10.6.6.6")

    refused = attempt(client, "ops", "pw-123456", address="10.6.6.6")

    assert refused.status_code == 429
    assert "Too many failed logins from this address: try again in 10 minutes." in (
        refused.content.decode()
    )
    assert attempt(client, "ops", "pw-123456", address="10.0.0.2").status_code == 302


def test_a_good_login_clears_the_names_failures(client, ops, throttle):
    attempt(client, "ops", "wrong")
    attempt(client, "ops", "wrong")
    assert attempt(client, "ops", "pw-123456").status_code == 302
    client.post("/logout/")
    attempt(client, "ops", "wrong")
    attempt(client, "ops", "wrong")

    assert attempt(client, "ops", "pw-123456").status_code == 302


def test_the_admins_login_is_throttled_too(client, ops, throttle):
    for _ in range(3):
        client.post("/admin/login/", {"username": "ops", "password": "wrong"})

    refused = client.post("/admin/login/", {"username": "ops", "password": "pw-123456"})

    assert "Too many failed logins as ops" in refused.content.decode()
    assert not client.session.get("_auth_user_id")
