"""The gateway end to end: the official openai client against `/v1/` of a real `llmgw serve`,
with real agents running sim engines.

One cluster per mode serves every test here (each start costs seconds); each test uses
models, keys and projects of its own where what it does could touch another's figures.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.agent.main import SIM_COMMAND_ENV

from .conftest import MODES
from .harness import (
    REPO,
    Cluster,
    engine_gauge,
    gateway_key,
    gateway_project,
    listener_pid,
    wait_for,
)

FAST = ["--ttft-ms", "5", "--tokens-per-sec", "500"]
NOBODYS_GPU = "b200-192g"  # the agents have h100-80g and l40s-48g


def _model(name: str, *, gpu_class: str = "h100-80g", args=FAST, **extra) -> dict:
    profile = {
        "name": "one",
        "engine": "sim",
        "gpu_class": gpu_class,
        "tp": 1,
        "args": args,
        "startup_timeout": 60,
    }
    return {"name": name, "source": f"org/{name}", "profiles": [profile], **extra}


MODELS = [
    _model(
        "chat",
        aliases=["assistant"],
        scaling={"min": 1},
        slo={"ttft_p95_ms": 2000, "tpot_p95_ms": 500},
    ),
    _model("embed", routing_profile="embedding", scaling={"min": 1}),
    # Two replicas, slow enough that a stream is still running when one is killed.
    _model("sturdy", args=["--ttft-ms", "5", "--tokens-per-sec", "100"], scaling={"min": 2}),
    _model("primary", gpu_class=NOBODYS_GPU, scaling={"min": 1}, fallbacks=["chat"]),
    _model("stranded", gpu_class=NOBODYS_GPU, scaling={"min": 1}),
    _model("lazy", scaling={"min": 0, "max": 1}),
    _model("nowhere", gpu_class=NOBODYS_GPU, scaling={"min": 0, "max": 1}),
    _model("late", gpu_class="l40s-48g", scaling={"min": 1}),  # on the node gpu-late
    # Routed by prefix, with the sim engine's prefix cache (on by default) counted.
    _model("sessions", scaling={"min": 2}),
]
MODELS[-1]["profiles"][0]["routing"] = "prefix"
HELLO = [{"role": "user", "content": "hello there"}]
# `llmgw sim-engine`, but a streamed body ends 0.3 s after its last event (`data: [DONE]`).
LATE_ENDING_ENGINE = """
import asyncio, sys
from aiohttp import web
from llmgw import simengine

write_eof = web.StreamResponse.write_eof


async def late_eof(self, data=b""):
    if type(self) is web.StreamResponse:
        await asyncio.sleep(0.3)
    await write_eof(self, data)


