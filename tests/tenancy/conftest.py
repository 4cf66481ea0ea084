"""The tenancy tests' shared fixture: a tenancy tree built from the paths it holds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tenancy.models import ApiKey, Organization, Project, Team
from tenancy.services import api_key_create, org_create, project_create, team_create

Scopes = dict[str, Organization | Team | Project | ApiKey]


def scopes_build(*paths: str, actor: str = "test") -> Scopes:
    """Create what `paths` name, through the services as an operator would: an org
    ("Acme"), a team ("Acme/ml"), a project ("Acme/ml/training") or an API key
    ("Acme/ml/training/ci"); each parent before its children, in the order given, so
    their IDs come out the same every time. Returns each by its path."""
    made: Scopes = {}
    for path in paths:
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            here, name = "/".join(parts[:depth]), parts[depth - 1]
            if here in made:
                continue
            parent = made["/".join(parts[: depth - 1])].pk if depth > 1 else None
            if depth == 1:
                made[here] = org_create(name=name, actor=actor)
            elif depth == 2:
                made[here] = team_create(org=parent, name=name, actor=actor)
            elif depth == 3:
                made[here] = project_create(team=parent, name=name, actor=actor)
            else:
                made[here] = api_key_create(project=parent, name=name, actor=actor)[0]
    return made


@pytest.fixture
def scopes(db) -> Callable[..., Scopes]:
    """Builds a tenancy tree from its paths (scopes_build)."""
    return scopes_build
