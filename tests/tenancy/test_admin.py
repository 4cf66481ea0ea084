"""Tenancy in Django admin: one line per record, keys shown once and revoked, quotas through
the services that check and record them."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.messages import get_messages

from llmgw.core.secrets import digest, keyed_digest
from tenancy.models import ApiKey, AuditEvent, CapacityQuota, Organization, Project, Team, Token
from tenancy.services import org_create, project_create, quota_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(scopes) -> dict:
    """Acme with team ml and its project training."""
    made = scopes("Acme/ml/training")
    return {"org": made["Acme"], "team": made["Acme/ml"], "project": made["Acme/ml/training"]}


def _cells(response) -> str:
    assert response.status_code == 200
    return response.content.decode()


def _errors(response, field: str) -> str:
    """The form's errors for one field, as plain sentences."""
    return " ".join(response.context["adminform"].form.errors.get(field, []))


def _shown_messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


class TestTheTreeIsListedOneLineARecord:
    def test_organizations_show_their_teams_and_projects(self, admin_client, tree):
        page = _cells(admin_client.get("/admin/tenancy/organization/?q=acm"))
        assert "column-team_count" in page and "column-project_count" in page
        row = re.search(r"<tr>(?:(?!</tr>).)*Acme.*?</tr>", page, re.S).group(0)
        assert re.findall(r'class="field-(?:team|project)_count">(\d+)<', row) == ["1", "1"]

    def test_teams_and_projects_show_their_parents_and_counts(self, admin_client, tree):
        teams = _cells(admin_client.get(f"/admin/tenancy/team/?org__id__exact={tree['org'].pk}"))
        assert "column-project_count" in teams and "Acme" in teams and ">ml<" in teams
        projects = _cells(admin_client.get("/admin/tenancy/project/?q=acme"))
        assert "column-live_keys" in projects and "Acme/ml" in projects and "training" in projects

    def test_an_organization_added_in_admin_goes_through_the_service_and_is_recorded(
        self, admin_client
    ):
        response = admin_client.post("/admin/tenancy/organization/add/", {"name": " Globex "})

        assert response.status_code == 302
        assert Organization.objects.get().name == "Globex"
        assert AuditEvent.objects.filter(action="org.add", actor="admin").count() == 1

    @pytest.mark.parametrize(
        "name, said",
        [("a/b", "may not contain '/'"), ("123", "digits alone"), ("acme", "already one named")],
    )
    def test_a_name_the_services_would_refuse_is_refused_beside_the_field(
        self, admin_client, tree, name, said
    ):
        response = admin_client.post("/admin/tenancy/organization/add/", {"name": name})

        assert response.status_code == 200
        assert said in _errors(response, "name")
        assert Organization.objects.count() == 1

    def test_a_team_keeps_its_organization_and_a_rename_is_recorded(self, admin_client, tree):
        other = org_create(name="Globex", actor="test")
        url = f"/admin/tenancy/team/{tree['team'].pk}/change/"

        response = admin_client.post(url, {"name": "research", "org": other.pk})

        assert response.status_code == 302
        team = Team.objects.get(pk=tree["team"].pk)
        assert (team.name, team.org_id) == ("research", tree["org"].pk)
        event = AuditEvent.objects.get(action="team.rename")
        assert event.detail == {"name": "research", "was": "ml"}

    def test_a_project_added_in_admin_lands_in_its_team(self, admin_client, tree):
        response = admin_client.post(
            "/admin/tenancy/project/add/", {"name": "serving", "team": tree["team"].pk}
        )

        assert response.status_code == 302
        assert Project.objects.get(name="serving").team == tree["team"]
        assert AuditEvent.objects.filter(action="project.add", actor="admin").exists()


