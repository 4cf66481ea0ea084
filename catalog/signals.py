"""Bump the measurements' revision on every save or delete of a measurement (a model's
removal deletes its own), so the reconciler reads them again only when they changed."""

from __future__ import annotations

from django.db.models import F
from django.db.models.signals import post_delete, post_save

from .models import Measurement, Revision


def measurements_revision_bump(**_) -> None:
    """One more change to the measurements, in the caller's transaction."""
    if not Revision.objects.filter(pk=1).update(measurements=F("measurements") + 1):
        Revision.objects.get_or_create(pk=1, defaults={"measurements": 1})


def connect() -> None:
    uid = "measurements-revision"
    post_save.connect(measurements_revision_bump, sender=Measurement, dispatch_uid=f"{uid}-save")
    post_delete.connect(
        measurements_revision_bump, sender=Measurement, dispatch_uid=f"{uid}-delete"
    )
