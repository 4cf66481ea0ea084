"""Fixtures for the agent websocket: a clean live fleet and channel layer, and connected agents."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from fleet.nodes import consumers
from fleet.nodes.connections import GATE
from fleet.nodes.live import LIVE

# Where the test agents connect from: the address their register frames declare
# (tests/fleet/builders.py register_frame), as a real agent's connection would show.
AGENT_ADDRESS = "10.0.0.7"


@pytest.fixture
def live():
    """The process's live fleet, empty before and after each test."""
    LIVE.nodes.clear()
    yield LIVE
    LIVE.nodes.clear()


@pytest.fixture
async def layer():
    """The channel layer with no groups or messages left over from another test."""
    layer = get_channel_layer()
    await layer.flush()
    # Each test has its own event loop: a flusher task from another loop can never run again.
    consumers._flusher = None
    yield layer
    if consumers._flusher is not None:
        consumers._flusher.cancel()
        consumers._flusher = None
    await layer.flush()


class Agents:
    """Opens agent connections against the real ASGI application and closes them afterwards."""

    def __init__(self, token: str):
        self.token = token
        # Each node's own credential, as its agent would keep it after its first register.
        self.node_tokens: dict[str, str] = {}
        self.open: list[WebsocketCommunicator] = []

    async def connect(
        self, token: str | None = None, *, headers=None, client: str = AGENT_ADDRESS
    ) -> WebsocketCommunicator:
        """A connection from `client` (the address the server sees it come from)."""
        from llmgw.asgi import application

        if headers is None:
            headers = [(b"authorization", f"Bearer {token or self.token}".encode())]
        comm = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
        # What daphne puts in the scope; set before the application first reads it.
        comm.scope["client"] = (client, 40000)
        connected, code = await comm.connect(timeout=5)
        self.open.append(comm)
        comm.refused = None if connected else code
        return comm

    async def registered(
        self, frame: dict, *, client: str = AGENT_ADDRESS
    ) -> WebsocketCommunicator:
        """A connection from `client` that has registered with `frame` and been answered
        `registered`: with the join token the first time, with the node's own credential
        after, as agents do."""
        node_id = frame["node_id"]
        comm = await self.connect(self.node_tokens.get(node_id), client=client)
        assert comm.refused is None
        await comm.send_json_to(frame)
        reply = await comm.receive_json_from(timeout=5)
        issued = reply.pop("node_token", None)
        assert reply == {"type": "registered", "node_id": node_id}
        assert (issued is None) == (node_id in self.node_tokens)
        self.node_tokens.setdefault(node_id, issued)
        return comm

    async def close_all(self) -> None:
        for comm in self.open:
            if comm.future.done():  # a receive that timed out cancels the application
                continue
            try:
                await comm.disconnect(timeout=5)
            except (Exception, asyncio.CancelledError):
                comm.future.cancel()


@pytest.fixture
async def agents(agent_token, live, layer):
    GATE.__init__()  # no failed handshakes of another test held against these
    a = Agents(agent_token)
    yield a
    await a.close_all()


async def answer(comm: WebsocketCommunicator) -> dict:
    return await comm.receive_json_from(timeout=5)


async def barrier(comm: WebsocketCommunicator) -> None:
    """Wait until the consumer has handled every frame sent before: frames are handled in order."""
    await comm.send_json_to({"type": "barrier"})
    reply = await answer(comm)
    assert reply["type"] == "error"


def in_db(fn):
    """Run ORM code from an async test."""
    return database_sync_to_async(fn)()