class TestAnApiKeyIsShownOnceAndRevoked:
    @pytest.fixture(autouse=True)
    def _llama(self, db):
        from catalog.services import model_add

        model_add(
            data={
                "name": "llama",
                "source": "hf://acme/llama",
                "profiles": [{"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"}],
            },
            actor="test",
        )

    def _add(self, admin_client, project, **extra):
        return admin_client.post(
            "/admin/tenancy/apikey/add/",
            {"project": project.pk, "name": "ci", "models_allowed": '["llama"]', **extra},
            follow=True,
        )

    def test_the_secret_is_shown_once_and_only_its_hash_and_prefix_are_kept(
        self, admin_client, tree
    ):
        response = self._add(admin_client, tree["project"], requests_per_minute="60")

        assert response.status_code == 200
        shown = [m for m in _shown_messages(response) if "shown only this once" in m]
        assert len(shown) == 1
        secret = shown[0].rsplit(" ", 1)[1]
        assert secret.startswith("llmgw_key_") and len(secret) > 40
        key = ApiKey.objects.get()
        assert key.secret_hash == keyed_digest(settings.SECRET_KEY, secret)
        assert key.prefix == secret[:14]
        assert (key.project, key.models_allowed, key.requests_per_minute, key.created_by) == (
            tree["project"],
            ["llama"],
            60,
            "admin",
        )
        assert secret not in repr(list(ApiKey.objects.values()))
        assert AuditEvent.objects.filter(action="key.add", target=f"key:{key.pk}").exists()

        # Never again: not on its page, not in the list.
        for url in (f"/admin/tenancy/apikey/{key.pk}/change/", "/admin/tenancy/apikey/"):
            page = _cells(admin_client.get(url))
            assert secret not in page and key.secret_hash not in page
            assert key.prefix in page

    def test_a_key_that_allows_a_model_that_is_not_a_name_is_refused(self, admin_client, tree):
        response = self._add(admin_client, tree["project"], models_allowed='{"a": 1}')

        assert "models_allowed" in response.context["adminform"].form.errors
        assert not ApiKey.objects.exists()

    def test_the_list_shows_models_limits_and_state_and_filters_by_it(self, admin_client, tree):
        self._add(admin_client, tree["project"], tokens_per_minute="10000")
        page = _cells(admin_client.get("/admin/tenancy/apikey/?state=live&q=training"))
        assert "llama" in page and "10,000 tok/min" in page and ">live<" in page
        assert "Acme/ml/training" in page
        assert (
            "ci"
            not in _cells(admin_client.get("/admin/tenancy/apikey/?state=revoked"))
            .split("result_list")[-1]
            .split("</table>")[0]
        )

    def test_revoke_sets_revoked_at_once_and_records_it(self, admin_client, tree):
        self._add(admin_client, tree["project"])
        key = ApiKey.objects.get()

        action = {"action": "revoke", "_selected_action": [key.pk]}
        response = admin_client.post("/admin/tenancy/apikey/", action, follow=True)
        key.refresh_from_db()
        first = key.revoked_at
        again = admin_client.post("/admin/tenancy/apikey/", action, follow=True)
        key.refresh_from_db()

        assert first is not None and key.revoked_at == first
        assert "Revoked 1 API key." in _shown_messages(response)
        assert "already revoked" in " ".join(_shown_messages(again))
        assert AuditEvent.objects.filter(action="key.revoke").count() == 1
        assert "revoked " in _cells(admin_client.get("/admin/tenancy/apikey/?state=revoked"))

    def test_a_key_cannot_be_deleted_or_moved_to_another_project(self, admin_client, tree):
        self._add(admin_client, tree["project"])
        key = ApiKey.objects.get()
        other = project_create(team=tree["team"].pk, name="other", actor="test")

        deleted = admin_client.post(f"/admin/tenancy/apikey/{key.pk}/delete/", {"post": "yes"})
        admin_client.post(
            f"/admin/tenancy/apikey/{key.pk}/change/",
            {"name": "renamed", "project": other.pk, "models_allowed": "[]"},
        )

        assert deleted.status_code == 403
        key.refresh_from_db()
        assert (key.name, key.project_id) == ("renamed", tree["project"].pk)


def test_a_token_added_in_admin_shows_its_secret_once(admin_client):
    response = admin_client.post(
        "/admin/tenancy/token/add/", {"name": "ops", "kind": "admin"}, follow=True
    )

    shown = [m for m in _shown_messages(response) if "shown only this once" in m]
    secret = shown[0].rsplit(" ", 1)[1]
    token = Token.objects.get()
    assert token.secret_hash == digest(secret) and secret.startswith("llmgw_adm_")


