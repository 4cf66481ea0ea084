"""The Celery app: beat schedules fleet.tasks.reconcile, a worker runs it (production)."""

import os

from celery import Celery
from celery.signals import worker_process_init

from llmgw.core import tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

app = Celery("llmgw")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The reconciler's passes as spans when OTEL_EXPORTER_OTLP_ENDPOINT is set: here for a
# worker running tasks itself (--pool solo), and again in each process a prefork pool
# forks, whose exporter thread the fork did not copy.
tracing.configure()


@worker_process_init.connect
def _traces_in_the_forked_process(**_) -> None:
    tracing.use(None)
    tracing.configure()
