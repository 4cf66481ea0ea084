"""`/metrics`: what the collector publishes, read back with prometheus_client's own parser."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import subprocess
import threading
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from catalog import selectors as catalog_selectors
from fleet.metrics import collector as metrics
from fleet.metrics.collector import FleetCollector, fleet_scrape, fleet_text
from fleet.metrics.series import DESCS
from fleet.models import DomainCondition, DomainHold, Lease, ModelState, Node, PowerBudget, Replica
from fleet.nodes.connections import REFUSED as AGENTS_REFUSED, REGISTRY as AGENTS_REGISTRY
from fleet.nodes.fabric import node_fabric_record
from fleet.nodes.heard import node_live_flush
from fleet.nodes.live import NodeWrite
from fleet.protocol import Fabric, Load
from fleet.reconciler.run import LEASE, advisory_take, reconcile_once
from fleet.selectors import state as selectors
from fleet.selectors.state import holdings_load
from llmgw.core import clock
from llmgw.gateway.metrics import REGISTRY as GATEWAY_REGISTRY
from tenancy.models import CapacityQuota, Organization, Team
from tenancy.selectors import quota_policy_load, quota_views

from .builders import H100, L4, T0, at, gpu_model, model_added, node_add
from .test_reconciler import ready

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
EXPORTED = (
    {d.sample for d in DESCS}
    | {d.name for d in DESCS}
    | set(GATEWAY_REGISTRY._names_to_collectors)  # the gateway's own series
    | set(AGENTS_REGISTRY._names_to_collectors)  # the agents' connections' counts
    | {"llmgw_database_up"}  # said only while the database is away (fleet/metrics/collector.py)
)


@pytest.fixture(autouse=True)
def _fresh_metric_caches():
    metrics.caches_clear()
    yield
    metrics.caches_clear()


@pytest.fixture
def at_t0(monkeypatch):
    """The clock the view reads stands at T0 + 5 s."""
    monkeypatch.setattr(clock, "now", lambda: T0 + timedelta(seconds=5))


def heard(node_id: str, now: datetime, load: dict | None) -> None:
    """A heartbeat's load written behind, as the consumer's flush writes it."""
    node_live_flush(
        writes=[
            NodeWrite(
                node_id=node_id,
                session=f"session-{node_id}",
                last_seen=now,
                sample=Load.model_validate(load) if load is not None else None,
                engines={},
                memory_total_mb=None,
                cpu_count=None,
                used_replicas=frozenset(),
            )
        ],
        now=now,
    )


def scrape(now: datetime = at(5)) -> list[str]:
    """Every sample as `name a=1 b=2 -> value`, labels sorted, like the seed's test."""
    return samples(fleet_scrape(now=now).text())


def samples(text: str) -> list[str]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = " ".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out.append(f"{s.name} {labels} -> {s.value:g}".replace("  ", " "))
    return out


def names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


SENSED = {
    "cpu_percent": 41.5,
    "load1": 3.5,
    "load5": 3.0,
    "load15": 2.0,
    "memory_used_bytes": 100 << 30,
    "memory_available_bytes": 150 << 30,
    "cpu_temp_c": 58,
    "cpu_power_w": 65,
    "inlet_temp_c": 23.5,
    "gpus": [
        {"index": 0, "temp_c": 88, "memory_temp_c": 81, "power_w": 698, "power_limit_w": 700,
         "throttle": ["sw_power_cap", "sw_thermal"], "utilization": 97, "memory_used_mb": 70000},
        {"index": 1, "temp_c": 35, "memory_temp_c": 40, "power_w": 80, "power_limit_w": 700,
         "utilization": 0, "memory_used_mb": 0},
    ],
}  # fmt: skip

