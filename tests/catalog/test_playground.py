"""The playground page: a key of the staff user's own project, made once a session and
kept; the models to try; staff with the right permissions only; never cached."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from catalog.services import model_add
from llmgw.core import clock
from tenancy.models import ApiKey
from tenancy.services.playground import project_name
from tests.fleet.builders import gpu_model

pytestmark = pytest.mark.django_db


def _staff(name: str = "ops", **flags) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user(name, is_staff=True, **flags))
    return client


def _secret(body: str) -> str:
    return re.search(r'data-key="(llmgw_key_[^"]+)"', body).group(1)


def test_a_staff_user_gets_a_key_of_their_own_project_kept_for_their_session():
    model_add(data=gpu_model("chat", aliases=["c"]), actor="t")
    staff = _staff(is_superuser=True)
    first = staff.get("/playground")
    assert first.status_code == 200
    assert "no-cache" in first["Cache-Control"] and "no-store" in first["Cache-Control"]
    body = first.content.decode()
    secret = _secret(body)
    assert '<option value="chat" selected>chat (c) · none ready</option>' in body
    assert "Console/playground/ops" in body
    key = ApiKey.objects.get()
    assert (key.name, key.project.name, key.project.team.name, key.project.team.org.name) == (
        "playground",
        "ops",
        "playground",
        "Console",
    )
    assert secret.startswith(key.prefix)
    # The same session: the same key.
    assert _secret(staff.get("/playground").content.decode()) == secret
    assert ApiKey.objects.count() == 1

    # Another session of the same user: a new key, the one before revoked.
    again = Client()
    again.force_login(get_user_model().objects.get(username="ops"))
    other = _secret(again.get("/playground").content.decode())
    assert other != secret
    live = ApiKey.objects.filter(revoked_at__isnull=True)
    assert [k.prefix for k in live] == [other[: len(key.prefix)]]


def test_a_revoked_key_is_replaced_on_the_next_visit():
    staff = _staff(is_superuser=True)
    model_add(data=gpu_model("chat"), actor="t")
    secret = _secret(staff.get("/playground").content.decode())
    ApiKey.objects.update(revoked_at=clock.now())
    assert _secret(staff.get("/playground").content.decode()) != secret


def test_the_playground_needs_to_see_models_and_to_make_keys():
    model_add(data=gpu_model("chat"), actor="t")
    viewer = _staff("vera")
    viewer_user = get_user_model().objects.get(username="vera")
    viewer_user.user_permissions.add(
        Permission.objects.get(codename="view_model", content_type__app_label="catalog")
    )
    refused = viewer.get("/playground")
    assert refused.status_code == 403
    assert "tenancy.add_apikey" in refused.content.decode()
    assert ApiKey.objects.count() == 0
    assert Client().get("/playground").status_code == 302  # to the login page


def test_an_unknown_model_asked_for_is_said_and_another_shown():
    model_add(data=gpu_model("chat"), actor="t")
    body = _staff(is_superuser=True).get("/playground?model=nope").content.decode()
    assert "There is no model nope; showing chat." in body
    assert '<option value="chat" selected>' in body


def test_with_no_model_the_page_says_so_and_makes_no_key():
    body = _staff(is_superuser=True).get("/playground").content.decode()
    assert 'id="no-models"' in body
    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize(("user", "project"), [("ops", "ops"), ("a/b", "a-b"), ("42", "user-42")])
def test_a_user_name_becomes_a_project_name(user, project):
    assert project_name(user) == project
