"""The cluster page (`/`) and a node's page (`/nodes/<id>`), through the Django client.

Each page and each fragment htmx polls is shown whole and as a fragment, to staff only;
the cluster page's queries are counted at 1,000 nodes and 500 models.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from catalog.models import Model, Profile
from fleet.models import Gpu, ModelState, Node, Replica, Shard
from fleet.nodes.figures import node_figures_refresh
from fleet.selectors.state import caches_clear
from llmgw.core import clock
from tenancy.services import org_create, quota_set

from .builders import H100, L4, cpu_model, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
# The cluster page's queries at any size: the session and user, the replicas and their
# shards, the nodes, the catalog (its revision and count), the models' states, their
# measured memory, the quota policy's revision (the policy itself is read again only when
# it moved), the reconciler's row (whether passes stopped). The nodes are one
# query: their figures are their own columns, and it says too whether any node says where
# it is or a power budget exists; then the racks are one query more (test_facility.py).
CLUSTER_QUERIES = 10
# Nodes alone: the session and user, the replicas and shards, the nodes.
NODES_FRAGMENT_QUERIES = 5
FRAGMENT_BYTES = 50 * 1024


@pytest.fixture(autouse=True)
def _fresh_registrations():
    """Each test reads its nodes' registrations afresh: ids and times are reused."""
    caches_clear()


@pytest.fixture
def now():
    return clock.now()


def rows(body: bytes, attribute: str) -> list[str]:
    """The values of `data-<attribute>` on the table rows, in order."""
    return re.findall(rf'<tr data-{attribute}="([^"]+)"', body.decode())


def counter(body: str, name: str) -> str:
    """What a counter tile says."""
    return re.search(
        rf'data-counter="{name}"[^>]*>.*?<div class="value">([^<]*)</div>', body
    ).group(1)


def place(replica_id: str, model: str, node_id: str, gpus: list[int], *, now, state="ready"):
    """A replica of `model` holding `gpus` of a node, as the reconciler would have left it."""
    Replica.objects.create(
        id=replica_id,
        model=model,
        profile="gpu",
        profile_fp="x",
        state=state,
        state_since=now,
        created_at=now,
        ready_at=now,
    )
    Shard.objects.create(
        id=f"{replica_id}-0",
        replica_id=replica_id,
        node_id=node_id,
        gpu_indices=gpus,
        http_port=20000,
        state="ready" if state == "ready" else "pending",
    )
    node_figures_refresh(nodes=[node_id])


def loaded(node_id: str, **load) -> None:
    Node.objects.filter(pk=node_id).update(load=load)


HOT = {
    "cpu_percent": 40.0,
    "memory_used_bytes": 1 << 39,
    "memory_available_bytes": 1 << 39,
    "load1": 3.5,
    "load5": 3.0,
    "load15": 2.5,
    "cpu_temp_c": 58.0,
    "cpu_power_w": 312.0,
    "inlet_temp_c": 24.5,
    "gpus": [
        {"index": 0, "temp_c": 71, "memory_temp_c": 84, "power_w": 612, "power_limit_w": 700},
        {
            "index": 1,
            "temp_c": 88,
            "power_w": 698,
            "power_limit_w": 700,
            "throttle": ["sw_power_cap", "sw_thermal"],
        },
    ],
}


# Staff only, and CSRF on the forms


PAGES = ["/", "/?fragment=nodes", "/?fragment=models", "/nodes/gpu-a", "/nodes/gpu-a?fragment=live"]


@pytest.mark.parametrize("url", PAGES)
def test_someone_not_logged_in_is_sent_to_log_in(client, url, now):
    node_add("gpu-a", now=now)
    response = client.get(url)
    assert response.status_code == 302
    assert response.url.startswith("/login/?next=/")
    # From htmx the whole page goes to the login form, not a form swapped into a table.
    response = client.get(url, **HX)
    assert response.status_code == 204 and response["HX-Redirect"].startswith("/login/")


@pytest.mark.parametrize("url", PAGES)
def test_a_user_who_is_not_staff_is_refused(client, django_user_model, url, now):
    node_add("gpu-a", now=now)
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    assert client.get(url).status_code == 403
    assert client.get(url, **HX).status_code == 403


def test_no_one_but_staff_can_drain_a_node(client, django_user_model, now):
    node_add("gpu-a", now=now)
    assert client.post("/nodes/gpu-a", {"action": "drain"}).status_code == 302
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    assert client.post("/nodes/gpu-a", {"action": "drain"}).status_code == 403
    assert not Node.objects.get(pk="gpu-a").draining


def test_a_drain_without_the_csrf_token_is_refused(django_user_model, now):
    node_add("gpu-a", now=now)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(
        django_user_model.objects.create_user("ops", password="x", is_staff=True, is_superuser=True)
    )
    page = browser.get("/nodes/gpu-a")
    assert b'name="csrfmiddlewaretoken"' in page.content

    assert browser.post("/nodes/gpu-a", {"action": "drain"}, **HX).status_code == 403
    assert not Node.objects.get(pk="gpu-a").draining

    # htmx sends the token in X-CSRFToken (base.html's hx-headers), as the page gave it.
    token = re.search(rb'"X-CSRFToken": "([^"]+)"', page.content).group(1).decode()
    response = browser.post("/nodes/gpu-a", {"action": "drain"}, HTTP_X_CSRFTOKEN=token, **HX)
    assert response.status_code == 200
    assert Node.objects.get(pk="gpu-a").draining