# gpu-a's fabric as its agent reports it: GPU 0 joined, a link down, an uncorrected ECC
# error and Xid 79; GPU 1 still joining; IMEX up; one InfiniBand port active, one down.
FABRIC = {
    "gpus": [
        {"index": 0,
         "fabric": {"cluster_uuid": "7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f", "clique_id": 1,
                    "state": "completed", "status": 0},
         "nvlinks": [{"link": 0, "up": True, "peer_index": 1, "replay_errors": 4},
                     {"link": 1, "up": False}],
         "ecc": {"enabled": True, "corrected_volatile": 3, "uncorrected_volatile": 1,
                 "remap_pending": False, "remap_failure": False},
         "xids": [79, 79]},
        {"index": 1, "fabric": {"state": "in_progress", "status": 0}},
    ],
    "imex": {"state": "up", "domain": "imex-0123456789ab"},
    "ib_ports": [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0, "link_downed": 2,
         "symbol_errors": 0},
        {"device": "mlx5_1", "port": 1, "state": "DOWN"},
    ],
}  # fmt: skip


def fabric_said(node_id: str, fabric: dict, now: datetime) -> None:
    """A heartbeat's fabric recorded, as the consumer records it."""
    node_fabric_record(node_id=node_id, fabric=Fabric.model_validate(fabric), now=now)


def test_sensors_are_published_fresh_and_only_when_measured():
    node_add("g1", now=T0, gpus=(H100,))
    node_add("vm1", now=T0, gpus=())
    heard("g1", at(1), {"cpu_temp_c": 58, "cpu_power_w": 65, "gpus": [
        {"index": 0, "temp_c": 88, "power_w": 698, "power_limit_w": 700,
         "throttle": ["sw_power_cap", "sw_thermal"]}]})  # fmt: skip
    heard("vm1", at(1), {"cpu_percent": 3})

    out = scrape()

    for want in (
        "llmgw_node_cpu_temperature_celsius node=g1 -> 58",
        "llmgw_node_cpu_power_watts node=g1 -> 65",
        "llmgw_gpu_power_watts class=h100-80g gpu=0 node=g1 -> 698",
        "llmgw_gpu_power_limit_watts class=h100-80g gpu=0 node=g1 -> 700",
        "llmgw_gpu_throttled class=h100-80g gpu=0 node=g1 reason=sw_thermal -> 1",
        "llmgw_gpu_throttled class=h100-80g gpu=0 node=g1 reason=sw_power_cap -> 1",
        "llmgw_gpu_temperature_celsius class=h100-80g gpu=0 node=g1 -> 88",
        "llmgw_node_cpu_percent node=vm1 -> 3",
    ):
        assert want in out
    for line in out:
        if "temperature" in line or "power" in line:
            assert "node=vm1" not in line, f"published what was not measured: {line}"
        assert "llmgw_node_inlet_temperature_celsius" not in line
        assert "llmgw_gpu_memory_temperature_celsius" not in line


def test_readings_from_a_node_not_heard_from_lately_are_not_published():
    node_add("g1", now=T0, gpus=(H100,))
    heard("g1", at(1), SENSED)
    unreachable = 15  # LLMGW_UNREACHABLE_SECONDS

    fresh, old = scrape(at(1 + unreachable - 1)), scrape(at(1 + unreachable))

    assert "llmgw_gpu_temperature_celsius class=h100-80g gpu=0 node=g1 -> 88" in fresh
    readings = [line for line in old if re.search("temperature|power|percent|load|used", line)]
    assert readings == []
    # What it registered still stands, and so does when it was last heard from.
    assert "llmgw_node_gpus node=g1 -> 1" in old
    assert f"llmgw_node_last_seen_timestamp_seconds node=g1 -> {at(1).timestamp():g}" in old


def test_a_fresh_reading_replaces_the_last_one():
    node_add("g1", now=T0, gpus=(H100,))
    heard("g1", at(1), {"gpus": [{"index": 0, "temp_c": 40}]})
    assert "llmgw_gpu_temperature_celsius class=h100-80g gpu=0 node=g1 -> 40" in scrape(at(2))

    heard("g1", at(6), {"gpus": [{"index": 0, "temp_c": 88}]})

    temps = [line for line in scrape(at(7)) if line.startswith("llmgw_gpu_temperature")]
    assert temps == ["llmgw_gpu_temperature_celsius class=h100-80g gpu=0 node=g1 -> 88"]


