"""A pass over real rows looks again only at the models whose rows changed (fleet/domain/quiet.py)."""

from __future__ import annotations

import pytest

import fleet.domain.reconcile as reconcile
from fleet.domain.quiet import QuietModels
from fleet.models import Replica
from fleet.reconciler import run as reconciler
from fleet.reconciler.run import reconcile_once

from .builders import T0, at, gpu_model, model_added, node_add
from .test_reconciler import heard, ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def steps(monkeypatch):
    """The models whose step each pass runs, in a fresh set of kept quiet models."""
    monkeypatch.setattr(reconciler, "QUIET", QuietModels())
    ran: list[str] = []
    real = reconcile._reconcile_model
    monkeypatch.setattr(
        reconcile, "_reconcile_model", lambda m, *a: ran.append(m.name) or real(m, *a)
    )
    return ran


def test_a_pass_with_nothing_changed_runs_no_models_step(no_settle, steps):
    for name in ("llama", "qwen", "mistral"):
        model_added(gpu_model(name))
    node_add("gpu-a", now=T0)
    node_add("gpu-b", now=T0)
    reconcile_once(now=T0)
    for replica in Replica.objects.all():
        ready(replica, T0)
    for second in (5, 10):  # the replicas ready, then their states kept
        heard("gpu-a", at(second))
        heard("gpu-b", at(second))
        reconcile_once(now=at(second))
    steps.clear()

    heard("gpu-a", at(15))
    heard("gpu-b", at(15))
    result = reconcile_once(now=at(15))

    assert (result["ran"], result["events"]) == (True, [])
    assert steps == []
    assert reconciler.QUIET.skipped == 3


def test_a_replica_failing_makes_only_its_model_looked_at_again(no_settle, steps):
    for name in ("llama", "qwen"):
        model_added(gpu_model(name))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    for replica in Replica.objects.all():
        ready(replica, T0)
    for second in (5, 10):
        heard("gpu-a", at(second))
        reconcile_once(now=at(second))
    steps.clear()

    Replica.objects.filter(model="qwen").update(state="failed", reason="engine exited")
    heard("gpu-a", at(15))
    result = reconcile_once(now=at(15))

    assert steps == ["qwen"]
    assert any("of qwen failed: engine exited" in line for line in result["events"])