web.StreamResponse.write_eof = late_eof
sys.exit(simengine.main(sys.argv[1:]))
"""


@dataclass
class Site:
    """The shared cluster, a project and a key that may use every model."""

    cluster: Cluster
    project: int
    secret: str

    def client(self, secret: str | None = None, timeout: float = 30) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.cluster.url}/v1",
            api_key=secret or self.secret,
            max_retries=0,
            timeout=timeout,
        )

    def post(self, path: str, body, secret: str | None = None, **kw) -> httpx.Response:
        """A raw POST to `/v1/<path>`: `body` as JSON when a dict, else as it is."""
        headers = {"Authorization": f"Bearer {secret or self.secret}"}
        content = json.dumps(body).encode() if isinstance(body, dict) else body
        headers["Content-Type"] = "application/json"
        return httpx.post(
            f"{self.cluster.url}/v1/{path}",
            content=content,
            headers=headers,
            timeout=kw.pop("timeout", 30),
            **kw,
        )


@pytest.fixture(scope="module", params=MODES)
def site(request, tmp_path_factory):
    """Agents with 8 simulated H100s and one L40S, the models above, and a key for project
    acme."""
    home = tmp_path_factory.mktemp(f"gateway-{request.param}")
    cluster = Cluster(home, production=request.param == "production")
    try:
        cluster.start_server()
        cluster.start_agent("gpu-a", "--simulate-gpus", "8xh100-80g", port_range="32000-32499")
        # A node whose sim engines end a streamed body a moment after its last event.
        cluster.env[SIM_COMMAND_ENV] = shlex.join([sys.executable, "-c", LATE_ENDING_ENGINE])
        try:
            cluster.start_agent(
                "gpu-late", "--simulate-gpus", "1xl40s-48g", port_range="32500-32999"
            )
        finally:
            del cluster.env[SIM_COMMAND_ENV]
        wait_for(
            "two ready nodes",
            lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready", "ready"],
        )
        for model in MODELS:
            cluster.post("/models", model)
        for name, count in (("chat", 1), ("embed", 1), ("sturdy", 2), ("late", 1)):
            wait_for(
                f"{count} ready replica(s) of {name}",
                lambda n=name, c=count: len(cluster.ready_replicas(n)) == c,
            )
        project = gateway_project(cluster, "acme")
        key = gateway_key(cluster, project, "main")
        yield Site(cluster=cluster, project=project, secret=key["secret"])
    finally:
        cluster.close()


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _error(resp: httpx.Response) -> dict:
    return resp.json()["error"]


def _sse_data(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def test_chat_completions_and_embeddings_answer_by_name_and_alias(site):
    client = site.client()

    answer = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=7)
    assert answer.model == "chat"
    assert answer.choices[0].message.content
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2, 7)

    # Streamed: the content arrives in chunks, and the usage-only chunk the gateway asks the
    # engine for (to count usage) is not passed to a caller who did not ask for it.
    chunks = list(
        client.chat.completions.create(model="chat", messages=HELLO, max_tokens=5, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"

    # Asked for, it is passed on with the engine's figures.
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=HELLO,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 4
    assert not chunks[-1].choices

    completion = client.completions.create(model="chat", prompt="once upon a time", max_tokens=3)
    assert completion.model == "chat"
    assert len(completion.choices[0].text.split()) == 3
    assert completion.usage.prompt_tokens == 4

    embedded = client.embeddings.create(model="embed", input=["one", "two words"])
    assert [len(d.embedding) for d in embedded.data] == [16, 16]
    assert embedded.data[0].embedding != embedded.data[1].embedding
    assert embedded.usage.prompt_tokens == 3

    # By alias: the engine is asked for the catalog name, which the answer carries.
    by_alias = client.chat.completions.create(model="assistant", messages=HELLO, max_tokens=2)
    assert by_alias.model == "chat"
    streamed = list(
        client.chat.completions.create(model="assistant", messages=HELLO, max_tokens=2, stream=True)
    )
    assert {c.model for c in streamed} == {"chat"}

    listed = {m.id: m for m in client.models.list()}
    assert sorted(listed) == sorted(m["name"] for m in MODELS)
    assert listed["chat"].aliases == ["assistant"]


def test_a_model_with_no_ready_replica_is_answered_by_its_fallback(site):
    assert site.cluster.ready_replicas("primary") == []
    client = site.client()

    answer = client.chat.completions.create(model="primary", messages=HELLO, max_tokens=3)
    assert answer.model == "chat"
    assert answer.usage.completion_tokens == 3
    chunks = list(
        client.chat.completions.create(model="primary", messages=HELLO, max_tokens=3, stream=True)
    )
    assert {c.model for c in chunks} == {"chat"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # With nothing to fall back to, the caller is told why, and that waiting will not bring
    # it: no node has its GPU.
    resp = site.post("chat/completions", {"model": "stranded", "messages": HELLO, "max_tokens": 1})
    assert resp.status_code == 503, resp.text
    assert "Retry-After" not in resp.headers
    assert resp.headers["x-should-retry"] == "false"
    assert _error(resp)["code"] == "model_unplaceable"
    assert "stranded has no ready replica" in _error(resp)["message"]


def test_an_on_demand_model_is_started_by_its_first_request_which_waits_for_it(site):
    cluster = site.cluster
    assert cluster.get("/replicas", model="lazy") == []

    request = {"model": "lazy", "messages": HELLO, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST",
        f"{cluster.url}/v1/chat/completions",
        json=request,
        headers={"Authorization": f"Bearer {site.secret}"},
        timeout=90,
    ) as resp:
        answered_at = time.time()
        body = resp.read().decode()
    assert resp.status_code == 200, body
    events = _sse_data(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["model"] for c in chunks} == {"lazy"}
    assert len("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).split()) == 3

    # Nothing was answered before the replica was ready, and the replica stays.
    (replica,) = cluster.ready_replicas("lazy")
    assert datetime.fromisoformat(replica["ready_at"]).timestamp() <= answered_at
    assert len(cluster.get("/replicas", model="lazy")) == 1
    again = site.client().chat.completions.create(model="lazy", messages=HELLO, max_tokens=1)
    assert again.model == "lazy"


def test_an_on_demand_model_with_no_room_answers_503_not_to_retry(site):
    resp = site.post(
        "chat/completions", {"model": "nowhere", "messages": HELLO, "max_tokens": 1}, timeout=90
    )
    assert resp.status_code == 503, resp.text
    assert "Retry-After" not in resp.headers
    assert resp.headers["x-should-retry"] == "false"
    error = _error(resp)
    assert "no room" in error["message"]
    assert error["code"] == "model_unplaceable"
    assert site.cluster.ready_replicas("nowhere") == []


def test_a_killed_replica_cuts_its_stream_with_an_error_and_the_next_requests_go_to_the_other(
    site,
):
    cluster = site.cluster
    ready = cluster.ready_replicas("sturdy")
    assert len(ready) == 2
    client = site.client(timeout=30)

    # 2,000 tokens at 100 a second: the stream would run 20 s.
    stream = client.chat.completions.create(
        model="sturdy", messages=HELLO, max_tokens=2000, stream=True
    )
    chunks = iter(stream)
    assert next(chunks).model == "sturdy"
    serving = wait_for(
        "the replica serving the stream",
        lambda: [r for r in ready if engine_gauge(r["endpoint"], "requests_running") == 1],
        timeout=10,
    )
    assert len(serving) == 1
    victim = serving[0]
    os.kill(listener_pid(_port(victim["endpoint"])), signal.SIGKILL)

    started = time.monotonic()
    with pytest.raises(openai.APIError) as cut:
        for _ in chunks:
            pass
    # An error from the gateway, soon: not the client's own timeout.
    assert not isinstance(cut.value, openai.APIConnectionError)
    assert "went away" in cut.value.message
    assert time.monotonic() - started < 10

    for _ in range(6):
        answer = client.chat.completions.create(model="sturdy", messages=HELLO, max_tokens=2)
        assert answer.model == "sturdy"
        assert answer.usage.completion_tokens == 2


def test_a_whole_answer_cut_by_a_killed_replica_is_answered_by_the_other(site):
    cluster = site.cluster
    ready = wait_for(
        "two ready replicas of sturdy, both answering",
        lambda: (
            len(r := cluster.ready_replicas("sturdy")) == 2
            and all(engine_gauge(x["endpoint"], "requests_running") == 0 for x in r)
            and r
        ),
    )
    client = site.client(timeout=30)
    # The gateway reads the replicas about once a second: wait until it sends to both.
    served = {r["id"]: engine_gauge(r["endpoint"], "requests_total") for r in ready}

    def both_served() -> bool:
        client.chat.completions.create(model="sturdy", messages=HELLO, max_tokens=1)
        return all(engine_gauge(r["endpoint"], "requests_total") > served[r["id"]] for r in ready)

    wait_for("the gateway to route to both replicas", both_served, timeout=15)
    answers: list = []

    def ask() -> None:
        try:
            answers.append(
                client.chat.completions.create(model="sturdy", messages=HELLO, max_tokens=500)
            )
        except openai.APIError as exc:
            answers.append(exc)

    asking = threading.Thread(target=ask)
    asking.start()
    serving = wait_for(
        "the replica working on the request",
        lambda: [r for r in ready if engine_gauge(r["endpoint"], "requests_running") == 1],
        timeout=10,
    )
    os.kill(listener_pid(_port(serving[0]["endpoint"])), signal.SIGKILL)
    asking.join(timeout=30)
    assert not asking.is_alive()
    (answer,) = answers
    assert not isinstance(answer, Exception), answer
    assert answer.usage.completion_tokens == 500


def test_keys_missing_wrong_revoked_or_limited_to_other_models_are_refused(site):
    cluster = site.cluster

    missing = httpx.post(f"{cluster.url}/v1/chat/completions", json={"model": "chat"})
    assert missing.status_code == 401
    assert _error(missing)["code"] == "invalid_api_key"

    with pytest.raises(openai.AuthenticationError) as wrong:
        site.client("llmgw_key_not-a-real-one").chat.completions.create(
            model="chat", messages=HELLO
        )

    revoked = gateway_key(cluster, site.project, "short-lived")
    client = site.client(revoked["secret"])
    assert client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1).choices
    cluster.client.delete(f"/keys/{revoked['id']}").raise_for_status()

    def refused() -> bool:
        try:
            client.models.list()
        except openai.AuthenticationError:
            return True
        return False

    wait_for("the revoked key to be refused", refused, timeout=10)
    with pytest.raises(openai.AuthenticationError) as after:
        client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)
    # A revoked key is told what a wrong one is: nothing says it existed (each names its
    # own request).
    assert after.value.request_id != wrong.value.request_id
    assert after.value.message.replace(after.value.request_id, "") == (
        wrong.value.message.replace(wrong.value.request_id, "")
    )

    narrow = gateway_key(cluster, site.project, "chat-only", models=["chat"])
    client = site.client(narrow["secret"])
    assert [m.id for m in client.models.list()] == ["chat"]
    assert client.chat.completions.create(model="assistant", messages=HELLO).model == "chat"
    with pytest.raises(openai.NotFoundError) as other:
        client.embeddings.create(model="embed", input="x")
    assert other.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="no-such-model", input="x")
    # A model the key may not use reads the same as one that does not exist.
    assert other.value.message.replace("embed", "").replace(
        other.value.request_id, ""
    ) == unknown.value.message.replace("no-such-model", "").replace(unknown.value.request_id, "")


def test_a_keys_requests_per_minute_answer_429_with_retry_after(site):
    key = gateway_key(site.cluster, site.project, "two-a-minute", limits={"requests_per_minute": 2})
    client = site.client(key["secret"])
    for _ in range(2):
        assert client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1).choices
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)

    resp = site.post("chat/completions", {"model": "chat", "messages": HELLO}, key["secret"])
    assert resp.status_code == 429
    # A sliding minute: the wait said is never more than a minute (limits.py).
    assert 1 <= int(resp.headers["Retry-After"]) <= 60
    assert _error(resp)["code"] == "rate_limit_exceeded"
    assert "allows 2 requests per minute" in _error(resp)["message"]
    # Another key is not held back by this one's limit.
    assert site.client().chat.completions.create(model="chat", messages=HELLO).choices


def test_a_projects_requests_per_minute_hold_every_key_of_it(site):
    cluster = site.cluster
    project = gateway_project(cluster, "limited")
    put = cluster.client.put(
        "/limits", json={"scope": f"project:{project}", "requests_per_minute": 3}
    )
    assert put.status_code == 200, put.text
    # The gateway reads limits with keys: once it knows these keys, it knows the limit.
    first = gateway_key(cluster, project, "first")
    second = gateway_key(cluster, project, "second")

    for _ in range(3):
        site.client(first["secret"]).chat.completions.create(
            model="chat", messages=HELLO, max_tokens=1
        )
    with pytest.raises(openai.RateLimitError):
        site.client(second["secret"]).chat.completions.create(model="chat", messages=HELLO)
    resp = site.post("completions", {"model": "chat", "prompt": "x"}, first["secret"])
    assert resp.status_code == 429
    assert int(resp.headers["Retry-After"]) >= 1
    assert "allows 3 requests per minute" in _error(resp)["message"]
    assert site.client().chat.completions.create(model="chat", messages=HELLO).choices


def test_a_burst_on_a_tokens_per_minute_key_stays_within_its_limit(site):
    # 20 requests at once, each able to use about 40 tokens (a prompt estimated at ~22 from
    # its body and 17 to write), on a key allowed 100 tokens a minute. Before reservations
    # every one was let in while a token of room was left: 20 answered, ~400 counted.
    cluster = site.cluster
    key = gateway_key(
        cluster, gateway_project(cluster, "bursty"), "bursty", limits={"tokens_per_minute": 100}
    )
    body = {"model": "chat", "messages": HELLO, "max_tokens": 17}
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        answers = list(
            pool.map(lambda _: site.post("chat/completions", body, key["secret"]), range(20))
        )
    codes = [r.status_code for r in answers]
    assert set(codes) == {200, 429}
    refused = next(r for r in answers if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert "allows 100 tokens per minute" in _error(refused)["message"]

    def recorded() -> dict | None:
        rows = [r for r in cluster.get("/usage", by="key")["rows"] if r["key_id"] == key["id"]]
        return rows[0] if rows and rows[0]["requests"] == 20 else None

    row = wait_for("the burst's usage to be written", recorded, timeout=15)
    assert row["errors"] == codes.count(429)
    assert 0 < row["prompt_tokens"] + row["completion_tokens"] <= 100


def test_usage_per_key_adds_up_the_engines_usage_figures(site):
    cluster = site.cluster
    key = gateway_key(cluster, gateway_project(cluster, "metered"), "metered")
    client = site.client(key["secret"])
    seen: dict[str, list[int]] = {}  # model -> [requests, errors, prompt, completion]

    def count(model: str, usage) -> None:
        figures = seen.setdefault(model, [0, 0, 0, 0])
        figures[0] += 1
        figures[2] += usage.prompt_tokens
        figures[3] += getattr(usage, "completion_tokens", 0) or 0

    messages = [{"role": "user", "content": "count these five words"}]
    count("chat", client.chat.completions.create(model="chat", messages=messages).usage)
    asked = {"model": "chat", "messages": messages, "max_tokens": 6, "stream": True}
    with_usage = list(
        client.chat.completions.create(**asked, stream_options={"include_usage": True})
    )
    count("chat", with_usage[-1].usage)
    # Not asked for, the usage is not shown, but it is counted all the same: the sim gives
    # the same prompt the same figures.
    without = list(client.chat.completions.create(**asked))
    assert all(c.usage is None for c in without)
    count("chat", with_usage[-1].usage)
    count(
        "chat",
        client.completions.create(model="assistant", prompt="a b c", max_tokens=4).usage,
    )
    count("embed", client.embeddings.create(model="embed", input=["a b", "c d e"]).usage)
    assert seen == {"chat": [4, 0, 15, 32], "embed": [1, 0, 5, 0]}

    def recorded() -> dict[str, list[int]]:
        rows = cluster.get("/usage", by="key")["rows"]
        return {
            r["model"]: [r["requests"], r["errors"], r["prompt_tokens"], r["completion_tokens"]]
            for r in rows
            if r["key_id"] == key["id"]
        }

    with contextlib.suppress(AssertionError):
        wait_for("usage to add up", lambda: recorded() == seen, timeout=15)
    assert recorded() == seen


def test_a_stream_read_to_its_end_is_counted_though_the_caller_hangs_up_before_its_close(
    site,
):
    # The official client stops reading and hangs up at `data: [DONE]`. The engine of
    # "late" ends its HTTP body a moment after that event (as a busy engine, or TCP's
    # delayed acknowledgements, sometimes do), so the caller is gone before the body ends.
    # The answer was whole, the usage reported and even shown: it is counted, not an error.
    cluster = site.cluster
    key = gateway_key(cluster, gateway_project(cluster, "streamer"), "streamer")
    client = site.client(key["secret"])
    asked = {"model": "late", "messages": HELLO, "max_tokens": 6, "stream": True}
    shown = list(client.chat.completions.create(**asked, stream_options={"include_usage": True}))
    assert shown[-1].usage.completion_tokens == 6
    unshown = list(client.chat.completions.create(**asked))
    assert unshown[-1].choices[0].finish_reason == "length"

    def recorded() -> list[int] | None:
        rows = cluster.get("/usage", by="key")["rows"]
        mine = [r for r in rows if r["key_id"] == key["id"]]
        figures = ("requests", "errors", "prompt_tokens", "completion_tokens")
        return [mine[0][f] for f in figures] if mine else None

    expected = [2, 0, 2 * shown[-1].usage.prompt_tokens, 12]
    with contextlib.suppress(AssertionError):
        wait_for("usage to add up", lambda: recorded() == expected, timeout=10)
    assert recorded() == expected


def test_hostile_requests_get_clear_errors(site):
    over = b"x" * (8 * 1024 * 1024 + 1)
    resp = site.post("chat/completions", over)
    assert resp.status_code == 413
    assert _error(resp)["code"] == "request_too_large"
    # Without a Content-Length, sent in chunks, it is cut off all the same.
    resp = site.post("chat/completions", iter([over[:4_000_000], over[4_000_000:]]))
    assert resp.status_code == 413

    nan = b'{"model": "chat", "messages": [], "temperature": NaN}'
    for body in (b"{not json", b"\xff\xfe", b"[1, 2]", b'"chat"', nan):
        resp = site.post("chat/completions", body)
        assert resp.status_code == 400, body
        assert _error(resp)["type"] == "invalid_request_error"
    resp = site.post("chat/completions", {"messages": HELLO})
    assert resp.status_code == 400
    assert _error(resp)["code"] == "missing_model"
    resp = site.post("chat/completions", {"model": "chat", "messages": HELLO, "stream": "yes"})
    assert resp.status_code == 400
    resp = site.post("embeddings", {"model": "embed", "input": "x", "stream": True})
    assert resp.status_code == 400
    resp = site.post("chat/completions", {"model": "no-such-model", "messages": HELLO})
    assert resp.status_code == 404
    assert _error(resp)["code"] == "model_not_found"

    auth = {"Authorization": f"Bearer {site.secret}"}
    wrong_method = httpx.get(f"{site.cluster.url}/v1/chat/completions", headers=auth)
    assert wrong_method.status_code == 405
    assert "error" in wrong_method.json()
    assert httpx.delete(f"{site.cluster.url}/v1/models", headers=auth).status_code == 405
    unknown = httpx.post(f"{site.cluster.url}/v1/nothing-here", headers=auth, json={})
    assert unknown.status_code == 404
    assert _error(unknown)["code"] == "unknown_url"


def test_a_caller_that_hangs_up_mid_stream_does_not_leave_the_engine_generating(site):
    (replica,) = site.cluster.ready_replicas("chat")
    endpoint = replica["endpoint"]
    assert engine_gauge(endpoint, "requests_running") == 0
    # 5,000 tokens at 500 a second: 10 s if nobody stops it.
    request = {"model": "chat", "messages": HELLO, "max_tokens": 5000, "stream": True}
    with httpx.stream(
        "POST",
        f"{site.cluster.url}/v1/chat/completions",
        json=request,
        headers={"Authorization": f"Bearer {site.secret}"},
        timeout=30,
    ) as resp:
        assert resp.status_code == 200
        # Kept: a dropped iterator would close the response before we mean to.
        received = resp.iter_bytes()
        assert next(received).startswith(b"data:")
        assert engine_gauge(endpoint, "requests_running") == 1
    wait_for(
        "the engine to stop the request",
        lambda: engine_gauge(endpoint, "requests_running") == 0,
        timeout=5,
    )


def test_the_servers_metrics_count_the_gateways_requests_by_model(site):
    def answered(model: str, code: str) -> float:
        text = httpx.get(f"{site.cluster.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == "llmgw_gateway_requests":
                for sample in family.samples:
                    labels = sample.labels
                    if sample.name.endswith("_total") and labels == {"model": model, "code": code}:
                        return sample.value
        return 0.0

    before = answered("chat", "200")
    client = site.client()
    client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)
    client.chat.completions.create(model="assistant", messages=HELLO, max_tokens=1)
    wait_for("two more requests counted", lambda: answered("chat", "200") >= before + 2)
    assert answered("chat", "200") == before + 2
    assert answered("assistant", "200") == 0  # counted under the catalog name, never an alias

    refused_before = answered("", "404")
    site.post("chat/completions", {"model": "no-such-model", "messages": HELLO})
    wait_for("the refusal counted", lambda: answered("", "404") >= refused_before + 1)
    assert answered("", "404") == refused_before + 1


def test_ctl_bench_ramps_through_the_gateway_and_saves_what_a_replica_served(site):
    cluster = site.cluster
    key = gateway_key(cluster, gateway_project(cluster, "bencher"), "bench")
    env = dict(
        cluster.env,
        LLMGW_SERVER=cluster.url,
        LLMGW_TOKEN=cluster.admin_token,
        LLMGW_API_KEY=key["secret"],
    )
    done = subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "bench", "chat", "--levels", "1,2"]
        + ["--seconds", "1", "--max-tokens", "8", "--save"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "capacity: 2 requests at once" in done.stdout
    saved = [m for m in cluster.get("/capacity") if m["model"] == "chat"]
    assert [(m["profile"], m["max_concurrency"]) for m in saved] == [("one", 2)]
    assert saved[0]["tok_per_sec"] > 0


def test_a_conversations_turns_go_to_the_replica_holding_its_prefix(site):
    wait_for(
        "2 ready replicas of sessions", lambda: len(site.cluster.ready_replicas("sessions")) == 2
    )
    client = site.client()
    system = {"role": "system", "content": "You answer briefly about GPU clusters. " * 40}
    served, cached = [], []
    for topic in ("NVLink", "HBM", "PCIe", "InfiniBand"):
        messages, turns = [system], []
        for part in range(3):
            messages.append(
                {"role": "user", "content": f"Tell me about {topic}, part {part}. " * 8}
            )
            raw = client.chat.completions.with_raw_response.create(
                model="sessions", messages=messages, max_tokens=6
            )
            answer = raw.parse()
            turns.append(raw.headers["x-llmgw-replica"])
            cached.append(answer.usage.prompt_tokens_details.cached_tokens)
            messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        served.append(turns)
    assert all(len(set(turns)) == 1 for turns in served), served
    # Every turn after a conversation's first found its history in the engine's cache.
    later = [c for i, c in enumerate(cached) if i % 3]
    assert all(c > 0 for c in later), cached

    def routed(how: str) -> float:
        text = httpx.get(f"{site.cluster.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == "llmgw_gateway_routed":
                for sample in family.samples:
                    if sample.labels == {"model": "sessions", "how": how}:
                        return sample.value
        return 0.0

    wait_for("the routed requests counted", lambda: routed("prefix") >= 11)


def test_each_replicas_engine_reading_reaches_metrics_and_ctl_replicas(site):
    """The sim engine's vLLM series, read by a real agent, reported to the control plane:
    on /metrics and in ctl replicas."""
    cluster = site.cluster
    client = site.client()
    for _ in range(3):  # prompt tokens looked up, so a hit rate is said
        client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1)

    def series(name: str) -> dict[str, float]:
        text = httpx.get(f"{cluster.url}/metrics", timeout=10).text
        return {
            s.labels["replica"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and s.labels.get("model") == "chat"
        }

    [ready] = [r["id"] for r in cluster.ready_replicas("chat")]
    wait_for("chat's engine reading on /metrics", lambda: ready in series("llmgw_replica_running"))
    assert series("llmgw_replica_waiting")[ready] == 0
    assert 0 <= series("llmgw_replica_kv_cache_usage_ratio")[ready] <= 1
    wait_for(
        "chat's prefix cache hit ratio on /metrics",
        lambda: ready in series("llmgw_replica_prefix_cache_hit_ratio"),
    )

    done = cluster.ctl("replicas", "--model", "chat")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.splitlines()[0].split(), done.stdout.splitlines()[1].split()
    said = dict(zip(header, row, strict=False))
    assert said["RUN"].isdigit() and said["WAIT"] == "0" and said["KV"].endswith("%")


def test_the_openai_client_reads_request_ids_and_what_openais_schema_says(site):
    from openai.types import Model
    from openai.types.chat import ChatCompletion

    client = site.client()
    # `stream=None` as the SDK sends it; the answer's id read from x-request-id.
    answer = client.chat.completions.create(model="chat", messages=HELLO, max_tokens=1, stream=None)
    assert answer._request_id.startswith("req_")
    assert answer.choices[0].message.refusal is None
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=HELLO, max_tokens=1, extra_headers={"x-request-id": "team-7.a"}
    )
    assert raw.headers["x-request-id"] == "team-7.a"
    ChatCompletion.model_validate(raw.http_response.json(), strict=True)
    listed = client.models.with_raw_response.list()
    entries = [Model.model_validate(m, strict=True) for m in listed.http_response.json()["data"]]
    assert all(m.created > 1_700_000_000 for m in entries)
    assert sorted(client.models.list(), key=lambda m: m.created)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=HELLO)
    assert missing.value.request_id.startswith("req_")
    assert f"(request {missing.value.request_id})" in missing.value.message
