"""A model's class, owner, reservations and measurements, each set through the one update path."""

from __future__ import annotations

import math

import pytest

from catalog import selectors as catalog_selectors
from catalog.domain import parse_model
from catalog.models import Measurement, Model
from catalog.selectors import catalog_load, measurements_load
from catalog.services import declared_sync, model_add, model_resources_set
from llmgw.core.errors import Invalid
from tenancy.models import AuditEvent, Organization, Team
from tests.fleet.builders import cpu_model, gpu_model
from tests.helpers import detail

pytestmark = pytest.mark.django_db


def two_profiles(name: str = "mixed") -> dict:
    return {
        "name": name,
        "source": f"hf://acme/{name}",
        "profiles": [
            {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"},
            {"name": "cpu", "engine": "sim", "cpu_cores": 2, "min_memory_gb": 4},
        ],
    }


def stored(name: str) -> tuple:
    """What the database holds of a model, to show a refusal changed nothing."""
    row = Model.objects.get(name=name)
    profiles = list(row.profiles.values_list("name", "min_memory_gb", "cpu_cores"))
    return (row.capacity_class, row.owner, row.updated_by, profiles)


@pytest.fixture
def teams(db):
    """Acme with teams ml and web, Scania with another ml."""
    acme = Organization.objects.create(name="Acme")
    scania = Organization.objects.create(name="Scania")
    return {
        "acme": acme.pk,
        "ml": Team.objects.create(org=acme, name="ml").pk,
        "web": Team.objects.create(org=acme, name="web").pk,
        "scania_ml": Team.objects.create(org=scania, name="ml").pk,
    }


# Class


@pytest.mark.parametrize("klass", ["critical", "standard", "opportunistic"])
def test_a_class_is_set_and_answered(api, klass):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models/llama/class", {"class": klass}, HTTP_X_LLMGW_ACTOR="dan")

    assert (response.status_code, response.json()) == (200, {"model": "llama", "class": klass})
    assert (Model.objects.get().capacity_class, Model.objects.get().updated_by) == (klass, "dan")
    assert AuditEvent.objects.filter(action="model.class", actor="dan").exists()


@pytest.mark.parametrize(
    "scaling, effective", [({"min": 1}, "standard"), ({"min": 0, "max": 2}, "opportunistic")]
)
def test_an_empty_class_returns_to_the_default_and_answers_the_effective_one(
    api, scaling, effective
):
    api.call("POST", "/models", gpu_model("llama", scaling=scaling, **{"class": "critical"}))

    response = api.call("POST", "/models/llama/class", {"class": ""})

    assert response.json() == {"model": "llama", "class": effective}
    assert Model.objects.get().capacity_class == ""
    assert api.call("GET", "/models/llama").json()["class"] == effective


@pytest.mark.parametrize(
    "body, says",
    [
        ({"class": "urgent"}, "class must be one of critical, standard, opportunistic"),
        ({"class": "Critical"}, "not 'Critical'"),
        ({"class": 3}, "class"),
        ({}, "class"),
        ({"class": "critical", "why": "x"}, "why"),
    ],
)
def test_an_unknown_class_is_400_and_changes_nothing(api, body, says):
    api.call("POST", "/models", gpu_model("llama"))
    before = stored("llama")

    response = api.call("POST", "/models/llama/class", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert stored("llama") == before


# Owner


@pytest.mark.parametrize(
    "given, key",
    [("team:Acme/ml", "ml"), ("team: acme / ML ", "ml"), ("team:web", "web"), ("org:Acme", "acme")],
)
def test_an_owner_is_named_by_path_and_stored_by_id(api, teams, given, key):
    api.call("POST", "/models", gpu_model("llama"))

    response = api.call("POST", "/models/llama/owner", {"owner": given})

    kind = "org" if key == "acme" else "team"
    assert response.status_code == 200
    assert response.json() == {"model": "llama", "owner": f"{kind}:{teams[key]}"}
    assert Model.objects.get().owner == f"{kind}:{teams[key]}"
    assert AuditEvent.objects.filter(action="model.owner").exists()


def test_an_owner_given_by_id_is_kept_and_an_empty_one_makes_the_model_shared(api, teams):
    api.call("POST", "/models", gpu_model("llama"))

    by_id = api.call("POST", "/models/llama/owner", {"owner": f"team:{teams['scania_ml']}"})
    assert by_id.json()["owner"] == f"team:{teams['scania_ml']}"

    shared = api.call("POST", "/models/llama/owner", {"owner": ""})
    assert (shared.status_code, shared.json()) == (200, {"model": "llama", "owner": ""})
    assert Model.objects.get().owner == ""


@pytest.mark.parametrize(
    "owner, says",
    [
        ("team:ml", '"ml" could be any of 2 teams; give its ID'),
        ("team:Acme/nope", 'there is no team "Acme/nope"'),
        ("group:Acme", "is not org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT"),
        ("Acme", "is not org:NAME"),
        ("team:999", 'there is no team "999"'),
        ("shared", "is not org:NAME"),
    ],
)
def test_a_malformed_unknown_or_ambiguous_owner_is_400_and_changes_nothing(api, teams, owner, says):
    api.call("POST", "/models", gpu_model("llama", owner=f"team:{teams['web']}"))
    before = stored("llama")

    response = api.call("POST", "/models/llama/owner", {"owner": owner})

    assert response.status_code == 400
    assert says in detail(response)
    assert stored("llama") == before
    assert not AuditEvent.objects.filter(action="model.owner").exists()


@pytest.mark.parametrize("path, body", [("class", {"class": "critical"}), ("owner", {"owner": ""})])
def test_class_and_owner_of_an_unknown_model_are_404(api, path, body):
    response = api.call("POST", f"/models/ghost/{path}", body)

    assert response.status_code == 404
    assert "ghost" in detail(response)


# Resources


class TestResourcesAreSetOnAStoredModelAndSurviveARestart:
    def test_set_refused_and_read_back(self, db):
        model_add(data=cpu_model("m", cores=1, memory_gb=2), actor="tester")

        got = model_resources_set(name="m", memory_gb=6, cpu_cores=3, actor="tester")
        assert (got.profiles[0].min_memory_gb, got.profiles[0].cpu_cores) == (6, 3)

        with pytest.raises(Invalid, match='model m has no profile "nope"'):
            model_resources_set(name="m", profile="nope", memory_gb=6, cpu_cores=3, actor="t")
        with pytest.raises(Invalid, match="cannot be negative"):
            model_resources_set(name="m", memory_gb=-1, cpu_cores=0, actor="tester")

        # As after a restart: nothing cached, the catalog read again from the database.
        catalog_selectors._cache["version"] = None
        profile = catalog_load()["m"].profiles[0]
        assert (profile.min_memory_gb, profile.cpu_cores) == (6, 3)


def test_resources_answer_the_model_view_and_set_every_profile_when_none_is_named(api):
    api.call("POST", "/models", two_profiles())

    response = api.call("POST", "/models/mixed/resources", {"memory_gb": 6, "cpu_cores": 3})

    assert response.status_code == 200
    view = response.json()
    assert view["name"] == "mixed"
    assert [(p["name"], p["min_memory_gb"], p["cpu_cores"]) for p in view["profiles"]] == [
        ("gpu", 6.0, 3),
        ("cpu", 6.0, 3),
    ]
    # Cores on a GPU profile are kept but reserve nothing: the view's figure is the first's.
    assert (view["memory_gb"], view["cpu_cores"]) == (6.0, None)
    assert AuditEvent.objects.get(action="model.resources").detail == {
        "memory_gb": 6,
        "cpu_cores": 3,
    }


def test_resources_of_one_profile_leave_the_others_alone(api):
    api.call("POST", "/models", two_profiles())

    api.call("POST", "/models/mixed/resources", {"profile": "cpu", "memory_gb": 8.5})

    spec = catalog_load()["mixed"]
    assert (spec.profile("cpu").min_memory_gb, spec.profile("cpu").cpu_cores) == (8.5, 2)
    assert spec.profile("gpu").min_memory_gb is None


def test_zero_cores_reserve_none(api):
    api.call("POST", "/models", cpu_model("tiny", cores=4))

    api.call("POST", "/models/tiny/resources", {"memory_gb": 4, "cpu_cores": 0})

    assert catalog_load()["tiny"].profiles[0].reserved_cores is None


def test_a_changed_profile_shows_its_running_replicas_as_outdated_not_restarted(api):
    api.call("POST", "/models", cpu_model("tiny", memory_gb=4))
    before = catalog_load()["tiny"].profiles[0].fingerprint()

    api.call("POST", "/models/tiny/resources", {"memory_gb": 6})

    assert catalog_load()["tiny"].profiles[0].fingerprint() != before


@pytest.mark.parametrize(
    "body, says",
    [
        ({"memory_gb": -1}, "memory and cores cannot be negative"),
        ({"memory_gb": 4, "cpu_cores": -2}, "memory and cores cannot be negative"),
        ({"memory_gb": 0}, "memory_gb must be more than 0"),
        ({"memory_gb": 4, "profile": "nope"}, 'model tiny has no profile "nope"'),
        ({"cpu_cores": 2}, "memory_gb"),
        ({"memory_gb": "4"}, "memory_gb"),
        ({"memory_gb": 4, "cpu_cores": 1.5}, "cpu_cores"),
        ({"memory_gb": 4, "cores": 2}, "cores"),
        ({"memory_gb": 1e300}, "too large"),
        ({"memory_gb": 4, "cpu_cores": 10**12}, "too large"),
        ('{"memory_gb": Infinity}', "memory_gb"),
        ('{"memory_gb": NaN}', "memory_gb"),
    ],
)
def test_bad_resources_are_400_and_change_nothing(api, body, says):
    api.call("POST", "/models", cpu_model("tiny", cores=2, memory_gb=4))
    before = stored("tiny")

    response = api.call("POST", "/models/tiny/resources", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert stored("tiny") == before
    assert not AuditEvent.objects.filter(action="model.resources").exists()


class TestACPUModelAddedNowMustSayHowMuchMemoryItNeeds:
    def test_refused_and_not_stored(self, api):
        bare = {"name": "bare", "profiles": [{"name": "p", "engine": "llamacpp"}]}

        response = api.call("POST", "/models", bare)

        assert response.status_code == 400
        assert "must declare min_memory_gb" in detail(response)
        assert Model.objects.count() == 0


# Measurements


def test_a_measurement_is_stored_with_when_and_by_whom_and_listed(api):
    api.call("POST", "/models", two_profiles())
    body = {"profile": "gpu", "max_concurrency": 16, "tok_per_sec": 500, "ttft_p95_ms": 420.5}

    response = api.call("PUT", "/models/mixed/capacity", body, HTTP_X_LLMGW_ACTOR="bench")

    assert response.status_code == 200
    saved = response.json()
    assert {k: saved[k] for k in body} == body
    assert (saved["model"], saved["tpot_p95_ms"], saved["measured_by"]) == ("mixed", None, "bench")
    assert saved["measured_at"]
    listed = api.call("GET", "/capacity").json()
    assert listed == [saved]
    assert measurements_load() == {("mixed", "gpu"): (16, 500.0, None, None)}


def test_a_new_measurement_replaces_the_one_before_for_that_profile(api):
    api.call("POST", "/models", two_profiles())
    api.call(
        "PUT",
        "/models/mixed/capacity",
        {"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 100},
    )
    api.call(
        "PUT",
        "/models/mixed/capacity",
        {"profile": "cpu", "max_concurrency": 2, "tok_per_sec": 9.5},
    )

    api.call(
        "PUT",
        "/models/mixed/capacity",
        {"profile": "gpu", "max_concurrency": 8, "tok_per_sec": 300},
    )

    assert measurements_load() == {
        ("mixed", "gpu"): (8, 300.0, None, None),
        ("mixed", "cpu"): (2, 9.5, None, None),
    }
    assert [(m["profile"], m["max_concurrency"]) for m in api.call("GET", "/capacity").json()] == [
        ("cpu", 2),
        ("gpu", 8),
    ]


def test_a_measurement_may_say_what_one_replica_drew_and_placement_reads_it(api):
    from fleet.domain.types import Measured
    from fleet.selectors.inputs import measured_load

    api.call("POST", "/models", two_profiles())
    body = {"profile": "gpu", "max_concurrency": 8, "tok_per_sec": 300, "watts": 1400}

    saved = api.call("PUT", "/models/mixed/capacity", body).json()

    assert saved["watts"] == 1400.0
    assert api.call("GET", "/capacity").json()[0]["watts"] == 1400.0
    # what orders profiles by tokens per watt (fleet/domain/measured.py)
    assert measured_load()[("mixed", "gpu")] == Measured(8, 300.0, 1400.0)
    for bad in (0, -5, math.inf, "1400", True):
        refused = api.call("PUT", "/models/mixed/capacity", body | {"watts": bad})
        assert refused.status_code in (400, 422), bad
    assert Measurement.objects.get().watts == 1400.0
    unsaid = api.call(
        "PUT", "/models/mixed/capacity", {k: v for k, v in body.items() if k != "watts"}
    )
    assert unsaid.json()["watts"] is None  # a new measurement without power: not measured
    assert measured_load()[("mixed", "gpu")] == Measured(8, 300.0, None)


def test_a_measurement_may_say_its_gpus_were_capped_and_the_autoscaler_reads_it(api):
    from fleet.domain.types import Measured
    from fleet.selectors.inputs import measured_load

    api.call("POST", "/models", two_profiles())
    body = {"profile": "gpu", "max_concurrency": 8, "tok_per_sec": 300, "power_share": 0.8}

    saved = api.call("PUT", "/models/mixed/capacity", body).json()

    assert saved["power_share"] == 0.8
    assert api.call("GET", "/capacity").json()[0]["power_share"] == 0.8
    # not scaled again for a replica held to the same share (fleet/domain/capped.py)
    assert measured_load()[("mixed", "gpu")] == Measured(8, 300.0, None, 0.8)
    for bad in (0, -0.5, 1.2, math.nan, "0.8", True):
        refused = api.call("PUT", "/models/mixed/capacity", body | {"power_share": bad})
        assert refused.status_code in (400, 422), bad
        if isinstance(bad, float | int) and not isinstance(bad, bool):
            assert "power_share must be a share above 0 and at most 1" in refused.json()["detail"]
    assert Measurement.objects.get().power_share == 0.8
    unsaid = api.call(
        "PUT", "/models/mixed/capacity", {k: v for k, v in body.items() if k != "power_share"}
    )
    assert unsaid.json()["power_share"] is None  # measured at the GPUs' default


def test_a_declared_model_may_be_measured(api):
    declared_sync(specs=[parse_model(gpu_model("llama"), declared=True)])

    response = api.call(
        "PUT", "/models/llama/capacity", {"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 80}
    )

    assert response.status_code == 200
    assert Measurement.objects.get().model.name == "llama"


@pytest.mark.parametrize(
    "body, says",
    [
        (
            {"profile": "nope", "max_concurrency": 4, "tok_per_sec": 80},
            'model mixed has no profile "nope"',
        ),
        (
            {"profile": "gpu", "max_concurrency": 0, "tok_per_sec": 80},
            "max_concurrency must be from 1",
        ),
        ({"profile": "gpu", "max_concurrency": 1.5, "tok_per_sec": 80}, "max_concurrency"),
        (
            {"profile": "gpu", "max_concurrency": 10**12, "tok_per_sec": 80},
            "max_concurrency must be from 1",
        ),
        (
            {"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 0},
            "tok_per_sec must be a finite number above 0",
        ),
        ({"profile": "gpu", "max_concurrency": 4, "tok_per_sec": -3}, "tok_per_sec"),
        ({"profile": "gpu", "max_concurrency": 4, "tok_per_sec": "80"}, "tok_per_sec"),
        ('{"profile": "gpu", "max_concurrency": 4, "tok_per_sec": Infinity}', "tok_per_sec"),
        (
            {"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 80, "ttft_p95_ms": 0},
            "ttft_p95_ms",
        ),
        ({"profile": "gpu", "max_concurrency": 4}, "tok_per_sec"),
        ({"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 80, "p99": 1}, "p99"),
        ({"max_concurrency": 4, "tok_per_sec": 80}, "profile"),
    ],
)
def test_a_bad_measurement_is_400_and_nothing_is_stored(api, body, says):
    api.call("POST", "/models", two_profiles())

    response = api.call("PUT", "/models/mixed/capacity", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert Measurement.objects.count() == 0


def test_every_measurement_write_moves_their_revision_and_nothing_else_does(api):
    """The reconciler reads the measurements again only when this counter moved."""
    from catalog.selectors import measurements_revision

    seen = [measurements_revision()]

    def moved() -> int:
        seen.append(measurements_revision())
        return seen[-1] - seen[-2]

    api.call("POST", "/models", two_profiles())
    api.call("POST", "/models", two_profiles("plain"))
    assert moved() == 0, "a model added is no measurement"
    body = {"profile": "gpu", "max_concurrency": 4, "tok_per_sec": 100}
    assert api.call("PUT", "/models/mixed/capacity", body).status_code == 200
    assert moved() == 1
    assert api.call("PUT", "/models/mixed/capacity", {**body, "profile": "cpu"}).status_code == 200
    assert moved() == 1, "a second profile measured"
    assert api.call("PUT", "/models/mixed/capacity", {**body, "tok_per_sec": 0}).status_code == 400
    assert moved() == 0, "a refused measurement"
    assert api.call("DELETE", "/models/plain").status_code == 200
    assert moved() == 0, "a model removed with no measurements"

    assert api.call("DELETE", "/models/mixed").status_code == 200

    assert not Measurement.objects.exists()
    assert moved() == 1, "a removal dropping both of its measurements: one write"


def test_a_declared_model_dropped_from_the_file_takes_its_measurements_and_moves_them():
    from catalog.selectors import measurements_revision
    from catalog.services import measurement_save
    from llmgw.core import clock

    declared_sync(specs=[parse_model(gpu_model("llama"), declared=True)])
    measurement_save(
        model="llama",
        profile="gpu",
        max_concurrency=4,
        tok_per_sec=80,
        actor="bench",
        now=clock.now(),
    )
    before = measurements_revision()

    declared_sync(specs=[])

    assert not Measurement.objects.exists()
    assert measurements_revision() == before + 1


def test_measuring_an_unknown_model_is_404(api):
    response = api.call(
        "PUT", "/models/ghost/capacity", {"profile": "p", "max_concurrency": 1, "tok_per_sec": 1}
    )

    assert response.status_code == 404
    assert Measurement.objects.count() == 0


def test_the_measurements_load_in_one_query(api, django_assert_num_queries):
    for name in ("a", "b", "c"):
        api.call("POST", "/models", gpu_model(name))
        api.call(
            "PUT",
            f"/models/{name}/capacity",
            {"profile": "gpu", "max_concurrency": 2, "tok_per_sec": 10},
        )

    with django_assert_num_queries(1):
        loaded = measurements_load()
    with django_assert_num_queries(1):
        listed = catalog_selectors.measurements_list()

    assert len(loaded) == len(listed) == 3
    assert all(math.isclose(t, 10.0) for _, t, _, _ in loaded.values())


def test_a_model_added_with_an_owner_by_name_is_stored_by_id(api):
    from tenancy.models import Organization, Team

    team = Team.objects.create(org=Organization.objects.create(name="Acme"), name="ml")
    body = {
        "name": "owned",
        "source": "hf://acme/owned",
        "profiles": [{"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"}],
        "owner": "team:Acme/ml",
    }
    response = api.call("POST", "/models", body)
    assert response.status_code == 201, response.content
    assert response.json()["owner"] == f"team:{team.pk}"

    unknown = api.call("POST", "/models", {**body, "name": "ghost", "owner": "team:424242"})
    assert unknown.status_code == 400
    assert "there is no team" in unknown.json()["detail"]
