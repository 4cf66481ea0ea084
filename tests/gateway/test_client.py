"""The gateway's HTTP/1.1 client to the engines (`client.py`), against raw sockets that
answer exactly the bytes each test writes, cut wherever hypothesis says."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from llmgw.gateway import client
from llmgw.gateway.client import Cut, NotHTTP, Pool


class Engine:
    """A socket server answering each request with the next of `answers` (bytes, written in
    the pieces given), closing the connection after it when the answer is None."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                pieces = self.answers.pop(0)
                if pieces is None:
                    break
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
        writer.close()


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = [], 0
    for size in [*sizes, len(body)]:
        part, at = body[at : at + max(size, 1)], at + max(size, 1)
        if part:
            out.append(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
        if at >= len(body):
            break
    return b"".join(out) + b"0\r\nTrailer: x\r\n\r\n"


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    edges = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False) if b > a]


async def ask(pool: Pool, url: str) -> tuple[int, str, bytes]:
    conn = await pool.post(url, "/v1/chat/completions", "Bearer k", b'{"a": 1}')
    try:
        out = []
        while data := await conn.read():
            out.append(data)
        return conn.status, conn.content_type, b"".join(out)
    finally:
        conn.release()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=3000),
    st.booleans(),
    st.lists(st.integers(1, 700), max_size=5),
    st.lists(st.integers(0, 4000), max_size=6),
)
def test_an_answer_cut_anywhere_reads_as_sent_and_its_connection_is_kept(
    body, is_chunked, sizes, cuts
):
    framing = (
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, sizes)
        if is_chunked
        else b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + framing

    async def run():
        engine = Engine([pieces(answer, cuts), pieces(answer, cuts[::-1])])
        async with engine as url:
            pool = Pool()
            first = await ask(pool, url)
            second = await ask(pool, url)
            await pool.close()
        assert first == second == (200, "text/event-stream", body)
        assert engine.connections == 1  # kept alive between the two
        assert engine.requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"Authorization: Bearer k\r\n" in engine.requests[0]
        assert engine.requests[0].endswith(b'Content-Length: 8\r\n\r\n{"a": 1}')

    asyncio.run(run())


async def test_a_connection_the_engine_closed_while_idle_is_replaced_unseen():
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    engine = Engine([ok, None, ok])
    async with engine as url:
        pool = Pool()
        assert await ask(pool, url) == (200, "", b"ok")
        await asyncio.sleep(0.05)
        # The engine closed that one on reading the next request: it is sent again.
        assert await ask(pool, url) == (200, "", b"ok")
        await pool.close()
    assert engine.connections == 2


async def test_an_endpoint_with_a_path_is_asked_under_it_and_its_userinfo_is_not_the_host():
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    engine = Engine([ok, ok])
    async with engine as url:
        pool = Pool()
        assert await ask(pool, url + "/serve/") == (200, "", b"ok")
        hostport = url.removeprefix("http://")
        assert await ask(pool, f"http://user:pw@{hostport}") == (200, "", b"ok")
        await pool.close()
    first, second = (r.split(b"\r\n")[:2] for r in engine.requests)
    assert first == [b"POST /serve/v1/chat/completions HTTP/1.1", b"Host: " + hostport.encode()]
    assert second == [b"POST /v1/chat/completions HTTP/1.1", b"Host: " + hostport.encode()]


async def test_an_answer_to_the_close_ends_there_and_is_not_kept():
    async with Engine([[b"HTTP/1.1 200 OK\r\n\r\nall of it"]]) as url:
        pool = Pool()
        assert await ask(pool, url) == (200, "", b"all of it")
        assert not pool._idle.get(url)
        await pool.close()


async def test_what_is_not_http_is_said_so():
    async with Engine([[b"garbage\r\n\r\n"]]) as url:
        with pytest.raises(NotHTTP, match="garbage"):
            await ask(Pool(), url)
    async with Engine([[b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]]) as url:
        with pytest.raises(NotHTTP, match="chunk size"):
            await ask(Pool(), url)


async def test_an_answer_cut_mid_body_is_a_cut_not_a_short_answer():
    async with Engine([[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"]]) as url:
        with pytest.raises(Cut, match="closed the connection") as cut:
            await ask(Pool(), url)
    assert not cut.value.timeout


async def test_nothing_listening_is_a_cut_and_a_quiet_engine_a_timeout(monkeypatch):
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(Cut, match="cannot connect") as cut:
        await ask(Pool(), f"http://127.0.0.1:{port}")
    assert not cut.value.timeout
    monkeypatch.setattr(client, "READ_S", 0.2)
    # The engine keeps the connection open, and says no more.
    async with Engine([[b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"], None]) as url:
        with pytest.raises(Cut, match="said nothing for 0.2 s") as cut:
            await ask(Pool(), url)
    assert cut.value.timeout
