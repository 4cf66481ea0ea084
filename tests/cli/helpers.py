"""A fake control plane for ``llmgw ctl``'s tests, and how to read what a command printed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from llmgw.cli import ctl

TOKEN = "adm-s3cret"


def ago(seconds: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat()


class FakeServer:
    """A control plane that answers ``(method, path)`` from a table and records each request."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, Any]] | None = None) -> None:
        self.routes = routes or {}
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        key = (request.method, request.url.path)
        if key not in self.routes:
            return httpx.Response(404, json={"detail": f"Not Found: {request.url.path}"})
        status, body = self.routes[key]
        if body is None:
            return httpx.Response(status)
        if isinstance(body, str | bytes):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    @property
    def asked(self) -> list[httpx.Request]:
        """The requests but ctl's look-ups of a model by name or alias (GET /models?name=)."""
        return [
            r
            for r in self.requests
            if not (r.url.path == "/api/v1/models" and "name" in r.url.params)
        ]

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def run(capsys, server: FakeServer | None, *argv: str) -> tuple[int, str, str]:
    transport = httpx.MockTransport(server) if server is not None else None
    code = ctl.main(list(argv), transport=transport)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def table(text: str) -> list[list[str]]:
    """A rendered table's lines split into cells (columns are two or more spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.strip().splitlines()]


def row_for(rows: list[list[str]], first: str) -> list[str]:
    return next(r for r in rows if r[0] == first)
