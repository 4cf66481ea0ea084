"""The quotas page: holds against guarantee and limit as bars, set and clear with errors beside
their field and nothing saved, the tenancy tree, and the scope search every scope field uses."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from catalog.services import model_add
from fleet.models import Replica, Shard
from llmgw.core import clock
from tenancy.models import CapacityQuota, Organization, Team
from tenancy.services import org_create, project_create, quota_set, team_create
from tests.fleet.builders import gpu_model, node_add

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def tree(scopes) -> dict[str, str]:
    """Acme with teams ml (and its project training) and web; scope keys by path."""
    made = scopes("Acme", "Acme/ml", "Acme/web", "Acme/ml/training", actor="t")
    return {
        "org:Acme": f"org:{made['Acme'].pk}",
        "team:Acme/ml": f"team:{made['Acme/ml'].pk}",
        "team:Acme/web": f"team:{made['Acme/web'].pk}",
        "project:Acme/ml/training": f"project:{made['Acme/ml/training'].pk}",
    }


def quotas_now() -> list[tuple]:
    return list(CapacityQuota.objects.order_by("scope").values_list())


def holding(model: str, *, owner: str, gpus: list[int], memory_gb: float) -> None:
    """A ready replica of a model owned by `owner` on node gpu-a, holding these GPUs."""
    if not Replica.objects.filter(model=model).exists():
        model_add(data=gpu_model(model, owner=owner), actor="t")
    now = clock.now()
    node_add(
        "gpu-a", now=now, gpus=({"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559},) * 4
    )
    replica = Replica.objects.create(
        id=f"{model}-{gpus[0]}",
        model=model,
        profile="gpu",
        profile_fp="x",
        state="ready",
        state_since=now,
        created_at=now,
        ready_at=now,
    )
    Shard.objects.create(
        id=f"{replica.id}-0",
        replica=replica,
        node_id="gpu-a",
        gpu_indices=gpus,
        memory_gb=memory_gb,
        http_port=20000 + gpus[0],
        state="ready",
    )


def test_each_quota_shows_its_holds_against_guarantee_and_limit_as_bars(staff, tree):
    ml = tree["team:Acme/ml"]
    quota_set(
        scope="team:Acme/ml", guarantee={"gpus": 4}, limit={"gpus": 8, "memory_gb": 100}, actor="t"
    )
    holding("llama", owner=ml, gpus=[0, 1], memory_gb=40)

    response = staff.get("/quotas")

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and "HX-Request" in response["Vary"]
    row = re.search(rf'<tr data-scope="{ml}">(.*?)</tr>', html, re.S)[1]
    assert "team:Acme/ml" in row and "Acme / ml" in row
    assert "2 / 4 (≤ 8)" in row  # GPUs: holds / guaranteed (≤ limit)
    assert "40 / - (≤ 100)" in row  # memory: limited, not guaranteed
    assert row.count('class="bar') == 2  # cores are not governed: no bar
    assert 'data-width="25.0"' in row and 'class="guarantee" data-left="50.0"' in row
    assert 'data-clear="' + ml + '"' in row


def test_a_scope_at_its_limit_is_drawn_full_and_red(staff, tree):
    ml = tree["team:Acme/ml"]
    quota_set(scope=ml, guarantee=None, limit={"gpus": 2}, actor="t")
    holding("llama", owner=ml, gpus=[0, 1], memory_gb=40)

    html = staff.get("/quotas").content.decode()

    assert 'class="bar over"' in html and 'data-width="100.0"' in html


def test_the_tenancy_tree_sits_beside_the_quotas_with_scope_names(staff, tree):
    quota_set(scope="team:Acme/web", guarantee={"gpus": 1}, limit=None, actor="t")

    html = staff.get("/quotas").content.decode()

    aside = html[html.index('id="tenancy-tree"') :]
    for name, key in tree.items():
        assert f'data-scope="{key}"' in aside and f"<code>{name}</code>" in aside
    # Organizations hold teams, teams hold projects.
    assert (
        aside.index("org:Acme")
        < aside.index("team:Acme/ml")
        < aside.index("project:Acme/ml/training")
        < aside.index("team:Acme/web")
    )
    assert aside.count('class="badge">quota') == 1


def test_htmx_gets_the_main_part_or_the_table_alone_without_the_page(staff, tree):
    quota_set(scope="org:Acme", guarantee={"gpus": 1}, limit=None, actor="t")

    main = staff.get("/quotas", **HTMX)
    table = staff.get("/quotas?fragment=quota-table", **HTMX)
    unknown = staff.get("/quotas?fragment=nonsense", **HTMX)

    for response in (main, table, unknown):
        assert response.status_code == 200
        assert "<html" not in response.content.decode()
        assert "HX-Request" in response["Vary"]
    assert (
        'id="quotas-main"' in main.content.decode() and 'id="quota-form"' in main.content.decode()
    )
    assert 'id="quota-table"' in table.content.decode()
    assert 'id="quota-form"' not in table.content.decode()
    assert unknown.content.decode().startswith('\n<div id="quotas-main">')


@pytest.mark.parametrize("path", ["/quotas", "/quotas?fragment=quota-table", "/scopes?q=a"])
def test_strangers_are_sent_to_log_in_and_non_staff_refused(client, path, db):
    assert client.get(path).url == f"/login/?next={path.replace('?', '%3F').replace('=', '%3D')}"
    assert client.get(path, **HTMX)["HX-Redirect"].startswith("/login/")
    assert client.post("/quotas", {"scope": "org:Acme", "gpus": 1}).status_code == 302

    client.force_login(get_user_model().objects.create_user("viewer"))
    assert client.get(path).status_code == 403
    assert client.post("/quotas", {"scope": "org:Acme", "gpus": 1}).status_code == 403
    assert not CapacityQuota.objects.exists()


def test_setting_a_quota_from_the_form_stores_it_and_says_so(staff, tree):
    response = staff.post(
        "/quotas",
        {
            "form": "set",
            "scope": "team: acme / ML",
            "gpus": "4",
            "limit_gpus": "8",
            "limit_memory": "512",
            "cores": "",
        },
    )

    assert (response.status_code, response.url) == (302, "/quotas")
    q = CapacityQuota.objects.get()
    assert q.scope == tree["team:Acme/ml"]
    assert (q.guarantee_gpus, q.limit_gpus, q.limit_memory_gb) == (4, 8, 512)
    assert (q.guarantee_cpu_cores, q.limit_cpu_cores, q.guarantee_memory_gb) == (None, None, None)
    assert q.updated_by == "ops"
    assert (
        "team:Acme/ml: set; it takes effect at the next reconciler pass"
        in staff.get("/quotas").content.decode()
    )


def test_an_htmx_set_answers_the_refreshed_part_with_the_new_row(staff, tree):
    response = staff.post(
        "/quotas", {"form": "set", "scope": "org:Acme", "limit_gpus": "16"}, **HTMX
    )

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html and 'id="notice"' in html
    assert f'data-scope="{tree["org:Acme"]}"' in html
    assert 'id="id_scope" value=""' in html  # a fresh form for the next one


BAD_QUOTAS = {
    "an unknown scope": (
        {"scope": "team:Acme/nope", "gpus": "1"},
        "id_scope_error",
        'there is no team "Acme/nope"',
    ),
    "not a scope name": ({"scope": "Acme", "gpus": "1"}, "id_scope_error", "is not org:NAME"),
    "a scope that could be several": (
        {"scope": "project:training", "gpus": "1", "_twin": "1"},
        "id_scope_error",
        "could be any of 2",
    ),
    "a negative guarantee": (
        {"scope": "org:Acme", "gpus": "-1"},
        "id_gpus_error",
        "a quota cannot be negative",
    ),
    "a negative limit": (
        {"scope": "org:Acme", "limit_memory": "-5"},
        "id_limit_memory_error",
        "a quota cannot be negative",
    ),
    "a guarantee above its limit": (
        {"scope": "org:Acme", "cores": "9", "limit_cores": "8"},
        "id_cores_error",
        "the guarantee of cpu_cores (9) is above its limit (8)",
    ),
    "a figure too large": (
        {"scope": "org:Acme", "limit_gpus": str(2**40)},
        "id_limit_gpus_error",
        "too large",
    ),
    "not a number": (
        {"scope": "org:Acme", "gpus": "two"},
        "id_gpus_error",
        "Enter a whole number.",
    ),
    "nothing governed": (
        {"scope": "org:Acme"},
        "quota-form-errors",
        "a quota needs a guarantee or a limit",
    ),
    "no scope": ({"scope": "", "gpus": "1"}, "id_scope_error", "This field is required."),
}


@pytest.mark.parametrize("htmx", [False, True], ids=["browser", "htmx"])
@pytest.mark.parametrize("case", BAD_QUOTAS.values(), ids=BAD_QUOTAS.keys())
def test_a_bad_quota_is_shown_beside_its_field_and_nothing_is_saved(staff, tree, case, htmx):
    given, where, sentence = case
    given = dict(given)
    if given.pop("_twin", None):
        team_create(org=org_create(name="Beta", actor="t").name, name="ops", actor="t")
        project_create(team="Beta/ops", name="training", actor="t")
    quota_set(scope="org:Acme", guarantee={"gpus": 2}, limit={"gpus": 4}, actor="t")
    before = quotas_now()

    response = staff.post("/quotas", {"form": "set", **given}, **(HTMX if htmx else {}))

    assert response.status_code == 400
    html = response.content.decode()
    assert ("<html" in html) != htmx
    shown = re.search(rf'id="{where}"[^>]*>(.*?)</(ul|div)>', html, re.S)
    assert shown and sentence in unescape(shown[1]), html
    assert html.count('class="errorlist') == 1  # beside that field only
    assert quotas_now() == before


def test_a_cleared_quota_is_gone_and_the_others_stay(staff, tree):
    quota_set(scope="org:Acme", guarantee={"gpus": 2}, limit=None, actor="t")
    quota_set(scope="team:Acme/ml", guarantee={"gpus": 1}, limit=None, actor="t")

    response = staff.post("/quotas", {"form": "clear", "scope": tree["team:Acme/ml"]}, **HTMX)

    assert response.status_code == 200
    assert "team:Acme/ml: quota removed" in response.content.decode()  # its name, not its key
    assert list(CapacityQuota.objects.values_list("scope", flat=True)) == [tree["org:Acme"]]


def test_clearing_a_quota_that_is_not_there_says_so_and_changes_nothing(staff, tree):
    quota_set(scope="org:Acme", guarantee={"gpus": 2}, limit=None, actor="t")
    before = quotas_now()

    response = staff.post("/quotas", {"form": "clear", "scope": tree["team:Acme/web"]}, **HTMX)

    assert response.status_code == 400
    assert re.search(
        r'id="clear-error"[^>]*>team:Acme/web has no capacity quota', response.content.decode()
    )
    assert quotas_now() == before


def test_the_set_form_refuses_a_post_without_its_csrf_token(tree):
    client = Client(enforce_csrf_checks=True)
    client.force_login(
        get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True)
    )
    body = {"form": "set", "scope": "org:Acme", "gpus": "1"}

    refused = client.post("/quotas", body)
    assert refused.status_code == 403 and not CapacityQuota.objects.exists()

    client.get("/quotas")
    token = client.cookies["csrftoken"].value
    accepted = client.post("/quotas", body, HTTP_X_CSRFTOKEN=token, **HTMX)
    assert accepted.status_code == 200 and CapacityQuota.objects.count() == 1


def test_the_scope_search_answers_matching_names_as_options(staff, tree):
    by_q = staff.get("/scopes?q=ML", **HTMX)
    by_field = staff.get("/scopes?scope=web")
    everything = staff.get("/scopes?owner=")

    html = by_q.content.decode()
    assert by_q.status_code == 200 and "<html" not in html and "HX-Request" in by_q["Vary"]
    assert re.findall(r'<option value="([^"]+)"', html) == [
        "project:Acme/ml/training",
        "team:Acme/ml",
    ]
    assert f"({tree['team:Acme/ml']})" in html
    assert re.findall(r'<option value="([^"]+)"', by_field.content.decode()) == ["team:Acme/web"]
    assert len(re.findall("<option", everything.content.decode())) == 4


def test_the_scope_search_offers_at_most_twenty(staff, db):
    Organization.objects.bulk_create(Organization(name=f"org{i:02}") for i in range(30))

    assert staff.get("/scopes?q=org").content.decode().count("<option") == 20


def _quotas(start: int, n: int) -> None:
    orgs = Organization.objects.bulk_create(
        Organization(name=f"org{i:03}") for i in range(start, start + n)
    )
    Team.objects.bulk_create(Team(org=o, name="ml") for o in orgs)
    CapacityQuota.objects.bulk_create(
        CapacityQuota(scope=f"org:{o.pk}", guarantee_gpus=1, limit_gpus=4, updated_by="t")
        for o in orgs
    )


def test_the_quotas_page_makes_as_many_queries_at_200_quotas_as_at_one(
    staff, django_assert_max_num_queries
):
    _quotas(0, 1)
    staff.get("/quotas")  # the catalog read once, as a running server has
    with CaptureQueriesContext(connection) as one:
        assert staff.get("/quotas").status_code == 200
    _quotas(1, 199)

    with django_assert_max_num_queries(13) as many:
        response = staff.get("/quotas")

    assert response.content.decode().count("<tr data-scope=") == 200
    assert len(many.captured_queries) == len(one.captured_queries)
