"""Celery shims: weights added send `mirror.tasks.fetch`; beat sends it too, for retries."""

from celery import shared_task

from .worker import work_until_idle


@shared_task(name="mirror.tasks.fetch", ignore_result=True)
def fetch() -> None:
    work_until_idle()
