"""An adapter added with a source on the hub (or an https server) has its weights added to
the mirror by the same add, as `llmgw ctl weights add` adds them: once, whatever adds them
first; bad input fetches nothing and stores nothing; a source the hub refuses or cannot be
asked about stores no adapter; the audit record names the weights (docs/adapters.md)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from catalog.models import Adapter
from catalog.services import model_add
from llmgw.core import clock
from llmgw.core.errors import Conflict
from mirror import services as mirror_services
from mirror.models import Weights
from mirror.worker import work_until_idle
from tenancy.models import AuditEvent
from tenancy.services import org_create, team_create
from tests.catalog.test_adapters import an_adapter, hub, slotted  # noqa: F401 - hub: autouse
from tests.helpers import detail
from tests.lora_files import PEFT_CONFIG, PEFT_WEIGHTS
from tests.mirror.test_weights import mirror_dir  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

SOURCE = "hf://acme/support-lora"


@pytest.fixture
def base(db):
    org_create(name="Acme", actor="t")
    team_create(org="Acme", name="ml", actor="t")
    model_add(data=slotted(), actor="t")


def _audit() -> dict:
    return AuditEvent.objects.get(action="adapter.add").detail


@pytest.mark.usefixtures("mirror_dir")
def test_an_adapter_from_the_hub_adds_its_repository_to_the_mirror(api, base):
    response = api.call("POST", "/adapters", an_adapter())

    assert response.status_code == 201, response.content
    assert response.json()["mirror"].startswith("0% of ")
    [weights] = api.call("GET", "/weights").json()
    assert weights["source"] == SOURCE
    assert weights["state"] == "queued"
    assert sorted(f["path"] for f in weights["files"]) == [PEFT_CONFIG, PEFT_WEIGHTS]
    assert weights["added_by"] == "ops"
    assert _audit()["mirror"] == {"weights": weights["id"], "added": True}
    assert work_until_idle() == 2
    assert api.call("GET", "/adapters/acme-support").json()["mirror"] == "ready"


def test_weights_the_mirror_holds_already_are_not_added_again(api, base):
    first = api.call("POST", "/weights", {"source": SOURCE}).json()
    assert api.call("POST", "/adapters", an_adapter()).status_code == 201
    # A second adapter of the same repository, and one of a folder of weights held.
    second = an_adapter(name="support-two")
    assert api.call("POST", "/adapters", second).status_code == 201
    whole = api.call("POST", "/weights", {"source": "hf://acme/loras"}).json()
    third = an_adapter(name="red", source="hf://acme/loras/red")
    assert api.call("POST", "/adapters", third).status_code == 201

    assert sorted(Weights.objects.values_list("pk", flat=True)) == [first["id"], whole["id"]]
    mirrored = [
        e.detail["mirror"] for e in AuditEvent.objects.filter(action="adapter.add").order_by("pk")
    ]
    assert mirrored == [
        {"weights": first["id"], "added": False},
        {"weights": first["id"], "added": False},
        {"weights": whole["id"], "added": False},
    ]


def test_bad_input_adds_nothing_to_the_mirror(api, base):
    response = api.call("POST", "/adapters", an_adapter(rank=32))

    assert response.status_code == 400
    assert "rank 32 is above base llama's max LoRA rank 16" in detail(response)
    assert not Weights.objects.exists() and not Adapter.objects.exists()


def test_a_repository_the_hub_does_not_have_stores_no_adapter(api, base):
    response = api.call("POST", "/adapters", an_adapter(source="hf://acme/nothing-here"))

    assert response.status_code == 400
    assert "There is no repository acme/nothing-here" in detail(response)
    assert not Weights.objects.exists() and not Adapter.objects.exists()


def test_a_hub_that_cannot_be_asked_stores_no_adapter(api, base, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    response = api.call("POST", "/adapters", an_adapter())

    assert response.status_code == 502
    assert "could not be asked about acme/support-lora" in detail(response)
    assert not Weights.objects.exists() and not Adapter.objects.exists()


def test_an_adapter_on_the_nodes_own_disk_is_not_mirrored(api, base, tmp_path):
    response = api.call("POST", "/adapters", an_adapter(source=str(tmp_path / "lora")))

    assert response.status_code == 201, response.content
    assert not Weights.objects.exists()
    assert "mirror" not in _audit()
    assert response.json()["mirror"] is None


def test_weights_added_for_an_adapter_that_cannot_then_be_stored_are_taken_out(base, monkeypatch):
    def taken(**_):
        raise Conflict("An adapter named acme-support already exists.")

    monkeypatch.setattr(mirror_services.catalog_services, "adapter_add", taken)
    with pytest.raises(Conflict):
        mirror_services.adapter_add(data=an_adapter(), actor="t", now=clock.now())
    assert not Weights.objects.exists()


def test_a_session_that_may_not_add_weights_is_refused_an_adapter_that_would(
    base, django_user_model
):
    user = django_user_model.objects.create_user("ada", password="x", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="catalog", codename="add_adapter")
    )
    browser = Client()
    browser.force_login(user)

    def add(body):
        return browser.post("/api/v1/adapters", json.dumps(body), content_type="application/json")

    response = add(an_adapter())
    assert response.status_code == 403
    assert detail(response).startswith(
        f"{SOURCE} is not in the mirror, and adding adapter acme-support would add it: "
        "ada may not add weights"
    )
    assert not Weights.objects.exists() and not Adapter.objects.exists()

    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="mirror", codename="add_weights")
    )
    browser.force_login(django_user_model.objects.get(pk=user.pk))  # permissions read afresh
    assert add(an_adapter()).status_code == 201
    assert Weights.objects.get().source == SOURCE


def test_listing_adapters_reads_the_mirror_once_however_many_there_are(base):
    """Each adapter's `mirror` is read from one look at the mirror's weights, not one per
    adapter: 40 adapters list in as many queries as 2."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from catalog.selectors.listings import adapter_views
    from catalog.services import adapter_add

    def listed() -> int:
        with CaptureQueriesContext(connection) as queries:
            views = adapter_views()
        assert all(v["mirror"].startswith("hf://acme/") for v in views)
        return len(queries)

    for n in range(2):
        adapter_add(data=an_adapter(name=f"a{n}", source=f"hf://acme/l{n}"), actor="t")
    two = listed()
    for n in range(2, 40):
        adapter_add(data=an_adapter(name=f"a{n}", source=f"hf://acme/l{n}"), actor="t")
    assert listed() == two