# The cluster page


def test_the_cluster_page_is_at_the_root_and_varies_on_htmx(staff, now):
    node_add("gpu-a", now=now)
    response = staff.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.startswith("<!doctype html>") and "<html" in body
    assert 'id="nodes-table"' in body and 'id="models-table"' in body
    assert 'aria-current="page">Cluster' in body
    assert "HX-Request" in response["Vary"]


def test_the_nodes_fragment_is_the_table_with_the_counters_out_of_band(staff, now):
    node_add("gpu-a", now=now)
    node_add("gpu-b", now=now, gpus=(L4,))
    place("r1", "llama", "gpu-a", [0], now=now)

    response = staff.get("/?fragment=nodes", **HX)
    body = response.content.decode()
    assert "<html" not in body and "<h1>" not in body
    assert body.lstrip().startswith('<div id="nodes"')
    assert rows(response.content, "node") == ["gpu-a", "gpu-b"]
    assert 'hx-trigger="every 5s"' in body
    assert '<div id="counters" class="tiles" hx-swap-oob="true">' in body
    assert counter(body, "nodes") == "2 / 2"
    assert counter(body, "gpus") == "2 / 3"
    assert counter(body, "replicas") == "1 / 1"
    assert 'id="models-table"' not in body
    assert "HX-Request" in response["Vary"]

    # Without htmx the same address is the whole page.
    assert "<html" in staff.get("/?fragment=nodes").content.decode()


def test_the_models_fragment_brings_the_attention_strip_out_of_band(staff, now):
    model_added(gpu_model("llama"))
    body = staff.get("/?fragment=models", **HX).content.decode()
    assert "<html" not in body
    assert body.lstrip().startswith('<div id="models"')
    assert rows(body.encode(), "model") == ["llama"]
    assert '<section id="attention" hx-swap-oob="true" hidden>' in body
    assert 'id="nodes-table"' not in body


def test_a_fragment_the_page_does_not_have_is_not_found(staff):
    assert staff.get("/?fragment=everything", **HX).status_code == 404
    assert staff.get("/nodes/x?fragment=everything", **HX).status_code == 404


def test_each_node_shows_its_gpus_free_of_total_with_their_class_and_its_replicas(staff, now):
    node_add("gpu-a", now=now, gpus=(H100,) * 4, memory_total_mb=512 * 1024, cpu_count=64)
    node_add("cpu-b", now=now, gpus=())
    place("r1", "llama", "gpu-a", [0, 1], now=now)
    place("r2", "llama", "gpu-a", [2], now=now, state="starting")
    place("r3", "llama", "gpu-a", [3], now=now, state="stopped")  # holds nothing
    Gpu.objects.filter(node_id="gpu-a", index=3).update(healthy=False)
    node_figures_refresh(nodes=["gpu-a"])

    body = staff.get("/").content.decode()
    gpu_a = re.search(r'<tr data-node="gpu-a">(.*?)</tr>', body).group(1)
    assert '<a href="/nodes/gpu-a">gpu-a</a>' in gpu_a
    # Four GPUs, three held and one unhealthy: none free.
    assert '0 / 4 <span class="muted">h100-80g</span>' in gpu_a
    assert "512 GB" in gpu_a and ">64<" in gpu_a
    assert gpu_a.endswith('<td class="num">2</td>')  # r1 and r2; r3 stopped
    cpu_b = re.search(r'<tr data-node="cpu-b">(.*?)</tr>', body).group(1)
    assert '<span class="muted">none</span>' in cpu_b and cpu_b.endswith('<td class="num">0</td>')


def test_a_gpu_class_label_names_the_class_shown(staff, now):
    node_add("gpu-a", now=now, labels={"llmgw.io/gpu-class": "h100-nvl"})
    body = staff.get("/").content.decode()
    assert '2 / 2 <span class="muted">h100-nvl</span>' in body
    assert rows(staff.get("/?gpu_class=h100-nvl").content, "node") == ["gpu-a"]


def test_a_node_that_registers_again_is_shown_with_what_it_says_now(staff, now):
    node_add("gpu-a", now=now, labels={"rack": "r1"})
    assert '2 / 2 <span class="muted">h100-80g</span>' in staff.get("/").content.decode()
    node_add("gpu-a", now=now + timedelta(seconds=1), gpus=(L4,), labels={"rack": "r2"})
    body = staff.get("/").content.decode()
    assert '1 / 1 <span class="muted">l4-24g</span>' in body
    assert rows(staff.get("/?label=rack%3Dr2").content, "node") == ["gpu-a"]
    Node.objects.filter(pk="gpu-a").delete()
    assert rows(staff.get("/").content, "node") == []


