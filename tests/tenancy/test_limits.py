"""Request and token limits per scope: set by name or ID, listed by name, cleared, audited; bad
input a clear 400 with nothing changed, over REST and in Django admin."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from llmgw.core.errors import Invalid, NotFound
from tenancy.models import AuditEvent, Organization, ScopeLimit
from tenancy.selectors import limits_list
from tenancy.services import limit_clear, limit_set, org_create, project_create, team_create
from tests.helpers import detail

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(scopes) -> dict:
    """Acme with teams ml and web, Scania with another ml, and Acme/ml/training."""
    made = scopes("Acme", "Scania", "Acme/ml", "Acme/web", "Scania/ml", "Acme/ml/training")
    return {
        "acme": f"org:{made['Acme'].pk}",
        "scania": f"org:{made['Scania'].pk}",
        "ml": f"team:{made['Acme/ml'].pk}",
        "web": f"team:{made['Acme/web'].pk}",
        "scania_ml": f"team:{made['Scania/ml'].pk}",
        "training": f"project:{made['Acme/ml/training'].pk}",
    }


def changed() -> tuple:
    """Everything a refused limit must leave as it was."""
    return (list(ScopeLimit.objects.values()), AuditEvent.objects.count())


# The services


def test_a_limit_is_set_on_a_scope_named_by_path_and_stored_under_its_id(tree):
    key = limit_set(
        scope="team:Acme/ml", requests_per_minute=600, tokens_per_minute=None, actor="dan"
    )

    assert key == tree["ml"]
    row = ScopeLimit.objects.get()
    assert (row.scope, row.requests_per_minute, row.tokens_per_minute, row.updated_by) == (
        tree["ml"],
        600,
        None,
        "dan",
    )
    event = AuditEvent.objects.get(action="limit.set")
    assert (event.actor, event.target) == ("dan", tree["ml"])
    assert event.detail == {"requests_per_minute": 600, "tokens_per_minute": None}


def test_setting_a_limit_again_replaces_it_whole(tree):
    limit_set(scope="org:Acme", requests_per_minute=100, tokens_per_minute=5000, actor="ops")

    limit_set(scope=tree["acme"], requests_per_minute=None, tokens_per_minute=9000, actor="ops")

    row = ScopeLimit.objects.get()
    assert (row.requests_per_minute, row.tokens_per_minute) == (None, 9000)
    assert AuditEvent.objects.filter(action="limit.set").count() == 2


def test_setting_and_clearing_a_limit_is_logged_with_what_changed(tree, caplog):
    with caplog.at_level(logging.INFO, logger="llmgw.tenancy"):
        limit_set(scope="team:web", requests_per_minute=60, tokens_per_minute=None, actor="dan")
        limit_clear(scope="team:web", actor="dan")

    lines = [r.getMessage() for r in caplog.records if r.name == "llmgw.tenancy"]
    assert lines[-2] == (
        f"limits of team:Acme/web ({tree['web']}) set by dan: "
        "60 requests/min, tokens not limited (was no limits)"
    )
    assert lines[-1] == (
        f"limits of team:Acme/web ({tree['web']}) removed by dan "
        "(was 60 requests/min, tokens not limited)"
    )


def test_a_limit_is_cleared_and_the_clearing_audited(tree):
    limit_set(scope="project:training", requests_per_minute=5, tokens_per_minute=5, actor="ops")

    assert limit_clear(scope="project:Acme/ml/training", actor="dan") == tree["training"]

    assert not ScopeLimit.objects.exists()
    event = AuditEvent.objects.get(action="limit.clear")
    assert (event.actor, event.target) == ("dan", tree["training"])


def test_clearing_a_scope_without_limits_is_not_found(tree):
    with pytest.raises(NotFound, match=r"^team:Acme/web has no request limits\.$"):
        limit_clear(scope="team:Acme/web", actor="ops")


@pytest.mark.parametrize(
    "rpm, tpm, says",
    [
        (None, None, "a limit needs requests_per_minute or tokens_per_minute"),
        (-1, None, "requests_per_minute must be a whole number from 1 to 2147483647, not -1."),
        (None, -5, "tokens_per_minute must be a whole number from 1 to 2147483647, not -5."),
        (0, None, "requests_per_minute must be a whole number from 1"),
        (1.5, None, "not 1.5"),
        ("60", None, "not '60'"),
        (True, None, "not True"),
        (None, 2**31, "tokens_per_minute must be a whole number from 1 to 2147483647"),
    ],
)
def test_a_bad_figure_is_refused_with_a_sentence_and_nothing_changes(tree, rpm, tpm, says):
    limit_set(scope="org:Acme", requests_per_minute=10, tokens_per_minute=None, actor="ops")
    before = changed()

    with pytest.raises(Invalid) as refused:
        limit_set(scope="org:Acme", requests_per_minute=rpm, tokens_per_minute=tpm, actor="ops")

    assert says in str(refused.value)
    assert changed() == before


@pytest.mark.parametrize(
    "scope, says",
    [
        ("team:ml", '"ml" could be any of 2 teams; give its ID'),
        ("team:Acme/nope", 'there is no team "Acme/nope"'),
        ("group:Acme", "is not org:NAME"),
    ],
)
def test_a_scope_that_names_none_or_several_is_refused(tree, scope, says):
    with pytest.raises(Invalid, match=says):
        limit_set(scope=scope, requests_per_minute=1, tokens_per_minute=None, actor="ops")
    assert changed() == ([], AuditEvent.objects.count())


# The list


def test_the_list_names_each_scope_as_the_quota_list_does_in_path_order(tree):
    limit_set(scope="team:Acme/ml", requests_per_minute=600, tokens_per_minute=None, actor="ops")
    limit_set(scope="org:Acme", requests_per_minute=None, tokens_per_minute=90_000, actor="dan")

    listed = limits_list()

    assert [(v["scope"], v["name"]) for v in listed] == [
        (tree["acme"], "Acme"),
        (tree["ml"], "Acme / ml"),
    ]
    acme, ml = listed
    assert (acme["requests_per_minute"], acme["tokens_per_minute"]) == (None, 90_000)
    assert (ml["requests_per_minute"], ml["tokens_per_minute"]) == (600, None)
    assert (acme["updated_by"], ml["updated_by"]) == ("dan", "ops")
    assert ml["updated_at"] is not None


def test_the_limit_of_a_scope_since_deleted_is_listed_by_its_key_and_can_be_cleared(tree):
    lonely = org_create(name="Lonely", actor="test")
    limit_set(scope="org:Lonely", requests_per_minute=1, tokens_per_minute=None, actor="ops")
    Organization.objects.filter(pk=lonely.pk).delete()

    assert limits_list()[-1]["name"] == f"org:{lonely.pk}"
    assert limit_clear(scope=f"org:{lonely.pk}", actor="ops") == f"org:{lonely.pk}"


def test_the_list_takes_as_many_queries_for_ten_limits_as_for_one(tree):
    limit_set(scope="org:Acme", requests_per_minute=1, tokens_per_minute=None, actor="ops")
    with CaptureQueriesContext(connection) as one:
        limits_list()
    for i in range(9):
        team_create(org="Scania", name=f"t{i}", actor="test")
        limit_set(scope=f"team:Scania/t{i}", requests_per_minute=1, tokens_per_minute=1, actor="o")
    with CaptureQueriesContext(connection) as ten:
        assert len(limits_list()) == 10

    assert len(ten) == len(one)


# Over REST


def test_a_limit_is_set_listed_and_cleared_over_rest(api, tree):
    response = api.call(
        "PUT",
        "/limits",
        {"scope": "team:Acme/ml", "requests_per_minute": 600, "tokens_per_minute": 90000},
        HTTP_X_LLMGW_ACTOR="dan",
    )

    assert (response.status_code, response.json()) == (200, {"scope": tree["ml"]})
    assert ScopeLimit.objects.get().updated_by == "dan"

    listed = api.call("GET", "/limits").json()
    assert len(listed) == 1
    assert {k: v for k, v in listed[0].items() if k != "updated_at"} == {
        "scope": tree["ml"],
        "name": "Acme / ml",
        "requests_per_minute": 600,
        "tokens_per_minute": 90000,
        "updated_by": "dan",
    }

    cleared = api.call("DELETE", "/limits/team:Acme%2Fml")
    assert (cleared.status_code, cleared.json()) == (200, {"removed": tree["ml"]})
    assert not ScopeLimit.objects.exists()


def test_a_figure_left_out_over_rest_is_not_limited(api, tree):
    api.call("PUT", "/limits", {"scope": "org:Acme", "tokens_per_minute": 1000})

    row = ScopeLimit.objects.get()
    assert (row.requests_per_minute, row.tokens_per_minute) == (None, 1000)


def test_a_limit_is_cleared_by_id_or_by_a_path_with_its_slashes(api, tree):
    api.call("PUT", "/limits", {"scope": "team:Acme/ml", "requests_per_minute": 1})
    api.call("PUT", "/limits", {"scope": "project:Acme/ml/training", "requests_per_minute": 1})

    by_id = api.call("DELETE", f"/limits/{tree['ml']}")
    by_path = api.call("DELETE", "/limits/project:Acme/ml/training")

    assert (by_id.status_code, by_path.status_code) == (200, 200)
    assert not ScopeLimit.objects.exists()


def test_clearing_a_scope_without_limits_over_rest_is_404(api, tree):
    response = api.call("DELETE", "/limits/team:Acme%2Fweb")

    assert response.status_code == 404
    assert detail(response) == "team:Acme/web has no request limits."


@pytest.mark.parametrize(
    "scope, says",
    [("team:ml", "could be any of 2"), ("group:x", "is not org:NAME"), ("%00", "is not org:NAME")],
)
def test_clearing_a_scope_that_names_none_over_rest_is_400(api, tree, scope, says):
    api.call("PUT", "/limits", {"scope": "team:Acme/ml", "requests_per_minute": 1})
    before = changed()

    response = api.call("DELETE", f"/limits/{scope}")

    assert response.status_code == 400
    assert says in detail(response)
    assert changed() == before


BAD_LIMITS = [
    ({"scope": "team:ml", "requests_per_minute": 1}, '"ml" could be any of 2 teams; give its ID'),
    ({"scope": "team:Acme/nope", "requests_per_minute": 1}, 'there is no team "Acme/nope"'),
    ({"scope": "group:Acme", "requests_per_minute": 1}, "is not org:NAME"),
    ({"scope": "org:Acme"}, "a limit needs requests_per_minute or tokens_per_minute"),
    (
        {"scope": "org:Acme", "requests_per_minute": None, "tokens_per_minute": None},
        "a limit needs requests_per_minute or tokens_per_minute",
    ),
    ({"scope": "org:Acme", "requests_per_minute": -1}, "requests_per_minute must be a whole"),
    ({"scope": "org:Acme", "tokens_per_minute": -5}, "tokens_per_minute must be a whole"),
    ({"scope": "org:Acme", "tokens_per_minute": 0}, "tokens_per_minute must be a whole"),
    ({"scope": "org:Acme", "requests_per_minute": 1.5}, "requests_per_minute"),
    ({"scope": "org:Acme", "requests_per_minute": "60"}, "requests_per_minute"),
    ({"scope": "org:Acme", "requests_per_minute": True}, "requests_per_minute"),
    ({"scope": "org:Acme", "requests_per_minute": 10**12}, "from 1 to 2147483647"),
    ({"scope": "org:Acme", "rpm": 60}, "rpm"),
    ({"requests_per_minute": 1}, "scope"),
    ({"scope": 7, "requests_per_minute": 1}, "scope"),
    ("[]", ""),
    ('{"scope": "org:Acme", "requests_per_minute": NaN}', ""),
    ("[" * 10_000 + "]" * 10_000, ""),
    (json.dumps({"scope": "team:" + "/" * 5000, "requests_per_minute": 1}), "scope"),
    (json.dumps({"scope": "org:Acme\x00", "requests_per_minute": 1}), ""),
    (json.dumps({"scope": "org:Acme", "requests_per_minute": 2**63}), ""),
    ("\xff\xfe", ""),
]


@pytest.mark.parametrize("body, says", BAD_LIMITS)
def test_a_bad_limit_over_rest_is_400_and_nothing_changes(api, tree, body, says):
    api.call("PUT", "/limits", {"scope": "org:Acme", "requests_per_minute": 4})
    before = changed()

    response = api.call("PUT", "/limits", body)

    assert response.status_code == 400, response.content[:200]
    assert says in detail(response)
    assert changed() == before


@pytest.mark.parametrize(
    "method, path", [("GET", "/limits"), ("PUT", "/limits"), ("DELETE", "/limits/org:Acme")]
)
def test_the_limits_need_an_admin_token(tree, method, path):
    limit_set(scope="org:Acme", requests_per_minute=4, tokens_per_minute=None, actor="ops")
    before = changed()
    body = json.dumps({"scope": "org:Acme", "requests_per_minute": 9})

    response = Client().generic(method, f"/api/v1{path}", body, "application/json")

    assert response.status_code == 401
    assert "admin token" in detail(response)
    assert changed() == before


# In Django admin


class TestAdmin:
    def test_the_list_shows_each_scope_by_name_with_its_figures(self, admin_client, tree):
        limit_set(scope="team:Acme/ml", requests_per_minute=600, tokens_per_minute=None, actor="o")

        page = admin_client.get("/admin/tenancy/scopelimit/")

        assert page.status_code == 200
        text = page.content.decode()
        assert "Acme / ml" in text and tree["ml"] in text and "600" in text

    def test_a_limit_added_in_admin_goes_through_the_service(self, admin_client, tree):
        response = admin_client.post(
            "/admin/tenancy/scopelimit/add/",
            {"scope": "team:acme/ml", "requests_per_minute": "60", "tokens_per_minute": ""},
        )

        assert response.status_code == 302
        row = ScopeLimit.objects.get()
        assert (row.scope, row.requests_per_minute, row.tokens_per_minute, row.updated_by) == (
            tree["ml"],
            60,
            None,
            "admin",
        )
        assert AuditEvent.objects.filter(action="limit.set", actor="admin").exists()

    @pytest.mark.parametrize(
        "form, field, said",
        [
            ({"scope": "team:nope", "requests_per_minute": "1"}, "scope", "nope"),
            ({"scope": "team:ml", "requests_per_minute": "1"}, "scope", "could be any of 2"),
            ({"scope": "org:Acme", "requests_per_minute": "0"}, "requests_per_minute", "from 1"),
            ({"scope": "org:Acme", "tokens_per_minute": str(2**31)}, "tokens_per_minute", "2147483647"),
            ({"scope": "org:Acme"}, "__all__", "a limit needs requests_per_minute or"),
        ],
    )  # fmt: skip
    def test_a_bad_limit_is_refused_beside_its_field_and_nothing_is_saved(
        self, admin_client, tree, form, field, said
    ):
        response = admin_client.post("/admin/tenancy/scopelimit/add/", form)

        assert response.status_code == 200
        errors = response.context["adminform"].form.errors.get(field, [])
        assert said in " ".join(errors)
        assert not ScopeLimit.objects.exists()

    def test_a_limit_changed_in_admin_keeps_its_scope(self, admin_client, tree):
        limit_set(scope="team:Acme/ml", requests_per_minute=5, tokens_per_minute=None, actor="o")
        row = ScopeLimit.objects.get()
        url = f"/admin/tenancy/scopelimit/{row.pk}/change/"
        assert admin_client.get(url).status_code == 200

        response = admin_client.post(url, {"scope": "org:Acme", "tokens_per_minute": "70"})

        assert response.status_code == 302
        row.refresh_from_db()
        assert (row.scope, row.requests_per_minute, row.tokens_per_minute, row.updated_by) == (
            tree["ml"],
            None,
            70,
            "admin",
        )

    def test_a_limit_deleted_in_admin_is_cleared_and_recorded(self, admin_client, tree):
        limit_set(scope="team:Acme/ml", requests_per_minute=5, tokens_per_minute=None, actor="o")
        row = ScopeLimit.objects.get()

        response = admin_client.post(f"/admin/tenancy/scopelimit/{row.pk}/delete/", {"post": "yes"})

        assert response.status_code == 302
        assert not ScopeLimit.objects.exists()
        assert AuditEvent.objects.filter(action="limit.clear", actor="admin").exists()

    def test_the_list_does_not_query_per_row(
        self, admin_client, tree, django_assert_max_num_queries
    ):
        for n in range(30):
            project = project_create(team=tree["ml"].partition(":")[2], name=f"p{n}", actor="t")
            limit_set(
                scope=f"project:{project.pk}",
                requests_per_minute=1,
                tokens_per_minute=None,
                actor="o",
            )

        with django_assert_max_num_queries(12):
            assert admin_client.get("/admin/tenancy/scopelimit/").status_code == 200

    def test_the_add_form_renders(self, admin_client, tree):
        assert admin_client.get("/admin/tenancy/scopelimit/add/").status_code == 200
