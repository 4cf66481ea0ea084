"""A wake in production reaches the broker the workers read: the project's Celery app."""

from dataclasses import replace

import pytest
from celery import current_app
from django.conf import settings as django_settings

import fleet.reconciler.wake
import mirror.wake
from fleet.tasks import reconcile
from mirror.tasks import fetch


def test_the_server_makes_the_projects_celery_app_its_current_one():
    # Before, the server's current app was Celery's default one, with no broker: a wake
    # sent from the gateway or the API in production reached no worker.
    import llmgw.asgi  # noqa: F401

    assert current_app.main == "llmgw"
    assert current_app.conf.broker_url == django_settings.CELERY_BROKER_URL


@pytest.mark.parametrize(
    ("module", "task"),
    [(fleet.reconciler.wake, reconcile), (mirror.wake, fetch)],
    ids=["reconciler", "mirror"],
)
def test_a_wake_in_production_sends_the_task_a_worker_runs(module, task, settings, monkeypatch):
    import llmgw.asgi  # noqa: F401

    settings.LLMGW = replace(settings.LLMGW, redis_url="redis://127.0.0.1:6379/0")
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, *a, **kw: sent.append(name))
    module.wake()
    assert sent == [task.name]