def test_sensor_columns_are_shown_only_when_some_node_measures_them(staff, now):
    node_add("hot", now=now)
    node_add("vm", now=now, gpus=())
    loaded("hot", load1=2.0, cpu_temp_c=58.0, inlet_temp_c=24.5)
    loaded("vm", load1=0.5)

    body = staff.get("/").content.decode()
    assert '<th class="num c-sensor">CPU temp</th>' in body
    assert '<th class="num c-sensor">Inlet</th>' in body
    assert "CPU power" not in body  # nobody measures it
    hot = re.search(r'<tr data-node="hot">(.*?)</tr>', body).group(1)
    vm = re.search(r'<tr data-node="vm">(.*?)</tr>', body).group(1)
    assert "58 °C" in hot and "24.5 °C" in hot and "2.00" in hot
    # The VM's cells are empty: it took no reading, which is not a reading of zero.
    assert "°C" not in vm and vm.count('<td class="num"></td>') == 2

    loaded("hot", load1=2.0)
    body = staff.get("/").content.decode()
    assert "°C" not in body and "CPU temp" not in body and "Inlet" not in body


def test_the_nodes_table_shows_a_hundred_a_page(staff, now):
    bulk_fleet(nodes=250, models=0, now=now)
    first = staff.get("/")
    assert rows(first.content, "node")[:2] == ["n00000", "n00001"]
    assert len(rows(first.content, "node")) == 100
    assert "nodes 1–100 of 250 · page 1 of 3" in first.content.decode()
    assert 'href="?page=2"' in first.content.decode()

    third = staff.get("/?page=3")
    assert rows(third.content, "node") == [f"n{i:05d}" for i in range(200, 250)]
    assert 'href="?page=2"' in third.content.decode() and "next →" not in third.content.decode()
    # A page past the last is the last; one that is not a number is the first.
    assert rows(staff.get("/?page=99").content, "node") == rows(third.content, "node")
    assert rows(staff.get("/?page=x").content, "node") == rows(first.content, "node")


def test_the_nodes_table_sorts_by_each_column_unknown_figures_last(staff, now):
    node_add("a", now=now, gpus=(H100,) * 2, memory_total_mb=64 * 1024, cpu_count=8)
    node_add("b", now=now, gpus=(H100,) * 8, memory_total_mb=512 * 1024, cpu_count=96)
    node_add("c", now=now, gpus=(), memory_total_mb=128 * 1024, cpu_count=32)
    place("r1", "llama", "b", [0, 1, 2, 3, 4, 5, 6], now=now)
    loaded("a", load1=4.0)
    loaded("c", load1=1.0)
    Node.objects.filter(pk="c").update(state="lost")

    def order(query: str) -> list[str]:
        return rows(staff.get(f"/?{query}").content, "node")

    assert order("") == ["a", "b", "c"]
    assert order("sort=-id") == ["c", "b", "a"]
    assert order("sort=state") == ["c", "a", "b"]  # trouble first
    assert order("sort=gpus_free") == ["b", "a", "c"]  # 1 free, 2 free, no GPUs
    assert order("sort=-gpus_free") == ["a", "b", "c"]
    assert order("sort=memory") == ["a", "c", "b"]
    assert order("sort=-cpus") == ["b", "c", "a"]
    assert order("sort=load") == ["c", "a", "b"]  # b says nothing of its load
    assert order("sort=-load") == ["a", "c", "b"]
    assert order("sort=nonsense") == ["a", "b", "c"]


def test_the_nodes_table_filters_by_state_label_and_gpu_class(staff, now):
    node_add("a", now=now, labels={"rack": "r1"})
    node_add("b", now=now, gpus=(L4,), labels={"rack": "r2"})
    node_add("c", now=now, gpus=(L4, H100), labels={"rack": "r1", "role": "edge"})
    Node.objects.filter(pk="c").update(cordoned=True)

    def shown(query: str) -> list[str]:
        return rows(staff.get(f"/?{query}").content, "node")

    assert shown("state=cordoned") == ["c"]
    assert shown("state=ready") == ["a", "b"]
    assert shown("label=rack%3Dr1") == ["a", "c"]
    assert shown("label=role%3Dedge") == ["c"]
    assert shown("gpu_class=l4-24g") == ["b", "c"]
    assert shown("gpu_class=l4-24g&label=rack%3Dr1&sort=-id") == ["c"]
    assert shown("state=lost") == []
    body = staff.get("/?state=lost").content.decode()
    assert "No node matches these filters." in body


def test_a_label_that_is_not_key_value_is_shown_wrong_and_filters_nothing(staff, now):
    node_add("a", now=now)
    response = staff.get("/?label=rack")
    body = response.content.decode()
    assert response.status_code == 200
    assert rows(response.content, "node") == ["a"]
    assert re.search(r'class="field-error">Label .*?A label is key=value', body, re.S)


def test_the_refresh_keeps_the_page_order_and_filters_and_so_do_the_links(staff, now):
    bulk_fleet(nodes=250, models=0, now=now)
    body = staff.get("/?state=ready&sort=-id&page=2").content.decode()
    assert 'hx-get="?fragment=nodes&amp;state=ready&amp;sort=-id&amp;page=2"' in body
    # Pages keep the order and filters; a new order starts from the first page.
    assert 'href="?state=ready&amp;sort=-id&amp;page=3"' in body
    assert 'href="?state=ready&amp;sort=-id"' in body  # back to page 1
    assert 'href="?state=ready&amp;sort=gpus_free"' in body
    assert 'hx-get="?fragment=nodes&amp;state=ready&amp;sort=id"' not in body
    refreshed = staff.get("/?fragment=nodes&state=ready&sort=-id&page=2", **HX)
    assert rows(refreshed.content, "node")[0] == "n00149"
    assert 'hx-get="?fragment=nodes&amp;state=ready&amp;sort=-id&amp;page=2"' in (
        refreshed.content.decode()
    )


