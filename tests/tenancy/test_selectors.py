"""The tenancy tree and the quota policy as the reconciler reads them: a few queries, always."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from llmgw.core.errors import Invalid
from tenancy.models import CapacityQuota, Organization, Project, Team
from tenancy.quota import Amount, Holding, Resources
from tenancy.selectors import quota_policy_load, scope_find, scope_tree

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme():
    org = Organization.objects.create(name="Acme")
    ml = Team.objects.create(org=org, name="ml")
    training = Project.objects.create(team=ml, name="training")
    return {"org": f"org:{org.pk}", "team": f"team:{ml.pk}", "project": f"project:{training.pk}"}


def test_the_tree_names_each_scope_by_path_and_lists_its_parents_nearest_first(acme):
    tree = scope_tree()

    assert tree.names == {
        acme["org"]: "org:Acme",
        acme["team"]: "team:Acme/ml",
        acme["project"]: "project:Acme/ml/training",
    }
    assert tree.parents == {
        acme["org"]: (),
        acme["team"]: (acme["org"],),
        acme["project"]: (acme["team"], acme["org"]),
    }
    assert tree.display(acme["project"]) == "Acme / ml / training"


def test_the_tree_takes_three_queries_however_many_scopes_there_are(acme):
    org = Organization.objects.get()
    for i in range(20):
        team = Team.objects.create(org=org, name=f"t{i}")
        Project.objects.create(team=team, name="p")

    with CaptureQueriesContext(connection) as queries:
        tree = scope_tree()

    assert len(queries) == 3
    assert len(tree.names) == 1 + 21 + 21


def test_the_policy_holds_every_quota_with_the_tree_in_four_queries(acme):
    CapacityQuota.objects.create(scope=acme["org"], limit_gpus=16, updated_by="ops")
    CapacityQuota.objects.create(scope=acme["team"], guarantee_gpus=8, guarantee_memory_gb=0)

    with CaptureQueriesContext(connection) as queries:
        policy = quota_policy_load()

    assert len(queries) == 4
    assert policy.quotas[acme["org"]].limit == Resources(gpus=16)
    assert policy.quotas[acme["org"]].updated_by == "ops"
    assert policy.quotas[acme["team"]].guarantee == Resources(gpus=8, memory_gb=0)
    assert policy.chain(acme["project"]) == (acme["project"], acme["team"], acme["org"])
    since = CapacityQuota.objects.first().updated_at
    held = Holding("r1", acme["project"], Amount(gpus=18), since)
    assert policy.at_limit(acme["project"], policy.usage([held]), Amount()) == (
        "org:Acme is at its capacity limit (18 GPUs of 16)"
    )


def test_a_scope_is_found_by_name_or_refused_as_bad_input(acme):
    assert scope_find("project:training") == acme["project"]
    with pytest.raises(Invalid, match='there is no team "web"'):
        scope_find("team:web")


def test_a_scope_is_named_by_its_path_in_one_query(django_assert_num_queries):
    from tenancy.selectors import scope_named
    from tenancy.services import org_create, project_create, team_create

    org = org_create(name="Acme", actor="t")
    team = team_create(org="Acme", name="ml", actor="t")
    project = project_create(team="Acme/ml", name="training", actor="t")
    with django_assert_num_queries(1):
        assert scope_named(f"project:{project.pk}") == "project:Acme/ml/training"
    assert scope_named(f"team:{team.pk}") == "team:Acme/ml"
    assert scope_named(f"org:{org.pk}") == "org:Acme"
    # A scope removed since, or not a key: said as it was given.
    assert scope_named("team:999") == "team:999"
    assert scope_named("shared") == "shared"
