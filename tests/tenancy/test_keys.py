"""Gateway API keys over REST: made for a project with the secret shown once, listed without
it, limited to some models, revoked; bad input a clear 400 and nothing written."""

from __future__ import annotations

import pytest
from django.conf import settings

from catalog.services import model_add
from llmgw.core.secrets import keyed_digest
from tenancy.models import ApiKey, AuditEvent, Organization, Project, Team
from tests.helpers import detail

pytestmark = pytest.mark.django_db


@pytest.fixture
def training(db) -> Project:
    team = Team.objects.create(org=Organization.objects.create(name="Acme"), name="ml")
    model_add(
        data={
            "name": "llama",
            "source": "hf://acme/llama",
            "aliases": ["chat"],
            "profiles": [{"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"}],
        },
        actor="test",
    )
    return Project.objects.create(team=team, name="training")


def test_a_key_is_made_for_a_project_and_its_secret_is_shown_once(api, training):
    response = api.call(
        "POST",
        "/keys",
        {
            "project": "Acme/ml/training",
            "name": "ci",
            "models": ["chat"],
            "limits": {"requests_per_minute": 60, "max_tokens": 512},
        },
    )

    assert response.status_code == 201, response.content
    made = response.json()
    secret = made["secret"]
    assert secret.startswith("llmgw_key_") and made["prefix"] == secret[:14]
    key = ApiKey.objects.get()
    assert key.secret_hash == keyed_digest(settings.SECRET_KEY, secret)
    assert (key.project, key.models_allowed, key.requests_per_minute) == (training, ["chat"], 60)
    assert key.max_tokens == 512
    assert AuditEvent.objects.filter(action="key.add", target=f"key:{key.pk}").exists()

    listed = api.call("GET", "/keys").json()
    assert [k["prefix"] for k in listed] == [made["prefix"]]
    assert listed[0]["project"] == "Acme/ml/training"
    assert (listed[0]["requests_per_minute"], listed[0]["max_tokens"]) == (60, 512)
    assert secret not in str(listed) and key.secret_hash not in str(listed)


def test_a_revoked_key_says_so_and_revoking_again_changes_nothing(api, training):
    made = api.call("POST", "/keys", {"project": training.pk, "name": "ci"}).json()

    assert api.call("DELETE", f"/keys/{made['id']}").json() == {"revoked": made["id"]}
    first = ApiKey.objects.get().revoked_at
    assert first is not None
    api.call("DELETE", f"/keys/{made['id']}")
    assert ApiKey.objects.get().revoked_at == first
    assert AuditEvent.objects.filter(action="key.revoke").count() == 1
    assert api.call("DELETE", "/keys/999").status_code == 404


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"project": "Acme/ml/nope", "name": "ci"}, "there is no project"),
        ({"project": "Acme/ml/training", "name": ""}, "needs a name"),
        ({"project": "Acme/ml/training", "name": "ci", "models": ["ghost"]}, "no model 'ghost'"),
        (
            {"project": "Acme/ml/training", "name": "ci", "limits": {"requests_per_minute": 0}},
            "requests_per_minute must be a whole number from 1",
        ),
        (
            {"project": "Acme/ml/training", "name": "ci", "limits": {"tokens_per_minute": -5}},
            "tokens_per_minute must be a whole number from 1",
        ),
        (
            {"project": "Acme/ml/training", "name": "ci", "limits": {"max_tokens": 0}},
            "max_tokens must be a whole number from 1",
        ),
        ({"project": "Acme/ml/training", "name": "ci", "secret": "mine"}, "secret"),
        ({"project": "Acme/ml/training", "name": "ci\x00"}, "control characters"),
    ],
)
def test_a_bad_key_is_refused_with_a_sentence_and_nothing_is_written(api, training, body, says):
    response = api.call("POST", "/keys", body)

    assert response.status_code == 400
    assert says in detail(response)
    assert not ApiKey.objects.exists()
