"""Spend budgets and model prices: set on a key or scope by name or ID, listed with what was
spent (summed from the usage rows the gateway writes), cleared, audited; bad input a clear 400
with nothing changed, over REST and in Django admin; and the verdict the gateway will ask for."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from llmgw.core.errors import Invalid, NotFound
from tenancy.models import AuditEvent, Budget, ModelPrice
from tenancy.selectors import budget_book, budget_verdict, budgets_list
from tenancy.services import team_create
from tenancy.services.budgets import budget_clear, budget_set, price_clear, price_set
from tenancy.services.usage import usage_add
from tests.helpers import detail

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 7, 15, 30, tzinfo=UTC)


@pytest.fixture
def tree(scopes) -> dict:
    """Acme/ml/training with keys ci and web, Acme/web/site with key site, and Scania/ml."""
    made = scopes(
        "Acme",
        "Scania",
        "Acme/ml",
        "Acme/web",
        "Scania/ml",
        "Acme/ml/training",
        "Acme/web/site",
        "Acme/ml/training/ci",
        "Acme/ml/training/other",
        "Acme/web/site/site",
    )
    return {
        "acme": f"org:{made['Acme'].pk}",
        "ml": f"team:{made['Acme/ml'].pk}",
        "web": f"team:{made['Acme/web'].pk}",
        "training": f"project:{made['Acme/ml/training'].pk}",
        "ci": made["Acme/ml/training/ci"],
        "other": made["Acme/ml/training/other"],
        "site": made["Acme/web/site/site"],
    }


def spend(key, model: str, prompt: int, completion: int, at: datetime = NOW) -> None:
    """What the gateway writes for requests of `key` at `at`."""
    minute = int(at.timestamp() // 60)
    usage_add(tallies={(minute, key.pk, key.project_id, model): [1, 0, prompt, completion, 5, 0]})


def changed() -> tuple:
    return (
        list(Budget.objects.values()),
        list(ModelPrice.objects.values()),
        AuditEvent.objects.count(),
    )


# Services


def test_a_budget_is_set_on_a_scope_by_path_and_audited(tree):
    key = budget_set(scope="team:Acme/ml", tokens_per_month=1_000_000, actor="dan")

    assert key == tree["ml"]
    row = Budget.objects.get()
    assert (row.scope, row.tokens_per_month, row.tokens_per_day, row.updated_by) == (
        tree["ml"],
        1_000_000,
        None,
        "dan",
    )
    event = AuditEvent.objects.get(action="budget.set")
    assert (event.actor, event.target) == ("dan", tree["ml"])
    assert event.detail == {
        "tokens_per_day": None,
        "tokens_per_month": 1_000_000,
        "cost_per_day": None,
        "cost_per_month": None,
    }


def test_a_budget_on_a_key_is_kept_under_its_id_and_set_again_replaces_it(tree):
    key = f"key:{tree['ci'].pk}"
    budget_set(scope=key, tokens_per_day=10, cost_per_month="12.5", actor="ops")

    budget_set(scope=key, cost_per_day=3, actor="ops")

    row = Budget.objects.get()
    assert (row.scope, row.tokens_per_day, row.cost_per_month, row.cost_per_day) == (
        key,
        None,
        None,
        Decimal(3),
    )


def test_a_budget_is_cleared_audited_and_a_second_clear_is_not_found(tree):
    budget_set(scope="org:Acme", tokens_per_day=5, actor="ops")

    assert budget_clear(scope="org:Acme", actor="eve") == tree["acme"]
    assert not Budget.objects.exists()
    assert AuditEvent.objects.filter(action="budget.clear", actor="eve").count() == 1
    with pytest.raises(NotFound, match="org:Acme has no budget."):
        budget_clear(scope="org:Acme", actor="eve")


def test_the_budget_of_a_key_since_deleted_can_still_be_cleared(tree):
    key = f"key:{tree['site'].pk}"
    budget_set(scope=key, tokens_per_day=5, actor="ops")
    tree["site"].delete()

    assert budget_clear(scope=key, actor="ops") == key


@pytest.mark.parametrize(
    "figures, says",
    [
        ({}, "a budget needs one of tokens_per_day"),
        ({"tokens_per_day": 0}, "tokens_per_day must be a whole number from 1"),
        ({"tokens_per_month": -3}, "tokens_per_month must be a whole number from 1"),
        ({"tokens_per_day": 1.5}, "not 1.5"),
        ({"tokens_per_day": True}, "not True"),
        ({"tokens_per_day": 10**16}, "from 1 to 1,000,000,000,000,000"),
        ({"cost_per_day": 0}, "cost_per_day must be a number from above 0"),
        ({"cost_per_day": -1}, "cost_per_day must be a number"),
        ({"cost_per_month": "NaN"}, "cost_per_month must be a number"),
        ({"cost_per_month": "lots"}, "not 'lots'"),
        ({"cost_per_month": "1e300"}, "to 100,000,000,000"),
        ({"cost_per_month": "0.00001"}, "at most 4 decimal places"),
        ({"cost_per_month": float("inf")}, "cost_per_month must be a number"),
        ({"cost_per_month": [1]}, "cost_per_month must be a number"),
        ({"dollars": 5}, "a budget has no field 'dollars'"),
    ],
)
def test_a_bad_figure_is_refused_with_a_sentence_and_nothing_changes(tree, figures, says):
    budget_set(scope="org:Acme", tokens_per_day=10, actor="ops")
    before = changed()

    with pytest.raises(Invalid) as refused:
        budget_set(scope="org:Acme", actor="ops", **figures)

    assert says in str(refused.value)
    assert changed() == before


@pytest.mark.parametrize(
    "scope, says",
    [
        ("team:ml", '"ml" could be any of 2 teams; give its ID'),
        ("key:999999", "there is no API key '999999'"),
        ("key:ci", "there is no API key 'ci'; a key's budget is key:ID."),
        ("group:Acme", "is not org:NAME"),
    ],
)
def test_a_scope_that_names_none_or_several_is_refused(tree, scope, says):
    with pytest.raises(Invalid, match=says):
        budget_set(scope=scope, tokens_per_day=1, actor="ops")
    assert not Budget.objects.exists()


def test_a_price_is_set_replaced_audited_and_cleared(tree):
    assert (
        price_set(model="llama", prompt_per_million=0.15, completion_per_million="0.6", actor="d")
        == "llama"
    )
    price_set(model="llama", prompt_per_million=1, completion_per_million=0, actor="d")

    row = ModelPrice.objects.get()
    assert (row.prompt_per_million, row.completion_per_million) == (Decimal(1), Decimal(0))
    assert AuditEvent.objects.filter(action="price.set", target="model:llama").count() == 2
    assert price_clear(model="llama", actor="d") == "llama"
    with pytest.raises(NotFound, match="llama has no price."):
        price_clear(model="llama", actor="d")


@pytest.mark.parametrize(
    "model, prompt, says",
    [
        ("", 1, "a price needs the model's name"),
        ("x" * 65, 1, "at most 64 characters"),
        ("a\x00", 1, "control characters"),
        ("llama", -1, "prompt_per_million must be a number from 0"),
        ("llama", None, "prompt_per_million must be a number"),
        ("llama", 10**8, "to 10,000,000"),
    ],
)
def test_a_bad_price_is_refused_and_nothing_changes(tree, model, prompt, says):
    with pytest.raises(Invalid, match=says):
        price_set(model=model, prompt_per_million=prompt, completion_per_million=1, actor="d")
    assert changed() == ([], [], AuditEvent.objects.count())


# Spend and the verdict


def test_spend_is_summed_from_usage_for_the_key_and_every_scope_above_it(tree):
    budget_set(scope="team:Acme/ml", tokens_per_month=1_000_000, actor="ops")
    budget_set(scope=f"key:{tree['ci'].pk}", tokens_per_day=100, actor="ops")
    spend(tree["ci"], "llama", 600_000, 2_311)
    spend(tree["other"], "llama", 400_000, 0, at=NOW - timedelta(days=2))
    spend(tree["site"], "llama", 5_000_000, 0)  # another team
    spend(tree["ci"], "llama", 9_999_999, 0, at=datetime(2026, 11, 30, 23, 59, tzinfo=UTC))

    chain = (f"key:{tree['ci'].pk}", tree["training"], tree["ml"], tree["acme"])
    verdict = budget_verdict(chain=chain, now=NOW)

    assert not verdict.allowed
    assert verdict.refusal == (
        "team:Acme/ml has spent 1,002,311 of its 1,000,000 tokens for December; "
        "it resets at 2027-01-01 00:00 UTC"
    )
    assert verdict.retry_after(NOW) == 24 * 3600 * 24 + 8 * 3600 + 30 * 60


def test_cost_is_priced_per_model_and_warned_at_four_fifths(tree):
    price_set(model="llama", prompt_per_million=1, completion_per_million=3, actor="ops")
    budget_set(scope="org:Acme", cost_per_day=10, actor="ops")
    spend(tree["ci"], "llama", 2_000_000, 2_000_000)  # 2 + 6
    spend(tree["site"], "qwen", 10**9, 0)  # no price: free

    chain = (f"key:{tree['site'].pk}", "project:0", tree["web"], tree["acme"])
    verdict = budget_verdict(chain=chain, now=NOW)

    assert verdict.allowed
    assert verdict.warnings == (
        "org:Acme has spent 80 % of its 10.00 in cost for 7 December (8.00); "
        "it resets at 2026-12-08 00:00 UTC",
    )


def test_a_chain_without_budgets_is_allowed_in_one_query(tree):
    spend(tree["ci"], "llama", 10**9, 0)

    with CaptureQueriesContext(connection) as queries:
        verdict = budget_verdict(chain=(f"key:{tree['ci'].pk}", tree["training"]), now=NOW)

    assert verdict.allowed and verdict.warnings == ()
    assert len(queries) == 1


def test_the_book_judges_in_memory_as_the_verdict_does(tree):
    budget_set(scope=f"key:{tree['ci'].pk}", tokens_per_day=100, actor="ops")
    spend(tree["ci"], "llama", 100, 0)
    book = budget_book(now=NOW)
    chain = (f"key:{tree['ci'].pk}", tree["training"], tree["ml"], tree["acme"])

    with CaptureQueriesContext(connection) as queries:
        refused = book.verdict(chain, NOW)
        tomorrow = book.verdict(chain, NOW + timedelta(days=1))

    assert len(queries) == 0
    assert refused.refusal.startswith(f"key:ci ({tree['ci'].prefix}…) has spent 100 of its 100")
    assert tomorrow.allowed


def test_the_book_takes_as_many_queries_for_ten_budgets_as_for_one(tree):
    budget_set(scope=f"key:{tree['ci'].pk}", tokens_per_day=5, actor="ops")
    spend(tree["ci"], "llama", 1, 1)
    with CaptureQueriesContext(connection) as one:
        budget_book(now=NOW)
    for name in ("a", "b", "c"):
        team_create(org="Acme", name=name, actor="t")
        budget_set(scope=f"team:Acme/{name}", tokens_per_day=5, cost_per_day=1, actor="ops")
    budget_set(scope="org:Acme", cost_per_month=5, actor="ops")
    budget_set(scope=f"key:{tree['site'].pk}", tokens_per_day=5, actor="ops")

    with CaptureQueriesContext(connection) as ten:
        budget_book(now=NOW)

    assert len(ten) == len(one)


def test_the_list_shows_each_budget_with_its_spend_resets_and_unpriced_models(tree):
    budget_set(scope="team:Acme/ml", tokens_per_month=1_000_000, cost_per_day="2.5", actor="ops")
    price_set(model="llama", prompt_per_million=1, completion_per_million=1, actor="ops")
    spend(tree["ci"], "llama", 1000, 500, at=NOW - timedelta(days=1))
    spend(tree["ci"], "qwen", 10, 0)

    listed = budgets_list(now=NOW)

    assert listed["unpriced"] == ["qwen"]
    (row,) = listed["budgets"]
    assert row["name"] == "Acme / ml"
    assert row["spent"] == {
        "day": {"tokens": 10, "cost": Decimal(0)},
        "month": {"tokens": 1510, "cost": Decimal("0.0015")},
    }
    assert row["resets_at"] == {
        "day": datetime(2026, 12, 8, tzinfo=UTC),
        "month": datetime(2027, 1, 1, tzinfo=UTC),
    }


# Over REST


def test_a_budget_is_set_listed_and_cleared_over_rest(api, tree):
    response = api.call(
        "PUT",
        "/budgets",
        {"scope": "team:Acme/ml", "tokens_per_month": 1000, "cost_per_day": 2.5},
        HTTP_X_LLMGW_ACTOR="dan",
    )
    assert (response.status_code, response.json()) == (200, {"scope": tree["ml"]})

    listed = api.call("GET", "/budgets").json()
    (row,) = listed["budgets"]
    assert {
        k: row[k] for k in ("scope", "name", "tokens_per_month", "cost_per_day", "updated_by")
    } == {
        "scope": tree["ml"],
        "name": "Acme / ml",
        "tokens_per_month": 1000,
        "cost_per_day": 2.5,
        "updated_by": "dan",
    }
    assert row["spent"]["month"] == {"tokens": 0, "cost": 0.0}
    assert set(row["resets_at"]) == {"day", "month"}

    cleared = api.call("DELETE", "/budgets/team:Acme%2Fml")
    assert (cleared.status_code, cleared.json()) == (200, {"removed": tree["ml"]})
    assert api.call("DELETE", "/budgets/team:Acme%2Fml").status_code == 404


def test_a_price_is_set_listed_and_cleared_over_rest(api, tree):
    response = api.call(
        "PUT",
        "/prices",
        {"model": "llama", "prompt_per_million": 0.15, "completion_per_million": "0.6"},
    )
    assert (response.status_code, response.json()) == (200, {"model": "llama"})

    (row,) = api.call("GET", "/prices").json()
    assert (row["model"], row["prompt_per_million"], row["completion_per_million"]) == (
        "llama",
        0.15,
        0.6,
    )
    assert api.call("DELETE", "/prices/llama").json() == {"removed": "llama"}


BAD_BUDGETS = [
    ({"scope": "team:ml", "tokens_per_day": 1}, '"ml" could be any of 2 teams; give its ID'),
    ({"scope": "key:nope", "tokens_per_day": 1}, "there is no API key"),
    ({"scope": "org:Acme"}, "a budget needs one of"),
    ({"scope": "org:Acme", "tokens_per_day": 0}, "tokens_per_day must be a whole number"),
    ({"scope": "org:Acme", "tokens_per_day": 1.5}, "tokens_per_day"),
    ({"scope": "org:Acme", "tokens_per_day": "9"}, "tokens_per_day"),
    ({"scope": "org:Acme", "cost_per_day": -1}, "cost_per_day must be a number"),
    ({"scope": "org:Acme", "cost_per_day": True}, "cost_per_day"),
    ({"scope": "org:Acme", "cost_per_day": "x"}, "cost_per_day must be a number"),
    ({"scope": "org:Acme", "dollars": 1}, "dollars"),
    ({"tokens_per_day": 1}, "scope"),
    ('{"scope": "org:Acme", "cost_per_day": NaN}', ""),
    (json.dumps({"scope": "org:Acme\x00", "tokens_per_day": 1}), ""),
    (json.dumps({"scope": "org:Acme", "tokens_per_day": 2**63}), ""),
    ("[]", ""),
]


@pytest.mark.parametrize("body, says", BAD_BUDGETS)
def test_a_bad_budget_over_rest_is_400_and_nothing_changes(api, tree, body, says):
    api.call("PUT", "/budgets", {"scope": "org:Acme", "tokens_per_day": 4})
    before = changed()

    response = api.call("PUT", "/budgets", body)

    assert response.status_code == 400, response.content[:200]
    assert says in detail(response)
    assert changed() == before


@pytest.mark.parametrize(
    "body, says",
    [
        (
            {"model": "llama", "prompt_per_million": -1, "completion_per_million": 1},
            "prompt_per_million",
        ),
        ({"model": "llama", "prompt_per_million": 1}, "completion_per_million"),
        ({"model": "", "prompt_per_million": 1, "completion_per_million": 1}, "model's name"),
        ({"model": 5, "prompt_per_million": 1, "completion_per_million": 1}, "model"),
    ],
)
def test_a_bad_price_over_rest_is_400_and_nothing_changes(api, tree, body, says):
    response = api.call("PUT", "/prices", body)

    assert response.status_code == 400, response.content[:200]
    assert says in detail(response)
    assert changed() == ([], [], AuditEvent.objects.count())


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/budgets"),
        ("PUT", "/budgets"),
        ("DELETE", "/budgets/org:Acme"),
        ("GET", "/prices"),
        ("PUT", "/prices"),
        ("DELETE", "/prices/llama"),
    ],
)
def test_budgets_and_prices_need_an_admin_token(tree, method, path):
    response = Client().generic(method, f"/api/v1{path}", "{}", "application/json")

    assert response.status_code == 401


# In Django admin


class TestAdmin:
    def test_the_list_shows_each_budget_by_name(self, admin_client, tree):
        budget_set(scope="team:Acme/ml", tokens_per_day=600, actor="o")

        page = admin_client.get("/admin/tenancy/budget/")

        assert page.status_code == 200
        text = page.content.decode()
        assert "Acme / ml" in text and tree["ml"] in text and "600" in text

    def test_a_budget_added_in_admin_goes_through_the_service(self, admin_client, tree):
        response = admin_client.post(
            "/admin/tenancy/budget/add/",
            {"scope": f"key:{tree['ci'].pk}", "cost_per_month": "12.5", "tokens_per_day": ""},
        )

        assert response.status_code == 302
        row = Budget.objects.get()
        assert (row.scope, row.cost_per_month, row.tokens_per_day, row.updated_by) == (
            f"key:{tree['ci'].pk}",
            Decimal("12.5"),
            None,
            "admin",
        )
        assert AuditEvent.objects.filter(action="budget.set", actor="admin").exists()

    @pytest.mark.parametrize(
        "form, field, said",
        [
            ({"scope": "team:ml", "tokens_per_day": "1"}, "scope", "could be any of 2"),
            ({"scope": "key:999", "tokens_per_day": "1"}, "scope", "there is no API key"),
            ({"scope": "org:Acme", "tokens_per_day": "0"}, "tokens_per_day", "from 1"),
            ({"scope": "org:Acme", "cost_per_day": "-1"}, "cost_per_day", "must be a number"),
            ({"scope": "org:Acme"}, "__all__", "A budget needs tokens or a cost"),
        ],
    )
    def test_a_bad_budget_is_refused_beside_its_field(self, admin_client, tree, form, field, said):
        response = admin_client.post("/admin/tenancy/budget/add/", form)

        assert response.status_code == 200
        errors = response.context["adminform"].form.errors.get(field, [])
        assert said in " ".join(errors)
        assert not Budget.objects.exists()

    def test_a_budget_deleted_in_admin_is_cleared_and_recorded(self, admin_client, tree):
        budget_set(scope="org:Acme", tokens_per_day=5, actor="o")
        row = Budget.objects.get()
        assert admin_client.get(f"/admin/tenancy/budget/{row.pk}/change/").status_code == 200

        response = admin_client.post(f"/admin/tenancy/budget/{row.pk}/delete/", {"post": "yes"})

        assert response.status_code == 302
        assert AuditEvent.objects.filter(action="budget.clear", actor="admin").exists()

    def test_a_price_is_added_and_deleted_in_admin_through_the_services(self, admin_client, tree):
        assert admin_client.get("/admin/tenancy/modelprice/add/").status_code == 200
        response = admin_client.post(
            "/admin/tenancy/modelprice/add/",
            {"model": "llama", "prompt_per_million": "0.15", "completion_per_million": "0.6"},
        )
        assert response.status_code == 302
        row = ModelPrice.objects.get()
        assert (row.model, row.updated_by) == ("llama", "admin")

        admin_client.post(f"/admin/tenancy/modelprice/{row.pk}/delete/", {"post": "yes"})

        assert not ModelPrice.objects.exists()
        assert AuditEvent.objects.filter(action="price.clear", actor="admin").exists()


# The days' sums the spend is read from


def test_the_days_sums_hold_what_the_usage_rows_hold_however_it_came(tree):
    from tenancy.models import DailySpend, Usage
    from tenancy.services.usage import usage_journal_settle

    late = NOW.replace(hour=23, minute=59)
    spend(tree["ci"], "llama", 10, 1)
    spend(tree["ci"], "llama", 20, 2, at=late)
    spend(tree["ci"], "llama", 40, 4, at=late + timedelta(minutes=1))  # the next UTC day
    minute = int(NOW.timestamp() // 60)
    usage_journal_settle(
        name="gw-1",
        tallies={(minute, tree["other"].pk, tree["other"].project_id, "qwen"): [1, 0, 7, 3, 1, 0]},
    )
    gone = tree["site"].pk
    usage_add(tallies={(minute, gone + 1000, tree["site"].project_id, "llama"): [1, 0, 5, 5, 1, 0]})

    days = {
        (d.day.isoformat(), d.api_key_id, d.model): (d.prompt_tokens, d.completion_tokens)
        for d in DailySpend.objects.all()
    }
    assert days == {
        ("2026-12-07", tree["ci"].pk, "llama"): (30, 3),
        ("2026-12-08", tree["ci"].pk, "llama"): (40, 4),
        ("2026-12-07", tree["other"].pk, "qwen"): (7, 3),
    }
    assert sum(p for p, _ in days.values()) == sum(
        Usage.objects.values_list("prompt_tokens", flat=True)
    )


def test_the_migration_sums_the_usage_recorded_before_it(tree):
    import importlib

    from django.apps import apps

    from tenancy.models import DailySpend

    spend(tree["ci"], "llama", 10, 1)
    spend(tree["ci"], "llama", 20, 2, at=NOW + timedelta(minutes=5))
    DailySpend.objects.all().delete()

    importlib.import_module("tenancy.migrations.0007_budgets").daily_spend_fill(apps, None)

    (row,) = DailySpend.objects.all()
    assert (row.day.isoformat(), row.prompt_tokens, row.completion_tokens) == ("2026-12-07", 30, 3)
