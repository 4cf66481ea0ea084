"""Celery shims: beat schedules `fleet.tasks.reconcile`, a worker runs it."""

from celery import shared_task

from .reconciler.run import reconcile_once


@shared_task(name="fleet.tasks.reconcile", ignore_result=True)
def reconcile() -> None:
    reconcile_once()
