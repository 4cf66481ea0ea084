"""``llmgw ctl usage`` and ``llmgw ctl limit list|set|clear``."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import FakeServer, row_for, run, table

SINCE = "2026-03-01T12:00:00Z"


def report(by: str, rows: list[dict], scope=None, name=None) -> dict:
    return {"scope": scope, "name": name, "since": SINCE, "by": by, "rows": rows}


def row(**given) -> dict:
    base = {
        "scope": "project:3",
        "name": "Acme / ml / training",
        "key": None,
        "key_id": None,
        "model": "llama",
        "requests": 12345,
        "errors": 2,
        "prompt_tokens": 1_000_000,
        "completion_tokens": 50_000,
        "avg_latency_ms": 812.25,
    }
    return {**base, **given}


BY_PROJECT = report(
    "project",
    [row(), row(name="Acme / web / site", scope="project:4", model="qwen", requests=7,
                errors=0, prompt_tokens=70, completion_tokens=0, avg_latency_ms=None)],
)  # fmt: skip


def test_usage_shows_a_row_per_project_and_model_and_the_window(capsys):
    server = FakeServer({("GET", "/api/v1/usage"): (200, BY_PROJECT)})

    code, out, err = run(capsys, server, "usage")

    assert (code, err) == (0, "")
    body, footer = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0] == [
        "PROJECT",
        "MODEL",
        "REQUESTS",
        "ERRORS",
        "PROMPT",
        "COMPLETION",
        "LATENCY",
    ]
    assert row_for(rows, "Acme / ml / training") == [
        "Acme / ml / training",
        "llama",
        "12,345",
        "2",
        "1,000,000",
        "50,000",
        "812 ms",
    ]
    assert row_for(rows, "Acme / web / site")[-1] == "-"
    assert footer == "Since 2026-03-01 12:00 UTC, by project and model; latency is the average."
    assert dict(server.last.url.params) == {}


def test_usage_sends_the_scope_since_and_grouping_given(capsys):
    server = FakeServer({("GET", "/api/v1/usage"): (200, report("key", []))})

    run(capsys, server, "usage", "--scope", "team:Acme/ml", "--since", "7d", "--by", "key")

    assert dict(server.last.url.params) == {"scope": "team:Acme/ml", "since": "7d", "by": "key"}


def test_usage_by_key_names_the_key_and_its_project(capsys):
    answer = report(
        "key", [row(key="ci (llmgw_key_ci00…)", key_id=9)], scope="team:7", name="Acme / ml"
    )
    server = FakeServer({("GET", "/api/v1/usage"): (200, answer)})

    _, out, _ = run(capsys, server, "usage", "--by", "key")

    body, footer = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0][:3] == ["KEY", "PROJECT", "MODEL"]
    assert rows[1][:4] == ["ci (llmgw_key_ci00…)", "Acme / ml / training", "llama", "12,345"]
    assert footer.startswith("Acme / ml (team:7) since 2026-03-01 12:00 UTC, by key and model")


def test_usage_by_model_has_no_project_column(capsys):
    answer = report("model", [row(scope=None, name=None)])
    server = FakeServer({("GET", "/api/v1/usage"): (200, answer)})

    _, out, _ = run(capsys, server, "usage", "--by", "model")

    rows = table(out.split("\n\n")[0])
    assert rows[0] == ["MODEL", "REQUESTS", "ERRORS", "PROMPT", "COMPLETION", "LATENCY"]
    assert rows[1] == ["llama", "12,345", "2", "1,000,000", "50,000", "812 ms"]


def test_usage_with_nothing_recorded_says_so(capsys):
    server = FakeServer({("GET", "/api/v1/usage"): (200, report("project", []))})

    _, out, _ = run(capsys, server, "usage")

    assert out == "No requests since 2026-03-01 12:00 UTC.\n"


def test_usage_json_is_the_servers_answer(capsys):
    server = FakeServer({("GET", "/api/v1/usage"): (200, BY_PROJECT)})

    _, out, _ = run(capsys, server, "usage", "--json")

    assert json.loads(out) == BY_PROJECT


def test_usage_refuses_a_grouping_it_does_not_know_before_asking(capsys):
    server = FakeServer()

    code, _, err = run(capsys, server, "usage", "--by", "team")

    assert code == 2
    assert "--by" in err
    assert server.requests == []


def test_usage_shows_the_servers_refusal(capsys):
    refusal = "since must be a time such as 2026-01-31T09:00:00Z or a span such as 15m, 24h or 7d"
    server = FakeServer({("GET", "/api/v1/usage"): (400, {"detail": refusal})})

    code, out, err = run(capsys, server, "usage", "--since", "yesterday")

    assert (code, out, err) == (1, "", f"error: {refusal}\n")


# Limits

LIMITS = [
    {
        "scope": "org:1",
        "name": "Acme",
        "requests_per_minute": None,
        "tokens_per_minute": 90000,
        "updated_by": "ops",
        "updated_at": "2026-01-01T00:00:00Z",
    },
    {
        "scope": "team:7",
        "name": "Acme / ml",
        "requests_per_minute": 600,
        "tokens_per_minute": None,
        "updated_by": "dan",
        "updated_at": "2026-01-01T00:00:00Z",
    },
]


def test_limit_list_shows_each_scope_with_its_figures(capsys):
    server = FakeServer({("GET", "/api/v1/limits"): (200, LIMITS)})

    code, out, _ = run(capsys, server, "limit", "list")

    assert code == 0
    rows = table(out)
    assert rows[0] == ["SCOPE", "NAME", "REQUESTS/MIN", "TOKENS/MIN", "SET BY"]
    assert row_for(rows, "org:1") == ["org:1", "Acme", "-", "90,000", "ops"]
    assert row_for(rows, "team:7") == ["team:7", "Acme / ml", "600", "-", "dan"]


def test_no_limits_says_so(capsys):
    server = FakeServer({("GET", "/api/v1/limits"): (200, [])})

    _, out, _ = run(capsys, server, "limit", "list")

    assert out == "No scope limits: only keys' own limits apply.\n"


def test_limit_list_json_is_the_servers_answer(capsys):
    server = FakeServer({("GET", "/api/v1/limits"): (200, LIMITS)})

    _, out, _ = run(capsys, server, "limit", "list", "--json")

    assert json.loads(out) == LIMITS


@pytest.mark.parametrize(
    "flags, sent",
    [
        (["--requests-per-minute", "600"], {"requests_per_minute": 600}),
        (["--tokens-per-minute", "90000"], {"tokens_per_minute": 90000}),
        (["--rpm", "1", "--tpm", "2"], {"requests_per_minute": 1, "tokens_per_minute": 2}),
        ([], {}),
    ],
)
def test_limit_set_sends_only_the_figures_given(capsys, flags, sent):
    server = FakeServer({("PUT", "/api/v1/limits"): (200, {"scope": "team:7"})})

    code, out, _ = run(capsys, server, "limit", "set", "team:Acme/ml", *flags)

    assert code == 0
    assert server.body() == {"scope": "team:Acme/ml", **sent}
    assert out == "team:Acme/ml: limits set\n"


@pytest.mark.parametrize("value", ["-1", "1.5", "many"])
def test_limit_set_refuses_a_figure_that_is_not_a_whole_number_before_asking(capsys, value):
    server = FakeServer()

    code, _, err = run(capsys, server, "limit", "set", "org:Acme", "--rpm", value)

    assert code == 2
    assert "--requests-per-minute" in err
    assert server.requests == []


def test_limit_set_shows_the_servers_refusal(capsys):
    refusal = "a limit needs requests_per_minute or tokens_per_minute; to remove one, DELETE it"
    server = FakeServer({("PUT", "/api/v1/limits"): (400, {"detail": refusal})})

    code, out, err = run(capsys, server, "limit", "set", "team:ml")

    assert (code, out, err) == (1, "", f"error: {refusal}\n")


def test_limit_clear_deletes_the_scope_written_as_one_path_segment(capsys):
    server = FakeServer({("DELETE", "/api/v1/limits/team:Acme/ml"): (200, {"removed": "team:7"})})

    code, out, _ = run(capsys, server, "limit", "clear", "team:Acme/ml")

    assert code == 0
    assert server.last.url.raw_path.decode() == "/api/v1/limits/team%3AAcme%2Fml"
    assert out == "team:Acme/ml: limits removed\n"


def test_key_create_sends_its_limits_and_the_list_shows_its_cap_on_max_tokens(capsys):
    made = {"id": 4, "name": "ci", "prefix": "llmgw_key_Ab12", "secret": "llmgw_key_Ab12xyz"}
    server = FakeServer({("POST", "/api/v1/keys"): (201, made)})

    code, out, _ = run(
        capsys, server, "key", "create", "ci", "--project", "Acme/ml/p", "--tpm", "9000",
        "--max-tokens", "512",
    )  # fmt: skip

    assert code == 0 and out.splitlines()[-1] == "llmgw_key_Ab12xyz"
    assert server.body() == {
        "project": "Acme/ml/p",
        "name": "ci",
        "limits": {"tokens_per_minute": 9000, "max_tokens": 512},
    }
    key = {**made, "project": "Acme/ml/p", "models": [], "tokens_per_minute": 9000}
    server = FakeServer({("GET", "/api/v1/keys"): (200, [{**key, "max_tokens": 512}])})
    _, out, _ = run(capsys, server, "key", "list")
    assert "9,000 tok/min, ≤ 512 tok/request" in out


def test_usage_says_how_many_of_its_tokens_are_estimates(capsys):
    rows = [row(estimated_tokens=1200), row(model="qwen", estimated_tokens=34)]
    server = FakeServer({("GET", "/api/v1/usage"): (200, report("project", rows))})

    _, out, _ = run(capsys, server, "usage")

    assert out.rstrip("\n").splitlines()[-1] == (
        "1,234 of the tokens are estimates: requests cut before their engine counted them "
        "(docs/gateway.md, Usage)."
    )


# One request, by its id

RECORD = {
    "request_id": "req_ab12",
    "at": "2026-03-01T12:00:03.250000Z",
    "key_id": 5,
    "key": "ci (llmgw_key_ci00…)",
    "scope": "project:3",
    "name": "Acme / ml / training",
    "model": "llama",
    "endpoint": "/v1/chat/completions",
    "status": 502,
    "prompt_tokens": 1200,
    "completion_tokens": 0,
    "duration_ms": 4312,
    "replica": "llama-1",
    "error": "upstream_status",
}


def test_usage_request_says_what_became_of_the_request(capsys):
    found = {"request_id": "req_ab12", "keep_hours": 24.0, "records": [RECORD]}
    server = FakeServer({("GET", "/api/v1/usage/requests/req_ab12"): (200, found)})

    code, out, err = run(capsys, server, "usage", "--request", "req_ab12")

    assert (code, err) == (0, "")
    assert out == (
        "Request req_ab12: /v1/chat/completions for llama, at 2026-03-01 12:00:03 UTC.\n"
        "Key ci (llmgw_key_ci00…), of Acme / ml / training (project:3).\n"
        "Answered 502 in 4,312 ms by replica llama-1; 1,200 prompt and 0 completion tokens.\n"
        "Failed: upstream_status.\n"
    )


def test_usage_request_of_a_deleted_key_refused_before_a_replica_says_so(capsys):
    record = {**RECORD, "key": None, "replica": "", "status": 0, "error": "client_gone"}
    found = {"request_id": "req_ab12", "keep_hours": 24.0, "records": [record, RECORD]}
    server = FakeServer({("GET", "/api/v1/usage/requests/req_ab12"): (200, found)})

    _, out, _ = run(capsys, server, "usage", "--request", "req_ab12")

    first, second = out.rstrip("\n").split("\n\n")
    assert "Key 5 (deleted since), of Acme / ml / training" in first
    assert "Answered nothing in 4,312 ms; " in first
    assert second.startswith("Request req_ab12: ")


def test_usage_request_not_kept_shows_the_servers_sentence(capsys):
    said = "No request 'nope' is kept. The gateway keeps each request's record for 24 hours"
    server = FakeServer({("GET", "/api/v1/usage/requests/nope"): (404, {"detail": said})})

    code, out, err = run(capsys, server, "usage", "--request", "nope")

    assert (code, out, err) == (1, "", f"error: {said}\n")
