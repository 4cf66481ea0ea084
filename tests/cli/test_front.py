"""The front's answers: a whole answer's head and body go out in one write, a stream's head
at the end of the loop's turn at the latest (llmgw/cli/front.py, `_Corked`)."""

from __future__ import annotations

import asyncio

from llmgw.cli.front import _Corked


class Transport:
    """What the connection's transport was asked to send, call by call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writelines(self, parts) -> None:
        self.calls.append(("writelines", tuple(parts)))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close",))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str):
        return f"extra {name}"


def corked(run) -> list[tuple]:
    async def main() -> list[tuple]:
        t = Transport()
        await run(_Corked(t, asyncio.get_running_loop()), t)
        await asyncio.sleep(0)
        return t.calls

    return asyncio.run(main())


def test_a_whole_answer_is_one_write():
    async def answer(c, t):
        c.write(b"HTTP/1.1 200 OK\r\n\r\n")
        c.write(b"{}")
        assert t.calls == [("writelines", (b"HTTP/1.1 200 OK\r\n\r\n", b"{}"))]

    assert corked(answer) == [("writelines", (b"HTTP/1.1 200 OK\r\n\r\n", b"{}"))]


def test_a_streams_head_goes_at_the_end_of_the_turn_and_its_events_as_they_come():
    async def stream(c, t):
        c.write(b"head")
        assert t.calls == []
        await asyncio.sleep(0)
        assert t.calls == [("write", b"head")]
        c.write(b"event 1")
        c.write(b"event 2")

    assert corked(stream) == [("write", b"head"), ("write", b"event 1"), ("write", b"event 2")]


def test_closing_sends_what_is_held_first():
    async def closed(c, t):
        c.write(b"head")
        c.close()

    assert corked(closed) == [("write", b"head"), ("close",)]


def test_nothing_is_written_to_a_connection_lost_meanwhile():
    async def lost(c, t):
        c.write(b"head")
        t.closing = True

    assert corked(lost) == []


def test_what_else_is_asked_is_the_transports():
    async def asked(c, t):
        assert c.get_extra_info("peername") == "extra peername"
        assert not c.is_closing()

    assert corked(asked) == []


# Through the front's own protocol on a real socket: what each answer's transport was
# asked to write, and what the client read.


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/v1/echo":
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
    else:
        body = b"ok"
    if scope["path"] == "/v1/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    length = str(len(body)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", length)]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
    if scope["path"] == "/v1/stop":  # a graceful stop in the turn its answer ended
        FRONT[0].stopListening()


class Spy:
    """The connection's transport, noting what it is asked to write."""

    def __init__(self, transport, calls: list[tuple]) -> None:
        self.real, self.calls = transport, calls

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))
        self.real.write(data)

    def writelines(self, parts) -> None:
        self.calls.append(("writelines", tuple(parts)))
        self.real.writelines(parts)

    def close(self) -> None:
        self.real.close()

    def is_closing(self) -> bool:
        return self.real.is_closing()


FRONT: list = []  # the front the talks are served by, which /v1/stop stops


def through_the_front(monkeypatch, *talks) -> tuple[list[bytes], list[list[tuple]]]:
    """Each talk (bytes to send, then to send after an answer's first bytes, or None) on a
    connection of its own; what the client read on each, and each answer's writes."""
    from llmgw.cli import front as front_module

    corks: list[list[tuple]] = []

    class Recorded(front_module._Corked):
        def __init__(self, transport, loop):
            corks.append([])
            super().__init__(Spy(transport, corks[-1]), loop)

    monkeypatch.setattr(front_module, "_Corked", Recorded)

    async def read(reader) -> bytes:
        out = b""
        while True:
            try:
                data = await asyncio.wait_for(reader.read(65536), 0.5)
            except TimeoutError:
                return out
            if not data:
                return out
            out += data

    async def main() -> list[bytes]:
        import socket

        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        front = front_module.Front(_app, None, 30.0)
        FRONT[:] = [front]
        await front.listen(listener)
        got = []
        for first, then in talks:
            reader, writer = await asyncio.open_connection(*listener.getsockname())
            writer.write(first)
            text = await read(reader)
            if then is not None:
                writer.write(then)
                text += await read(reader)
            got.append(text)
            writer.close()
        front.stopListening()
        return got

    return asyncio.run(main()), corks


def test_through_the_front_a_whole_answer_is_one_write_and_a_heads_alone_is_sent(monkeypatch):
    got, corks = through_the_front(
        monkeypatch,
        (b"GET /v1/a HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"HEAD /v1/a HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/b HTTP/1.1\r\nHost: a\r\n\r\n", None),
        (b"GET /v1/stream HTTP/1.1\r\nHost: a\r\n\r\n", None),
    )
    whole, head, after_head, stream = corks
    assert [c[0] for c in whole] == ["writelines"] and got[0].endswith(b"\r\n\r\nok")
    assert [c[0] for c in head] == ["write"] and b"ok" not in head[0][1]
    assert [c[0] for c in after_head] == ["writelines"]
    assert got[1].count(b"HTTP/1.1 200 OK") == 2 and got[1].endswith(b"\r\n\r\nok")
    # The stream's head went at the end of its turn, before its first event 0.2 s later.
    assert stream[0][0] == "write" and stream[0][1].startswith(b"HTTP/1.1 200 OK")
    assert b"data: 1" in stream[1][1] and b"data: 1\n\n" in got[2]


def test_a_heads_alone_is_sent_before_a_graceful_stop_closes_the_connection(monkeypatch):
    got, _ = through_the_front(monkeypatch, (b"HEAD /v1/stop HTTP/1.1\r\nHost: a\r\n\r\n", None))
    assert got[0].startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 2\r\n" in got[0]


def test_through_the_front_100_continue_is_sent_at_once_and_the_answer_whole(monkeypatch):
    ask = b"POST /v1/echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    got, corks = through_the_front(monkeypatch, (ask, b"hello"))
    assert corks[0] == [
        ("write", b"HTTP/1.1 100 Continue\r\n\r\n"),
        ("writelines", (corks[0][1][1][0], b"hello")),
    ]
    assert got[0].startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert got[0].endswith(b"\r\n\r\nhello")