def test_the_models_table_has_the_seeds_columns(staff, now):
    model_added(cpu_model("tiny", cores=4, memory_gb=4, **{"class": "critical"}))
    model_added(
        gpu_model(
            "llama",
            description="chat for the support team",
            aliases=["chat"],
            fallbacks=["tiny"],
            scaling={"min": 2, "max": 4},
        )
    )
    node_add("gpu-a", now=now)
    place("llama-1", "llama", "gpu-a", [0], now=now)
    place("tiny-1", "tiny", "gpu-a", [], now=now)
    loaded("gpu-a", shards={"tiny-1-0": {"rss_bytes": 8 * 1024**3}})
    ModelState.objects.create(
        model="llama",
        desired=2,
        preempted=3,
        held_for="tiny",
        held_until=now + timedelta(minutes=5),
    )
    ModelState.objects.create(model="tiny", desired=2)

    body = staff.get("/").content.decode()
    head = re.search(r'<table id="models-table">\s*<thead>(.*?)</thead>', body, re.S).group(1)
    titles = re.findall(r"<th[^>]*>([^<]+)</th>", head)
    assert titles == [
        "Model",
        "Aliases",
        "Ready",
        "Wanted",
        "Class",
        "Reserves",
        "Profiles",
        "Fallbacks",
        "What it is for",
    ]
    llama = re.search(r'<tr data-model="llama">(.*?)</tr>', body).group(1)
    assert '<a href="/models/llama">llama</a>' in llama
    assert "<td>chat</td>" in llama
    assert '<td class="num">2 <span class="muted">2–4</span></td>' in llama
    assert '<td class="class">standard <span class="warn">gave room to tiny</span>' in llama
    assert "−3" in llama
    assert "<td>gpu</td>" in llama and "<td>tiny</td>" in llama
    assert "chat for the support team" in llama
    tiny = re.search(r'<tr data-model="tiny">(.*?)</tr>', body).group(1)
    assert '<td class="class">critical</td>' in tiny
    # Reserves 4 GB and 4 cores, measured using 8: a warning, its reason on hover.
    assert "4G · 4c" in tiny and "8.0G used" in tiny and "⚠" in tiny
    assert "replicas use 8.0 GB but reserve 4 GB" in tiny


def test_no_fallbacks_column_when_no_model_has_one(staff):
    model_added(gpu_model("llama"))
    assert "<th>Fallbacks</th>" not in staff.get("/").content.decode()


def test_the_attention_strip_names_what_cannot_run_what_is_down_and_quotas_at_a_limit(staff, now):
    org = org_create(name="Acme", actor="test")
    model_added(gpu_model("parked-one"))
    model_added(gpu_model("stuck", owner=f"org:{org.pk}"))
    model_added(gpu_model("fine"))
    ModelState.objects.create(
        model="parked-one", desired=1, parked_since=now, parked_reason="the engine exited 3 times"
    )
    ModelState.objects.create(
        model="stuck",
        desired=2,
        unplaceable=True,
        explanation=[{"profile": "gpu", "reasons": ["no node has 1 free h100-80g"]}],
    )
    node_add("gpu-a", now=now)
    node_add("gpu-b", now=now)
    Node.objects.filter(pk="gpu-b").update(state="unreachable")
    place("stuck-1", "stuck", "gpu-a", [0], now=now)
    quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 1}, actor="test")

    body = staff.get("/").content.decode()
    # gpu-a has one GPU of two free; gpu-b's two idle ones are not room while it is unreachable.
    assert counter(body, "gpus") == "1 / 4"
    text = re.search(r'<section id="attention".*?</section>', body, re.S).group(0)
    assert "parked-one</a> is parked: the engine exited 3 times" in text
    assert "stuck</a> cannot be placed: no node has 1 free h100-80g" in text
    assert '<a href="/nodes/gpu-b">gpu-b</a> is <span class="state state-unreachable">' in text
    assert ">Acme</a> holds 1 GPUs of a limit of 1" in text
    assert "fine" not in text and "gpu-a" not in text

    # The models fragment brings the same strip, reading the nodes down itself.
    oob = staff.get("/?fragment=models", **HX).content.decode()
    assert "gpu-b</a> is" in oob and "Acme</a> holds" in oob


def test_a_quota_at_its_limit_costs_the_page_no_query_until_the_quotas_change(staff, now):
    org = org_create(name="Acme", actor="test")
    model_added(gpu_model("stuck", owner=f"org:{org.pk}"))
    node_add("gpu-a", now=now)
    place("stuck-1", "stuck", "gpu-a", [0], now=now)
    without, _ = queries(staff, "/")
    quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 1}, actor="test")

    held, body = queries(staff, "/")
    assert held == without <= CLUSTER_QUERIES
    assert ">Acme</a> holds 1 GPUs of a limit of 1" in body.decode()
    # A new limit is on the next page: the policy's revision moved.
    quota_set(scope="org:Acme", guarantee=None, limit={"gpus": 2}, actor="test")
    assert "Acme</a> holds" not in staff.get("/").content.decode()


