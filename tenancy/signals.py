"""Bump the quota policy's revision whenever what the policy is built from changes: a
quota, or the tree it sits in (names and parents). Through signals, so admin's forms and
deletes (cascades included) count as much as the services do."""

from __future__ import annotations

from django.db.models import F
from django.db.models.signals import post_delete, post_save

from .models import CapacityQuota, Organization, PolicyRevision, Project, Team


def policy_revision_bump(**_) -> None:
    """One more change to the policy, in the caller's transaction."""
    if not PolicyRevision.objects.filter(pk=1).update(value=F("value") + 1):
        PolicyRevision.objects.get_or_create(pk=1, defaults={"value": 1})


def connect() -> None:
    for sender in (CapacityQuota, Organization, Team, Project):
        uid = f"policy-revision-{sender.__name__}"
        post_save.connect(policy_revision_bump, sender=sender, dispatch_uid=f"{uid}-save")
        post_delete.connect(policy_revision_bump, sender=sender, dispatch_uid=f"{uid}-delete")