def test_a_sensor_that_reads_zero_or_nothing_has_no_series_but_an_idle_gpu_does():
    node_add("g1", now=T0, gpus=(H100, H100))
    heard("g1", at(1), {"cpu_percent": 0, "cpu_temp_c": 0, "gpus": [
        {"index": 0, "temp_c": 0, "power_w": 0, "utilization": 0, "memory_used_mb": 0},
        {"index": 1}]})  # fmt: skip

    out = scrape()

    assert "llmgw_node_cpu_percent node=g1 -> 0" in out
    assert "llmgw_gpu_utilization_percent class=h100-80g gpu=0 node=g1 -> 0" in out
    assert "llmgw_gpu_memory_used_bytes class=h100-80g gpu=0 node=g1 -> 0" in out
    assert not [line for line in out if "gpu=1" in line and "healthy" not in line and "total" not in line]  # fmt: skip
    assert not [line for line in out if "temperature" in line or "power" in line]


def a_whole_cluster(no_settle) -> None:
    """Two nodes with every sensor, a model running and one that cannot run, quotas."""
    acme = Organization.objects.create(name="Acme")
    ml = Team.objects.create(org=acme, name="ml")
    CapacityQuota.objects.create(scope=f"org:{acme.pk}", guarantee_gpus=1, limit_gpus=2)
    CapacityQuota.objects.create(scope=f"team:{ml.pk}", limit_gpus=1, limit_memory_gb=64)
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={"llmgw.io/rack": "r1"})
    node_add("gpu-b", now=T0, gpus=(L4,))
    PowerBudget.objects.create(kind="rack", name="r1", watts=16000)
    DomainCondition.objects.create(kind="rack", name="r1", condition="ok", read_at=T0)
    DomainHold.objects.create(kind="pdu", name="p1", held_at=T0)
    model_added(gpu_model("chat", owner=f"team:{ml.pk}"))
    model_added(gpu_model("huge", gpu_class="b200-192g"))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(1))
    ModelState.objects.filter(pk="chat").update(preempted=3)
    ModelState.objects.filter(pk="huge").update(failures=5, parked_since=at(1))
    heard("gpu-a", at(2), SENSED)
    heard("gpu-b", at(2), {"gpus": [{"index": 0, "temp_c": 50}]})
    fabric_said("gpu-a", FABRIC, at(2))
    # chat's engine said what it runs; a llama-server would say no KV use, absent then.
    shard = Replica.objects.get(model="chat").shards.get()
    gpu_a = Node.objects.get(pk="gpu-a")
    said = {"running": 3, "waiting": 1, "kv_cache": 0.42, "prefix_hit_rate": 0.8}
    said["adapters"] = [{"name": "acme-tone", "engine_id": None}]  # a LoRA adapter it holds
    Node.objects.filter(pk="gpu-a").update(load={**gpu_a.load, "engines": {shard.id: said}})
    # Its agent could not install llama.cpp from the mirror.
    Node.objects.filter(pk="gpu-b").update(
        engine_installs=[
            {"engine": "llamacpp", "version": "b6000", "state": "failed", "detail": "no disk"}
        ]
    )


def leading(holder: str = "cp-1:42:7", until: datetime = at(60)) -> None:
    """A reconciler pass in progress in some process: it holds the lease (and on
    PostgreSQL the advisory lock, which the leader gauge asks for)."""
    Lease.objects.filter(pk=LEASE).update(holder=holder, expires_at=until)
    if connection.vendor == "postgresql":
        advisory_take()


@pytest.fixture(autouse=True)
def _no_lock_left():
    yield
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")


def test_a_leader_row_a_killed_worker_left_is_no_leader_on_postgresql(no_settle):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's lease is its row")
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    Lease.objects.filter(pk=LEASE).update(holder="dead:1:1", expires_at=at(60))

    assert not [line for line in scrape(at(5)) if line.startswith("llmgw_leader")]


