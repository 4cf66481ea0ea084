"""What agents send never makes a line of the text log of its own: a newline or a terminal
escape in a field is written as its escape. Through the real consumer and the formatter
the settings configure."""

from __future__ import annotations

import copy
import json
import logging
from logging.config import DictConfigurator

import pytest
from django.conf import settings

import llmgw.asgi  # noqa: F401  set up here: setting Django up again configures logging anew

from .builders import register_frame, running_shard

pytestmark = pytest.mark.django_db(transaction=True)

FORGED = "10.0.0.7\nCRITICAL llmgw.serve forged line\r\x1b[2Kand\u2028more"


def formatter(name: str) -> logging.Formatter:
    """The formatter `name` as the settings' LOGGING makes it (on a copy: it is consumed)."""
    config = copy.deepcopy(settings.LOGGING)
    return DictConfigurator(config).configure_formatter(config["formatters"][name])


async def test_a_newline_in_what_an_agent_sends_stays_on_its_log_line(agents, caplog):
    # The shard's endpoint is not on the address the node claims: the refusal names both.
    frame = {**register_frame("gpu-a", shards=(running_shard("r-1", "m", "gpu"),))}
    caplog.set_level(logging.INFO)

    await agents.registered({**frame, "mgmt_addr": FORGED})

    records = [r for r in caplog.records if "forged line" in r.getMessage()]
    assert records, "the agent's shard was logged"
    text = formatter("text")
    for record in records:
        line = text.format(record)
        assert "\n" not in line and "\r" not in line and "\x1b" not in line
        assert "\u2028" not in line
        assert "10.0.0.7\\nCRITICAL llmgw.serve forged line\\r\\x1b[2Kand\\u2028more" in line
        assert json.loads(formatter("json").format(record))["message"] == record.getMessage()


def test_a_traceback_still_follows_its_line(caplog):
    log = logging.getLogger("llmgw.test")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed with %s", "a\nb")

    line = formatter("text").format(caplog.records[-1])

    first, *rest = line.splitlines()
    assert first.endswith("failed with a\\nb")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"
