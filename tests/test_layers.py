"""Embedded mode's channel layer: messages flow as through Channels' own, a mailbox a channel,
cleaned once a second."""

import asyncio
import time

import pytest
from channels.exceptions import ChannelFull
from hypothesis import given, settings, strategies as st

from llmgw.layers import PacedInMemoryChannelLayer


async def test_messages_reach_a_group_and_expired_ones_are_still_dropped(monkeypatch):
    layer = PacedInMemoryChannelLayer(expiry=60)
    await layer.group_add("node.a", "agent.one")
    await layer.group_send("node.a", {"type": "agent.command", "n": 1})
    assert await layer.receive("agent.one") == {"type": "agent.command", "n": 1}

    await layer.group_add("node.b", "agent.two")
    await layer.send("agent.two", {"type": "x"})
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    monkeypatch.setattr(time, "monotonic", lambda: later)  # a second and more since the last
    layer._clean_expired()
    assert "agent.two" not in layer.channels
    assert "agent.two" not in layer.groups["node.b"]  # its receiver is taken as gone


@pytest.mark.parametrize("calls", [1, 500])
async def test_the_whole_layer_is_walked_at_most_once_a_second(calls, monkeypatch):
    layer = PacedInMemoryChannelLayer()
    walks = []
    monkeypatch.setattr(PacedInMemoryChannelLayer, "_walk_expired", lambda self: walks.append(1))
    for i in range(calls):
        await layer.group_send("node.a", {"type": "agent.command", "n": i})
    assert walks == [1]


async def test_a_receiver_waits_for_the_message_sent_after_it_began():
    layer = PacedInMemoryChannelLayer()
    receiving = asyncio.ensure_future(layer.receive("agent.one"))
    await asyncio.sleep(0)
    assert not receiving.done()

    await layer.send("agent.one", {"type": "x", "n": 1})
    assert await receiving == {"type": "x", "n": 1}
    assert layer.channels == {}  # nothing kept for a channel with nothing in it


async def test_a_full_channel_refuses_more():
    layer = PacedInMemoryChannelLayer(capacity=2)
    await layer.send("agent.one", {"type": "x"})
    await layer.send("agent.one", {"type": "x"})
    with pytest.raises(ChannelFull):
        await layer.send("agent.one", {"type": "x"})


async def test_a_receiver_cancelled_once_woken_leaves_the_message_to_the_next():
    layer = PacedInMemoryChannelLayer()
    first = asyncio.ensure_future(layer.receive("agent.one"))
    second = asyncio.ensure_future(layer.receive("agent.one"))
    await asyncio.sleep(0)
    await layer.send("agent.one", {"type": "x"})  # wakes the first
    first.cancel()  # before it ran to take it
    assert await second == {"type": "x"}
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_receiver_cancelled_while_waiting_leaves_nothing_behind():
    layer = PacedInMemoryChannelLayer()
    waiting = asyncio.ensure_future(layer.receive("agent.one"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert layer.channels == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), max_size=30))
def test_every_message_is_received_once_and_in_order(steps):
    """Sends (True) and receivers starting (False) in any order: each message reaches one
    receiver, in the order sent, the first receiver waiting first."""

    async def run() -> tuple[list, list]:
        layer = PacedInMemoryChannelLayer()
        receivers, sent = [], []
        for send in steps:
            if send:
                sent.append(len(sent))
                await layer.send("agent.one", {"type": "x", "n": sent[-1]})
            else:
                receivers.append(asyncio.ensure_future(layer.receive("agent.one")))
            await asyncio.sleep(0)
        for _ in range(len(receivers), len(sent)):
            receivers.append(asyncio.ensure_future(layer.receive("agent.one")))
        await asyncio.sleep(0)
        got = [r.result()["n"] for r in receivers if r.done()]
        for r in receivers:
            r.cancel()
        return got, sent

    got, sent = asyncio.run(run())
    assert got == sent
