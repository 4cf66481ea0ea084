"""The gateway's tables: built from rows, and read again only for what changed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.domain import ModelSpec, Profile
from fleet.models import Replica, Shard
from llmgw.gateway.tables import KeyRow, Loader, ReplicaRow, build_keys, build_routes, names_of
from tenancy.services import api_key_create, api_key_revoke, org_create, project_create, team_create
from tests.fleet.builders import gpu_model, model_added, node_add


def spec(name="llama", weights=(("a", 1), ("b", 3), ("off", 0)), aliases=()):
    profiles = tuple(Profile(name=p, engine="sim", weight=w) for p, w in weights)
    return ModelSpec(name=name, profiles=profiles, aliases=aliases)


def test_routes_are_ready_replicas_with_an_endpoint_weighted_by_their_profile():
    rows = [
        ReplicaRow("r2", "llama", "b", "ready", "http://10.0.0.2:9000/"),
        ReplicaRow("r1", "llama", "a", "ready", "http://10.0.0.1:9000"),
        ReplicaRow("r3", "llama", "off", "ready", "http://10.0.0.3:9000"),
        ReplicaRow("r4", "llama", "a", "ready", ""),
        ReplicaRow("r5", "llama", "a", "starting", ""),
        ReplicaRow("r6", "llama", "a", "pending", ""),
    ]
    ups, starting = build_routes(rows, spec(), lambda rid: f"key-{rid}")
    assert [(u.replica_id, u.url, u.weight) for u in ups] == [
        ("r1", "http://10.0.0.1:9000", 1),
        ("r2", "http://10.0.0.2:9000", 3),
    ]
    assert ups[0].authorization == "Bearer key-r1"
    assert starting == 2


def test_a_replica_of_a_model_no_longer_in_the_catalog_takes_nothing():
    rows = [ReplicaRow("r1", "gone", "a", "ready", "http://10.0.0.1:9000")]
    assert build_routes(rows, None, str) == ((), 0)


def test_keys_carry_their_chain_and_their_models_by_catalog_name():
    names = names_of({"llama": spec(aliases=("chat",)), "qwen": spec("qwen")})
    rows = [
        KeyRow(1, "a", "p1", "d1", 3, ("chat",), 60, None),
        KeyRow(2, "b", "p2", "d2", 3, (), None, None),
        KeyRow(3, "c", "p3", "d3", 3, ("deleted-model",), None, None),
    ]
    keys = build_keys(rows, {3: ("project:3", "team:2", "org:1")}, names)
    assert keys["d1"].models == frozenset({"llama"})
    assert keys["d1"].scopes == ("project:3", "team:2", "org:1")
    assert keys["d2"].models is None
    # Limited to models that are all gone: it may use none, not every one.
    assert keys["d3"].models == frozenset()


@pytest.mark.django_db
class TestTheLoader:
    @pytest.fixture(autouse=True)
    def rows(self):
        org_create(name="Acme", actor="t")
        team_create(org="Acme", name="ml", actor="t")
        project_create(team="Acme/ml", name="chat", actor="t")
        node_add("gpu-a", now=timezone.now())
        model_added(gpu_model("llama", scaling={"min": 0, "max": 3}))

    def replica(self, rid, state="ready", since=None):
        now = since or timezone.now()
        rep = Replica.objects.create(
            id=rid,
            model="llama",
            profile="gpu",
            profile_fp="",
            state=state,
            state_since=now,
            created_at=now,
        )
        Shard.objects.create(
            id=f"{rid}-0",
            replica=rep,
            node_id="gpu-a",
            http_port=1,
            endpoint=f"http://10.0.0.1:{9000 + int(rid[-1])}",
            state=state,
        )

    def test_nothing_changed_is_no_new_tables(self):
        loader = Loader()
        assert loader.refresh() is not None
        assert loader.refresh() is None

    def test_a_replica_becoming_ready_or_going_away_is_routed_at_the_next_refresh(self):
        long_ago = timezone.now() - timedelta(hours=1)
        self.replica("llama-1", since=long_ago)
        loader = Loader()
        loader.refresh()
        assert [u.replica_id for u in loader.tables.upstreams["llama"]] == ["llama-1"]

        self.replica("llama-2", state="starting")
        assert loader.refresh().starting == {"llama": 1}
        Replica.objects.filter(pk="llama-2").update(state="ready", state_since=timezone.now())
        tables = loader.refresh()
        assert [u.replica_id for u in tables.upstreams["llama"]] == ["llama-1", "llama-2"]
        assert tables.starting == {}

        Replica.objects.filter(pk="llama-1").update(state="stopping", state_since=timezone.now())
        tables = loader.refresh()
        assert [u.replica_id for u in tables.upstreams["llama"]] == ["llama-2"]

        Replica.objects.filter(pk="llama-2").delete()
        assert "llama" not in loader.refresh().upstreams

    def test_a_change_whose_time_is_behind_the_clock_is_still_found(self):
        self.replica("llama-1")
        loader = Loader()
        loader.refresh()
        # A pass that stamped its change with a time before the last read.
        Replica.objects.filter(pk="llama-1").update(
            state="failed", state_since=timezone.now() - timedelta(days=1)
        )
        Replica.objects.create(
            id="llama-2",
            model="llama",
            profile="gpu",
            profile_fp="",
            state="pending",
            state_since=timezone.now() - timedelta(days=1),
            created_at=timezone.now(),
        )
        tables = loader.refresh()
        assert "llama" not in tables.upstreams
        assert tables.starting == {"llama": 1}

    def test_a_revoked_key_leaves_the_table(self):
        key, _ = api_key_create(project="Acme/ml/chat", name="k", actor="t")
        loader = Loader()
        assert len(loader.refresh().keys) == 1
        api_key_revoke(key_id=key.pk, actor="t")
        assert loader.refresh().keys == {}

    def test_a_keys_new_model_list_is_read_within_a_few_refreshes(self):
        from tenancy.models import ApiKey

        model_added(gpu_model("qwen"))
        key, _ = api_key_create(project="Acme/ml/chat", name="k", actor="t")
        loader = Loader()
        loader.refresh()
        ApiKey.objects.filter(pk=key.pk).update(models_allowed=["qwen"])
        for _ in range(Loader.KEYS_EVERY):
            loader.refresh()
        assert next(iter(loader.tables.keys.values())).models == frozenset({"qwen"})

    def test_a_catalog_change_reroutes_with_the_new_weights(self):
        from catalog.services import model_remove

        self.replica("llama-1")
        loader = Loader()
        loader.refresh()
        model_remove(name="llama", actor="t")
        tables = loader.refresh()
        assert "llama" not in tables.upstreams
        assert tables.resolve("llama") is None
