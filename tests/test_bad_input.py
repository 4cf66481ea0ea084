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
def staff(client, django_user_model) -> Client:
    client.force_login(django_user_model.objects.create_user("ops", password="x", is_staff=True))
    client.raise_request_exception = False
    return client


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
