"""The catalog cache each process keeps for the reconciler: read again whenever the catalog changed."""

from datetime import UTC, datetime

import pytest

from catalog.models import Model
from catalog.selectors import catalog_load
from catalog.services import model_add, model_remove, model_scale

pytestmark = pytest.mark.django_db

LLAMA = {
    "name": "llama",
    "profiles": [{"name": "gpu", "engine": "sim", "gpu_class": "h100-80g"}],
    "scaling": {"min": 1},
}


def test_a_change_is_seen_even_when_the_writers_clock_is_behind_another_hosts():
    model_add(data=LLAMA, actor="ops")
    model_add(data={**LLAMA, "name": "qwen"}, actor="ops")
    # qwen was last written by a host whose clock runs ahead.
    Model.objects.filter(name="qwen").update(updated_at=datetime(2100, 1, 1, tzinfo=UTC))
    assert catalog_load()["llama"].min_replicas == 1
    model_scale(name="llama", actor="ops", scaling={"min": 3})
    assert catalog_load()["llama"].min_replicas == 3


def test_a_removed_model_leaves_the_cached_catalog():
    model_add(data=LLAMA, actor="ops")
    assert "llama" in catalog_load()
    model_remove(name="llama", actor="ops")
    assert "llama" not in catalog_load()
