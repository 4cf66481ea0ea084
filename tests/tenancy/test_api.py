"""The tenancy tree and capacity quotas over the REST API."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from llmgw.core import clock
from tenancy.models import AuditEvent, CapacityQuota, Organization, Project, Team
from tests.fleet.builders import gpu_model, node_add
from tests.helpers import detail

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(api):
    """Acme with teams ml and web, Scania with another ml, and Acme/ml/training."""
    acme = api.call("POST", "/orgs", {"name": "Acme"}).json()
    scania = api.call("POST", "/orgs", {"name": "Scania"}).json()
    ml = api.call("POST", "/teams", {"org": "Acme", "name": "ml"}).json()
    web = api.call("POST", "/teams", {"org": acme["id"], "name": "web"}).json()
    scania_ml = api.call("POST", "/teams", {"org": "scania", "name": "ml"}).json()
    training = api.call("POST", "/projects", {"team": "Acme/ml", "name": "training"}).json()
    return {
        "acme": acme["id"],
        "scania": scania["id"],
        "ml": ml["id"],
        "web": web["id"],
        "scania_ml": scania_ml["id"],
        "training": training["id"],
    }


def nothing_written() -> tuple:
    return (
        Organization.objects.count(),
        Team.objects.count(),
        Project.objects.count(),
        CapacityQuota.objects.count(),
        AuditEvent.objects.count(),
    )


# The tree


def test_an_organization_team_and_project_are_added_and_listed_with_their_paths(api, tree):
    orgs = api.call("GET", "/orgs").json()
    teams = api.call("GET", "/teams").json()
    projects = api.call("GET", "/projects").json()

    assert orgs == [{"id": tree["acme"], "name": "Acme"}, {"id": tree["scania"], "name": "Scania"}]
    assert teams == [
        {"id": tree["ml"], "name": "ml", "org": "Acme", "path": "Acme/ml"},
        {"id": tree["web"], "name": "web", "org": "Acme", "path": "Acme/web"},
        {"id": tree["scania_ml"], "name": "ml", "org": "Scania", "path": "Scania/ml"},
    ]
    assert projects == [
        {"id": tree["training"], "name": "training", "team": "Acme/ml", "path": "Acme/ml/training"}
    ]


def test_adding_answers_201_and_is_audited_with_the_actor(api):
    response = api.call("POST", "/orgs", {"name": "  Acme "}, HTTP_X_LLMGW_ACTOR="dan")

    assert response.status_code == 201
    assert response.json() == {"id": Organization.objects.get().pk, "name": "Acme"}
    event = AuditEvent.objects.get()
    key = f"org:{Organization.objects.get().pk}"
    assert (event.actor, event.action, event.target) == ("dan", "org.add", key)


def test_a_team_is_added_to_an_org_named_by_id_or_with_its_kind(api, tree):
    by_id = api.call("POST", "/teams", {"org": str(tree["scania"]), "name": "ops"})
    by_scope = api.call("POST", "/teams", {"org": "org:Acme", "name": "ops"})

    assert (by_id.status_code, by_id.json()["path"]) == (201, "Scania/ops")
    assert (by_scope.status_code, by_scope.json()["path"]) == (201, "Acme/ops")


def test_a_project_is_added_to_a_team_named_by_id(api, tree):
    response = api.call("POST", "/projects", {"team": tree["scania_ml"], "name": "eval"})

    assert response.status_code == 201
    assert response.json()["path"] == "Scania/ml/eval"


@pytest.mark.parametrize(
    "path, body, says",
    [
        ("/orgs", {"name": "acme"}, "there is already an organization named Acme."),
        ("/teams", {"org": "Acme", "name": "ML"}, "there is already a team in Acme named ml."),
        (
            "/projects",
            {"team": "Acme/ml", "name": "Training"},
            "there is already a project in Acme/ml named training.",
        ),
    ],
)
def test_a_name_taken_at_its_level_is_a_conflict_whatever_its_case(api, tree, path, body, says):
    before = nothing_written()

    response = api.call("POST", path, body)

    assert response.status_code == 409
    assert detail(response) == says
    assert nothing_written() == before


def test_the_same_name_under_another_parent_is_fine(api, tree):
    response = api.call("POST", "/teams", {"org": "Scania", "name": "web"})

    assert response.status_code == 201


BAD_TREE_BODIES = [
    ("/orgs", {"name": ""}, "An organization needs a name."),
    ("/orgs", {"name": "   "}, "An organization needs a name."),
    ("/orgs", {"name": "x" * 101}, "An organization's name is at most 100 characters long."),
    ("/orgs", {"name": "a\x00b"}, "control characters such as NUL"),
    ("/orgs", {"name": "a/b"}, "may not contain '/'"),
    ("/orgs", {"name": "2024"}, "digits alone"),
    ("/orgs", {"name": 5}, "name"),
    ("/orgs", {}, "name"),
    ("/orgs", {"name": "Acme", "colour": "red"}, "colour"),
    ("/orgs", [], ""),
    ("/teams", {"org": "Nope", "name": "ml"}, 'there is no org "Nope"'),
    ("/teams", {"org": "", "name": "ml"}, "Give the org by its name or ID."),
    ("/teams", {"org": "Acme", "name": ""}, "A team needs a name."),
    ("/teams", {"name": "ml"}, "org"),
    ("/teams", {"org": True, "name": "ml"}, "org"),
    ("/projects", {"team": "ml", "name": "x"}, '"ml" could be any of 2 teams; give its ID'),
    ("/projects", {"team": "Acme/nope", "name": "x"}, 'there is no team "Acme/nope"'),
    ("/projects", {"team": "Acme/ml", "name": "x" * 101}, "at most 100 characters"),
]


@pytest.mark.parametrize("path, body, says", BAD_TREE_BODIES)
def test_a_bad_name_or_parent_is_400_and_nothing_is_written(api, tree, path, body, says):
    before = nothing_written()

    response = api.call("POST", path, body)

    assert response.status_code == 400
    assert says in detail(response)
    assert nothing_written() == before


def test_an_org_team_or_project_is_renamed_by_path_or_id_and_audited(api, tree):
    team = api.call("PATCH", "/teams/Acme/ml", {"name": "research"}, HTTP_X_LLMGW_ACTOR="dan")
    project = api.call("PATCH", f"/projects/{tree['training']}", {"name": "train"})
    org = api.call("PATCH", "/orgs/Scania", {"name": "Scania AB"})

    assert (team.status_code, team.json()["path"]) == (200, "Acme/research")
    assert project.json()["path"] == "Acme/research/train"
    assert org.json() == {"id": tree["scania"], "name": "Scania AB"}
    assert api.call("GET", "/teams").json()[2]["path"] == "Scania AB/ml"
    event = AuditEvent.objects.filter(action="team.rename").get()
    assert (event.actor, event.target, event.detail) == (
        "dan",
        f"team:{tree['ml']}",
        {"name": "research", "was": "ml"},
    )
    # The same name again is no change, and says nothing.
    before = nothing_written()
    assert api.call("PATCH", "/orgs/Acme", {"name": "Acme"}).status_code == 200
    assert nothing_written() == before


@pytest.mark.parametrize(
    "path, body, status, says",
    [
        ("/orgs/Acme", {"name": "scania"}, 409, "there is already an organization named Scania."),
        ("/teams/Acme/ml", {"name": "WEB"}, 409, "there is already a team in Acme named web."),
        ("/teams/Acme/nope", {"name": "x"}, 400, 'there is no team "Acme/nope"'),
        ("/teams/ml", {"name": "x"}, 400, '"ml" could be any of 2 teams; give its ID'),
        ("/projects/Acme/ml/training", {"name": "a/b"}, 400, "may not contain '/'"),
        ("/orgs/Acme", {"name": ""}, 400, "An organization needs a name."),
        ("/orgs/Acme", {"name": 5}, 400, "name"),
        ("/orgs/Acme", {}, 400, "name"),
        ("/orgs/Acme", {"name": "x", "colour": "red"}, 400, "colour"),
    ],
)
def test_a_bad_rename_is_refused_and_nothing_is_written(api, tree, path, body, status, says):
    before = nothing_written()

    response = api.call("PATCH", path, body)

    assert response.status_code == status, response.content
    assert says in detail(response)
    assert nothing_written() == before


def test_listing_the_tree_takes_one_query_whatever_its_size(api, tree):
    for i in range(5):
        api.call("POST", "/teams", {"org": "Acme", "name": f"t{i}"})
        api.call("POST", "/projects", {"team": f"Acme/t{i}", "name": "p"})
    for path in ("/orgs", "/teams", "/projects"):
        api.call("GET", path)  # the token lookup's own queries, once
        with CaptureQueriesContext(connection) as queries:
            assert api.call("GET", path).status_code == 200
        mine = [q for q in queries.captured_queries if "tenancy_token" not in q["sql"]]
        assert len(mine) == 1, (path, [q["sql"] for q in mine])


# Quotas


class TestAQuotaIsSetListedAndCleared:
    def test_set_listed_and_cleared(self, api, tree):
        body = {"scope": "team:Acme/ml", "guarantee": {"gpus": 8}, "limit": {"gpus": 16}}

        response = api.call("PUT", "/quotas", body, HTTP_X_LLMGW_ACTOR="ops")

        assert response.status_code == 200
        assert response.json() == {"scope": f"team:{tree['ml']}"}
        row = CapacityQuota.objects.get()
        assert (row.scope, row.guarantee_gpus, row.limit_gpus, row.updated_by) == (
            f"team:{tree['ml']}",
            8,
            16,
            "ops",
        )

        views = api.call("GET", "/quotas").json()
        assert len(views) == 1
        assert views[0]["name"] == "Acme / ml"

        empty = api.call("PUT", "/quotas", {"scope": "team:Acme/ml"})
        assert empty.status_code == 400
        assert detail(empty) == "a quota needs a guarantee or a limit; to remove one, DELETE it"

        cleared = api.call("DELETE", "/quotas/team:Acme%2Fml")
        assert cleared.status_code == 200
        assert cleared.json() == {"removed": f"team:{tree['ml']}"}
        assert CapacityQuota.objects.count() == 0


def test_the_quota_list_shows_the_governed_figures_and_what_the_scope_holds(api, tree):
    api.call("PUT", "/quotas", {"scope": "org:Acme", "limit": {"gpus": 4, "memory_gb": 0}})
    api.call("PUT", "/quotas", {"scope": f"team:{tree['ml']}", "guarantee": {"cpu_cores": 8}})

    views = api.call("GET", "/quotas").json()

    assert [v["name"] for v in views] == ["Acme", "Acme / ml"]
    acme, ml = views
    assert acme["scope"] == f"org:{tree['acme']}"
    assert (acme["guarantee"], acme["limit"]) == ({}, {"gpus": 4, "memory_gb": 0})
    assert (ml["guarantee"], ml["limit"]) == ({"cpu_cores": 8}, {})
    assert acme["holds"] == {"gpus": 0, "cpu_cores": 0, "memory_gb": 0.0}
    assert ml["updated_by"] == "ops"
    assert ml["updated_at"]


def test_what_a_teams_replicas_hold_counts_for_it_and_its_org(api, tree, no_settle):
    node_add("gpu-a", now=clock.now())
    owner = f"team:{tree['ml']}"
    model = gpu_model("llama", owner=owner, scaling={"min": 2})
    assert api.call("POST", "/models", model).status_code == 201
    api.call("PUT", "/quotas", {"scope": owner, "guarantee": {"gpus": 1}})
    api.call("PUT", "/quotas", {"scope": "org:Acme", "limit": {"gpus": 8}})
    api.call("PUT", "/quotas", {"scope": "team:Scania/ml", "limit": {"gpus": 8}})
    api.call("POST", "/reconcile")

    holds = {v["name"]: v["holds"]["gpus"] for v in api.call("GET", "/quotas").json()}

    assert holds == {"Acme": 2, "Acme / ml": 2, "Scania / ml": 0}


def test_setting_a_quota_again_replaces_it_whole(api, tree):
    api.call(
        "PUT", "/quotas", {"scope": "org:Acme", "guarantee": {"gpus": 8}, "limit": {"gpus": 9}}
    )

    api.call("PUT", "/quotas", {"scope": f"org:{tree['acme']}", "limit": {"memory_gb": 64}})

    row = CapacityQuota.objects.get()
    assert (row.guarantee_gpus, row.limit_gpus, row.limit_memory_gb) == (None, None, 64)
    assert AuditEvent.objects.filter(action="quota.set").count() == 2


def test_setting_a_quota_is_audited_and_logged_with_what_changed(api, tree, caplog):
    with caplog.at_level(logging.INFO, logger="llmgw.tenancy"):
        api.call(
            "PUT",
            "/quotas",
            {"scope": "team:web", "guarantee": {"gpus": 2}},
            HTTP_X_LLMGW_ACTOR="dan",
        )
        api.call("DELETE", "/quotas/team:web", HTTP_X_LLMGW_ACTOR="dan")

    key = f"team:{tree['web']}"
    events = list(AuditEvent.objects.filter(action__startswith="quota.").order_by("pk"))
    assert [(e.action, e.actor, e.target) for e in events] == [
        ("quota.set", "dan", key),
        ("quota.clear", "dan", key),
    ]
    assert events[0].detail == {"guarantee": {"gpus": 2}, "limit": {}}
    lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.tenancy"]
    assert f"quota of team:Acme/web ({key}) set by dan: guarantee gpus 2; limit none" in lines[-2]
    assert "(was no quota)" in lines[-2]
    assert lines[-1].startswith(f"quota of team:Acme/web ({key}) removed by dan")


BAD_QUOTAS = [
    ({"scope": "team:ml", "limit": {"gpus": 1}}, '"ml" could be any of 2 teams; give its ID'),
    ({"scope": "team:Acme/nope", "limit": {"gpus": 1}}, 'there is no team "Acme/nope"'),
    ({"scope": "group:Acme", "limit": {"gpus": 1}}, "is not org:NAME"),
    ({"scope": "org:Acme"}, "a quota needs a guarantee or a limit; to remove one, DELETE it"),
    ({"scope": "org:Acme", "guarantee": {}, "limit": {}}, "a quota needs a guarantee or a limit"),
    ({"scope": "org:Acme", "guarantee": {"gpus": -1}}, "a quota cannot be negative"),
    ({"scope": "org:Acme", "limit": {"memory_gb": -5}}, "a quota cannot be negative"),
    ({"scope": "org:Acme", "limit": {"gpus": 1.5}}, "gpus"),
    ({"scope": "org:Acme", "limit": {"gpus": "2"}}, "gpus"),
    ({"scope": "org:Acme", "limit": {"gpus": True}}, "gpus"),
    ({"scope": "org:Acme", "limit": {"gpus": 10**12}}, "too large"),
    ({"scope": "org:Acme", "limit": {"tpus": 1}}, "tpus"),
    ({"scope": "org:Acme", "limits": {"gpus": 1}}, "limits"),
    ({"scope": "org:Acme", "guarantee": {"gpus": 9}, "limit": {"gpus": 8}}, "above its limit"),
    ({"limit": {"gpus": 1}}, "scope"),
    ({"scope": 7, "limit": {"gpus": 1}}, "scope"),
    ("[]", ""),
    ('{"scope": "org:Acme", "limit": {"gpus": NaN}}', "gpus"),
]


@pytest.mark.parametrize("body, says", BAD_QUOTAS)
def test_a_bad_quota_is_400_and_nothing_changes(api, tree, body, says):
    api.call("PUT", "/quotas", {"scope": "org:Acme", "limit": {"gpus": 4}})
    before = (nothing_written(), list(CapacityQuota.objects.values()))

    response = api.call("PUT", "/quotas", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert (nothing_written(), list(CapacityQuota.objects.values())) == before


def test_clearing_a_scope_with_no_quota_is_404(api, tree):
    response = api.call("DELETE", "/quotas/team:Acme%2Fweb")

    assert response.status_code == 404
    assert detail(response) == "team:Acme/web has no capacity quota."


@pytest.mark.parametrize(
    "scope, says",
    [("team:ml", "could be any of 2"), ("group:x", "is not org:NAME"), ("%00", "is not org:NAME")],
)
def test_clearing_a_scope_that_names_none_is_400(api, tree, scope, says):
    api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "limit": {"gpus": 1}})

    response = api.call("DELETE", f"/quotas/{scope}")

    assert response.status_code == 400
    assert says in detail(response)
    assert CapacityQuota.objects.count() == 1


def test_a_quota_is_cleared_by_id_or_by_a_path_with_its_slashes(api, tree):
    api.call("PUT", "/quotas", {"scope": "team:Acme/ml", "limit": {"gpus": 1}})
    api.call("PUT", "/quotas", {"scope": "project:Acme/ml/training", "limit": {"gpus": 1}})

    by_id = api.call("DELETE", f"/quotas/team:{tree['ml']}")
    by_path = api.call("DELETE", "/quotas/project:Acme/ml/training")

    assert (by_id.status_code, by_path.status_code) == (200, 200)
    assert CapacityQuota.objects.count() == 0


def test_the_quota_of_a_scope_since_deleted_can_still_be_cleared_by_its_key(api, tree):
    lonely = api.call("POST", "/orgs", {"name": "Lonely"}).json()["id"]
    api.call("PUT", "/quotas", {"scope": "org:Lonely", "limit": {"gpus": 1}})
    Organization.objects.filter(pk=lonely).delete()

    assert api.call("GET", "/quotas").json()[-1]["name"] == f"org:{lonely}"
    response = api.call("DELETE", f"/quotas/org:{lonely}")

    assert (response.status_code, response.json()) == (200, {"removed": f"org:{lonely}"})


def test_no_hostile_body_makes_a_tenancy_endpoint_fail_with_a_500(api, tree):
    hostile = [
        "[" * 10_000 + "]" * 10_000,
        '{"name": NaN}',
        json.dumps({"name": "x\x00"}),
        json.dumps({"org": "Acme\x00", "name": "x"}),
        json.dumps({"team": "A" * 100_000, "name": "x"}),
        json.dumps({"scope": "team:" + "/" * 5000, "limit": {"gpus": 1}}),
        json.dumps({"scope": "org:Acme", "limit": {"gpus": 2**63}}),
        json.dumps(None),
        "\xff\xfe",
    ]
    before = nothing_written()
    for method, path in [
        ("POST", "/orgs"),
        ("POST", "/teams"),
        ("POST", "/projects"),
        ("PUT", "/quotas"),
    ]:
        for body in hostile:
            response = api.call(method, path, body)
            assert response.status_code == 400, (path, body[:40], response.content[:200])
            detail(response)
    assert nothing_written() == before


def test_the_quota_list_takes_as_many_queries_for_ten_quotas_as_for_one(api, tree):
    api.call("PUT", "/quotas", {"scope": "org:Acme", "limit": {"gpus": 1}})
    api.call("GET", "/quotas")  # the token lookup's own queries, once
    with CaptureQueriesContext(connection) as one:
        api.call("GET", "/quotas")
    for i in range(9):
        api.call("POST", "/teams", {"org": "Scania", "name": f"t{i}"})
        api.call("PUT", "/quotas", {"scope": f"team:Scania/t{i}", "guarantee": {"gpus": 1}})
    with CaptureQueriesContext(connection) as ten:
        views = api.call("GET", "/quotas").json()

    assert len(views) == 10
    assert len(ten) == len(one)
