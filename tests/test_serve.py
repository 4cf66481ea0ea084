"""`llmgw serve`'s daphne lets go of a finished request at once, leaving errors to its sweep."""

from __future__ import annotations

import asyncio

from llmgw.cli.serve import _server_class


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
