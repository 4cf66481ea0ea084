"""Failures on the pages: the cluster page's "Needs attention", the model page's last failure
and each replica's engine log."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.db import connection
from django.test import AsyncClient, Client
from django.test.utils import CaptureQueriesContext

from fleet.models import ModelState, Node, Replica, Shard
from fleet.selectors.state import caches_clear
from llmgw.core import clock

from .builders import gpu_model, model_added, node_add, register_frame
from .conftest import answer, in_db

HX = {"HTTP_HX_REQUEST": "true"}
TAIL = "llama_model_load: loading model\nerror: failed to open GGUF file '/m/chat.gguf'"
# As tests/fleet/test_pages.py counts them: failures are read with the models' states.
CLUSTER_QUERIES = 10


@pytest.fixture(autouse=True)
def _fresh():
    caches_clear()
    yield
    caches_clear()


def failing(name: str, *, failures: int = 3, parked: bool = False, node: str = "gpu-a") -> None:
    now = clock.now()
    ModelState.objects.create(
        model=name,
        desired=1,
        failures=failures,
        last_failure_at=now,
        backoff_until=None if parked else now,
        parked_since=now if parked else None,
        parked_reason=f"shard {name}-9-0 on node {node} failed (exit code 1): The engine exited"
        if parked
        else "",
        last_failure={
            "replica": f"{name}-9",
            "node": node,
            "exit_code": 1,
            "detail": f"The engine exited with code 1.\n{TAIL}",
            "at": now.isoformat(),
        },
    )


def attention(body: str) -> str:
    return re.search(r'<section id="attention".*?</section>', body, re.S).group(0)


@pytest.mark.django_db
def test_needs_attention_names_each_model_backing_off_or_parked_with_its_engines_words(staff):
    for name in ("chat", "parked-one", "fine"):
        model_added(gpu_model(name))
    node_add("gpu-a", now=clock.now())
    failing("chat")
    failing("parked-one", failures=5, parked=True)

    body = staff.get("/").content.decode()

    text = attention(body)
    assert " hidden>" not in text.split("\n")[0]
    assert re.search(
        r'chat</a> is <span class="state state-failing">failing</span> after 3 failures: '
        r'<span class="failure-said"[^>]*>'
        r"error: failed to open GGUF file &#x27;/m/chat.gguf&#x27;</span>",
        text,
    )
    assert 'replica <span class="mono">chat-9</span> on <a href="/nodes/gpu-a">gpu-a</a>' in text
    assert ", exit code 1)" in text
    assert "parked-one</a> is parked after 5 failures: " in text
    assert "fine" not in text
    # The strip that comes with the models' refresh says the same.
    oob = staff.get("/?fragment=models", **HX).content.decode()
    assert attention(oob) == text.replace(
        '<section id="attention">', '<section id="attention" hx-swap-oob="true">'
    )


@pytest.mark.django_db
def test_a_model_whose_failures_no_longer_count_needs_no_attention(staff):
    model_added(gpu_model("chat"))
    failing("chat", failures=0)
    assert '<section id="attention" hidden>' in staff.get("/").content.decode()


def _queries(client: Client, url: str) -> int:
    client.get(url)
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.django_db
def test_the_cluster_page_makes_as_many_queries_with_200_models_failing_as_with_two(staff):
    node_add("gpu-a", now=clock.now())
    for i in range(2):
        model_added(gpu_model(f"m{i:03d}"))
        failing(f"m{i:03d}")
    few = _queries(staff, "/")
    for i in range(2, 200):
        model_added(gpu_model(f"m{i:03d}"))
        failing(f"m{i:03d}", parked=i % 2 == 0)
    many = _queries(staff, "/")
    assert many == few <= CLUSTER_QUERIES
    # Ten of each kind by name, the rest counted: 101 back off, 99 are parked.
    text = attention(staff.get("/").content.decode())
    assert text.count('data-attention="backing-off"') == 11
    assert "and 91 more models failing" in text


@pytest.mark.django_db
def test_the_model_page_shows_the_last_failure_and_a_log_link_per_replica(staff):
    model_added(gpu_model("chat"))
    node_add("gpu-a", now=clock.now())
    failing("chat")
    now = clock.now()
    Replica.objects.create(
        id="chat-2", model="chat", profile="gpu", profile_fp="x", state="starting",
        state_since=now, created_at=now,
    )  # fmt: skip
    Shard.objects.create(id="chat-2-0", replica_id="chat-2", node_id="gpu-a", http_port=20000)

    body = staff.get("/models/chat").content.decode()

    section = re.search(r'<section id="last-failure">.*?</section>', body, re.S).group(0)
    assert 'Replica <span class="mono">chat-9</span> on <a href="/nodes/gpu-a">gpu-a</a>' in section
    assert "exit code 1" in section
    # The line that says why above the whole tail.
    assert (
        '<p class="failure-said" id="failure-said">error: failed to open GGUF file '
        "&#x27;/m/chat.gguf&#x27;</p>"
    ) in section
    assert (
        '<pre class="engine-log" id="failure-detail">The engine exited with code 1.\n'
        "llama_model_load: loading model\n"
        "error: failed to open GGUF file &#x27;/m/chat.gguf&#x27;</pre>"
    ) in section
    assert 'hx-get="/replicas/chat-9/log"' in section
    row = re.search(r'<tr data-replica="chat-2">.*?</tr>', body, re.S).group(0)
    assert 'hx-get="/replicas/chat-2/log" hx-target="#replica-log"' in row


@pytest.mark.django_db
def test_the_model_page_makes_as_many_queries_failing_as_not(staff):
    model_added(gpu_model("chat"))
    model_added(gpu_model("calm"))
    node_add("gpu-a", now=clock.now())
    failing("chat")
    ModelState.objects.create(model="calm", desired=1)
    assert _queries(staff, "/models/chat") == _queries(staff, "/models/calm")


@pytest.mark.django_db
def test_the_log_of_a_replica_on_a_node_that_is_away_says_so_in_its_place(staff):
    model_added(gpu_model("chat"))
    node_add("gpu-a", now=clock.now())
    failing("chat")
    Node.objects.filter(pk="gpu-a").update(state=Node.LOST)

    r = staff.get("/replicas/chat-9/log", **HX)

    assert r.status_code == 200
    body = r.content.decode()
    assert body.lstrip().startswith('<section id="replica-log"')
    assert "Node gpu-a is lost: the log of chat-9 can be read once its agent is back." in body


@pytest.mark.django_db
@pytest.mark.parametrize("lines", ["0", "1001", "many"])
def test_the_log_page_refuses_lines_out_of_range(staff, lines):
    r = staff.get(f"/replicas/chat-9/log?lines={lines}")
    assert r.status_code == 400
    assert b"lines must be a whole number from 1 to 1000" in r.content


@pytest.mark.django_db
def test_the_log_page_is_for_staff_only(client):
    r = client.get("/replicas/chat-9/log")
    assert r.status_code == 302 and "/login" in r["Location"]


@pytest.mark.django_db(transaction=True)
async def test_the_log_page_shows_the_lines_the_agent_sends(agents, django_user_model):
    user = await in_db(
        lambda: django_user_model.objects.create_user(
            "ops", password="x", is_staff=True, is_superuser=True
        )
    )
    web = AsyncClient()
    await web.aforce_login(user)
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(lambda: model_added(gpu_model("chat")))
    await in_db(lambda: failing("chat"))

    asked = asyncio.ensure_future(
        web.get("/replicas/chat-9/log?lines=2", headers={"HX-Request": "true"})
    )
    frame = await answer(comm)
    await comm.send_json_to(
        {
            "type": "engine_log_lines",
            "request_id": frame["request_id"],
            "shard_id": "chat-9-0",
            "lines": ["<b>loading</b>", "error: no such file"],
        }
    )
    r = await asked

    assert r.status_code == 200
    body = r.content.decode()
    assert '<pre class="engine-log">&lt;b&gt;loading&lt;/b&gt;\nerror: no such file</pre>' in body
    assert 'on <a href="/nodes/gpu-a">gpu-a</a> <span class="muted">(its last 2 lines)' in body


@pytest.mark.django_db
def test_a_failing_model_reads_as_failing_and_a_signal_by_its_name(staff):
    model_added(gpu_model("chat"))
    node_add("gpu-a", now=clock.now())
    failing("chat")
    ModelState.objects.filter(pk="chat").update(
        last_failure={
            "replica": "chat-9",
            "node": "gpu-a",
            "exit_code": -9,
            "detail": f"The engine was stopped by SIGKILL.\n{TAIL}",
        }
    )

    listed = staff.get("/models").content.decode()
    assert re.search(r'<span class="state state-failing" title="[^"]*">failing</span>', listed)
    assert "state-waiting" not in listed
    section = re.search(
        r'<section id="last-failure">.*?</section>',
        staff.get("/models/chat").content.decode(),
        re.S,
    ).group(0)
    assert "gpu-a</a>, stopped by SIGKILL:" in section
    assert "exit code -9" not in section
    strip = attention(staff.get("/").content.decode())
    assert ", stopped by SIGKILL)" in strip
