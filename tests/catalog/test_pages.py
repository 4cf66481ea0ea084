"""The models pages: the list and the add form, and each model's page with its forms; errors
beside their field with nothing saved, declared models read-only, staff only, queries pinned."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from catalog.domain import parse_model
from catalog.models import Model, Profile, Revision
from catalog.selectors import catalog_load
from catalog.services import declared_sync, measurement_save, model_add
from fleet.models import ModelState, Replica, Shard
from llmgw.core import clock
from tenancy.models import AuditEvent
from tenancy.services import org_create, team_create
from tests.fleet.builders import cpu_model, gpu_model, node_add

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def ml(db) -> str:
    """The key of team Acme/ml."""
    org_create(name="Acme", actor="t")
    return f"team:{team_create(org='Acme', name='ml', actor='t').pk}"


@pytest.fixture
def llama(ml) -> str:
    model_add(data=gpu_model("llama", owner=ml, scaling={"min": 1, "max": 3}), actor="t")
    return "llama"


@pytest.fixture
def vital(db) -> str:
    """A model declared in the catalog file."""
    declared_sync(specs=[parse_model(gpu_model("vital"), declared=True)])
    return "vital"


def catalog_now() -> list:
    """Every model and profile row as stored (nothing may change on a refused form)."""
    models = list(Model.objects.order_by("name").values_list())
    profiles = list(Profile.objects.order_by("model__name", "position").values_list())
    return [models, profiles]


def stored(name: str):
    """The model as the catalog now has it (every write tells the cache)."""
    return catalog_load()[name]


def ready_replica(replica_id: str, model: str, *, node: str, gpus: list[int], fp: str = "x"):
    now = clock.now()
    replica = Replica.objects.create(
        id=replica_id,
        model=model,
        profile="gpu",
        profile_fp=fp,
        state="ready",
        state_since=now,
        created_at=now,
        ready_at=now,
    )
    Shard.objects.create(
        id=f"{replica_id}-0",
        replica=replica,
        node_id=node,
        gpu_indices=gpus,
        memory_gb=40,
        http_port=20000 + gpus[0],
        state="ready",
    )


def error_text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</(ul|div|p)>', html, re.S)
    assert found, f"no #{element_id} in the answer"
    return unescape(re.sub(r"<[^>]+>", "", found[1]))


def test_the_models_list_shows_each_model_with_its_figures(staff, llama, vital, ml):
    model_add(data=cpu_model("tiny", scaling={"min": 0, "max": 2}), actor="t")

    response = staff.get("/models")

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and "HX-Request" in response["Vary"]
    assert re.findall(r'<tr data-model="([^"]+)"', html) == ["llama", "tiny", "vital"]
    row = re.search(r'<tr data-model="llama">(.*?)</tr>', html, re.S)[1]
    assert '<a href="/models/llama">llama</a>' in row
    assert 'data-ready="0" data-desired="1"' in row and "0 / 1" in row
    assert "team:Acme/ml" in row and "standard" in row and "runtime" in row
    assert "gpu: sim on h100-80g ×1" in row
    tiny = re.search(r'<tr data-model="tiny">(.*?)</tr>', html, re.S)[1]
    assert "shared" in tiny and "opportunistic" in tiny and "cpu: sim on CPU" in tiny
    assert ">declared<" in re.search(r'<tr data-model="vital">(.*?)</tr>', html, re.S)[1]
    assert 'id="model-add-form"' in html


def test_htmx_gets_the_list_or_the_table_without_the_page(staff, llama):
    main = staff.get("/models", **HTMX)
    table = staff.get("/models?fragment=model-table", **HTMX)

    for response in (main, table):
        assert response.status_code == 200 and "HX-Request" in response["Vary"]
        assert "<html" not in response.content.decode()
        assert 'data-model="llama"' in response.content.decode()
    assert 'id="model-add-form"' in main.content.decode()
    assert 'id="model-add-form"' not in table.content.decode()


def test_another_profile_row_comes_numbered_after_the_last(staff, db):
    response = staff.get("/models?fragment=profile-added&profile-TOTAL_FORMS=1", **HTMX)

    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'name="profile-1-name"' in html and 'name="profile-1-engine"' in html
    assert re.search(
        r'name="profile-TOTAL_FORMS" value="2" id="id_profile-TOTAL_FORMS" hx-swap-oob="true"', html
    )

    full = staff.get(
        "/models?fragment=profile-added&profile-TOTAL_FORMS=16", **HTMX
    ).content.decode()
    assert "profile-16-name" not in full and "at most 16 profiles" in full


def add_form(**given) -> dict:
    """A filled add form: one GPU profile unless profiles are given."""
    profiles = given.pop(
        "profiles", [{"name": "gpu", "engine": "sim", "gpu_class": "h100-80g", "tp": "2"}]
    )
    body = {
        "name": "mistral",
        "source": "hf://acme/mistral",
        "capacity_class": "",
        "owner": "",
        "min": "1",
        "max": "2",
        "description": "",
        **given,
        "profile-TOTAL_FORMS": str(len(profiles)),
        "profile-INITIAL_FORMS": "0",
    }
    for i, p in enumerate(profiles):
        row = {
            "name": "",
            "engine": "sim",
            "gpu_class": "",
            "tp": "",
            "min_memory_gb": "",
            "cpu_cores": "",
            **p,
        }
        body |= {f"profile-{i}-{k}": v for k, v in row.items()}
    return body


def test_a_runtime_model_is_added_with_its_profiles_and_the_browser_sent_to_it(staff, ml):
    response = staff.post(
        "/models",
        add_form(
            capacity_class="critical",
            owner="team:acme/ml",
            description="chat for the support desk",
            profiles=[
                {"name": "gpu", "gpu_class": "h100-80g", "tp": "2"},
                {"name": "cpu", "engine": "llamacpp", "min_memory_gb": "12.5", "cpu_cores": "8"},
            ],
        ),
    )

    assert (response.status_code, response.url) == (302, "/models/mistral")
    spec = stored("mistral")
    assert (spec.capacity_class, spec.owner, spec.min_replicas, spec.max_replicas) == (
        "critical",
        ml,
        1,
        2,
    )
    assert [(p.name, p.engine, p.gpu_class, p.tp) for p in spec.profiles] == [
        ("gpu", "sim", "h100-80g", 2),
        ("cpu", "llamacpp", "", 1),
    ]
    assert (spec.profiles[1].min_memory_gb, spec.profiles[1].cpu_cores) == (12.5, 8)
    assert Model.objects.get(name="mistral").updated_by == "ops"
    assert "model mistral added" in staff.get("/models/mistral").content.decode()


def test_an_htmx_add_answers_the_list_with_the_new_row_and_a_fresh_form(staff, db):
    # The empty second row (added and left blank) is not a profile.
    body = add_form() | {"profile-TOTAL_FORMS": "2", "profile-1-engine": "llamacpp"}
    response = staff.post("/models", body, **HTMX)

    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert 'data-model="mistral"' in html and "model mistral added" in html
    assert (
        'name="profile-TOTAL_FORMS" value="1"' in html
        and 'name="name" maxlength="200" id="id_name"' in html
    )
    assert [p.name for p in stored("mistral").profiles] == ["gpu"]


BAD_MODELS = {
    "a name with capitals": (
        add_form(name="Mistral 7B"),
        "id_name_error",
        "A model's name must be",
    ),
    "no name": (add_form(name=""), "id_name_error", "not ''"),
    "a name that is taken": (
        add_form(name="llama"),
        "id_name_error",
        "A model named llama already exists.",
    ),
    "an unknown owner": (
        add_form(owner="team:Acme/nope"),
        "id_owner_error",
        'owner: there is no team "Acme/nope"',
    ),
    "max below min": (add_form(min="3", max="2"), "id_max_error", "max (2) is below min (3)"),
    "a negative min": (add_form(min="-1"), "id_min_error", "min must be at least 0"),
    "no profile": (
        add_form(profiles=[{"engine": "llamacpp"}]),
        "profiles-errors",
        "at least one profile is needed",
    ),
    "a bad gpu class": (
        add_form(profiles=[{"name": "gpu", "gpu_class": "H100!"}]),
        "id_profile-0-gpu_class_error",
        "gpu_class must look like h100-80g",
    ),
    "tp without a gpu class": (
        add_form(profiles=[{"name": "cpu", "tp": "2", "min_memory_gb": "4"}]),
        "id_profile-0-tp_error",
        "need a gpu_class",
    ),
    "a CPU profile without memory": (
        add_form(
            profiles=[{"name": "gpu", "gpu_class": "h100-80g"}, {"name": "cpu", "cpu_cores": "2"}]
        ),
        "id_profile-1-min_memory_gb_error",
        "must declare min_memory_gb",
    ),
    "zero cores": (
        add_form(profiles=[{"name": "cpu", "cpu_cores": "0", "min_memory_gb": "4"}]),
        "id_profile-0-cpu_cores_error",
        "cpu_cores must be at least 1",
    ),
    "a profile without a name": (
        add_form(profiles=[{"gpu_class": "h100-80g"}]),
        "id_profile-0-name_error",
        "a profile needs a name",
    ),
    "two profiles of one name": (
        add_form(
            profiles=[{"name": "p", "gpu_class": "h100-80g"}, {"name": "p", "min_memory_gb": "4"}]
        ),
        "id_profile-1-name_error",
        "two profiles are named p",
    ),
    "an unknown engine": (
        add_form(profiles=[{"name": "gpu", "engine": "tgi", "gpu_class": "h100-80g"}]),
        "id_profile-0-engine_error",
        "Select a valid choice",
    ),
    "memory not a number": (
        add_form(profiles=[{"name": "cpu", "min_memory_gb": "lots"}]),
        "id_profile-0-min_memory_gb_error",
        "Enter a number.",
    ),
    "too many profiles": (
        add_form(profiles=[{"name": f"p{i}", "min_memory_gb": "1"} for i in range(17)]),
        "profiles-errors",
        "at most 16",
    ),
}


@pytest.mark.parametrize("htmx", [False, True], ids=["browser", "htmx"])
@pytest.mark.parametrize("case", BAD_MODELS.values(), ids=BAD_MODELS.keys())
def test_a_bad_model_is_shown_beside_its_field_and_nothing_is_added(staff, llama, case, htmx):
    body, where, sentence = case
    before, audits = catalog_now(), AuditEvent.objects.count()

    response = staff.post("/models", body, **(HTMX if htmx else {}))

    assert response.status_code == 400
    html = response.content.decode()
    assert ("<html" in html) != htmx
    assert sentence in error_text(html, where)
    assert len(re.findall(r'class="errorlist', html)) == 1  # beside that field only
    assert catalog_now() == before and AuditEvent.objects.count() == audits


@pytest.fixture
def fleet(llama):
    """llama on gpu-a: one ready replica started with an older profile, one failed placement,
    and a measurement."""
    node_add("gpu-a", now=clock.now())
    ready_replica("llama-a1", "llama", node="gpu-a", gpus=[0], fp="old")
    ModelState.objects.create(
        model="llama",
        desired=2,
        unplaceable=True,
        explanation=[{"profile": "gpu", "reasons": ["gpu-b: no free h100-80g GPU (needs 1)"]}],
    )
    measurement_save(
        model="llama",
        profile="gpu",
        max_concurrency=16,
        tok_per_sec=850.0,
        ttft_p95_ms=120,
        actor="bench",
        now=clock.now(),
    )
    return "llama"


def test_a_models_page_shows_replicas_explanation_headroom_measurements_and_the_dry_run(
    staff, fleet
):
    # ?all=1: everything inline, as a browser without scripts asks (the page below).
    response = staff.get("/models/llama?all=1")

    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" in html and "HX-Request" in response["Vary"]
    replica = re.search(r'<tr data-replica="llama-a1">(.*?)</tr>', html, re.S)[1]
    assert '<a href="/nodes/gpu-a" data-node="gpu-a">gpu-a</a>' in replica
    assert "gpu-a:0" in replica and "state-ready" in replica and "outdated" in replica
    assert "data-engine-reading" not in replica, "its engine said nothing: no figures, not 0"
    assert re.search(r"<time datetime=", replica)
    explanation = html[html.index('id="explanation"') : html.index('id="headroom"')]
    assert (
        'data-profile="gpu"' in explanation
        and "gpu-b: no free h100-80g GPU (needs 1)" in explanation
    )
    headroom = html[html.index('id="headroom"') : html.index('id="preemption"')]
    assert re.search(r'id="headroom-more">1<', headroom)  # one H100 left on gpu-a
    assert "850 tokens/s" in headroom
    assert "llama fits" in error_text(html, "preemption-summary")
    measured = html[html.index('id="measurements"') :]
    assert '<tr data-profile="gpu">' in measured and "850" in measured and "120 ms" in measured
    assert re.search(r'id="model-owner"[^>]*>team:Acme/ml<', html)
    for form in (
        "scale-form",
        "class-form",
        "owner-form",
        "resources-form",
        "restart-form",
        "retry-form",
    ):
        assert f'id="{form}"' in html
    assert 'list="owner-options"' in html and 'hx-get="/scopes"' in html
    assert "disabled" not in html


def test_htmx_gets_the_models_main_part_or_its_replicas_alone(staff, fleet):
    main = staff.get("/models/llama", **HTMX)
    replicas = staff.get("/models/llama?fragment=replicas", **HTMX)

    for response in (main, replicas):
        assert response.status_code == 200 and "HX-Request" in response["Vary"]
        assert "<html" not in response.content.decode()
        assert 'data-replica="llama-a1"' in response.content.decode()
    assert 'id="scale-form"' in main.content.decode()
    assert 'id="scale-form"' not in replicas.content.decode()
    assert 'id="headroom"' not in replicas.content.decode()


def test_the_analysis_and_the_record_come_after_the_page_as_fragments_of_their_own(staff, fleet):
    page = staff.get("/models/llama").content.decode()
    for part, shows in (("analysis", 'id="headroom"'), ("record", 'id="measurements"')):
        # Until it comes: a section that asks for it as the page loads, and a link that
        # shows it inline for a browser without scripts.
        asking = re.search(rf'<section id="{part}"([^>]*)>(.*?)</section>', page, re.S)
        assert f'hx-get="/models/llama?fragment={part}" hx-trigger="load"' in asking[1]
        assert '<a href="?all=1">' in asking[2]
        assert shows not in page
        fragment = staff.get(f"/models/llama?fragment={part}", **HTMX).content.decode()
        assert fragment.lstrip().startswith(f'<div id="{part}">') and "<html" not in fragment
        assert shows in fragment
    analysis = staff.get("/models/llama?fragment=analysis", **HTMX).content.decode()
    assert re.search(r'id="headroom-more">1<', analysis)
    assert "llama fits" in error_text(analysis, "preemption-summary")


def test_an_unknown_model_is_not_found(staff, db):
    assert staff.get("/models/ghost").status_code == 404
    assert staff.post("/models/ghost", {"form": "scale", "min": "1"}).status_code == 404


@pytest.mark.parametrize("path", ["/models", "/models?fragment=model-table", "/models/llama"])
def test_strangers_are_sent_to_log_in_and_non_staff_refused(client, llama, path):
    assert client.get(path).status_code == 302
    assert client.get(path).url.startswith("/login/?next=/models")
    assert client.get(path, **HTMX)["HX-Redirect"].startswith("/login/")
    before = catalog_now()
    assert client.post("/models/llama", {"form": "scale", "min": "2"}).status_code == 302

    client.force_login(get_user_model().objects.create_user("viewer"))
    assert client.get(path).status_code == 403
    assert client.post("/models/llama", {"form": "scale", "min": "2"}).status_code == 403
    assert client.post("/models", add_form()).status_code == 403
    assert catalog_now() == before


def test_the_forms_refuse_a_post_without_its_csrf_token(llama):
    client = Client(enforce_csrf_checks=True)
    client.force_login(
        get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True)
    )
    before = catalog_now()

    assert (
        client.post("/models/llama", {"form": "class", "capacity_class": "critical"}).status_code
        == 403
    )
    assert client.post("/models", add_form()).status_code == 403
    assert catalog_now() == before

    client.get("/models/llama")
    token = client.cookies["csrftoken"].value
    body = {"form": "class", "capacity_class": "critical"}
    assert client.post("/models/llama", body, HTTP_X_CSRFTOKEN=token, **HTMX).status_code == 200
    assert stored("llama").capacity_class == "critical"


GOOD_FORMS = {
    "scale": (
        {"form": "scale", "min": "2", "max": "4", "idle_timeout": "900"},
        "model llama scaled: min 2, max 4, idle timeout 900 s",
        lambda s: (s.min_replicas, s.max_replicas, s.idle_timeout_s) == (2, 4, 900),
    ),
    "class": (
        {"form": "class", "capacity_class": "opportunistic"},
        "model llama is opportunistic",
        lambda s: s.capacity_class == "opportunistic",
    ),
    "class back to the default": (
        {"form": "class", "capacity_class": "default"},
        "model llama is standard",
        lambda s: s.capacity_class == "",
    ),
    "owner": (
        {"form": "owner", "owner": "org:Acme"},
        "model llama counts against org:Acme",
        lambda s: s.owner.startswith("org:"),
    ),
    "shared": ({"form": "owner", "owner": ""}, "model llama is shared", lambda s: s.owner == ""),
    "resources": (
        {"form": "resources", "profile": "gpu", "memory_gb": "48", "cpu_cores": "4"},
        "model llama reserves gpu: 48 GB, 4 cores",
        lambda s: (s.profiles[0].min_memory_gb, s.profiles[0].cpu_cores) == (48.0, 4),
    ),
}


@pytest.mark.parametrize("case", GOOD_FORMS.values(), ids=GOOD_FORMS.keys())
def test_a_form_changes_the_model_and_the_page_shows_it(staff, llama, case):
    body, said, check = case

    response = staff.post("/models/llama", body, **HTMX)

    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert said in error_text(html, "notice")
    assert check(stored("llama"))
    assert AuditEvent.objects.filter(actor="ops").count() == 1


def test_a_browser_form_redirects_back_with_a_message(staff, llama):
    response = staff.post("/models/llama", {"form": "class", "capacity_class": "critical"})

    assert (response.status_code, response.url) == (302, "/models/llama")
    page = staff.get("/models/llama").content.decode()
    assert "model llama is critical" in page
    assert re.search(r'id="model-class" data-class="critical"', page)


def test_restart_and_retry_go_through_the_fleet(staff, llama):
    restart = staff.post("/models/llama", {"form": "restart"}, **HTMX)
    retry = staff.post("/models/llama", {"form": "retry"}, **HTMX)

    assert restart.status_code == 200 and "model llama restarting" in restart.content.decode()
    assert retry.status_code == 200 and "its failures are cleared" in retry.content.decode()
    assert ModelState.objects.get(pk="llama").restart_requested_at is not None


BAD_FORMS = {
    "max below min": (
        {"form": "scale", "min": "3", "max": "2"},
        "id_max_error",
        "max (2) is below min (3)",
    ),
    "too many replicas": (
        {"form": "scale", "min": "20000"},
        "id_min_error",
        "min must be at most 10000",
    ),
    "a zero idle timeout": (
        {"form": "scale", "idle_timeout": "0"},
        "id_idle_timeout_error",
        "idle_timeout must be at least 1",
    ),
    "a negative max": ({"form": "scale", "max": "-1"}, "id_max_error", "max must be at least 0"),
    "scaling with nothing": (
        {"form": "scale"},
        "scale-form-errors",
        "Give min, max or idle timeout.",
    ),
    "an unknown class": (
        {"form": "class", "capacity_class": "gold"},
        "id_capacity_class_error",
        "Select a valid choice",
    ),
    "an unknown owner": (
        {"form": "owner", "owner": "team:Acme/nope"},
        "id_owner_error",
        'there is no team "Acme/nope"',
    ),
    "an owner that is no scope": (
        {"form": "owner", "owner": "acme"},
        "id_owner_error",
        "is not org:NAME",
    ),
    "negative memory": (
        {"form": "resources", "memory_gb": "-4"},
        "id_memory_gb_error",
        "memory and cores cannot be negative",
    ),
    "negative cores": (
        {"form": "resources", "memory_gb": "4", "cpu_cores": "-2"},
        "id_cpu_cores_error",
        "memory and cores cannot be negative",
    ),
    "zero memory": (
        {"form": "resources", "memory_gb": "0"},
        "id_memory_gb_error",
        "memory_gb must be more than 0",
    ),
    "no memory": (
        {"form": "resources", "memory_gb": ""},
        "id_memory_gb_error",
        "This field is required.",
    ),
    "memory that is no number": (
        {"form": "resources", "memory_gb": "nan"},
        "id_memory_gb_error",
        "Enter a number.",
    ),
    "an unknown profile": (
        {"form": "resources", "profile": "tpu", "memory_gb": "4"},
        "id_profile_error",
        "Select a valid choice",
    ),
    "too many cores": (
        {"form": "resources", "memory_gb": "4", "cpu_cores": str(2**40)},
        "id_cpu_cores_error",
        "cpu_cores is too large",
    ),
}


@pytest.mark.parametrize("htmx", [False, True], ids=["browser", "htmx"])
@pytest.mark.parametrize("case", BAD_FORMS.values(), ids=BAD_FORMS.keys())
def test_a_bad_form_is_shown_beside_its_field_and_nothing_is_saved(staff, llama, case, htmx):
    body, where, sentence = case
    before, audits = catalog_now(), AuditEvent.objects.count()

    response = staff.post("/models/llama", body, **(HTMX if htmx else {}))

    assert response.status_code == 400
    html = response.content.decode()
    assert ("<html" in html) != htmx
    assert sentence in error_text(html, where)
    assert len(re.findall(r'class="errorlist', html)) == 1
    assert catalog_now() == before and AuditEvent.objects.count() == audits


def test_a_declared_models_forms_are_disabled_with_the_reason(staff, vital):
    html = staff.get("/models/vital").content.decode()

    assert "declared in the catalog file; edit that file and restart llmgw serve" in error_text(
        html, "declared-reason"
    )
    for form in ("scale-form", "class-form", "owner-form", "resources-form"):
        start = html.index(f'id="{form}"')
        assert re.match(
            r"[^<]*>\s*<input[^>]*csrf[^>]*><input[^>]*>\s*<fieldset disabled", html[start:], re.S
        )
    assert html.count("<fieldset disabled") == 4


@pytest.mark.parametrize(
    "body",
    [
        {"form": "scale", "min": "2"},
        {"form": "class", "capacity_class": "critical"},
        {"form": "owner", "owner": ""},
        {"form": "resources", "memory_gb": "8"},
    ],
    ids=lambda b: b["form"],
)
def test_a_post_to_a_declared_models_form_is_refused(staff, vital, body):
    before = catalog_now()

    response = staff.post("/models/vital", body, **HTMX)

    assert response.status_code == 400
    said = error_text(response.content.decode(), f"{body['form']}-form-errors")
    assert (
        "model vital is declared in the catalog file; edit that file and restart llmgw serve"
        in said
    )
    assert catalog_now() == before


def test_a_post_naming_no_form_of_the_page_is_refused(staff, llama):
    assert staff.post("/models/llama", {"form": "delete"}).status_code == 400


def _models(start: int, n: int) -> None:
    rows = Model.objects.bulk_create(
        Model(name=f"m{i:04}", source="hf://x") for i in range(start, start + n)
    )
    Profile.objects.bulk_create(
        Profile(model=m, name="gpu", engine="sim", gpu_class="h100-80g") for m in rows
    )
    Revision.objects.update_or_create(pk=1, defaults={"value": start + n})


def test_the_models_list_makes_as_many_queries_at_500_models_as_at_one(
    staff, ml, django_assert_max_num_queries
):
    _models(0, 1)
    staff.get("/models")  # the catalog read once, as a running server has
    with CaptureQueriesContext(connection) as one:
        staff.get("/models")
    _models(1, 499)
    staff.get("/models")

    with django_assert_max_num_queries(12) as many:
        response = staff.get("/models")

    assert response.content.decode().count("<tr data-model=") == 500
    assert len(many.captured_queries) == len(one.captured_queries)


def test_a_models_page_makes_as_many_queries_at_40_replicas_as_at_one(
    staff, fleet, django_assert_max_num_queries
):
    staff.get("/models/llama")
    with CaptureQueriesContext(connection) as one:
        staff.get("/models/llama")
    for i in range(2, 42):
        node_add(f"gpu-{i}", now=clock.now())
        ready_replica(f"llama-{i}", "llama", node=f"gpu-{i}", gpus=[0])
    staff.get("/models/llama")  # the new nodes' static figures read once, then cached

    # The analysis (headroom, the dry run) and the record (events, measurements) come after
    # the page as fragments of their own; the page reads the catalog, the states and the
    # replicas once (it was 64, and 39 with them inline), and what their engines said
    # from their nodes' loads (one more, a few per 500 nodes).
    with django_assert_max_num_queries(13) as many:
        response = staff.get("/models/llama")

    assert response.content.decode().count("<tr data-replica=") == 41
    assert len(many.captured_queries) == len(one.captured_queries)


def test_a_profile_may_pass_engine_arguments_from_the_add_form(staff, db):
    profiles = [
        {"name": "cpu", "engine": "llamacpp", "min_memory_gb": "2", "cpu_cores": "1",
         "args": "--ctx-size 8192 --chat-template 'gemma 3'"},
    ]  # fmt: skip
    response = staff.post("/models", add_form(profiles=profiles))

    assert response.status_code == 302, response.content.decode()[:2000]
    assert stored("mistral").profiles[0].args == (
        "--ctx-size",
        "8192",
        "--chat-template",
        "gemma 3",
    )


def test_engine_arguments_that_cannot_be_split_are_refused_beside_the_field(staff, db):
    profiles = [{"name": "cpu", "engine": "llamacpp", "min_memory_gb": "2", "args": "--x 'open"}]

    response = staff.post("/models", add_form(profiles=profiles))

    assert response.status_code == 400
    assert "The engine arguments cannot be read: No closing quotation." in response.content.decode()
    assert not Model.objects.filter(name="mistral").exists()


def test_a_replica_whose_agent_fetches_its_weights_says_how_far_on_the_model_page(staff, fleet):
    from fleet.models import Shard

    shard = Shard.objects.filter(replica__model="llama").first()
    Shard.objects.filter(pk=shard.pk).update(
        state="fetching", progress_done=100_000_000, progress_total=250_000_000
    )

    html = staff.get("/models/llama").content.decode()

    assert "fetching 40% of 250 MB" in html


def test_a_models_page_shows_what_each_replicas_engine_said(staff, fleet):
    from fleet.models import Node, Shard

    shard = Shard.objects.get(replica_id="llama-a1")
    said = {"running": 3, "waiting": 0, "kv_cache": 0.456, "prefix_hit_rate": 0.25}
    Node.objects.filter(pk="gpu-a").update(load={"engines": {shard.id: said}})
    html = staff.get("/models/llama?fragment=replicas", **HTMX).content.decode()
    replica = re.search(r'<tr data-replica="llama-a1">(.*?)</tr>', html, re.S)[1]
    shown = re.search(r"data-engine-reading>(.*?)</span>\s*</td>", replica, re.S)[1]
    assert re.sub(r"<[^>]+>", "", shown) == "runs 3 · queues 0 · KV 46% · hits 25%"
