"""A runtime model replaced whole: PUT /models/{name} and ctl model update; its replicas
roll when its source or a profile changed, and stay when only its settings did."""

from __future__ import annotations

import pytest

from catalog.domain import parse_model
from catalog.models import Model
from catalog.services import declared_sync
from fleet.models import ModelState
from tests.fleet.builders import cpu_model, gpu_model
from tests.helpers import detail

pytestmark = pytest.mark.django_db


def test_a_changed_profile_replaces_the_model_and_rolls_its_replicas(api):
    api.call("POST", "/models", cpu_model("tiny", cores=2))

    response = api.call("PUT", "/models/tiny", cpu_model("tiny", cores=4))

    assert response.status_code == 200, response.content
    assert response.json()["cpu_cores"] == 4
    assert Model.objects.get().profiles.get().cpu_cores == 4
    assert ModelState.objects.get(pk="tiny").restart_requested_at is not None


def test_a_changed_source_rolls_too_and_a_description_alone_does_not(api):
    api.call("POST", "/models", cpu_model("tiny"))

    api.call("PUT", "/models/tiny", {**cpu_model("tiny"), "description": "small"})
    assert not ModelState.objects.filter(pk="tiny", restart_requested_at__isnull=False).exists()

    api.call("PUT", "/models/tiny", {**cpu_model("tiny"), "source": "hf://acme/other"})
    assert ModelState.objects.get(pk="tiny").restart_requested_at is not None


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        ({**cpu_model("other")}, 400, "The body names model 'other', not 'tiny'"),
        ({"name": "tiny", "profiles": []}, 400, "at least one profile is needed"),
        ("[1]", 400, "A model must be an object"),
        ("{nope", 400, "The body is not valid JSON"),
    ],
)
def test_an_update_that_cannot_be_made_is_a_sentence_and_changes_nothing(api, body, status, said):
    api.call("POST", "/models", cpu_model("tiny", cores=2))

    response = api.call("PUT", "/models/tiny", body)

    assert response.status_code == status, response.content
    assert said in detail(response)
    assert Model.objects.get().profiles.get().cpu_cores == 2


def test_an_unknown_or_declared_model_is_not_updated(api):
    assert api.call("PUT", "/models/nope", cpu_model("nope")).status_code == 404
    declared_sync(specs=[parse_model(gpu_model("llama"), declared=True)])

    response = api.call("PUT", "/models/llama", gpu_model("llama"))

    assert response.status_code == 400
    assert "declared" in detail(response)