def test_nothing_needs_attention_on_a_quiet_cluster(staff, now):
    node_add("gpu-a", now=now)
    assert '<section id="attention" hidden>' in staff.get("/").content.decode()


def test_the_attention_strip_says_when_no_reconciler_pass_ran_for_several_intervals(staff, now):
    from fleet.models import Lease
    from fleet.reconciler.run import LEASE

    node_add("gpu-a", now=now)
    Lease.objects.create(name=LEASE, expires_at=now, last_pass_at=now - timedelta(minutes=5))

    text = re.search(r'<section id="attention".*?</section>', staff.get("/").content.decode(), re.S)
    assert 'data-attention="reconciler">No reconciler pass for 3' in text.group(0)
    cause = (
        "the reconciler in llmgw serve has stopped"
        if settings.LLMGW.embedded  # with Redis (CI) passes are Celery's
        else "is celery beat running, and a worker?"
    )
    assert f"(every 5 s expected): {cause}" in text.group(0)


def bulk_fleet(*, nodes: int, models: int, now, start: int = 0, start_model: int = 0) -> None:
    """Nodes with eight H100s and every sensor, and models of two replicas each on them,
    written in bulk as benchmarks/reconcile_pass.py does."""
    load = {
        "cpu_percent": 12.5,
        "load1": 1.25,
        "load5": 1.0,
        "load15": 0.75,
        "memory_used_bytes": 100 << 30,
        "cpu_temp_c": 55.0,
        "cpu_power_w": 250.0,
        "inlet_temp_c": 22.5,
        "gpus": [
            {"index": g, "temp_c": 60, "power_w": 300, "power_limit_w": 700} for g in range(8)
        ],
    }
    ids = [f"n{i:05d}" for i in range(start, start + nodes)]
    Node.objects.bulk_create(
        (
            Node(
                id=node_id,
                state="ready",
                state_since=now,
                registered_at=now,
                last_seen=now,
                memory_total_mb=1024 * 1024,
                cpu_count=96,
                labels={"rack": f"r{i % 20}"},
                load=load,
            )
            for i, node_id in enumerate(ids)
        ),
        batch_size=1000,
    )
    Gpu.objects.bulk_create(
        (
            Gpu(node_id=n, index=g, name=H100["name"], memory_mb=81559, gpu_class="h100-80g")
            for n in ids
            for g in range(8)
        ),
        batch_size=5000,
    )
    names = [f"m{i:05d}" for i in range(start_model, start_model + models)]
    rows_ = Model.objects.bulk_create(
        (
            Model(name=n, min_replicas=2, max_replicas=2, description=f"{n} for tests")
            for n in names
        ),
        batch_size=1000,
    )
    Profile.objects.bulk_create(
        (Profile(model=m, name="gpu", engine="sim", gpu_class="h100-80g", tp=2) for m in rows_),
        batch_size=1000,
    )
    replicas, shards = [], []
    for slot, (name, r) in enumerate((n, r) for n in names for r in range(2)):
        node, first = divmod(slot, 4)
        rid = f"{name}-{r}"
        replicas.append(
            Replica(id=rid, model=name, profile="gpu", profile_fp="x", state="ready",
                    state_since=now, created_at=now, ready_at=now)
        )  # fmt: skip
        shards.append(
            Shard(id=f"{rid}-0", replica_id=rid, node_id=ids[node % len(ids)],
                  gpu_indices=[first * 2, first * 2 + 1], http_port=20000 + first, state="ready")
        )  # fmt: skip
    Replica.objects.bulk_create(replicas, batch_size=2000)
    Shard.objects.bulk_create(shards, batch_size=2000)
    ModelState.objects.bulk_create((ModelState(model=n, desired=2) for n in names), batch_size=1000)
    node_figures_refresh(nodes=ids)


def queries(client: Client, url: str, **headers) -> tuple[int, bytes]:
    client.get(url, **headers)  # caches read the same queries either way; warm them
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **headers)
    assert response.status_code == 200
    return len(ctx.captured_queries), response.content


def test_the_cluster_page_makes_as_many_queries_at_1000_nodes_as_at_ten(
    staff, now, django_assert_max_num_queries
):
    bulk_fleet(nodes=10, models=5, now=now)
    small, _ = queries(staff, "/")
    small_fragment, _ = queries(staff, "/?fragment=nodes", **HX)

    bulk_fleet(nodes=990, models=495, now=now, start=10, start_model=5)
    staff.get("/")
    with django_assert_max_num_queries(CLUSTER_QUERIES):
        response = staff.get("/")
    big, body = queries(staff, "/")
    print(f"cluster page at 1,000 nodes and 500 models: {big} queries, {len(body):,} bytes")
    assert big == small <= CLUSTER_QUERIES
    # Both tables are paged by 100: 1,000 nodes and 500 models show their first hundred each.
    assert len(rows(body, "node")) == 100 and len(rows(body, "model")) == 100
    assert b"models 1\xe2\x80\x93100 of 500" in body
    # 500 models of two replicas of two GPUs: 2,000 of the 8,000 GPUs are taken.
    assert counter(response.content.decode(), "gpus") == "6000 / 8000"
    assert counter(response.content.decode(), "replicas") == "1000 / 1000"

    big_fragment, fragment = queries(staff, "/?fragment=nodes", **HX)
    print(f"nodes refresh, 100 rows: {big_fragment} queries, {len(fragment):,} bytes")
    assert big_fragment == small_fragment <= NODES_FRAGMENT_QUERIES
    assert len(rows(fragment, "node")) == 100
    assert len(fragment) <= FRAGMENT_BYTES


