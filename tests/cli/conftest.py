"""Every ctl test has a token and no server in its environment unless it sets one; `server`
hands a test's requests to the real REST API through Django's test client."""

from __future__ import annotations

import httpx
import pytest

from tests.cli.helpers import TOKEN


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    monkeypatch.setenv("LLMGW_TOKEN", TOKEN)
    monkeypatch.delenv("LLMGW_SERVER", raising=False)


@pytest.fixture
def server(admin_token, monkeypatch):
    """An httpx transport that hands each request to Django, as the server would."""
    monkeypatch.setenv("LLMGW_TOKEN", admin_token)
    from django.test import Client

    client = Client()

    def handle(request: httpx.Request) -> httpx.Response:
        response = client.generic(
            request.method,
            request.url.raw_path.decode(),
            data=request.content,
            content_type=request.headers.get("Content-Type", "application/json"),
            HTTP_AUTHORIZATION=request.headers["Authorization"],
            **(
                {"HTTP_X_LLMGW_ACTOR": request.headers["X-Llmgw-Actor"]}
                if "X-Llmgw-Actor" in request.headers
                else {}
            ),
        )
        return httpx.Response(response.status_code, content=response.content)

    return httpx.MockTransport(handle)