class TestQuotas:
    def test_the_list_shows_each_scope_by_name_with_its_figures_and_who_set_them(
        self, admin_client, tree
    ):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit={"gpus": 8}, actor="ops")
        quota_set(scope="org:Acme", guarantee=None, limit={"memory_gb": 512}, actor="ops")

        page = _cells(admin_client.get("/admin/tenancy/capacityquota/"))

        assert "Acme / ml" in page and f"team:{tree['team'].pk}" in page
        assert "4 (≤ 8)" in page and "- (≤ 512)" in page
        assert "column-updated_by" in page and ">ops<" in page

    def test_a_quota_is_found_by_its_scope_key_or_path(self, admin_client, tree):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        quota_set(scope="org:Acme", guarantee={"gpus": 8}, limit=None, actor="ops")

        by_path = admin_client.get("/admin/tenancy/capacityquota/?q=acme/ml")
        by_key = admin_client.get(f"/admin/tenancy/capacityquota/?q=team:{tree['team'].pk}")

        for response in (by_path, by_key):
            assert [q.scope for q in response.context["cl"].result_list] == [
                f"team:{tree['team'].pk}"
            ]

    def test_a_quota_set_in_admin_goes_through_the_service(self, admin_client, tree):
        response = admin_client.post(
            "/admin/tenancy/capacityquota/add/",
            {"scope": "team:acme/ml", "guarantee_gpus": "2", "limit_gpus": "4"},
        )

        assert response.status_code == 302
        quota = CapacityQuota.objects.get()
        assert (quota.scope, quota.guarantee_gpus, quota.limit_gpus, quota.updated_by) == (
            f"team:{tree['team'].pk}",
            2,
            4,
            "admin",
        )
        assert AuditEvent.objects.filter(action="quota.set", actor="admin").exists()

    @pytest.mark.parametrize(
        "form, field, said",
        [
            ({"scope": "team:nope", "limit_gpus": "1"}, "scope", "nope"),
            ({"scope": "team:ml", "guarantee_gpus": "9", "limit_gpus": "4"}, "guarantee_gpus", "above its limit"),
            ({"scope": "team:ml", "limit_gpus": "-1"}, "limit_gpus", "greater than or equal to 0"),
            ({"scope": "team:ml", "limit_gpus": str(2**31)}, "limit_gpus", "At most"),
            ({"scope": "team:ml"}, "__all__", "needs a guarantee or a limit"),
        ],
    )  # fmt: skip
    def test_a_bad_quota_is_refused_beside_its_field_and_nothing_is_saved(
        self, admin_client, tree, form, field, said
    ):
        response = admin_client.post("/admin/tenancy/capacityquota/add/", form)

        assert response.status_code == 200
        assert said in _errors(response, field)
        assert not CapacityQuota.objects.exists()

    def test_a_quota_changed_in_admin_keeps_its_scope_and_records_who(self, admin_client, tree):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        quota = CapacityQuota.objects.get()
        url = f"/admin/tenancy/capacityquota/{quota.pk}/change/"
        assert admin_client.get(url).status_code == 200

        response = admin_client.post(url, {"scope": "org:Acme", "limit_gpus": "6"})

        assert response.status_code == 302
        quota.refresh_from_db()
        assert (quota.scope, quota.guarantee_gpus, quota.limit_gpus, quota.updated_by) == (
            f"team:{tree['team'].pk}",
            None,
            6,
            "admin",
        )

    def test_a_quota_deleted_in_admin_is_cleared_and_recorded(self, admin_client, tree):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        quota = CapacityQuota.objects.get()

        response = admin_client.post(
            f"/admin/tenancy/capacityquota/{quota.pk}/delete/", {"post": "yes"}
        )

        assert response.status_code == 302
        assert not CapacityQuota.objects.exists()
        assert AuditEvent.objects.filter(action="quota.clear", actor="admin").exists()


def test_the_key_and_quota_lists_do_not_query_per_row(
    admin_client, tree, django_assert_max_num_queries
):
    for n in range(30):
        project = project_create(team=tree["team"].pk, name=f"p{n}", actor="test")
        ApiKey.objects.create(project=project, name=f"k{n}", prefix=f"p{n}", secret_hash=f"h{n}")
        quota_set(scope=f"project:{project.pk}", guarantee={"gpus": 1}, limit=None, actor="ops")

    with django_assert_max_num_queries(12):
        assert admin_client.get("/admin/tenancy/apikey/").status_code == 200
    with django_assert_max_num_queries(12):
        assert admin_client.get("/admin/tenancy/capacityquota/").status_code == 200
    with django_assert_max_num_queries(12):
        assert admin_client.get("/admin/tenancy/project/").status_code == 200


@pytest.mark.parametrize(
    "model", ["organization", "team", "project", "apikey", "capacityquota", "token"]
)
def test_each_list_and_add_form_renders_for_a_superuser(admin_client, tree, model):
    assert admin_client.get(f"/admin/tenancy/{model}/").status_code == 200
    add = admin_client.get(f"/admin/tenancy/{model}/add/")
    assert add.status_code == 200
    if model == "apikey":
        # Nothing about the secret is asked for or shown before it exists.
        assert 'name="prefix"' not in add.content.decode()
        assert 'name="secret_hash"' not in add.content.decode()


