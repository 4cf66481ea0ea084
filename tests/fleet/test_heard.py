"""A node's silence marked by the process holding its connection, and its coming back."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from fleet.models import Event, Node
from fleet.nodes.heard import node_live_flush, node_silent_mark
from fleet.nodes.live import LiveFleet, Silence
from llmgw.core import clock

from .builders import node_add, register_frame
from .conftest import barrier, in_db

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def heartbeat(seq: int):
    from fleet.protocol import Heartbeat

    return Heartbeat.model_validate({"type": "heartbeat", "seq": seq})


# The live state alone: which nodes are taken as silent, and when again.


def test_a_node_is_taken_as_silent_once_the_window_has_passed_and_only_once():
    live = LiveFleet()
    live.connected("gpu-a", "s1", NOW)
    live.connected("gpu-b", "s2", later(5))

    assert live.silent(later(14.9), 15) == []
    assert live.silent(later(15), 15) == [Silence("gpu-a", "s1", NOW)]
    assert live.silent(later(19), 15) == []  # already taken
    assert live.silent(later(20), 15) == [Silence("gpu-b", "s2", later(5))]


def test_a_node_heard_from_again_is_written_at_once_and_can_be_silent_again():
    live = LiveFleet()
    live.connected("gpu-a", "s1", NOW)
    live.silent(later(15), 15)

    assert live.heartbeat("gpu-a", heartbeat(1), later(16)) is True  # written now, not later
    assert live.heartbeat("gpu-a", heartbeat(2), later(17)) is False
    assert live.silent(later(31), 15) == []
    assert live.silent(later(32), 15) == [Silence("gpu-a", "s1", later(17))]


def test_a_silence_that_could_not_be_marked_is_taken_again():
    live = LiveFleet()
    live.connected("gpu-a", "s1", NOW)
    taken = live.silent(later(15), 15)

    live.unsilenced(taken)

    assert live.silent(later(16), 15) == taken


def test_a_failed_mark_does_not_take_back_a_node_heard_from_since():
    live = LiveFleet()
    live.connected("gpu-a", "s1", NOW)
    taken = live.silent(later(15), 15)
    live.heartbeat("gpu-a", heartbeat(1), later(15.5))
    live.silent(later(31), 15)  # silent again, on its new heartbeat

    live.unsilenced(taken)  # the first mark's failure comes back late

    assert live.silent(later(32), 15) == []


# The mark in the database.


@pytest.mark.django_db
def test_a_silent_node_is_unreachable_with_the_reconcilers_sentence():
    node_add("gpu-a", now=NOW)

    marked = node_silent_mark(silent=[Silence("gpu-a", "session-gpu-a", NOW)], now=later(15.4))

    node = Node.objects.get(pk="gpu-a")
    assert marked == ["gpu-a"]
    assert (node.state, node.state_since) == (Node.UNREACHABLE, later(15.4))
    event = Event.objects.get(kind="node_state")
    assert (event.node, event.message) == (
        "gpu-a",
        "node gpu-a is unreachable: nothing heard for 15s",
    )


@pytest.mark.django_db
def test_a_silence_on_an_older_connection_or_a_node_not_ready_changes_nothing():
    node_add("gpu-a", now=NOW)
    node_add("gpu-b", now=NOW)
    Node.objects.filter(pk="gpu-b").update(state=Node.LOST, state_since=NOW)

    marked = node_silent_mark(
        silent=[Silence("gpu-a", "an-older-session", NOW), Silence("gpu-b", "session-gpu-b", NOW)],
        now=later(16),
    )

    assert marked == []
    states = dict(Node.objects.values_list("id", "state"))
    assert states == {"gpu-a": Node.READY, "gpu-b": Node.LOST}
    assert not Event.objects.exists()


@pytest.mark.django_db
def test_a_node_marked_silent_and_heard_from_again_is_ready_and_the_events_say_both():
    node_add("gpu-a", now=NOW)
    live = LiveFleet()
    live.connected("gpu-a", "session-gpu-a", NOW)
    node_silent_mark(silent=live.silent(later(15), 15), now=later(15))
    live.heartbeat("gpu-a", heartbeat(1), later(17))

    node_live_flush(writes=live.due(only="gpu-a"), now=later(17))

    assert Node.objects.get(pk="gpu-a").state == Node.READY
    said = list(Event.objects.order_by("id").values_list("message", flat=True))
    assert said == [
        "node gpu-a is unreachable: nothing heard for 15s",
        "node gpu-a is ready: heard from again",
    ]


# Through the real websocket: the serving process marks its own agent's silence.


@pytest.mark.django_db(transaction=True)
async def test_an_agent_gone_quiet_is_marked_unreachable_by_its_process_and_back_on_its_heartbeat(
    agents, monkeypatch
):
    from fleet.nodes import consumers

    monkeypatch.setattr(consumers, "FLUSH_EVERY_S", 0.02)
    comm = await agents.registered(register_frame("gpu-a"))
    registered = (await in_db(lambda: Node.objects.get(pk="gpu-a"))).last_seen
    window = settings.LLMGW.timings.unreachable
    at = [registered + timedelta(seconds=window + 1)]
    monkeypatch.setattr(clock, "now", lambda: at[0])

    for _ in range(250):
        node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
        if node.state == Node.UNREACHABLE:
            break
        await asyncio.sleep(0.02)
    assert node.state == Node.UNREACHABLE
    at[0] += timedelta(seconds=1)
    await comm.send_json_to({"type": "heartbeat", "seq": 1})
    await barrier(comm)

    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.state == Node.READY
    said = await in_db(lambda: list(Event.objects.order_by("id").values_list("message", flat=True)))
    assert said == [
        f"node gpu-a is unreachable: nothing heard for {int(window) + 1}s",
        "node gpu-a is ready: heard from again",
    ]
