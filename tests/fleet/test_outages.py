"""Outages are seen, survived and said once (issue 12, item 9, in part)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fleet.models import Node
from fleet.nodes.live import LIVE
from llmgw.core.outage import Outage

from .builders import register_frame
from .conftest import in_db

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_closed_connection_makes_the_node_unreachable_with_the_channel_layer_away(
    agents, layer, monkeypatch
):
    comm = await agents.registered(register_frame("gpu-a"))

    async def away(*args, **kwargs):
        raise ConnectionError("Redis is away")

    monkeypatch.setattr(layer, "group_discard", away)
    await comm.disconnect()

    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.state == Node.UNREACHABLE
    assert "gpu-a" not in LIVE.nodes


def test_an_outage_is_said_when_it_starts_and_when_it_ends_not_per_attempt(caplog):
    log = logging.getLogger("llmgw.test.outage")
    outage = Outage("writing heartbeats", log)

    with caplog.at_level(logging.INFO, logger="llmgw.test.outage"):
        for _ in range(60):
            outage.failed(ConnectionError("connection refused\nmore"))
        outage.worked()
        outage.worked()

    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "writing heartbeats failed: connection refused; retrying, and saying so again only "
        "once it works",
        "writing heartbeats works again after 0 s; 60 attempts failed meanwhile",
    ]


def _away(*args, **kwargs):
    from django.db import OperationalError

    raise OperationalError("server closed the connection unexpectedly")


def test_the_api_answers_503_with_a_sentence_while_the_database_is_away(api, monkeypatch):
    from fleet.selectors import listings

    monkeypatch.setattr(listings, "nodes_list", _away)

    response = api.call("GET", "/nodes")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json() == {
        "detail": "The control plane's database is not answering; nothing was changed. "
        "Try again in a moment."
    }


def test_metrics_answer_the_last_good_scrape_and_say_the_database_is_down(client, monkeypatch):
    from fleet.metrics import collector as metrics

    monkeypatch.setattr(metrics, "fleet_text", lambda: "llmgw_node_up 1.0\n")
    # (Followed by whatever this process counted of agents and the gateway.)
    assert client.get("/metrics").content.decode().startswith("llmgw_node_up 1.0\n")

    monkeypatch.setattr(metrics, "fleet_text", _away)
    response = client.get("/metrics")

    assert response.status_code == 200
    text = response.content.decode()
    assert text.startswith("llmgw_node_up 1.0\n")
    assert "llmgw_database_up 0.0" in text


async def test_a_handshake_while_the_database_is_away_is_told_to_try_again(agents, monkeypatch):
    """Not refused: an agent refused would give up its own credential."""
    from fleet.nodes import consumers
    from llmgw.core.db import Batched

    monkeypatch.setattr(consumers, "_CREDENTIALS", Batched(_away, most=1))

    comm = await agents.connect()

    assert comm.refused is None
    closed = await comm.receive_output(timeout=5)
    assert (closed["type"], closed["code"]) == ("websocket.close", 4503)


async def test_with_the_channel_layer_away_an_agent_registers_and_gets_commands_once_it_is_back(
    agents, layer, monkeypatch
):
    from fleet.nodes import consumers
    from fleet.nodes.dispatch import Command, send_commands

    monkeypatch.setattr(consumers, "JOIN_RETRY_S", 0.05)
    real_add, failures = layer.group_add, []

    async def add(group, channel):
        if len(failures) < 3:
            failures.append(group)
            raise ConnectionError("Redis is away")
        await real_add(group, channel)

    monkeypatch.setattr(layer, "group_add", add)

    comm = await agents.registered(register_frame("gpu-a"))  # registered all the same

    node = await in_db(lambda: Node.objects.get(pk="gpu-a"))
    assert node.state == Node.READY
    for _ in range(100):
        if len(failures) == 3:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    await send_commands([Command("gpu-a", {"type": "stop_shard", "shard_id": "x", "grace_s": 0})])
    assert (await comm.receive_json_from(timeout=5))["type"] == "stop_shard"
