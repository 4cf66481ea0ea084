"""Embedded mode's channel layer: messages flow as through Channels' own, cleaned once a second."""

import time

import pytest

from llmgw.layers import PacedInMemoryChannelLayer


async def test_messages_reach_a_group_and_expired_ones_are_still_dropped(monkeypatch):
    layer = PacedInMemoryChannelLayer(expiry=60)
    await layer.group_add("node.a", "agent.one")
    await layer.group_send("node.a", {"type": "agent.command", "n": 1})
    assert await layer.receive("agent.one") == {"type": "agent.command", "n": 1}

    await layer.send("agent.two", {"type": "x"})
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    monkeypatch.setattr(time, "monotonic", lambda: later)  # a second and more since the last
    layer._clean_expired()
    assert "agent.two" not in layer.channels


@pytest.mark.parametrize("calls", [1, 500])
async def test_the_whole_layer_is_walked_at_most_once_a_second(calls, monkeypatch):
    layer = PacedInMemoryChannelLayer()
    walks = []
    monkeypatch.setattr(
        PacedInMemoryChannelLayer.__mro__[1], "_clean_expired", lambda self: walks.append(1)
    )
    for i in range(calls):
        await layer.group_send("node.a", {"type": "agent.command", "n": i})
    assert walks == [1]
