"""Outages are seen, survived and said once (issue 12, item 9, in part)."""

from __future__ import annotations

import logging

import pytest

from fleet.live import LIVE
from fleet.models import Node
from llmgw.outage import Outage

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
