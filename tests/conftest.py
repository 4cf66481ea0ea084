"""Shared fixtures: tokens, an authenticated API client, a staff client, and a clean channel layer."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Each test starts with no cached views (they are keyed by ids and times tests reuse)
    and ends with no database connection kept."""
    from catalog import selectors as catalog_selectors
    from fleet.facility import observe as facility_observe
    from fleet.facility.caps import caps_clear
    from fleet.reconciler.run import MEASUREMENTS, POLICY
    from fleet.selectors.state import caches_clear
    from llmgw.core.db import kept_connections_close
    from llmgw.core.history import HISTORY
    from llmgw.gateway.load import BOARD

    caches_clear()
    HISTORY.clear(15)
    BOARD.running.clear()
    BOARD.waiting.clear()
    catalog_selectors._cache["version"] = None
    POLICY.clear()
    MEASUREMENTS.clear()
    facility_observe.caches_clear()
    caps_clear()
    yield
    # The agents' database thread keeps its connection: none outlives the test.
    kept_connections_close()


@pytest.fixture
def admin_token(db) -> str:
    from tenancy.services import token_create

    return token_create(name="ops")[1]


@pytest.fixture
def agent_token(db) -> str:
    from tenancy.models import Token
    from tenancy.services import token_create

    return token_create(name="agents", kind=Token.AGENT)[1]


@pytest.fixture
def api(admin_token):
    """A Django test client that sends the admin token and JSON bodies."""
    from django.test import Client

    class ApiClient(Client):
        def call(self, method: str, path: str, body=None, **headers):
            kwargs = {"HTTP_AUTHORIZATION": f"Bearer {admin_token}", **headers}
            if body is not None:
                import json

                kwargs["data"] = body if isinstance(body, str | bytes) else json.dumps(body)
                kwargs["content_type"] = "application/json"
            return getattr(self, method.lower())(f"/api/v1{path}", **kwargs)

    return ApiClient()


@pytest.fixture
def staff(client, django_user_model):
    """The test client logged in as "ops", a staff superuser: every page open to it. The
    pages write that name as who changed a row, which the page tests read back."""
    client.force_login(
        django_user_model.objects.create_user("ops", password="x", is_staff=True, is_superuser=True)
    )
    return client


@pytest.fixture
def no_settle(settings):
    """The reconciler places at once instead of waiting LLMGW_SETTLE_SECONDS after a start."""
    from dataclasses import replace

    settings.LLMGW = replace(settings.LLMGW, timings=replace(settings.LLMGW.timings, settle=0))
    return settings.LLMGW.timings
