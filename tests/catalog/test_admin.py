"""Django admin shows the catalog but cannot change it: changes go through the one update path."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from catalog.models import Measurement, Model
from tests.fleet.builders import gpu_model, model_added

pytestmark = pytest.mark.django_db


@pytest.fixture
def llama(db) -> Model:
    model_added(gpu_model("llama", scaling={"min": 2, "max": 3}))
    return Model.objects.get(name="llama")


def test_the_model_list_shows_the_models_and_where_to_change_them(admin_client, llama):
    response = admin_client.get("/admin/catalog/model/?q=llama")

    assert response.status_code == 200
    page = response.content.decode()
    assert f"/admin/catalog/model/{llama.pk}/change/" in page
    assert "change models with llmgw ctl or the REST API" in page
    assert "catalog file" in page
    assert "/admin/catalog/model/add/" not in page


def test_a_model_cannot_be_added_in_admin(admin_client, llama):
    assert admin_client.get("/admin/catalog/model/add/").status_code == 403
    response = admin_client.post("/admin/catalog/model/add/", {"name": "sneaky"})

    assert response.status_code == 403
    assert list(Model.objects.values_list("name", flat=True)) == ["llama"]


def test_a_model_and_its_profiles_can_be_seen_but_not_changed(admin_client, llama):
    page = admin_client.get(f"/admin/catalog/model/{llama.pk}/change/")
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert page.context["inline_admin_formsets"][0].has_change_permission is False

    response = admin_client.post(
        f"/admin/catalog/model/{llama.pk}/change/",
        {"name": "llama", "min_replicas": 9, "max_replicas": 9},
    )

    assert response.status_code == 403
    llama.refresh_from_db()
    assert (llama.min_replicas, llama.max_replicas) == (2, 3)


def test_a_model_cannot_be_deleted_in_admin(admin_client, llama):
    response = admin_client.post(f"/admin/catalog/model/{llama.pk}/delete/", {"post": "yes"})

    assert response.status_code == 403
    assert Model.objects.filter(pk=llama.pk).exists()


def test_measurements_are_view_only(admin_client, llama):
    measurement = Measurement.objects.create(
        model=llama, profile="gpu", max_concurrency=8, tok_per_sec=400, measured_at=timezone.now()
    )

    assert admin_client.get("/admin/catalog/measurement/").status_code == 200
    assert admin_client.get("/admin/catalog/measurement/add/").status_code == 403
    change = f"/admin/catalog/measurement/{measurement.pk}/change/"
    assert admin_client.post(change, {"max_concurrency": 99}).status_code == 403
    delete = f"/admin/catalog/measurement/{measurement.pk}/delete/"
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    measurement.refresh_from_db()
    assert measurement.max_concurrency == 8


def test_a_model_and_its_measurements_stay_when_admin_is_asked_to_delete_them(admin_client, llama):
    """Admin deletes nothing of the catalog, so it never has to move the measurements' revision:
    a model is removed, with its measurements, through the one removal path (which does)."""
    from catalog.selectors import measurements_revision
    from catalog.services import measurement_save

    measurement_save(
        model="llama",
        profile="gpu",
        max_concurrency=8,
        tok_per_sec=400,
        actor="bench",
        now=timezone.now(),
    )
    before = measurements_revision()
    measurement = Measurement.objects.get()

    deletes = [
        admin_client.post(f"/admin/catalog/model/{llama.pk}/delete/", {"post": "yes"}),
        admin_client.post(
            "/admin/catalog/model/",
            {"action": "delete_selected", "_selected_action": [llama.pk], "post": "yes"},
        ),
        admin_client.post(f"/admin/catalog/measurement/{measurement.pk}/delete/", {"post": "yes"}),
    ]

    assert [r.status_code for r in deletes[::2]] == [403, 403]
    assert Model.objects.filter(pk=llama.pk).exists() and Measurement.objects.exists()
    assert measurements_revision() == before


@pytest.fixture
def three(llama) -> int:
    """llama (shared, 2–3), chat (critical, owned by Acme's ml) and spare (on demand);
    the team's ID."""
    from tenancy.services import org_create, team_create

    team = team_create(org=org_create(name="Acme", actor="t").pk, name="ml", actor="t")
    model_added(gpu_model("chat", owner=f"team:{team.pk}", **{"class": "critical"}))
    model_added(gpu_model("spare", scaling={"min": 0, "max": 1}))
    return team.pk


def test_the_model_list_has_a_line_per_model_with_class_owner_and_replicas(admin_client, three):
    page = admin_client.get("/admin/catalog/model/").content.decode()

    for column in ("shown_class", "owner", "replicas", "profile_names", "declared"):
        assert f"column-{column}" in page
    assert "critical" in page and f"team:{three} (Acme / ml)" in page
    assert "standard (default)" in page and "opportunistic (default)" in page
    assert "2–3" in page and "shared" in page


@pytest.mark.parametrize(
    "query, shown",
    [
        ("owner=team", ["chat"]),
        ("owner=shared", ["llama", "spare"]),
        ("runs=on-demand", ["spare"]),
        ("capacity_class=critical", ["chat"]),
        ("declared__exact=0&q=cha", ["chat"]),
    ],
)
def test_the_model_list_filters_by_owner_class_and_how_it_runs(admin_client, three, query, shown):
    response = admin_client.get(f"/admin/catalog/model/?{query}")

    assert [m.name for m in response.context["cl"].result_list] == shown


def test_the_model_list_reads_the_tenancy_tree_once_whatever_the_rows(
    admin_client, three, django_assert_max_num_queries
):
    for n in range(20):
        model_added(gpu_model(f"m{n}", owner="" if n % 2 else f"team:{three}"))

    with django_assert_max_num_queries(11):
        assert admin_client.get("/admin/catalog/model/").status_code == 200


def test_a_view_only_lists_title_is_a_title_and_where_to_change_it_is_said_under_it(
    admin_client, llama
):
    body = admin_client.get("/admin/catalog/model/").content.decode()
    assert "<title>Select model to view | Django site admin</title>" in body
    said = re.search(r'<p class="help" id="view-only">(.*?)</p>', body).group(1)
    assert said.startswith("View only: change models with llmgw ctl or the REST API")
