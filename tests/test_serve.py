"""`llmgw serve`'s daphne lets go of a finished request at once, leaving errors to its sweep,
hands each application what it receives through a small inbox, and lets go of an open
websocket's handshake
and an upgraded connection's HTTP request."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.cli.serve import _server_class
from llmgw.core.inbox import Inbox


def server():
    s = object.__new__(_server_class())
    s.connections = {}
    return s


async def test_a_request_answered_and_closed_is_let_go_at_once():
    s = server()
    s.connections["req"] = {"connected": 0}

    async def app():
        return None

    s.connections["req"]["application_instance"] = task = asyncio.ensure_future(app())
    task.add_done_callback(lambda _t: s._reap("req"))
    s.protocol_disconnected("req")
    assert "req" in s.connections, "its application has not ended yet"
    await task
    await asyncio.sleep(0)
    assert "req" not in s.connections


async def test_an_application_that_failed_is_left_for_daphnes_sweep_to_log():
    s = server()

    async def app():
        raise RuntimeError("boom")

    task = asyncio.ensure_future(app())
    await asyncio.sleep(0)
    s.connections["req"] = {"connected": 0, "application_instance": task}
    s.protocol_disconnected("req")
    assert "req" in s.connections


async def test_a_connection_still_open_is_kept():
    s = server()

    async def app():
        return None

    task = asyncio.ensure_future(app())
    await task
    s.connections["req"] = {"connected": 0, "application_instance": task}
    s._reap("req")
    assert "req" in s.connections


class FakeRequest:
    """What the server's reply path asks of daphne's request: a producer slot and the
    parts written, as Twisted's request would keep them."""

    def __init__(self):
        self.producer, self.written, self.finished = None, [], False

    def registerProducer(self, producer, streaming):
        assert streaming and self.producer is None
        self.producer = producer

    def unregisterProducer(self):
        self.producer = None

    def handle_reply(self, message):
        if message["type"] == "http.response.body":
            self.written.append(message.get("body", b""))
            self.finished = not message.get("more_body", False)


async def test_a_body_sent_in_parts_waits_while_the_client_is_slower():
    s = server()
    req = FakeRequest()
    s.connections[req] = {"connected": 0}
    s.check_headers_type = lambda message: None

    await s.handle_reply(req, {"type": "http.response.body", "body": b"a", "more_body": True})
    assert req.producer is not None, "a streamed body is paced by a producer"
    req.producer.pauseProducing()  # Twisted: the write buffer is full
    second = asyncio.ensure_future(
        s.handle_reply(req, {"type": "http.response.body", "body": b"b", "more_body": True})
    )
    await asyncio.sleep(0.05)
    assert not second.done(), "the send waits until the buffer drains"
    req.producer.resumeProducing()
    await asyncio.wait_for(second, 1)

    await s.handle_reply(req, {"type": "http.response.body", "body": b"c"})
    assert req.written == [b"a", b"b", b"c"] and req.finished
    assert req.producer is None, "the last part lets the producer go"


async def test_a_lost_connection_never_leaves_a_send_waiting():
    s = server()
    req = FakeRequest()
    s.connections[req] = {"connected": 0}
    s.check_headers_type = lambda message: None
    await s.handle_reply(req, {"type": "http.response.body", "body": b"a", "more_body": True})
    req.producer.pauseProducing()
    waiting = asyncio.ensure_future(
        s.handle_reply(req, {"type": "http.response.body", "body": b"b", "more_body": True})
    )
    await asyncio.sleep(0.01)

    req.producer.stopProducing()

    await asyncio.wait_for(waiting, 1)


async def test_an_application_receives_through_its_inbox_and_is_let_go_once_done():
    s = server()
    s.connections["ws"] = {"connected": 0}
    got = []

    async def app(scope, receive, send):
        got.append(await receive())
        got.append(await receive())

    s.application = app
    inbox = s.create_application("ws", {"type": "websocket"})
    inbox.put_nowait({"type": "websocket.connect"})
    inbox.put_nowait({"type": "websocket.receive", "text": "hi"})
    s.protocol_disconnected("ws")
    await s.connections["ws"]["application_instance"]
    await asyncio.sleep(0)

    assert got == [{"type": "websocket.connect"}, {"type": "websocket.receive", "text": "hi"}]
    assert "ws" not in s.connections


async def test_an_inbox_hands_over_in_order_and_waits_when_empty():
    inbox = Inbox()
    inbox.put_nowait(1)
    waiting = asyncio.ensure_future(_two(inbox))
    await asyncio.sleep(0)
    assert not waiting.done()

    inbox.put_nowait(2)

    assert await waiting == [1, 2]


