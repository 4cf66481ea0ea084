"""An engine's log read from its node through the agent's websocket (GET /replicas/{id}/logs)."""

from __future__ import annotations

import asyncio

import pytest
from django.test import AsyncClient

from fleet.models import ModelState, Node, Replica, Shard
from fleet.nodes import logs
from llmgw.core import clock

from .builders import register_frame
from .conftest import answer, barrier, in_db

pytestmark = pytest.mark.django_db(transaction=True)


def replica_on(node_id: str, replica_id: str = "chat-1") -> None:
    now = clock.now()
    replica = Replica.objects.create(
        id=replica_id,
        model="chat",
        profile="gpu",
        profile_fp="fp",
        state="starting",
        state_since=now,
        created_at=now,
    )
    Shard.objects.create(id=f"{replica_id}-0", replica=replica, node_id=node_id, http_port=20001)


def get(token: str, path: str):
    return AsyncClient().get(path, headers={"Authorization": f"Bearer {token}"})


async def test_the_log_is_asked_of_the_agent_and_its_lines_answered(agents, admin_token):
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(lambda: replica_on("gpu-a"))

    asked = asyncio.ensure_future(get(admin_token, "/api/v1/replicas/chat-1/logs?lines=5"))
    frame = await answer(comm)
    assert frame == {
        "type": "engine_log",
        "request_id": frame["request_id"],
        "shard_id": "chat-1-0",
        "lines": 5,
    }
    await comm.send_json_to(
        {
            "type": "engine_log_lines",
            "request_id": frame["request_id"],
            "shard_id": "chat-1-0",
            "lines": ["loading m.gguf", "error: no such file"],
        }
    )
    r = await asked
    assert r.status_code == 200, r.content
    assert r.json() == {
        "replica": "chat-1",
        "shard": "chat-1-0",
        "node": "gpu-a",
        "lines": ["loading m.gguf", "error: no such file"],
    }


async def test_the_log_of_a_failed_replica_already_forgotten_is_asked_where_it_ran(
    agents, admin_token
):
    comm = await agents.registered(register_frame("gpu-a"))
    failure = {"replica": "chat-9", "node": "gpu-a", "exit_code": 1, "detail": "x", "at": None}
    await in_db(lambda: ModelState.objects.create(model="chat", failures=1, last_failure=failure))

    asked = asyncio.ensure_future(get(admin_token, "/api/v1/replicas/chat-9/logs"))
    frame = await answer(comm)
    assert (frame["shard_id"], frame["lines"]) == ("chat-9-0", logs.DEFAULT_LINES)
    await comm.send_json_to(
        {
            "type": "engine_log_lines",
            "request_id": frame["request_id"],
            "shard_id": "chat-9-0",
            "found": False,
        }
    )
    r = await asked
    assert (r.status_code, r.json()) == (404, {"detail": "Node gpu-a has no log of chat-9-0."})


async def test_a_node_that_is_away_is_a_sentence_and_nothing_is_asked(agents, admin_token):
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(lambda: replica_on("gpu-a"))
    await in_db(lambda: Node.objects.filter(pk="gpu-a").update(state=Node.UNREACHABLE))

    r = await get(admin_token, "/api/v1/replicas/chat-1/logs")

    assert r.status_code == 503
    assert r.json()["detail"] == (
        "Node gpu-a is unreachable: the log of chat-1 can be read once its agent is back."
    )
    assert await comm.receive_nothing(timeout=0.2)


async def test_a_node_that_does_not_answer_in_time_is_a_504(agents, admin_token, monkeypatch):
    monkeypatch.setattr(logs, "ANSWER_TIMEOUT_S", 0.2)
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(lambda: replica_on("gpu-a"))

    r = await get(admin_token, "/api/v1/replicas/chat-1/logs")
    asked = await answer(comm)

    assert asked["type"] == "engine_log"
    assert r.status_code == 504
    assert r.json()["detail"].startswith("Node gpu-a did not answer within 0.2 s")
    # Its answer, late, is let go without an error: nobody waits for it.
    await comm.send_json_to(
        {
            "type": "engine_log_lines",
            "request_id": asked["request_id"],
            "shard_id": "chat-1-0",
            "lines": ["late"],
        }
    )
    await barrier(comm)


@pytest.mark.parametrize("lines", ["0", "1001", "-3", "ten", "1.5"])
async def test_lines_out_of_range_or_not_a_number_is_a_400_and_nothing_is_asked(
    agents, admin_token, lines
):
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(lambda: replica_on("gpu-a"))

    r = await get(admin_token, f"/api/v1/replicas/chat-1/logs?lines={lines}")

    assert r.status_code == 400
    assert "lines" in r.json()["detail"]
    assert await comm.receive_nothing(timeout=0.2)


async def test_an_unknown_replica_is_a_404(agents, admin_token):
    r = await get(admin_token, "/api/v1/replicas/nope-1/logs")
    assert (r.status_code, r.json()) == (404, {"detail": "There is no replica 'nope-1'."})


async def test_the_log_needs_an_admin_token(agents):
    r = await AsyncClient().get("/api/v1/replicas/chat-1/logs")
    assert r.status_code == 401


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param({"lines": ["x"] * 1001}, id="more than a thousand lines"),
        pytest.param({"lines": ["nul \x00 inside"]}, id="a NUL in a line"),
        pytest.param({"lines": ["y" * 4001]}, id="a line longer than an agent sends"),
        pytest.param({"request_id": "../../x"}, id="a request id of odd characters"),
        pytest.param({"lines": "not a list"}, id="lines that are not a list"),
    ],
)
async def test_an_invalid_engine_log_answer_is_refused_with_an_error(agents, frame):
    comm = await agents.registered(register_frame("gpu-a"))

    await comm.send_json_to(
        {"type": "engine_log_lines", "request_id": "q1", "shard_id": "chat-1-0"} | frame
    )

    assert (await answer(comm))["type"] == "error"
