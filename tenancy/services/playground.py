"""The console playground's key: a gateway key of the staff user's own project.

The playground (catalog/playground.py) talks to the gateway as any client does, with an
API key, so what it asks is limited, counted and billed as any request is. Each staff
user has a project of their own for it, `Console/playground/<user>`, made when first
needed; its key is named "playground" and made when a session of theirs first opens the
playground. A new one revokes the ones before it, so a user holds one playground key at
a time whatever the number of logins, and `ctl usage` shows what they tried.
"""

from __future__ import annotations

import contextlib

from django.db import transaction

from llmgw.core.errors import Conflict

from ..models import ApiKey, Organization, Project, Team
from . import api_key_create, api_key_revoke, org_create, project_create, team_create

ORG, TEAM, KEY_NAME = "Console", "playground", "playground"


def project_name(user: str) -> str:
    """The user's name as a project's name: '/' cannot be in one, nor digits alone."""
    name = user.strip().replace("/", "-")[:100] or "staff"
    return f"user-{name}"[:100] if name.isdigit() else name


def _project(user: str) -> Project:
    """The user's own project, made (with the organization and team) when missing. Made by
    another request in between, each is found rather than refused (Conflict)."""
    name = project_name(user)
    mine = Project.objects.filter(
        team__org__name__iexact=ORG, team__name__iexact=TEAM, name__iexact=name
    )
    if (found := mine.first()) is not None:
        return found
    with contextlib.suppress(Conflict):
        if not Organization.objects.filter(name__iexact=ORG).exists():
            org_create(name=ORG, actor=user)
    with contextlib.suppress(Conflict):
        if not Team.objects.filter(org__name__iexact=ORG, name__iexact=TEAM).exists():
            team_create(org=ORG, name=TEAM, actor=user)
    with contextlib.suppress(Conflict):
        return project_create(team=f"{ORG}/{TEAM}", name=name, actor=user)
    return mine.get()


def playground_key_usable(key_id: object) -> bool:
    """Whether the key a session holds is still there and not revoked."""
    if not isinstance(key_id, int):
        return False
    return ApiKey.objects.filter(pk=key_id, name=KEY_NAME, revoked_at__isnull=True).exists()


def playground_key_make(*, user: str) -> tuple[ApiKey, str]:
    """A new playground key for `user`'s own project (made when missing), revoking the
    ones before it; with its secret, which only the session that asked keeps."""
    project = _project(user)
    with transaction.atomic():
        for old in project.api_keys.filter(name=KEY_NAME, revoked_at__isnull=True):
            api_key_revoke(key_id=old.pk, actor=user)
        return api_key_create(project=project.pk, name=KEY_NAME, actor=user)