def test_passes_missed_are_a_gauge(no_settle):
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)

    assert "llmgw_reconciler_stale -> 0" in scrape(at(5))
    assert "llmgw_reconciler_stale -> 1" in scrape(at(47))


def test_the_fabric_is_published_as_its_agent_said_it():
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    heard("gpu-a", at(1), {})
    fabric_said("gpu-a", FABRIC, at(1))

    fabric = [
        s for s in scrape(at(5))
        if any(w in s for w in ("nvlink", "ecc", "memory_repair", "fabric", "xid", "imex", "ib_"))
    ]  # fmt: skip

    assert fabric == [
        "llmgw_gpu_nvlink_up class=h100-80g gpu=0 link=0 node=gpu-a -> 1",
        "llmgw_gpu_nvlink_up class=h100-80g gpu=0 link=1 node=gpu-a -> 0",
        "llmgw_gpu_nvlink_errors_total class=h100-80g gpu=0 kind=replay link=0 node=gpu-a -> 4",
        "llmgw_gpu_ecc_errors_total class=h100-80g gpu=0 kind=corrected node=gpu-a scope=volatile -> 3",
        "llmgw_gpu_ecc_errors_total class=h100-80g gpu=0 kind=uncorrected node=gpu-a scope=volatile -> 1",
        "llmgw_gpu_memory_repair class=h100-80g gpu=0 node=gpu-a state=remap_pending -> 0",
        "llmgw_gpu_memory_repair class=h100-80g gpu=0 node=gpu-a state=remap_failed -> 0",
        "llmgw_gpu_fabric_state class=h100-80g gpu=0 node=gpu-a state=completed -> 1",
        "llmgw_gpu_fabric_state class=h100-80g gpu=1 node=gpu-a state=in_progress -> 1",
        "llmgw_gpu_nvlink_joined class=h100-80g clique=1 cluster=7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f"
        " gpu=0 node=gpu-a -> 1",
        "llmgw_gpu_xid class=h100-80g gpu=0 node=gpu-a xid=79 -> 2",
        "llmgw_node_imex_up domain=imex-0123456789ab node=gpu-a -> 1",
        "llmgw_node_ib_port_active device=mlx5_0 node=gpu-a port=1 -> 1",
        "llmgw_node_ib_port_active device=mlx5_1 node=gpu-a port=1 -> 0",
        "llmgw_node_ib_port_rate_gbps device=mlx5_0 node=gpu-a port=1 -> 400",
        "llmgw_node_ib_port_errors_total counter=link_downed device=mlx5_0 node=gpu-a port=1 -> 2",
        "llmgw_node_ib_port_errors_total counter=symbol_errors device=mlx5_0 node=gpu-a port=1 -> 0",
    ]


def test_a_changed_fabric_replaces_the_last_one_and_a_silent_node_publishes_none():
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    heard("gpu-a", at(1), {})
    fabric_said("gpu-a", FABRIC, at(1))
    assert "llmgw_node_imex_up domain=imex-0123456789ab node=gpu-a -> 1" in scrape(at(5))

    fabric_said("gpu-a", {**FABRIC, "imex": {"state": "down"}}, at(6))
    now = scrape(at(7))
    ticked = json.loads(json.dumps(FABRIC))
    ticked["gpus"][0]["nvlinks"][0]["replay_errors"] = 9  # what placement reads stays
    fabric_said("gpu-a", ticked, at(8))
    later = scrape(at(9))

    assert "llmgw_node_imex_up domain= node=gpu-a -> 0" in now
    assert (
        "llmgw_gpu_nvlink_errors_total class=h100-80g gpu=0 kind=replay link=0 node=gpu-a -> 9"
        in later
    )
    assert not [s for s in scrape(at(3600)) if "imex" in s or "nvlink" in s]


