"""An engine's failure kept with its model: from the agent's shard_status through a pass to the
API's ModelView and explain."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from fleet.models import Lease, ModelState, Replica
from fleet.reconciler.run import reconcile_once
from fleet.services import model_retry
from llmgw.core import clock

from .builders import gpu_model, model_added, register_frame
from .conftest import answer, barrier, in_db

pytestmark = pytest.mark.django_db(transaction=True)

TAIL = "llama_model_load: loading model\nerror: failed to open GGUF file '/m/llama.gguf'"


async def fail_first_start(agents, detail: str, exit_code: int | None = 1):
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)
    await comm.send_json_to(
        {
            "type": "shard_status",
            "shard_id": start["shard_id"],
            "state": "failed",
            "detail": detail,
            "exit_code": exit_code,
        }
    )
    await barrier(comm)
    return comm, start


def api_get(token: str, path: str):
    return Client().get(path, headers={"Authorization": f"Bearer {token}"}).json()


async def test_the_engines_last_lines_are_kept_with_the_model_and_shown(
    agents, no_settle, admin_token
):
    _, start = await fail_first_start(agents, f"The engine exited with code 1.\n{TAIL}")
    replica = await in_db(lambda: Replica.objects.get())
    # The replica's reason is one line: the log's line that says why, not the whole log.
    assert replica.reason == (
        f"shard {start['shard_id']} on node gpu-a failed (exit code 1): "
        "error: failed to open GGUF file '/m/llama.gguf'"
    )

    await in_db(reconcile_once)

    state = await in_db(lambda: ModelState.objects.get(pk="llama"))
    assert state.failures == 1
    failure = state.last_failure
    assert (failure["replica"], failure["node"], failure["exit_code"]) == (
        start["replica_id"],
        "gpu-a",
        1,
    )
    assert failure["detail"] == f"The engine exited with code 1.\n{TAIL}"
    view = await in_db(lambda: api_get(admin_token, "/api/v1/models/llama"))
    assert view["last_failure"]["detail"].endswith("failed to open GGUF file '/m/llama.gguf'")
    assert view["last_failure"]["replica"] == start["replica_id"]
    assert view["last_failure"]["said"] == "error: failed to open GGUF file '/m/llama.gguf'"
    assert view["last_failure"]["exit"] == "exit code 1"
    # Failing, with why and its next try, not "waiting".
    assert view["status"] == "failing"
    assert view["reason"].startswith(
        "error: failed to open GGUF file '/m/llama.gguf'; 1 failure, next try in "
    ), view["reason"]
    explain = await in_db(lambda: api_get(admin_token, "/api/v1/models/llama/explain"))
    assert explain["reason"] == view["reason"]
    reasons = [r for e in explain["explanation"] for r in e.get("reasons", ())]
    assert reasons[0].startswith("backing off after 1 failures"), reasons
    assert explain["last_failure"] == view["last_failure"]


async def test_a_retry_puts_the_failure_behind_the_model(agents, no_settle, admin_token):
    await fail_first_start(agents, f"The engine exited with code 1.\n{TAIL}")
    await in_db(reconcile_once)

    await in_db(lambda: model_retry(name="llama", actor="ops"))

    view = await in_db(lambda: api_get(admin_token, "/api/v1/models/llama"))
    assert (view["failures"], view["last_failure"]) == (0, None)


async def test_a_model_given_up_on_at_startup_gets_the_log_its_agent_sends_at_the_stop(
    agents, no_settle, admin_token
):
    data = gpu_model("llama")
    data["profiles"][0]["startup_timeout"] = 60
    await in_db(lambda: model_added(data))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)

    # Started 61 s ago, as far as the control plane knows, and never ready.
    began = clock.now() - timedelta(seconds=61)
    await in_db(lambda: Replica.objects.update(created_at=began))
    await in_db(lambda: Lease.objects.update(settle_until=began, settled_from=began))
    await in_db(reconcile_once)
    stop = await answer(comm)
    assert stop["type"] == "stop_shard"
    await comm.send_json_to(
        {
            "type": "shard_status",
            "shard_id": start["shard_id"],
            "state": "stopped",
            "detail": f"Stopped before the engine answered /health.\n{TAIL}",
            "exit_code": -15,
        }
    )
    await barrier(comm)

    failure = (await in_db(lambda: ModelState.objects.get(pk="llama"))).last_failure
    assert failure["detail"] == (
        f"replica {start['replica_id']} did not become ready within 1m0s\n{TAIL}"
    )
    assert failure["node"] == "gpu-a"


OUTGROWN = (
    "llama-server used 11.2 GB of its 2 GB reservation; stopped. Raise the profile's memory "
    "or lower --ctx-size."
)


@pytest.mark.parametrize(("stopped_for", "counted"), [("memory", 1), (None, 0)])
async def test_a_ready_replica_stopped_for_its_memory_counts_as_a_failure(
    agents, no_settle, admin_token, stopped_for, counted
):
    """A crash after serving is replaced without counting; one stopped for outgrowing its
    reservation counts, as it would grow again started as it is."""
    await in_db(lambda: model_added(gpu_model("llama")))
    comm = await agents.registered(register_frame("gpu-a"))
    await in_db(reconcile_once)
    start = await answer(comm)
    endpoint = f"http://10.0.0.7:{start['http_port']}"
    ready = {"type": "shard_status", "shard_id": start["shard_id"], "state": "ready"}
    await comm.send_json_to(ready | {"endpoint": endpoint})
    await barrier(comm)
    failed = {
        "type": "shard_status",
        "shard_id": start["shard_id"],
        "state": "failed",
        "detail": f"{OUTGROWN}\nllama_init_from_model: n_ctx = 4000000",
        "exit_code": -15,
    }
    await comm.send_json_to(failed | ({"stopped_for": stopped_for} if stopped_for else {}))
    await barrier(comm)
    replica = await in_db(lambda: Replica.objects.get())
    assert replica.reason == (
        f"shard {start['shard_id']} on node gpu-a failed (stopped by SIGTERM): {OUTGROWN}"
    )

    await in_db(reconcile_once)

    state = await in_db(lambda: ModelState.objects.get(pk="llama"))
    assert state.failures == counted
    if counted:
        view = await in_db(lambda: api_get(admin_token, "/api/v1/models/llama"))
        assert view["last_failure"]["said"] == OUTGROWN
        assert view["status"] == "failing"
        assert view["reason"].startswith(f"{OUTGROWN}; 1 failure, next try in ")
