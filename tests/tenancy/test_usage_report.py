"""What the gateway recorded, summed per project, key or model and always per model: since a
time or a span ago, under a scope or everywhere, busiest first, in a few queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from llmgw.core import clock
from llmgw.core.errors import Invalid
from tenancy.models import ApiKey, Project, Usage
from tenancy.selectors import usage_report, usage_since
from tenancy.services import project_create
from tests.helpers import detail

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def tree(scopes) -> dict:
    """Acme/ml/training and Acme/web/site, Scania/ml/eval; a key in each, two in training."""
    made = scopes(
        "Acme",
        "Scania",
        "Acme/ml",
        "Acme/web",
        "Scania/ml",
        "Acme/ml/training",
        "Acme/web/site",
        "Scania/ml/eval",
    )
    training, site = made["Acme/ml/training"], made["Acme/web/site"]
    scania_eval = made["Scania/ml/eval"]
    return {
        "acme": made["Acme"],
        "ml": made["Acme/ml"],
        "training": training,
        "site": site,
        "eval": scania_eval,
        "ci": key(training, "ci", "llmgw_key_ci00"),
        "nb": key(training, "notebook", "llmgw_key_nb00"),
        "web": key(site, "web", "llmgw_key_web0"),
        "eval_key": key(scania_eval, "bench", "llmgw_key_ev00"),
    }


def key(project: Project, name: str, prefix: str) -> ApiKey:
    return ApiKey.objects.create(project=project, name=name, prefix=prefix, secret_hash=prefix)


def used(
    api_key: ApiKey, model: str, *, ago: timedelta, requests: int, now=NOW, **figures
) -> Usage:
    """A minute of what the gateway recorded for one key and model, `ago` before `now`."""
    return Usage.objects.create(
        bucket=now - ago,
        api_key=api_key,
        project=api_key.project,
        model=model,
        requests=requests,
        **figures,
    )


@pytest.fixture
def recorded(tree) -> dict:
    minute = timedelta(minutes=1)
    used(
        tree["ci"],
        "llama",
        ago=10 * minute,
        requests=10,
        errors=1,
        prompt_tokens=1000,
        completion_tokens=500,
        latency_ms_total=2000,
    )
    used(
        tree["ci"],
        "llama",
        ago=5 * minute,
        requests=30,
        errors=0,
        prompt_tokens=3000,
        completion_tokens=1500,
        latency_ms_total=4000,
    )
    used(
        tree["nb"],
        "llama",
        ago=5 * minute,
        requests=5,
        prompt_tokens=100,
        completion_tokens=50,
        latency_ms_total=1000,
    )
    used(tree["nb"], "qwen", ago=2 * minute, requests=7, errors=7, latency_ms_total=700)
    used(
        tree["web"],
        "llama",
        ago=3 * minute,
        requests=20,
        prompt_tokens=400,
        completion_tokens=200,
        latency_ms_total=1000,
    )
    used(
        tree["eval_key"],
        "qwen",
        ago=1 * minute,
        requests=100,
        prompt_tokens=9000,
        completion_tokens=100,
        latency_ms_total=10000,
    )
    # Two days old: outside the default day.
    used(tree["ci"], "llama", ago=timedelta(days=2), requests=1000, prompt_tokens=1)
    return tree  # fmt: skip


def figures(row: dict) -> tuple:
    return (
        row["requests"],
        row["errors"],
        row["prompt_tokens"],
        row["completion_tokens"],
        row["avg_latency_ms"],
    )


# The selector


def test_by_project_each_project_and_model_is_summed_busiest_first(recorded):
    report = usage_report(scope=None, since=NOW - timedelta(hours=24), by="project")

    rows = [(r["name"], r["model"], figures(r)) for r in report["rows"]]
    assert rows == [
        ("Scania / ml / eval", "qwen", (100, 0, 9000, 100, 100.0)),
        ("Acme / ml / training", "llama", (45, 1, 4100, 2050, 155.6)),
        ("Acme / web / site", "llama", (20, 0, 400, 200, 50.0)),
        ("Acme / ml / training", "qwen", (7, 7, 0, 0, 100.0)),
    ]
    assert report["rows"][1]["scope"] == f"project:{recorded['training'].pk}"
    assert report["rows"][1]["key"] is None
    assert (report["by"], report["scope"], report["name"]) == ("project", None, None)
    assert report["since"] == NOW - timedelta(hours=24)


def test_by_key_each_key_is_named_with_its_prefix_and_project(recorded):
    report = usage_report(scope="team:Acme/ml", since=NOW - timedelta(hours=1), by="key")

    rows = [(r["key"], r["name"], r["model"], r["requests"]) for r in report["rows"]]
    assert rows == [
        ("ci (llmgw_key_ci00…)", "Acme / ml / training", "llama", 40),
        ("notebook (llmgw_key_nb00…)", "Acme / ml / training", "qwen", 7),
        ("notebook (llmgw_key_nb00…)", "Acme / ml / training", "llama", 5),
    ]
    assert report["rows"][0]["key_id"] == recorded["ci"].pk


def test_by_model_the_projects_are_summed_together(recorded):
    report = usage_report(scope=None, since=NOW - timedelta(hours=24), by="model")

    rows = [(r["model"], r["scope"], r["name"], figures(r)) for r in report["rows"]]
    assert rows == [
        ("qwen", None, None, (107, 7, 9000, 100, 100.0)),
        ("llama", None, None, (65, 1, 4500, 2250, 123.1)),
    ]


def test_a_scope_keeps_only_the_projects_beneath_it_and_is_named_in_the_report(recorded):
    def projects(scope: str) -> set[str]:
        report = usage_report(scope=scope, since=NOW - timedelta(hours=24), by="project")
        return {r["name"] for r in report["rows"]}

    assert projects("org:Acme") == {"Acme / ml / training", "Acme / web / site"}
    assert projects("team:Acme/web") == {"Acme / web / site"}
    assert projects(f"project:{recorded['eval'].pk}") == {"Scania / ml / eval"}
    report = usage_report(scope="team:Acme/ml", since=NOW, by="project")
    assert (report["scope"], report["name"]) == (f"team:{recorded['ml'].pk}", "Acme / ml")


def test_only_buckets_from_since_on_count(recorded):
    report = usage_report(scope=None, since=NOW - timedelta(minutes=5), by="model")

    assert {r["model"]: r["requests"] for r in report["rows"]} == {"llama": 55, "qwen": 107}


def test_a_week_back_takes_in_older_buckets(recorded):
    report = usage_report(
        scope="project:Acme/ml/training", since=NOW - timedelta(days=7), by="model"
    )

    assert {r["model"]: r["requests"] for r in report["rows"]} == {"llama": 1045, "qwen": 7}


def test_nothing_recorded_is_an_empty_report(tree):
    assert usage_report(scope=None, since=NOW, by="project")["rows"] == []


def test_a_row_with_no_requests_has_no_average_latency(tree):
    used(tree["ci"], "llama", ago=timedelta(minutes=1), requests=0, latency_ms_total=0)

    (row,) = usage_report(scope=None, since=NOW - timedelta(hours=1), by="project")["rows"]

    assert (row["requests"], row["avg_latency_ms"]) == (0, None)


@pytest.mark.parametrize(
    "scope, by, says",
    [
        ("team:ml", "project", '"ml" could be any of 2 teams; give its ID'),
        ("team:Acme/nope", "project", 'there is no team "Acme/nope"'),
        ("group:x", "project", "is not org:NAME"),
        (None, "team", "by must be project, key or model, not 'team'."),
    ],
)
def test_a_bad_scope_or_grouping_is_refused_with_a_sentence(tree, scope, by, says):
    with pytest.raises(Invalid, match=says):
        usage_report(scope=scope, since=NOW, by=by)


@pytest.mark.parametrize("by", ["project", "key", "model"])
def test_the_report_takes_as_many_queries_for_many_projects_as_for_one(tree, by):
    used(tree["ci"], "llama", ago=timedelta(minutes=1), requests=1)
    with CaptureQueriesContext(connection) as one:
        usage_report(scope="org:Acme", since=NOW - timedelta(hours=1), by=by)
    for n in range(10):
        project = project_create(team=tree["ml"].pk, name=f"p{n}", actor="test")
        project_key = key(project, f"k{n}", f"llmgw_key_p{n:03}")
        for model in ("llama", "qwen", "mistral"):
            used(project_key, model, ago=timedelta(minutes=1), requests=n)
    with CaptureQueriesContext(connection) as many:
        report = usage_report(scope="org:Acme", since=NOW - timedelta(hours=1), by=by)

    assert len(report["rows"]) > 1
    assert len(many) == len(one) <= 5


# Since


@pytest.mark.parametrize(
    "text, since",
    [
        (None, NOW - timedelta(hours=24)),
        ("", NOW - timedelta(hours=24)),
        ("15m", NOW - timedelta(minutes=15)),
        (" 24h ", NOW - timedelta(hours=24)),
        ("7d", NOW - timedelta(days=7)),
        ("90s", NOW - timedelta(seconds=90)),
        ("2w", NOW - timedelta(weeks=2)),
        ("2026-02-28T09:30:00Z", datetime(2026, 2, 28, 9, 30, tzinfo=UTC)),
        ("2026-02-28T09:30:00+02:00", datetime(2026, 2, 28, 7, 30, tzinfo=UTC)),
        ("2026-02-28T09:30:00", datetime(2026, 2, 28, 9, 30, tzinfo=UTC)),
        ("2026-02-28", datetime(2026, 2, 28, tzinfo=UTC)),
    ],
)
def test_since_is_a_time_or_a_span_back_from_now(text, since):
    assert usage_since(text, now=NOW) == since


@pytest.mark.parametrize(
    "text", ["yesterday", "15", "-5m", "1.5h", "5y", "9999999999d", "99999999w", "x" * 500, "\x00"]
)
def test_since_that_is_neither_is_refused_with_a_sentence(text):
    with pytest.raises(Invalid, match="since must be a time such as 2026-01-31T09:00:00Z or"):
        usage_since(text, now=NOW)


# Over REST


def test_the_report_over_rest_says_what_it_covers(api, tree):
    used(tree["ci"], "llama", ago=timedelta(minutes=2), now=clock.now(), requests=3,
         prompt_tokens=30, completion_tokens=12, latency_ms_total=900)  # fmt: skip

    response = api.call("GET", "/usage?scope=team:Acme/ml&since=1h&by=key")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["scope"], body["name"], body["by"]) == (
        f"team:{tree['ml'].pk}",
        "Acme / ml",
        "key",
    )
    since = datetime.fromisoformat(body["since"])
    assert abs(since - (clock.now() - timedelta(hours=1))) < timedelta(minutes=1)
    assert body["rows"] == [
        {
            "scope": f"project:{tree['training'].pk}",
            "name": "Acme / ml / training",
            "key": "ci (llmgw_key_ci00…)",
            "key_id": tree["ci"].pk,
            "model": "llama",
            "requests": 3,
            "errors": 0,
            "prompt_tokens": 30,
            "completion_tokens": 12,
            "estimated_tokens": 0,
            "avg_latency_ms": 300.0,
        }
    ]


def test_the_report_over_rest_covers_the_last_day_by_project_by_default(api, tree):
    now = clock.now()
    used(tree["web"], "llama", ago=timedelta(hours=23), now=now, requests=4)
    used(tree["web"], "llama", ago=timedelta(hours=25), now=now, requests=40)

    body = api.call("GET", "/usage").json()

    assert body["by"] == "project"
    assert [(r["name"], r["model"], r["requests"]) for r in body["rows"]] == [
        ("Acme / web / site", "llama", 4)
    ]


@pytest.mark.parametrize(
    "query, says",
    [
        ("?since=yesterday", "since must be a time such as"),
        ("?since=-5m", "since must be a time such as"),
        ("?since=" + "9" * 300, "since must be a time such as"),
        ("?by=team", "by must be project, key or model, not 'team'."),
        ("?scope=team:ml", "could be any of 2 teams"),
        ("?scope=team:Acme/nope", 'there is no team "Acme/nope"'),
        ("?scope=%00", "is not org:NAME"),
        ("?scope=team:" + "x" * 1000, "a scope name is text of at most"),
    ],
)
def test_a_bad_query_over_rest_is_400_with_a_sentence(api, tree, query, says):
    response = api.call("GET", f"/usage{query}")

    assert response.status_code == 400
    assert says in detail(response)


def test_the_report_needs_an_admin_token(tree):
    response = Client().get("/api/v1/usage")

    assert response.status_code == 401
    assert "admin token" in detail(response)
