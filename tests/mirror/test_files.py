"""The mirror's file server: verified files by digest, to node credentials only, with
ranges and the digest as ETag."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace

import httpx
import pytest

from mirror import store
from mirror.files import MirrorFiles

pytestmark = pytest.mark.django_db(transaction=True)

DATA = os.urandom(3 * (1 << 20) + 17)
DIGEST = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def blob(settings, tmp_path):
    settings.LLMGW = replace(settings.LLMGW, mirror=replace(settings.LLMGW.mirror, dir=tmp_path))
    path = store.blob(DIGEST)
    path.parent.mkdir(parents=True)
    path.write_bytes(DATA)
    return path


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"django"})


READER = "llmgw_node_reader"


def _refusal(*, secret: str, sha256: str):
    """The server's mechanics are tested here with one reader allowed everything; who may
    read what is the fleet's rule (tests/fleet/test_identity.py, through the real app)."""
    return None if secret == READER else (401, "A node's own credential is needed.")


def _client(token: str | None = None) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=MirrorFiles(_inner, refusal=_refusal))
    return httpx.AsyncClient(transport=transport, base_url="http://llmgw", headers=headers)


URL = f"/api/v1/mirror/files/{DIGEST}"


async def test_an_agent_gets_the_whole_file_with_its_digest_as_etag(blob):
    async with _client(READER) as c:
        r = await c.get(URL)

    assert r.status_code == 200
    assert r.content == DATA
    assert r.headers["etag"] == f'"{DIGEST}"'
    assert r.headers["content-length"] == str(len(DATA))
    assert r.headers["accept-ranges"] == "bytes"


@pytest.mark.parametrize(
    ("asked", "start", "end"),
    [
        ("bytes=100-", 100, len(DATA) - 1),
        ("bytes=0-9", 0, 9),
        ("bytes=-5", len(DATA) - 5, len(DATA) - 1),
        ("bytes=10-99999999", 10, len(DATA) - 1),
    ],
)
async def test_a_range_is_answered_206_with_its_bytes(blob, asked, start, end):
    async with _client(READER) as c:
        r = await c.get(URL, headers={"range": asked})

    assert r.status_code == 206
    assert r.content == DATA[start : end + 1]
    assert r.headers["content-range"] == f"bytes {start}-{end}/{len(DATA)}"


async def test_a_range_past_the_end_is_416_with_the_size(blob):
    async with _client(READER) as c:
        r = await c.get(URL, headers={"range": f"bytes={len(DATA)}-"})

    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{len(DATA)}"


async def test_the_etag_matching_is_304_and_a_stale_if_range_is_the_whole_file(blob):
    async with _client(READER) as c:
        same = await c.get(URL, headers={"if-none-match": f'"{DIGEST}"'})
        stale = await c.get(URL, headers={"range": "bytes=5-", "if-range": '"other"'})

    assert same.status_code == 304 and same.content == b""
    assert stale.status_code == 200 and stale.content == DATA


async def test_a_head_says_the_size_and_sends_nothing(blob):
    async with _client(READER) as c:
        r = await c.head(URL)

    assert (
        r.status_code == 200 and r.headers["content-length"] == str(len(DATA)) and r.content == b""
    )


async def test_without_a_readers_credential_nothing_is_served(blob, admin_token):
    async with (
        _client() as anonymous,
        _client(admin_token) as admin,
        _client("llmgw_agt_wrong") as wrong,
    ):
        for c in (anonymous, admin, wrong):
            r = await c.get(URL)
            assert r.status_code == 401
            assert "credential" in r.json()["detail"]


async def test_an_unknown_digest_and_a_bad_name_are_404(blob):
    async with _client(READER) as c:
        unknown = await c.get("/api/v1/mirror/files/" + "a" * 64)
        bad = await c.get("/api/v1/mirror/files/" + "A" * 64)

    assert unknown.status_code == 404 and "no file with sha256" in unknown.json()["detail"]
    assert bad.status_code == 404


async def test_writes_are_refused_and_other_paths_reach_django(blob):
    async with _client(READER) as c:
        put = await c.put(URL, content=b"x")
        other = await c.get("/api/v1/weights")

    assert put.status_code == 405
    assert other.status_code == 418 and other.content == b"django"
