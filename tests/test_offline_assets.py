"""Nothing from a CDN: the API's documentation and the console's icon are served from
static/ through the real application (issue 14, item 4)."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.test import Client

from tests.test_bad_input import get

pytestmark = pytest.mark.django_db


def test_the_api_docs_name_only_assets_this_server_serves(settings):
    settings.ALLOWED_HOSTS = ["testserver"]
    page = Client().get("/api/v1/docs")
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.content.decode())
    assert "/static/ninja/swagger-ui-bundle.js" in assets
    assert all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    for asset in assets:
        status, body = asyncio.run(get(asset))
        assert (asset, status) == (asset, 200)
        assert body


def test_every_console_page_names_the_icon_and_favicon_ico_leads_to_it(admin_client):
    page = admin_client.get("/")
    assert b'rel="icon" href="/static/favicon.svg"' in page.content
    moved = Client().get("/favicon.ico")
    assert (moved.status_code, moved["Location"]) == (301, "/static/favicon.svg")
    status, icon = asyncio.run(get("/static/favicon.svg"))
    assert status == 200
    assert icon.startswith(b"<svg")
