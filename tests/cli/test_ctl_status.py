"""`llmgw ctl status` (issue 37, item 7): the control plane's own health on one screen,
through the real REST API, and each part's failure said as one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from django.db import connection

from catalog.services import model_add
from fleet.models import Node
from fleet.reconciler.run import reconcile_once
from fleet.selectors.status import needing_attention, workers_health
from llmgw.cli import ctl
from llmgw.cli.ctl_status import render_status
from llmgw.core import clock
from tests.fleet.builders import gpu_model, node_add

pytestmark = pytest.mark.django_db


def ctl_run(capsys, server, *argv: str) -> tuple[int, str, str]:
    code = ctl.main(list(argv), transport=server)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_status_says_each_part_and_the_models_that_need_attention(
    capsys, server, no_settle, settings
):
    # As the embedded control plane says it, whichever mode the tests run in.
    settings.LLMGW = replace(settings.LLMGW, redis_url=None)
    node_add("gpu-a", now=clock.now())  # two H100s
    node_add("gpu-b", now=clock.now())
    Node.objects.filter(pk="gpu-b").update(draining=True, cordoned=True)
    # A GPU class no node has: it cannot be placed.
    model_add(data=gpu_model("llama-405b", gpu_class="b200-192g"), actor="test")
    reconcile_once(now=clock.now())

    code, out, err = ctl_run(capsys, server, "status")

    assert (code, err) == (0, "")
    lines = out.splitlines()
    said = dict(line.split(":", 1) for line in lines if not line.startswith("  "))
    said = {k: v.strip() for k, v in said.items()}
    assert said["database"].startswith(f"ok, {connection.vendor} (")
    assert said["redis"] == "not used: embedded mode keeps its layers in memory"
    assert said["reconciler"].startswith("ok, last pass ")
    assert said["workers"] == "not used: the reconciler runs inside llmgw serve"
    assert said["nodes"] == "2: 2 ready, 0 unreachable, 0 lost (1 draining)"
    assert said["attention"] == "1 model(s)"
    assert lines[-1].startswith("  llama-405b (unplaceable): ")
    assert len(lines) <= 24, "one screen"

    code, out, _ = ctl_run(capsys, server, "status", "--json")
    answer = json.loads(out)
    assert set(answer) == {"database", "redis", "reconciler", "workers", "nodes", "attention"}
    assert answer["database"]["ok"] is True and answer["redis"]["ok"] is None
    assert [m["name"] for m in answer["attention"]] == ["llama-405b"]


def test_a_failing_part_reads_as_failing():
    said = render_status(
        {
            "database": {"ok": True, "ms": 0.4, "said": "postgresql"},
            "redis": {"ok": False, "ms": None, "said": "no answer: Connection refused"},
            "reconciler": {"warning": "no reconciler pass for 95 s (every 5 s expected)"},
            "workers": {"ok": False, "names": [], "said": "no Celery worker answered within 1 s"},
            "nodes": {"ready": 0, "unreachable": 1, "lost": 2},
            "attention": [],
        }
    )
    assert said.splitlines() == [
        "database:   ok, postgresql (0.4 ms)",
        "redis:      FAILING: no answer: Connection refused",
        "reconciler: FAILING: no reconciler pass for 95 s (every 5 s expected)",
        "workers:    FAILING: no Celery worker answered within 1 s",
        "nodes:      3: 0 ready, 1 unreachable, 2 lost",
        "attention:  nothing",
    ]


def test_a_failing_model_is_named_with_the_engines_line_that_says_why_once():
    models = [
        {"name": "ok-model", "status": "ready", "reason": ""},
        {
            "name": "chat",
            "status": "failing",
            "reason": "CUDA out of memory; 3 failures, next try in 40s",
            "last_failure": {
                "said": "CUDA out of memory",
                "detail": 'CUDA out of memory\n  File "worker.py", line 9, in run',
            },
        },
        {"name": "big", "status": "parked", "parked": True, "reason": "parked after 5"},
        {"name": "old", "status": "waiting", "reason": "", "last_failure": {"said": "bad"}},
    ]
    assert needing_attention(models) == [
        {
            "name": "chat",
            "status": "failing",
            "reason": "CUDA out of memory; 3 failures, next try in 40s",
        },
        {"name": "big", "status": "parked", "reason": "parked after 5"},
        {"name": "old", "status": "waiting", "reason": "bad"},
    ]


def test_no_worker_answering_in_production_is_a_failure(settings, monkeypatch):
    from dataclasses import replace

    from llmgw.celery import app

    settings.LLMGW = replace(settings.LLMGW, redis_url="redis://127.0.0.1:1/0")
    monkeypatch.setattr(app.control, "ping", lambda timeout: [])
    assert workers_health() == {
        "ok": False,
        "names": [],
        "said": "no Celery worker answered within 1 s",
    }
    monkeypatch.setattr(app.control, "ping", lambda timeout: [{"celery@a": {"ok": "pong"}}])
    assert workers_health()["names"] == ["celery@a"]