def test_every_metric_is_published_where_there_is_something_to_say(no_settle):
    a_whole_cluster(no_settle)
    leading()

    text = fleet_text(now=at(5))

    assert {f.name for f in text_string_to_metric_families(text)} == {d.name for d in DESCS}


def test_the_fleet_as_it_stands(no_settle):
    a_whole_cluster(no_settle)
    leading()

    out = scrape()

    placed = Replica.objects.get(model="chat").shards.get()
    for want in (
        "llmgw_node_up node=gpu-a -> 1",
        "llmgw_node_gpus node=gpu-a -> 2",
        # chat holds GPU 0; GPU 1 is still joining its fabric (FABRIC): neither is free.
        "llmgw_node_gpus_free node=gpu-a -> 0",
        "llmgw_node_gpus_free node=gpu-b -> 1",
        "llmgw_node_multinode_replicas node=gpu-a -> 0",
        "llmgw_node_cpus node=gpu-a -> 32",
        f"llmgw_node_memory_total_bytes node=gpu-a -> {256 * 1024 * 1048576:g}",
        f"llmgw_node_memory_used_bytes node=gpu-a -> {100 << 30:g}",
        "llmgw_node_load15 node=gpu-a -> 2",
        "llmgw_node_inlet_temperature_celsius node=gpu-a -> 23.5",
        f"llmgw_gpu_memory_total_bytes class=h100-80g gpu=0 node=gpu-a -> {81559 * 1048576:g}",
        "llmgw_gpu_healthy class=l4-24g gpu=0 node=gpu-b -> 1",
        "llmgw_gpu_memory_temperature_celsius class=h100-80g gpu=1 node=gpu-a -> 40",
        "llmgw_gpu_utilization_percent class=h100-80g gpu=0 node=gpu-a -> 97",
        f"llmgw_gpu_memory_used_bytes class=h100-80g gpu=0 node=gpu-a -> {70000 * 1048576:g}",
        "llmgw_gpu_temperature_celsius class=l4-24g gpu=0 node=gpu-b -> 50",
        "llmgw_replicas model=chat state=ready -> 1",
        "llmgw_model_replicas_ready model=chat -> 1",
        "llmgw_model_replicas_ready model=huge -> 0",
        "llmgw_model_desired model=huge -> 1",
        "llmgw_model_failures model=huge -> 5",
        "llmgw_model_parked model=huge -> 1",
        "llmgw_model_parked model=chat -> 0",
        "llmgw_model_unplaceable model=huge -> 1",
        "llmgw_model_unplaceable model=chat -> 0",
        "llmgw_model_preempted_total class=standard model=chat -> 3",
        f"llmgw_replica_running model=chat replica={placed.replica_id} -> 3",
        f"llmgw_replica_waiting model=chat replica={placed.replica_id} -> 1",
        f"llmgw_replica_kv_cache_usage_ratio model=chat replica={placed.replica_id} -> 0.42",
        f"llmgw_replica_prefix_cache_hit_ratio model=chat replica={placed.replica_id} -> 0.8",
        f"llmgw_adapter_loaded adapter=acme-tone model=chat replica={placed.replica_id} -> 1",
        "llmgw_capacity_holds resource=gpus scope=org:Acme -> 1",
        "llmgw_capacity_guarantee resource=gpus scope=org:Acme -> 1",
        "llmgw_capacity_limit resource=gpus scope=org:Acme -> 2",
        "llmgw_capacity_holds resource=gpus scope=team:Acme/ml -> 1",
        "llmgw_capacity_limit resource=memory_gb scope=team:Acme/ml -> 64",
        "llmgw_leader holder=cp-1:42:7 -> 1",
        f"llmgw_reconciler_last_pass_timestamp_seconds -> {T0.timestamp():g}",
        "llmgw_reconciler_settling -> 0",
        "llmgw_node_engine_install engine=llamacpp node=gpu-b state=failed version=b6000 -> 1",
        # chat holds gpu-a's GPU 0, drawing 698 W of a 700 W limit; gpu-a's CPUs draw 65 W
        # (RAPL), measured with it.
        "llmgw_domain_power_budget_watts kind=rack name=r1 -> 16000",
        "llmgw_domain_power_held_watts kind=rack name=r1 -> 700",
        "llmgw_domain_power_limit_watts kind=rack name=r1 -> 16000",
        "llmgw_domain_reserved_watts kind=rack name=r1 -> 700",
        "llmgw_domain_measured_watts kind=rack name=r1 -> 763",
    ):
        assert want in out, want
    assert placed.node_id == "gpu-a"
    # Neither guaranteed nor limited: not governed, so not published.
    assert not [line for line in out if "resource=cpu_cores" in line]
    assert "llmgw_capacity_guarantee resource=gpus scope=team:Acme/ml" not in " ".join(out)


