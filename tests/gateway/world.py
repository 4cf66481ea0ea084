"""A world for the gateway's tests in this process: tenancy rows, a node, replicas, and
real sim engines on the test's loop (the fixtures `world` and `gateway` are conftest's)."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from fleet.models import Replica, Shard
from llmgw.core.secrets import engine_key
from llmgw.simengine import ENGINE, SimConfig, start_server
from tenancy.services import org_create, project_create, team_create
from tests.fleet.builders import node_add


async def django_inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"django"})


class World:
    """Rows for a project, a key and models; sim engines serving their replicas."""

    def __init__(self) -> None:
        self.runners = []
        self.engines = {}

    async def engine(self, replica_id: str, model: str, **config):
        runner, port = await start_server(
            SimConfig(
                **{
                    "model": model,
                    "ttft_ms": 0,
                    "tokens_per_sec": 10_000,
                    "api_key": engine_key(settings.SECRET_KEY, replica_id),
                    **config,
                }
            )
        )
        self.runners.append(runner)
        self.engines[replica_id] = runner.app[ENGINE]
        return f"http://127.0.0.1:{port}"

    async def close(self):
        for r in self.runners:
            await r.cleanup()


def _tenancy():
    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    project_create(team="Acme/ml", name="chat", actor="t")
    node_add("gpu-a", now=timezone.now())


def _replica(replica_id: str, model: str, endpoint: str, state: str = "ready") -> None:
    now = timezone.now()
    rep = Replica.objects.create(
        id=replica_id,
        model=model,
        profile="gpu",
        profile_fp="",
        state=state,
        state_since=now,
        created_at=now,
        ready_at=now if state == "ready" else None,
    )
    Shard.objects.create(
        id=f"{replica_id}-0",
        replica=rep,
        node_id="gpu-a",
        rank=0,
        gpu_indices=[0],
        http_port=1,
        endpoint=endpoint,
        state=state,
    )