def test_an_empty_inbox_is_still_there_to_be_told_a_caller_hung_up():
    # daphne's HTTP request asks `if self.application_queue:` before it puts the
    # http.disconnect; an inbox that read as false when empty lost every hang-up.
    assert Inbox()


async def _two(inbox: Inbox) -> list:
    return [await inbox.get(), await inbox.get()]


async def test_a_receive_cancelled_as_it_was_woken_loses_nothing():
    inbox = Inbox()
    first = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)

    inbox.put_nowait("kept")
    first.cancel()  # before it ran again to take the item

    with pytest.raises(asyncio.CancelledError):
        await first
    assert await inbox.get() == "kept"


async def test_an_inbox_serves_the_first_receiver_waiting_first():
    inbox = Inbox()
    first = asyncio.ensure_future(inbox.get())
    second = asyncio.ensure_future(inbox.get())
    await asyncio.sleep(0)

    inbox.put_nowait("a")
    inbox.put_nowait("b")

    assert [await first, await second] == ["a", "b"]
    assert not inbox.waited_on


def test_an_open_websocket_lets_go_of_its_handshake(monkeypatch):
    from autobahn.websocket import protocol as autobahn
    from daphne.ws_protocol import WebSocketProtocol

    from llmgw.cli.serve import _lighter_handshakes, _Opened

    for owner, name in [
        (WebSocketProtocol, "onOpen"),
        (autobahn, "pformat"),
        (autobahn.Timings, "__str__"),
    ]:
        monkeypatch.setattr(owner, name, getattr(owner, name))  # put back afterwards
    _lighter_handshakes()
    logged = []

    class Server:
        def log_action(self, kind, action, details):
            logged.append((kind, action, details["path"]))

    class Handshake:
        path = "/ws/agent/"
        headers = {"authorization": "Bearer llmgw_node_secret"}

    ws = object.__new__(WebSocketProtocol)
    ws.server, ws.client_addr, ws.request = Server(), None, Handshake()
    ws.clean_headers = scope_headers = [(b"authorization", b"Bearer llmgw_node_secret")]
    ws.http_request_data = b"GET /ws/agent/ HTTP/1.1\r\nAuthorization: Bearer llmgw_node_secret"
    ws.http_headers = {"authorization": "Bearer llmgw_node_secret"}

    ws.onOpen()

    assert logged == [("websocket", "connected", "/ws/agent/")]
    # Only the path is read after (daphne's access log); the credential is kept nowhere.
    assert ws.request == _Opened("/ws/agent/")
    assert scope_headers == []  # the scope's own list, emptied where the scope holds it
    assert ws.http_request_data is None and ws.http_headers is None


def test_an_upgraded_connection_lets_go_of_its_http_request(monkeypatch):
    from daphne import http_protocol
    from twisted.internet.protocol import Protocol
    from twisted.internet.testing import StringTransport

    from llmgw.cli.serve import _lighter_requests

    monkeypatch.setattr(http_protocol, "WebRequest", http_protocol.WebRequest)
    monkeypatch.setattr(http_protocol.HTTPFactory, "log", http_protocol.HTTPFactory.log)
    _lighter_requests()

    class Websocket(Protocol):
        def __init__(self) -> None:
            self.received = b""

        def dataReceived(self, data: bytes) -> None:
            self.received += data

    class WsFactory:
        def buildProtocol(self, addr):
            self.built = Websocket()
            return self.built

    class Server:
        proxy_forwarded_address_header = None
        ws_factory = WsFactory()
        connected: list = []

        def protocol_connected(self, request):
            self.connected.append(request)

        def protocol_disconnected(self, request):
            self.connected.remove(request)

    server = Server()
    channel = http_protocol.HTTPFactory(server).buildProtocol(None)
    channel.makeConnection(StringTransport())
    channel.dataReceived(
        b"GET /ws/agent/ HTTP/1.1\r\nHost: cp\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nAuthorization: Bearer llmgw_node_secret\r\n\r\n"
    )

    # The websocket was handed the handshake, and Twisted's channel (still the socket's
    # producer) no longer holds the request, its headers or the credential in them.
    assert server.ws_factory.built.received.startswith(b"GET /ws/agent/ HTTP/1.1\r\n")
    assert channel._channel.requests == []  # the HTTP/1.1 channel the request was on
    assert server.connected == []
