"""The quotas page's spend budgets: each budget with what its scope spent this UTC day and
month, loaded after the page so the quotas keep their few queries."""

from __future__ import annotations

import time

import pytest

from tenancy.services.budgets import budget_set
from tenancy.services.usage import usage_add

pytestmark = pytest.mark.django_db


@pytest.fixture
def key(scopes):
    return scopes("Acme/ml/chat/k", actor="t")["Acme/ml/chat/k"]


def budgets_part(staff) -> str:
    answer = staff.get("/quotas?fragment=budget-table", HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    return answer.content.decode()


def test_the_page_asks_for_the_budgets_after_it_loads(staff, key):
    page = staff.get("/quotas").content.decode()
    assert 'hx-get="/quotas?fragment=budget-table"' in page
    assert "Reading the budgets" in page


def test_each_budget_shows_its_spend_against_it_day_and_month(staff, key):
    budget_set(scope="team:Acme/ml", actor="t", tokens_per_day=1000, tokens_per_month=5000)
    minute = int(time.time() // 60)
    usage_add(tallies={(minute, key.pk, key.project_id, "llama"): [1, 0, 800, 50, 5, 0]})
    part = budgets_part(staff)
    assert part.strip().startswith('<section id="budget-table"')
    assert 'data-budget="team:' in part
    assert ">Acme / ml<" in part
    assert 'data-cell="tokens / day" title="spent / budget">850 / 1,000<' in part
    assert 'class="num warn" data-cell="tokens / day"' in part
    assert 'data-cell="tokens / month" title="spent / budget">850 / 5,000<' in part
    assert 'data-cell="cost / day" title="spent / budget">-<' in part
    assert "Used this month without a price" in part and "llama" in part


def test_no_budgets_says_how_to_set_one(staff, key):
    assert 'id="no-budgets"' in budgets_part(staff)
