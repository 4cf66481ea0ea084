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