# A node's page


def test_a_nodes_sensors_are_on_its_page_and_nothing_it_cannot_measure(staff, now):
    """The seed's TestANodesSensorsAreOnItsPageAndNothingItCannotMeasure."""
    node_add("llmgw-node01", now=now, memory_total_mb=1 << 20, cpu_count=64)
    loaded("llmgw-node01", **HOT)
    body = staff.get("/nodes/llmgw-node01").content.decode()
    for want in (
        "58 °C",
        "312 W",
        "24.5 °C",
        "inlet air",
        "84 °C",
        "612 W",
        "of 700",
        '<span class="bad">sw_power_cap, sw_thermal</span>',
    ):
        assert want in body, f"the page lacks {want!r}"

    node_add("vm", now=now, gpus=())
    loaded(
        "vm",
        cpu_percent=80.0,
        memory_used_bytes=1 << 30,
        memory_available_bytes=3 << 30,
        load1=1.0,
        load5=1.0,
        load15=1.0,
    )
    vm = staff.get("/nodes/vm").content.decode()
    for absent in ("°C", "<h2>GPUs</h2>", "inlet air", "CPU power", "CPU temperature"):
        assert absent not in vm, f"a node with no sensors shows {absent!r}"
    # What it does measure is there.
    assert 'data-tile="cpu"' in vm and "80%" in vm and 'data-tile="load"' in vm


