"""No ghost replicas, over real rows: after a restart, what its agent does not confirm within
the unreachable window is not routed to; its agent heard again, it is."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.models import Node, Replica
from fleet.reconciler.run import reconcile_once
from fleet.services import replica_unhealthy_mark
from llmgw.core import clock
from llmgw.gateway.tables import Loader

from .builders import gpu_model, model_added, node_add
from .test_reconciler import heard, ready

pytestmark = pytest.mark.django_db


def routed(loader: Loader) -> list[str]:
    loader.refresh()
    return [u.replica_id for u in loader.tables.upstreams.get("llama", ())]


def test_a_replica_whose_agent_died_while_the_server_was_down_stops_being_routed(no_settle):
    t0 = clock.now()
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=t0)
    reconcile_once(now=t0)
    replica = Replica.objects.get()
    ready(replica, t0)
    for shard in replica.shards.all():
        shard.endpoint = "http://127.0.0.1:9"
        shard.save()
    loader = Loader()
    assert routed(loader) == [replica.id]

    # llmgw serve was down ten minutes; the agent and its engine died meanwhile.
    restart = t0 + timedelta(minutes=10)
    reconcile_once(now=restart, fresh_start=True)
    reconcile_once(now=restart + timedelta(seconds=10))
    assert Node.objects.get().state == Node.READY
    assert routed(loader) == [replica.id]  # within the window, nothing says otherwise yet

    result = reconcile_once(now=restart + timedelta(seconds=15))

    assert Node.objects.get().state == Node.UNREACHABLE
    marked = Replica.objects.get()
    assert (marked.state, marked.unhealthy_reason) == (
        "ready",
        "node gpu-a not heard from for 15 s",
    )
    assert (
        f"replica {replica.id} is not routed to: node gpu-a not heard from for 15 s"
        in (result["events"])
    )
    assert routed(loader) == []

    # Its agent comes back and says it still runs the shard.
    heard("gpu-a", restart + timedelta(seconds=20))
    reconcile_once(now=restart + timedelta(seconds=20))
    assert Replica.objects.get().unhealthy_since is None
    assert routed(loader) == [replica.id]


def test_a_gateways_mark_lasts_until_the_agent_is_heard_after_it(no_settle):
    t0 = clock.now()
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=t0)
    reconcile_once(now=t0)
    replica = Replica.objects.get()
    ready(replica, t0)
    heard("gpu-a", t0 + timedelta(seconds=1))

    assert replica_unhealthy_mark(
        replica_id=replica.id, reason="refused", now=t0 + timedelta(seconds=2)
    )
    assert not replica_unhealthy_mark(
        replica_id=replica.id, reason="again", now=t0 + timedelta(seconds=2)
    )
    reconcile_once(now=t0 + timedelta(seconds=3))
    assert Replica.objects.get().unhealthy_reason == "refused"

    heard("gpu-a", t0 + timedelta(seconds=4))
    reconcile_once(now=t0 + timedelta(seconds=5))
    assert Replica.objects.get().unhealthy_since is None
