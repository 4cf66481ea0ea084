"""``llmgw ctl budget list|set|clear`` and ``llmgw ctl price list|set|clear``: against a fake
server for what they send and show, and against the real REST API for the shapes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from llmgw.cli import ctl
from tenancy.models import Budget, ModelPrice
from tests.cli.helpers import FakeServer, row_for, run, table

RESETS = {"day": "2026-12-08T00:00:00Z", "month": "2027-01-01T00:00:00Z"}


def budget(**given) -> dict:
    base = {
        "scope": "team:7",
        "name": "Acme / ml",
        "tokens_per_day": None,
        "tokens_per_month": 1_000_000,
        "cost_per_day": 100.0,
        "cost_per_month": None,
        "spent": {"day": {"tokens": 5, "cost": 12.5}, "month": {"tokens": 812_000, "cost": 40.0}},
        "resets_at": RESETS,
        "updated_by": "dan",
        "updated_at": "2026-12-07T12:00:00Z",
    }
    return {**base, **given}


BUDGETS = {"budgets": [budget()], "unpriced": [], "read_at": "2026-12-07T12:00:00Z"}


def test_budget_list_shows_spent_of_each_budget_and_when_they_reset(capsys):
    server = FakeServer({("GET", "/api/v1/budgets"): (200, BUDGETS)})

    code, out, err = run(capsys, server, "budget", "list")

    assert (code, err) == (0, "")
    body, footer = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0] == [
        "SCOPE",
        "NAME",
        "TOKENS TODAY",
        "TOKENS THIS MONTH",
        "COST TODAY",
        "COST THIS MONTH",
        "SET BY",
    ]
    assert row_for(rows, "team:7") == [
        "team:7",
        "Acme / ml",
        "-",
        "812,000 / 1,000,000 (81 %)",
        "12.50 / 100.00 (12 %)",
        "-",
        "dan",
    ]
    assert footer == (
        "Each cell: spent / budget. The day resets at 2026-12-08 00:00 UTC, the month at "
        "2027-01-01 00:00 UTC. - is not budgeted."
    )


def test_budget_list_names_the_models_used_without_a_price(capsys):
    answer = {**BUDGETS, "unpriced": ["qwen", "llama"]}
    server = FakeServer({("GET", "/api/v1/budgets"): (200, answer)})

    _, out, _ = run(capsys, server, "budget", "list")

    assert out.rstrip("\n").endswith(
        "Used this month without a price, so free to cost budgets: qwen, llama "
        "(llmgw ctl price set)."
    )


def test_no_budgets_says_so_and_json_is_the_servers_answer(capsys):
    empty = {"budgets": [], "unpriced": [], "read_at": "2026-12-07T12:00:00Z"}
    server = FakeServer({("GET", "/api/v1/budgets"): (200, empty)})

    assert run(capsys, server, "budget", "list")[1] == (
        "No budgets: keys and scopes may spend without end.\n"
    )
    assert json.loads(run(capsys, server, "budget", "list", "--json")[1]) == empty


@pytest.mark.parametrize(
    "flags, sent",
    [
        (["--tokens-per-day", "600"], {"tokens_per_day": 600}),
        (["--tokens-per-month", "9"], {"tokens_per_month": 9}),
        (["--cost-per-day", "0.10"], {"cost_per_day": "0.10"}),
        (
            ["--cost-per-month", "2", "--tokens-per-day", "1"],
            {"cost_per_month": "2", "tokens_per_day": 1},
        ),
        ([], {}),
    ],
)
def test_budget_set_sends_only_the_figures_given(capsys, flags, sent):
    server = FakeServer({("PUT", "/api/v1/budgets"): (200, {"scope": "team:7"})})

    code, out, _ = run(capsys, server, "budget", "set", "team:Acme/ml", *flags)

    assert code == 0
    assert server.body() == {"scope": "team:Acme/ml", **sent}
    assert out == "team:Acme/ml: budget set\n"


@pytest.mark.parametrize(
    "flag, value",
    [("--tokens-per-day", "-1"), ("--tokens-per-month", "1.5"), ("--cost-per-day", "lots")],
)
def test_budget_set_refuses_a_figure_that_is_no_number_before_asking(capsys, flag, value):
    server = FakeServer()

    code, _, err = run(capsys, server, "budget", "set", "org:Acme", flag, value)

    assert code == 2
    assert flag in err
    assert server.requests == []


def test_budget_clear_deletes_the_scope_as_one_segment_and_shows_a_refusal(capsys):
    server = FakeServer({("DELETE", "/api/v1/budgets/team:Acme/ml"): (200, {"removed": "team:7"})})

    code, out, _ = run(capsys, server, "budget", "clear", "team:Acme/ml")

    assert (code, out) == (0, "team:Acme/ml: budget removed\n")
    assert server.last.url.raw_path.decode() == "/api/v1/budgets/team%3AAcme%2Fml"
    refusing = FakeServer(
        {("DELETE", "/api/v1/budgets/org:x"): (404, {"detail": "org:x has no budget."})}
    )
    assert run(capsys, refusing, "budget", "clear", "org:x") == (
        1,
        "",
        "error: org:x has no budget.\n",
    )


def test_price_set_list_and_clear(capsys):
    prices = [
        {
            "model": "llama",
            "prompt_per_million": 0.15,
            "completion_per_million": 0.6,
            "updated_by": "dan",
            "updated_at": "2026-12-07T12:00:00Z",
        }
    ]
    server = FakeServer(
        {
            ("PUT", "/api/v1/prices"): (200, {"model": "llama"}),
            ("GET", "/api/v1/prices"): (200, prices),
            ("DELETE", "/api/v1/prices/llama"): (200, {"removed": "llama"}),
        }
    )

    assert run(capsys, server, "price", "set", "llama", "0.15", "0.6")[1] == "llama: price set\n"
    assert server.body() == {
        "model": "llama",
        "prompt_per_million": "0.15",
        "completion_per_million": "0.6",
    }
    body = run(capsys, server, "price", "list")[1].split("\n\n")[0]
    assert table(body)[1] == ["llama", "0.15", "0.60", "dan"]
    assert run(capsys, server, "price", "clear", "llama")[1] == (
        "llama: price removed; its tokens cost nothing\n"
    )


# Against the real REST API


def ctl_run(capsys, server, *argv: str) -> tuple[int, str, str]:
    code = ctl.main(list(argv), transport=server)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.django_db
def test_a_budget_and_a_price_are_set_listed_and_cleared_with_ctl(capsys, server):
    from tenancy.services import api_key_create, org_create, project_create, team_create
    from tenancy.services.usage import usage_add

    org_create(name="Acme", actor="t")
    team = team_create(org="Acme", name="ml", actor="t")
    project = project_create(team="Acme/ml", name="chat", actor="t")
    key = api_key_create(project=project.pk, name="ci", actor="t")[0]
    minute = int(datetime.now(UTC).timestamp() // 60)
    usage_add(tallies={(minute, key.pk, project.pk, "llama"): [1, 0, 600_000, 200_000, 5, 0]})

    code, out, err = ctl_run(
        capsys,
        server,
        "budget",
        "set",
        "team:Acme/ml",
        "--tokens-per-month",
        "1000000",
        "--cost-per-day",
        "2.5",
    )
    assert (code, out, err) == (0, "team:Acme/ml: budget set\n", "")
    assert ctl_run(capsys, server, "price", "set", "llama", "1", "3")[0] == 0
    assert ModelPrice.objects.get().completion_per_million == 3

    code, out, _ = ctl_run(capsys, server, "budget", "list")
    assert code == 0
    assert row_for(table(out.split("\n\n")[0]), f"team:{team.pk}") == [
        f"team:{team.pk}",
        "Acme / ml",
        "-",
        "800,000 / 1,000,000 (80 %)",
        "1.20 / 2.50 (48 %)",
        "-",
        "ops",
    ]

    code, _, err = ctl_run(capsys, server, "budget", "set", "team:Acme/ml", "--cost-per-day", "0")
    assert code == 1 and "cost_per_day must be a number from above 0" in err
    assert ctl_run(capsys, server, "budget", "clear", "team:Acme/ml")[0] == 0
    assert not Budget.objects.exists()
    assert ctl_run(capsys, server, "price", "clear", "llama")[0] == 0
