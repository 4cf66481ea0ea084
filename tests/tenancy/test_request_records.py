"""Each gateway request's record, found by the id its caller was told (x-request-id):
written in the usage's batch and its transaction, kept LLMGW_REQUESTS_KEEP_HOURS,
expired at most hourly, and looked up over REST with a sentence when it is not kept."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from llmgw.core import clock
from tenancy.models import ApiKey, RequestRecord, Usage, UsageJournal
from tenancy.services import usage as services
from tenancy.services.usage import request_records_expire
from tests.helpers import detail

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def five_minutes_on(monkeypatch):
    """The lookup's clock, five minutes after the records below."""
    monkeypatch.setattr(clock, "now", lambda: NOW + timedelta(minutes=5))


@pytest.fixture
def ci(scopes) -> ApiKey:
    return ApiKey.objects.create(
        project=scopes("Acme/ml/training")["Acme/ml/training"],
        name="ci",
        prefix="llmgw_key_ci00",
        secret_hash="x",
    )


def record(ci: ApiKey, rid: str, *, at: datetime = NOW, status: int = 200, error: str = ""):
    """A record as the gateway notes it (llmgw/gateway/accounting.py `_note`)."""
    return (rid, at.timestamp(), ci.pk, ci.project_id, "llama", "/v1/chat/completions",
            status, 12, 3, 812, "llama-1", error)  # fmt: skip


def test_the_records_are_written_with_the_usage_in_one_statement(ci):
    minute = int(NOW.timestamp() // 60)
    tallies = {(minute, ci.pk, ci.project_id, "llama"): [2, 1, 24, 3, 1624, 0]}
    batch = [record(ci, "a1"), record(ci, "a2", status=429, error="limit")]

    with CaptureQueriesContext(connection) as queries:
        services.usage_add(tallies=tallies, records=batch)

    inserts = [q for q in queries if "tenancy_requestrecord" in q["sql"]]
    assert len(inserts) == 1
    assert Usage.objects.get().requests == 2
    a2 = RequestRecord.objects.get(request_id="a2")
    assert (a2.at, a2.key_id, a2.status, a2.error, a2.duration_ms) == (
        NOW,
        ci.pk,
        429,
        "limit",
        812,
    )


def test_a_batch_that_fails_leaves_no_record_to_be_written_twice(ci, monkeypatch):
    # The gateway gives a batch that failed back, records and all, to be written again:
    # what was written of it before the failure must not stay.
    def down(**_):
        raise RuntimeError("database is away")

    monkeypatch.setattr(UsageJournal.objects, "update_or_create", down)
    minute = int(NOW.timestamp() // 60)
    tallies = {(minute, ci.pk, ci.project_id, "llama"): [1, 0, 12, 3, 812, 0]}

    with pytest.raises(RuntimeError):
        services.usage_add(tallies=tallies, journal="gw-1", batch=1, records=[record(ci, "a1")])

    assert (RequestRecord.objects.count(), Usage.objects.count()) == (0, 0)


def test_records_past_their_keeping_are_deleted_at_most_hourly(ci, monkeypatch):
    services.request_records_add(
        [record(ci, "old", at=NOW - timedelta(hours=25)), record(ci, "new", at=NOW)]
    )
    monkeypatch.setattr(services, "_expired_at", float("-inf"))

    assert request_records_expire(now=NOW, keep_hours=24) == 1
    assert request_records_expire(now=NOW + timedelta(hours=30), keep_hours=24) == 0  # too soon
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["new"]
    monkeypatch.setattr(services, "_expired_at", float("-inf"))
    assert request_records_expire(now=NOW, keep_hours=0) == 1  # none kept: all go


def test_a_request_is_found_by_its_id_naming_its_key_and_project(ci, api):
    services.request_records_add(
        [record(ci, "a1", at=NOW - timedelta(minutes=1)),
         record(ci, "a1", status=502, error="upstream_status"), record(ci, "b2")]
    )  # fmt: skip

    response = api.call("GET", "/usage/requests/a1")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["request_id"], body["keep_hours"]) == ("a1", 24.0)
    latest, first = body["records"]  # the same id sent twice: both, the latest first
    assert latest == {
        "request_id": "a1",
        "at": "2026-03-01T12:00:00Z",
        "key_id": ci.pk,
        "key": "ci (llmgw_key_ci00…)",
        "scope": f"project:{ci.project_id}",
        "name": "Acme / ml / training",
        "model": "llama",
        "endpoint": "/v1/chat/completions",
        "status": 502,
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "duration_ms": 812,
        "replica": "llama-1",
        "error": "upstream_status",
    }
    assert (first["status"], first["error"]) == (200, "")


def test_a_request_of_a_key_deleted_since_is_still_found(ci, api):
    services.request_records_add([record(ci, "a1")])
    ci.delete()

    found = api.call("GET", "/usage/requests/a1").json()["records"][0]

    assert (found["key"], found["name"]) == (None, "Acme / ml / training")


def test_a_request_not_kept_is_answered_404_saying_how_long_records_are_kept(ci, api, settings):
    # Past its keeping, though the hourly expiry has not deleted it yet: not shown.
    services.request_records_add([record(ci, "nope", at=NOW - timedelta(hours=24))])

    response = api.call("GET", "/usage/requests/nope")

    assert response.status_code == 404
    said = detail(response)
    assert "No request 'nope' is kept" in said
    assert "24 hours (LLMGW_REQUESTS_KEEP_HOURS)" in said

    settings.LLMGW = replace(settings.LLMGW, requests_keep_hours=0.0)
    said = detail(api.call("GET", "/usage/requests/nope"))
    assert "keeps no request records (LLMGW_REQUESTS_KEEP_HOURS is 0)" in said


def test_the_lookup_needs_an_admin_token(ci):
    response = Client().get("/api/v1/usage/requests/a1")

    assert response.status_code == 401