def test_the_audit_trail_is_read_only_in_admin(admin_client, tree):
    event = AuditEvent.objects.first()

    assert admin_client.get("/admin/tenancy/auditevent/?q=org.add").status_code == 200
    assert admin_client.get("/admin/tenancy/auditevent/add/").status_code == 403
    changed = admin_client.post(f"/admin/tenancy/auditevent/{event.pk}/change/", {"actor": "x"})
    deleted = admin_client.post(f"/admin/tenancy/auditevent/{event.pk}/delete/", {"post": "yes"})
    assert (changed.status_code, deleted.status_code) == (403, 403)
    event.refresh_from_db()
    assert event.actor == "test"


class TestEveryAdminWriteMovesThePolicyRevision:
    """The reconciler reads the quota policy again only when its revision moved: an add, a
    change or a delete in admin, of a quota or of the tree it names, must move it, and
    once per write, whatever the rows."""

    @pytest.fixture
    def revision(self):
        from tenancy.selectors import quota_policy_revision

        return quota_policy_revision

    @pytest.mark.parametrize(
        "model, form",
        [
            ("organization", lambda tree: {"name": "Globex"}),
            ("team", lambda tree: {"name": "web", "org": tree["org"].pk}),
            ("project", lambda tree: {"name": "serving", "team": tree["team"].pk}),
            ("capacityquota", lambda tree: {"scope": "team:Acme/ml", "limit_gpus": "4"}),
        ],
    )
    def test_an_add(self, admin_client, tree, revision, model, form):
        before = revision()

        response = admin_client.post(f"/admin/tenancy/{model}/add/", form(tree))

        assert response.status_code == 302
        assert revision() == before + 1

    @pytest.mark.parametrize(
        "model, key, form",
        [
            ("organization", "org", {"name": "Globex"}),
            ("team", "team", {"name": "research"}),
            ("project", "project", {"name": "serving"}),
        ],
    )
    def test_a_rename(self, admin_client, tree, revision, model, key, form):
        before = revision()

        response = admin_client.post(f"/admin/tenancy/{model}/{tree[key].pk}/change/", form)

        assert response.status_code == 302
        assert type(tree[key]).objects.get(pk=tree[key].pk).name == form["name"]
        assert revision() == before + 1

    def test_a_quota_changed(self, admin_client, tree, revision):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        quota = CapacityQuota.objects.get()
        before = revision()

        response = admin_client.post(
            f"/admin/tenancy/capacityquota/{quota.pk}/change/", {"limit_gpus": "6"}
        )

        assert response.status_code == 302
        assert CapacityQuota.objects.get().limit_gpus == 6
        assert revision() == before + 1

    def test_a_delete_of_each_from_its_page(self, admin_client, tree, revision):
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        rows = [
            ("capacityquota", CapacityQuota.objects.get()),
            ("project", tree["project"]),
            ("team", tree["team"]),
            ("organization", tree["org"]),
        ]
        for model, row in rows:
            before = revision()

            response = admin_client.post(
                f"/admin/tenancy/{model}/{row.pk}/delete/", {"post": "yes"}
            )

            assert response.status_code == 302, model
            assert not type(row).objects.filter(pk=row.pk).exists(), model
            assert revision() == before + 1, model

    def test_delete_selected_moves_it_once_for_the_tree_and_once_a_quota(
        self, admin_client, tree, revision
    ):
        other = project_create(team=tree["team"].pk, name="other", actor="test")
        quota_set(scope="team:Acme/ml", guarantee={"gpus": 4}, limit=None, actor="ops")
        quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 8}, actor="ops")
        before = revision()

        projects = admin_client.post(
            "/admin/tenancy/project/",
            {
                "action": "delete_selected",
                "_selected_action": [tree["project"].pk, other.pk],
                "post": "yes",
            },
        )
        assert projects.status_code == 302
        assert not Project.objects.exists()
        assert revision() == before + 1

        quotas = admin_client.post(
            "/admin/tenancy/capacityquota/",
            {
                "action": "delete_selected",
                "_selected_action": list(CapacityQuota.objects.values_list("pk", flat=True)),
                "post": "yes",
            },
        )
        assert quotas.status_code == 302
        assert not CapacityQuota.objects.exists()
        assert revision() == before + 3, "each quota is cleared through the service"

    def test_a_refused_form_or_delete_leaves_it_alone(self, admin_client, tree, revision):
        before = revision()

        refused = admin_client.post("/admin/tenancy/organization/add/", {"name": "a/b"})
        # Acme still has its team: admin refuses to delete it and deletes nothing.
        protected = admin_client.post(
            f"/admin/tenancy/organization/{tree['org'].pk}/delete/", {"post": "yes"}
        )

        assert (refused.status_code, protected.status_code) == (200, 200)
        assert Organization.objects.filter(pk=tree["org"].pk).exists()
        assert revision() == before
