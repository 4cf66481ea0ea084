"""`llmgw createsuperuser` and `llmgw changepassword`: a console login without a checkout's
manage.py (issue 14, item 4)."""

from __future__ import annotations

import pytest
from django.contrib.auth import authenticate, get_user_model

from llmgw.cli import main

pytestmark = pytest.mark.django_db


def test_a_superuser_is_made_and_its_password_changed(monkeypatch, capsys):
    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "first-Pass-42")
    argv = ["createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com"]
    assert main(argv) == 0
    user = get_user_model().objects.get(username="ops")
    assert (user.is_superuser, user.is_staff) == (True, True)
    assert authenticate(username="ops", password="first-Pass-42") == user

    typed = iter(["second-Pass-42", "second-Pass-42"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(typed))
    assert main(["changepassword", "ops"]) == 0
    assert authenticate(username="ops", password="second-Pass-42") == user
    assert "Password changed successfully for user 'ops'" in capsys.readouterr().out


def test_an_unknown_login_or_a_taken_name_is_told_and_changes_nothing(monkeypatch, capsys):
    assert main(["changepassword", "nobody"]) == 2
    assert "llmgw: user 'nobody' does not exist" in capsys.readouterr().err

    monkeypatch.setenv("DJANGO_SUPERUSER_PASSWORD", "first-Pass-42")
    argv = ["createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com"]
    assert main(argv) == 0
    assert main(argv) == 2
    assert "That username is already taken" in capsys.readouterr().err
    assert get_user_model().objects.count() == 1


def test_the_usage_names_them():
    from llmgw.cli import USAGE

    assert "createsuperuser" in USAGE
    assert "changepassword" in USAGE