def test_a_nodes_whole_draw_from_its_bmc_is_on_its_page_only_where_it_reports_one(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", **HOT, node_power_w=1180.4)
    node_add("gpu-b", now=now)
    loaded("gpu-b", **HOT)
    page = staff.get("/nodes/gpu-a").content.decode()
    tile = re.search(r'<div class="tile" data-tile="node-power">(.*?)</div></div>', page)
    assert tile and "node power, BMC" in tile.group(1) and "1180 W" in tile.group(1)
    assert 'data-tile="node-power"' not in staff.get("/nodes/gpu-b").content.decode()


def test_a_gpu_node_without_gpu_sensors_shows_its_gpus_without_their_columns(staff, now):
    node_add("gpu-a", now=now)
    place("llama-1", "llama", "gpu-a", [1], now=now)
    body = staff.get("/nodes/gpu-a").content.decode()
    head = re.search(r'<table id="gpus-table">\s*<thead>(.*?)</thead>', body, re.S).group(1)
    assert re.findall(r"<th[^>]*>([^<]+)</th>", head) == ["GPU", "Name", "Class", "Runs"]
    free = re.search(r'<tr data-gpu="0">(.*?)</tr>', body).group(1)
    held = re.search(r'<tr data-gpu="1">(.*?)</tr>', body).group(1)
    assert free.endswith('<td><span class="muted">nothing</span></td>')
    assert held.endswith('<td><a href="/models/llama">llama-1</a></td>')
    assert "°C" not in body and " W" not in body


def test_a_node_page_shows_its_tiles_gpus_and_replicas(staff, now):
    node_add("gpu-a", now=now, memory_total_mb=1 << 20, cpu_count=64)
    loaded("gpu-a", **HOT)
    place("llama-1", "llama", "gpu-a", [0], now=now)
    place("llama-2", "llama", "gpu-a", [1], now=now, state="starting")
    body = staff.get("/nodes/gpu-a").content.decode()

    assert "CPU · 64 cores" in body and "40%" in body
    assert '<div class="label">RAM in use</div>' in body
    assert "of 1.0\xa0TB · 512.0\xa0GB available" in body
    # The load tile's label on one line, the longer averages below its figure.
    load = re.search(r'<div class="tile" data-tile="load">(.*?)</div></div>', body).group(1)
    assert '<div class="label">load, 1 min</div><div class="value">3.50</div>' in load
    assert "5 min 3.00 · 15 min 2.50" in load
    gpu0 = re.search(r'<tr data-gpu="0">(.*?)</tr>', body).group(1)
    assert '<span data-width="87"></span>' in gpu0  # 612 W of 700 as a bar
    assert '<span class="muted">nothing</span>' in gpu0  # nothing throttles it
    assert gpu0.endswith('<a href="/models/llama">llama-1</a></td>')
    assert rows(body.encode(), "replica") == ["llama-1", "llama-2"]
    replica = re.search(r'<tr data-replica="llama-2">(.*?)</tr>', body).group(1)
    assert '<a href="/models/llama">llama</a>' in replica
    assert '<td class="state state-starting">starting</td>' in replica


def test_the_live_fragment_refreshes_readings_and_the_state_out_of_band(staff, now):
    node_add("gpu-a", now=now)
    loaded("gpu-a", **HOT)
    Node.objects.filter(pk="gpu-a").update(state="unreachable")
    response = staff.get("/nodes/gpu-a?fragment=live", **HX)
    body = response.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<div id="node-live"')
    assert "58 °C" in body and 'id="gpus-table"' in body
    assert '<span id="node-state" class="state state-unreachable" hx-swap-oob="true">' in body
    assert "drain-button" not in body
    assert "HX-Request" in response["Vary"]
    assert "<html" in staff.get("/nodes/gpu-a?fragment=live").content.decode()


def test_draining_from_the_page_confirms_then_shows_the_result_and_the_new_state(staff, now):
    node_add("gpu-a", now=now)
    page = staff.get("/nodes/gpu-a").content.decode()
    drain = re.search(r'<form[^>]*hx-confirm="([^"]*)"[^>]*>[^\n]*id="drain-button"', page)
    assert drain.group(1) == "Drain gpu-a? Its replicas move elsewhere, a replacement first."

    response = staff.post("/nodes/gpu-a", {"action": "drain"}, **HX)
    body = response.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<section id="node-summary">')
    assert "node gpu-a draining: its replicas move elsewhere, a replacement first" in body
    assert '<span id="node-state" class="state state-draining">draining</span>' in body
    node = Node.objects.get(pk="gpu-a")
    assert node.draining and node.cordoned

    response = staff.post("/nodes/gpu-a", {"action": "uncordon"}, **HX)
    assert "state-ready" in response.content.decode()
    assert not Node.objects.get(pk="gpu-a").cordoned


def test_a_plain_form_cordons_and_comes_back_with_the_result(staff, now):
    node_add("gpu-a", now=now)
    response = staff.post("/nodes/gpu-a", {"action": "cordon"}, follow=True)
    assert response.redirect_chain == [("/nodes/gpu-a", 302)]
    body = response.content.decode()
    assert "node gpu-a cordoned: nothing new is placed on it" in body
    assert 'class="state state-cordoned">cordoned<' in body
    assert Node.objects.get(pk="gpu-a").cordoned


def test_an_order_that_is_not_cordon_uncordon_or_drain_changes_nothing(staff, now):
    node_add("gpu-a", now=now)
    body = staff.post("/nodes/gpu-a", {"action": "delete"}, **HX).content.decode()
    assert "can be cordoned, uncordoned, drained, approved or forgotten" in body
    node = Node.objects.get(pk="gpu-a")
    assert not (node.cordoned or node.draining)
    assert staff.get("/nodes/gpu-a", {"action": "drain"}).status_code == 200
    assert not Node.objects.get(pk="gpu-a").draining
    assert staff.put("/nodes/gpu-a").status_code == 405


def test_an_unapproved_node_is_approved_from_its_page(staff, now, settings):
    from dataclasses import replace

    settings.LLMGW = replace(
        settings.LLMGW, agents=replace(settings.LLMGW.agents, approval="manual")
    )
    node_add("gpu-a", now=now)
    page = staff.get("/nodes/gpu-a").content.decode()
    assert 'class="state state-unapproved">unapproved<' in page and "approve-button" in page

    body = staff.post("/nodes/gpu-a", {"action": "approve"}, **HX).content.decode()

    assert "node gpu-a approved: placement may use it from the next reconciler pass" in body
    assert "approve-button" not in body and Node.objects.get(pk="gpu-a").approved


def test_forgetting_from_the_page_ends_on_the_cluster_page_with_the_sentence(staff, now):
    node_add("gpu-a", now=now)

    response = staff.post("/nodes/gpu-a", {"action": "forget"}, follow=True)

    assert response.redirect_chain == [("/", 302)]
    assert "node gpu-a forgotten: its credential is revoked" in response.content.decode()
    assert not Node.objects.filter(pk="gpu-a").exists()
    htmx = staff.post("/nodes/gpu-b", {"action": "forget"}, **HX)
    assert htmx.status_code == 404


def test_a_node_that_does_not_exist_is_a_404_page(staff):
    response = staff.get("/nodes/nowhere")
    assert response.status_code == 404
    assert "There is no node nowhere" in response.content.decode()
    assert "<html" in response.content.decode()
    assert staff.get("/nodes/nowhere?fragment=live", **HX).status_code == 404
    assert staff.post("/nodes/nowhere", {"action": "drain"}).status_code == 404


def test_a_node_page_makes_the_same_few_queries_whatever_it_runs(staff, now):
    node_add("gpu-a", now=now, gpus=(H100,) * 8)
    loaded("gpu-a", **HOT)
    for i in range(8):
        place(f"m{i}-1", f"m{i}", "gpu-a", [i], now=now)
    count, _ = queries(staff, "/nodes/gpu-a")
    # Session, user, the node, its GPUs, the shards holding them, its replicas, what their
    # engines said, and what happened to it: its events and the changes people made to it.
    assert count == 9


def test_a_nodes_page_says_when_it_was_seen_its_disk_weights_and_what_each_replica_uses(staff, now):
    node_add("gpu-a", now=now)
    Node.objects.filter(pk="gpu-a").update(
        weights=[
            {"sha256": "ab" * 32, "source": "hf://acme/llama/model.gguf", "size": 4 << 30},
            {"sha256": "cd" * 32, "source": ""},
        ]
    )
    place("llama-1", "llama", "gpu-a", [0, 1], now=now)
    Shard.objects.filter(pk="llama-1-0").update(cpu_cores=4, memory_gb=16)
    loaded(
        "gpu-a",
        shards={"llama-1-0": {"cpu_cores": 1.5, "rss_bytes": 2 << 30}},
        gpus=[{"index": 0, "memory_used_mb": 40960}, {"index": 1, "memory_used_mb": 20480}],
        # What its engine said: a llama-server, so no KV use.
        engines={"llama-1-0": {"running": 4, "waiting": 2, "prefix_hit_rate": 0.8}},
    )
    body = staff.get("/nodes/gpu-a").content.decode()
    # When it was last seen: relative, the exact time on hover.
    seen = re.search(r'last seen <time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', body)
    assert seen and seen.group(2).endswith(" UTC") and seen.group(3) in ("just now", "1 s ago")
    assert "500 GB free of 1000 GB" in body
    weights = re.search(r'<table id="node-weights">.*?</table>', body, re.S).group(0)
    # In the mirror's decimal units (llmgw/core/sizes.py): 4 GiB is 4.3 GB on every page.
    assert 'title="hf://acme/llama/model.gguf"' in weights and ">4.3 GB<" in weights
    assert f'title="{"cd" * 32}"' in weights
    row = re.search(r'<tr data-replica="llama-1">(.*?)</tr>', body).group(1)
    assert "16 GB · 4 cores" in row
    assert '<td class="num" data-use="cores">1.5</td>' in row
    assert '<td class="num" data-use="memory">2.0\xa0GB</td>' in row
    assert '<td class="num" data-use="gpu-memory">60.0 GB</td>' in row
    said = re.search(
        r"<span class=\"engine-reading\" data-engine-reading>(.*?)</span>\s*</td>", row
    )
    assert re.sub(r"<[^>]+>", "", said.group(1)) == "runs 4 · queues 2 · hits 80%"


def test_a_replica_use_no_node_reported_has_no_column(staff, now):
    node_add("gpu-a", now=now)
    place("llama-1", "llama", "gpu-a", [0], now=now)
    body = staff.get("/nodes/gpu-a").content.decode()
    head = re.search(r'<table id="node-replicas">\s*<thead>(.*?)</thead>', body, re.S).group(1)
    assert re.findall(r"<th[^>]*>([^<]+)</th>", head) == [
        "Replica",
        "Model",
        "State",
        "GPUs",
        "Reserves",
    ]


@pytest.mark.parametrize(
    ("cordoned", "draining", "buttons"),
    [
        (False, False, {"cordon-button", "drain-button"}),
        (True, False, {"uncordon-button", "drain-button"}),
        (True, True, {"uncordon-button"}),
    ],
)
def test_a_node_page_offers_only_the_schedule_actions_that_change_something(
    staff, now, cordoned, draining, buttons
):
    node_add("gpu-a", now=now)
    Node.objects.filter(pk="gpu-a").update(cordoned=cordoned, draining=draining)
    body = staff.get("/nodes/gpu-a").content.decode()
    offered = set(re.findall(r'id="((?:un)?cordon-button|drain-button)"', body))
    assert offered == buttons
    assert ("Uncordon, ending the drain" in body) == draining


def test_a_node_page_says_its_location_once_and_its_other_labels(staff, now):
    node_add("gpu-a", now=now, labels={"llmgw.io/rack": "r1", "kind": "gpu"})
    body = staff.get("/nodes/gpu-a").content.decode()
    assert '<span class="badge">rack r1</span>' in body
    labels = re.search(r'<p class="labels" id="node-labels">(.*?)</p>', body).group(1)
    assert re.findall(r"<span[^>]*>([^<]+)</span>", labels) == ["kind=gpu"]


def test_a_node_page_shows_the_location_tree_as_badges(staff, now):
    tree = {"llmgw.io/site": "sto1", "llmgw.io/room": "hall-b", "llmgw.io/row": "12"}
    node_add("gpu-a", now=now, labels={**tree, "llmgw.io/rack": "r12-07"})
    body = staff.get("/nodes/gpu-a").content.decode()
    for badge in ("site sto1", "room hall-b", "row 12", "rack r12-07"):
        assert f'<span class="badge">{badge}</span>' in body
    assert 'id="node-labels"' not in body  # each said once, as a badge


def test_idle_gpus_on_a_draining_node_are_not_counted_free_and_the_page_says_so(staff, now):
    node_add("gpu-a", now=now)
    node_add("gpu-b", now=now)
    Node.objects.filter(pk="gpu-b").update(cordoned=True, draining=True)
    node_figures_refresh()
    body = staff.get("/").content.decode()
    gpus = re.search(r'<div class="tile" data-counter="gpus".*?</div></div>', body, re.S).group(0)
    assert '<div class="value">2 / 4</div>' in gpus
    assert "not free: 2 idle on draining nodes" in gpus
    row = re.search(r'<tr data-node="gpu-b">(.*?)</tr>', body).group(1)
    assert '0 / 2 <span class="muted">(2 idle)</span>' in row