def test_what_each_scope_holds_is_what_the_quota_list_says(no_settle):
    a_whole_cluster(no_settle)
    # gpu-a's GPUs are healthy again (the whole cluster's fabric has both out of service),
    # so the model below is placed on one and Acme holds two.
    fabric_said("gpu-a", {"gpus": [{"index": 0}, {"index": 1}]}, at(2))
    acme = Organization.objects.get(name="Acme")
    model_added(gpu_model("more", owner=f"org:{acme.pk}", profiles=[
        {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g", "min_memory_gb": 20}]))  # fmt: skip
    reconcile_once(now=at(3))
    policy = quota_policy_load()
    listed = {
        (policy.name(q["scope"]), r): v
        for q in quota_views(holdings=holdings_load())
        for r, v in q["holds"].items()
    }

    published = {
        (scope, resource): float(value)
        for resource, scope, value in re.findall(
            r"^llmgw_capacity_holds resource=(\S+) scope=(\S+) -> (\S+)$", "\n".join(scrape()), re.M
        )
    }

    assert published == {
        ("org:Acme", "gpus"): 2,
        ("team:Acme/ml", "gpus"): 1,
        ("team:Acme/ml", "memory_gb"): 0,
    }
    assert all(listed[key] == value for key, value in published.items())


def test_the_leader_is_published_only_while_it_holds_the_lease(no_settle):
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)

    out = scrape(at(5))

    # A pass lets the lease go when it ends; when it began is what says one runs.
    assert not [line for line in out if line.startswith("llmgw_leader")]
    assert f"llmgw_reconciler_last_pass_timestamp_seconds -> {T0.timestamp():g}" in out
    leading("cp-2:7:1", until=at(4))
    assert not [line for line in scrape(at(5)) if line.startswith("llmgw_leader")]


def test_a_scrape_costs_the_same_queries_at_any_fleet_size(no_settle):
    def queries() -> tuple[int, int]:
        # Cold as a process that just started: nothing cached here, nor by the selectors.
        metrics.caches_clear()
        selectors.caches_clear()
        catalog_selectors._cache["version"] = None
        with CaptureQueriesContext(connection) as cold:
            fleet_scrape(now=at(5))
        with CaptureQueriesContext(connection) as warm:
            fleet_scrape(now=at(5))
        return len(cold), len(warm)

    a_whole_cluster(no_settle)
    small = queries()
    for i in range(40):
        node_add(f"more-{i}", now=at(2), gpus=(H100,) * 8)
        heard(f"more-{i}", at(3), SENSED)
    model_added(gpu_model("chat2"))
    reconcile_once(now=at(3))
    large = queries()

    assert small == large
    assert large[1] <= 20


@pytest.mark.django_db(transaction=True)
def test_a_scrape_reads_one_snapshot_and_leaves_writers_free(monkeypatch):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's repeatable read needs no showing; SQLite's locks do")
    node_add("g1", now=T0, gpus=(H100,))
    model_added(gpu_model("chat"))
    ModelState.objects.create(model="chat", failures=1)
    scrape_models = metrics._models

    def another_process_writes_midway(*args):
        # A heartbeat flush or a reconciler pass elsewhere, while this scrape reads.
        db = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2)
        try:
            db.execute("UPDATE fleet_modelstate SET failures = 2 WHERE model = 'chat'")
            db.commit()
        finally:
            db.close()
        return scrape_models(*args)

    monkeypatch.setattr(metrics, "_models", another_process_writes_midway)
    during = scrape(at(1))
    monkeypatch.setattr(metrics, "_models", scrape_models)

    # The write did not wait for the scrape (it would have failed after 0.2 s), and the
    # scrape kept the picture it began with; the next one sees the write.
    assert "llmgw_model_failures model=chat -> 1" in during
    assert "llmgw_model_failures model=chat -> 2" in scrape(at(2))


def test_two_processes_answer_the_same(no_settle):
    a_whole_cluster(no_settle)
    first = fleet_text(now=at(5))

    metrics.caches_clear()  # another process: nothing cached
    second = fleet_text(now=at(5))

    assert first == second
    # What one process writes, another publishes on its next scrape.
    heard("gpu-b", at(6), {"gpus": [{"index": 0, "temp_c": 77}]})
    assert "llmgw_gpu_temperature_celsius class=l4-24g gpu=0 node=gpu-b -> 77" in samples(
        fleet_text(now=at(7))
    )


def test_a_node_that_registers_again_is_published_with_its_new_gpus():
    node_add("g1", now=T0, gpus=(H100, H100))
    assert "llmgw_node_gpus node=g1 -> 2" in scrape(at(1))

    node_add("g1", now=at(2), gpus=(L4,), labels={"llmgw.io/gpu-class": "l4-special"})

    out = scrape(at(3))
    assert "llmgw_node_gpus node=g1 -> 1" in out
    gpus = [line for line in out if line.startswith("llmgw_gpu_healthy")]
    assert gpus == ["llmgw_gpu_healthy class=l4-special gpu=0 node=g1 -> 1"]


def test_label_values_are_escaped():
    odd = 'a "quoted"\\class\nsplit'
    node_add("g1", now=T0, gpus=(H100,), labels={"llmgw.io/gpu-class": odd})

    families = list(text_string_to_metric_families(fleet_text(now=at(1))))

    healthy = next(f for f in families if f.name == "llmgw_gpu_healthy")
    assert healthy.samples[0].labels == {"class": odd, "gpu": "0", "node": "g1"}


def test_the_text_is_what_prometheus_client_writes_for_the_collector(no_settle, at_t0):
    a_whole_cluster(no_settle)
    registry = CollectorRegistry()
    registry.register(FleetCollector())

    assert generate_latest(registry).decode() == fleet_text()


def test_the_view_answers_without_credentials_and_gzips_when_asked(client, no_settle, at_t0):
    a_whole_cluster(no_settle)

    plain = client.get("/metrics")
    zipped = client.get("/metrics", HTTP_ACCEPT_ENCODING="gzip, deflate")

    assert plain.status_code == 200
    assert plain["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert gzip.decompress(zipped.content) == plain.content
    assert zipped["Content-Encoding"] == "gzip"
    assert "llmgw_node_up" in names(plain.content.decode())
    assert client.post("/metrics").status_code == 405


async def test_the_asgi_server_renders_it_off_the_event_loop(monkeypatch):
    from channels.testing import HttpCommunicator

    from llmgw.asgi import application

    rendered_in = []

    def text(**kwargs) -> str:
        rendered_in.append(threading.get_ident())
        return "# HELP llmgw_x x\n# TYPE llmgw_x gauge\nllmgw_x 1.0\n"

    monkeypatch.setattr(metrics, "fleet_text", text)

    # With a Host the server answers to (LLMGW_ALLOWED_HOSTS: loopback names by default).
    response = await HttpCommunicator(
        application, "GET", "/metrics", headers=[(b"host", b"127.0.0.1")]
    ).get_response()

    assert response["status"] == 200
    assert response["body"].startswith(b"# HELP llmgw_x x\n# TYPE llmgw_x gauge\nllmgw_x 1.0\n")
    # Not the thread running the loop that serves the agents' websockets.
    assert rendered_in and rendered_in[0] != threading.get_ident()


def test_an_empty_cluster_answers_with_nothing_to_say(client):
    # A process whose agents' connections refused nothing yet: the counts of this
    # process's earlier tests' refusals are said, as any counter that counted.
    AGENTS_REFUSED.clear()
    response = client.get("/metrics")

    assert response.status_code == 200
    assert response.content == b""


def _exprs(panels: list[dict]) -> list[str]:
    out = []
    for panel in panels:
        out.extend(t["expr"] for t in panel.get("targets", ()) if "expr" in t)
        out.extend(_exprs(panel.get("panels", ())))
    return out


def test_the_dashboard_queries_only_what_the_collector_exports():
    board = json.loads((ROOT / "docs/grafana/llmgw.json").read_text())

    exprs = _exprs(board["panels"])
    used = {m for e in exprs for m in re.findall(r"\bllmgw_[a-z0-9_]+", e)}

    assert exprs and len(exprs) >= 10
    assert used - EXPORTED == set()
    assert any(v["type"] == "datasource" for v in board["templating"]["list"])
    assert all(
        p.get("datasource", {}).get("uid") == "${datasource}"
        for p in board["panels"]
        if p["type"] != "row"
    )


PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)


@pytest.mark.django_db(False)
@needs_promtool
def test_the_alert_rules_pass_promtool():
    done = subprocess.run(
        [PROMTOOL, "check", "rules", "docs/alerts.yml"], cwd=ROOT, capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db(False)
@needs_promtool
def test_the_alerts_fire_when_they_should_and_not_before():
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "tests/fleet/alerts_test.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )

    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.django_db(False)
def test_every_alert_says_what_to_do_about_series_the_collector_exports():
    rules = [
        rule
        for group in yaml.safe_load((ROOT / "docs/alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    wanted = {"ModelPreempted", "CapacityAtLimit", "EngineInstallFailed"}

    assert wanted <= {r["alert"] for r in rules}
    for rule in rules:
        assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 80
        used = set(re.findall(r"\bllmgw_[a-z0-9_]+", rule["expr"]))
        assert used <= EXPORTED, rule["alert"]


@pytest.mark.django_db(False)
@needs_promtool
def test_the_dashboards_queries_are_promql(tmp_path):
    board = json.loads((ROOT / "docs/grafana/llmgw.json").read_text())
    exprs = [e.replace("$resource", "gpus").replace("$node", ".*") for e in _exprs(board["panels"])]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}  # fmt: skip
    (tmp_path / "queries.yml").write_text(yaml.safe_dump(rules))

    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(tmp_path / "queries.yml")], capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout + done.stderr


def test_a_cordoned_gpu_is_not_free_and_a_replica_over_two_nodes_counts_on_each(no_settle):
    from fleet.services import gpu_set_cordon

    for node in ("gpu-a", "gpu-b", "gpu-c"):
        node_add(node, now=T0, labels={"llmgw.io/fabric": "ib"})
    gpu_set_cordon(node_id="gpu-c", index=1, cordoned=True, actor="ops", now=T0)
    wide = {"name": "gpu", "engine": "sim", "gpu_class": "h100-80g", "tp": 4, "nodes": 2}
    model_added(gpu_model("wide") | {"profiles": [wide]})
    reconcile_once(now=at(1))
    held = sorted(s.node_id for s in Replica.objects.get().shards.all())
    assert held == ["gpu-a", "gpu-b"]

    out = scrape()

    for want in (
        "llmgw_node_gpus_free node=gpu-a -> 0",
        "llmgw_node_gpus_free node=gpu-c -> 1",
        "llmgw_node_multinode_replicas node=gpu-a -> 1",
        "llmgw_node_multinode_replicas node=gpu-b -> 1",
        "llmgw_node_multinode_replicas node=gpu-c -> 0",
    ):
        assert want in out, want
