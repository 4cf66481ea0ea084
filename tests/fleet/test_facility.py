"""Power budgets over REST and through the reconciler's shell; racks on the pages
(docs/facility.md)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import ModelState, Node, PowerBudget, Replica
from fleet.reconciler.run import reconcile_once
from llmgw.core import clock
from llmgw.core.permissions import OPERATORS
from tests.helpers import detail

from .builders import H100, T0, cpu_model, gpu_model, model_added, node_add
from .test_pages import CLUSTER_QUERIES

pytestmark = pytest.mark.django_db

RACK = "llmgw.io/rack"


def powered(node_id: str, *, limit: float = 700, draw: float | None = None, gpus: int = 2):
    """The node's agent reported each GPU's enforced power limit (and its draw), just now:
    the racks' measured draw counts only readings heard within LLMGW_UNREACHABLE_SECONDS."""
    readings = [
        {"index": i, "power_limit_w": limit, **({"power_w": draw} if draw else {})}
        for i in range(gpus)
    ]
    Node.objects.filter(pk=node_id).update(load={"gpus": readings}, last_seen=clock.now())


def budgets() -> list[tuple]:
    return list(PowerBudget.objects.values_list("kind", "name", "watts"))


# The API.


def test_a_budget_is_set_listed_replaced_and_cleared(api):
    answer = api.call(
        "PUT", "/facility/budgets", {"kind": "rack", "name": "r12-07", "watts": 16000}
    )
    assert answer.status_code == 200, answer.content
    assert answer.json() == {
        "kind": "rack",
        "name": "r12-07",
        "watts": 16000.0,
        "margin": 0.0,
        "feeds": [],
        "derating": 0.8,
        "other_watts": 0.0,
    }
    api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "r12-07-a", "watts": 7400.5})
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r12-07", "watts": 15000})
    assert budgets() == [("pdu", "r12-07-a", 7400.5), ("rack", "r12-07", 15000.0)]

    listed = api.call("GET", "/facility").json()
    assert [(d["kind"], d["name"], d["budget_w"], d["said"]) for d in listed] == [
        ("rack", "r12-07", 15000.0, "0 of 15 kW"),
        ("pdu", "r12-07-a", 7400.5, "0 of 7.4 kW"),
    ]

    gone = api.call("DELETE", "/facility/budgets/rack/r12-07")
    assert gone.status_code == 200 and gone.json()["watts"] == 15000.0
    assert budgets() == [("pdu", "r12-07-a", 7400.5)]
    again = api.call("DELETE", "/facility/budgets/rack/r12-07")
    assert again.status_code == 404
    assert detail(again) == "rack r12-07 has no power budget."


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        ({"kind": "rack", "name": "r1", "watts": -5}, 400, "watts must be a number above 0"),
        ({"kind": "rack", "name": "r1", "watts": 0}, 400, "watts must be a number above 0"),
        ({"kind": "rack", "name": "r1", "watts": 1e12}, 400, "at most 10,000,000"),
        ({"kind": "zone", "name": "z", "watts": 100}, 400, "a room or a site, not 'zone'"),
        ({"kind": "row", "name": "b 12", "watts": 100}, 400, "is not a row's name"),
        ({"kind": "rack", "name": "r 1/2", "watts": 100}, 400, "is not a rack's name"),
        ({"kind": "rack", "name": "-r1", "watts": 100}, 400, "is not a rack's name"),
        ({"kind": "rack", "name": "r" * 64, "watts": 100}, 400, "at most 63 characters, not 64"),
        ({"kind": "rack", "name": "", "watts": 100}, 400, "a rack needs a name"),
        ({"kind": "rack", "name": "r1", "watts": "100"}, 400, "watts"),
        ({"kind": "rack", "name": "r1", "watts": True}, 400, "watts"),
        ({"kind": "rack", "name": "r1"}, 400, "watts"),
        ({"kind": "rack", "name": "r1", "watts": 100, "margin": 5}, 400, "margin"),
        ({"kind": "rack", "name": 7, "watts": 100}, 400, "name"),
        ({"kind": "rack", "name": "r1", "watts": 100, "margin": 0.6}, 400, "from 0 to 0.5"),
        ({"kind": "rack", "name": "r1", "watts": 100, "feeds": [7400]}, 400, "not both"),
        ({"kind": "rack", "name": "r1", "feeds": []}, 400, "needs its watts"),
        ({"kind": "rack", "name": "r1", "feeds": [7400, -1]}, 400, "a feed's rating"),
        ({"kind": "rack", "name": "r1", "feeds": [1, 2, 3, 4, 5]}, 400, "one to 4 ratings"),
        ({"kind": "rack", "name": "r1", "feeds": [7400], "derating": 0}, 400, "derating"),
        ({"kind": "rack", "name": "r1", "watts": 100, "other_watts": -1}, 400, "other_watts"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(api, body, status, said):
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 9000})
    answer = api.call("PUT", "/facility/budgets", body)
    assert answer.status_code == status, answer.content
    assert said in detail(answer)
    assert budgets() == [("rack", "r1", 9000.0)]


def test_a_dual_fed_budget_with_a_margin_and_other_equipment_is_listed_with_its_figures(
    api, settings
):
    from dataclasses import replace

    settings.LLMGW = replace(settings.LLMGW, power=replace(settings.LLMGW.power, node_watts=300))
    node_add("gpu-a", labels={RACK: "r1"}, now=T0)
    body = {
        "kind": "rack",
        "name": "r1",
        "feeds": [7400, 9000],
        "margin": 0.1,
        "other_watts": 1200,
    }
    answer = api.call("PUT", "/facility/budgets", body)
    assert answer.status_code == 200, answer.content
    assert answer.json()["watts"] == pytest.approx(5920.0)  # the smaller feed at 80 %
    assert budgets() == [("rack", "r1", pytest.approx(5920.0))]

    (rack,) = api.call("GET", "/facility").json()
    assert rack["budget_w"] == pytest.approx(5920.0)
    assert rack["limit_w"] == pytest.approx(5328.0)  # less 10 %
    assert rack["reserved_w"] == 1500.0  # the node's 300 W and 1,200 W of other equipment
    assert rack["said"] == "1.5 of 5.9 kW"


def test_clearing_a_budget_by_a_bad_kind_or_name_is_refused(api):
    assert api.call("DELETE", "/facility/budgets/zone/r1").status_code == 400
    assert api.call("DELETE", "/facility/budgets/rack/-x").status_code == 400


def test_a_viewer_may_list_but_not_set_budgets(client, django_user_model):
    from django.contrib.auth.models import Group

    from llmgw.core.permissions import VIEWERS

    for name, group in (("vera", VIEWERS), ("otto", OPERATORS)):
        user = django_user_model.objects.create_user(name, password="x", is_staff=True)
        user.groups.add(Group.objects.get(name=group))
    client.login(username="vera", password="x")
    assert client.get("/api/v1/facility").status_code == 200
    body = {"kind": "rack", "name": "r1", "watts": 100}
    refused = client.put("/api/v1/facility/budgets", body, content_type="application/json")
    assert refused.status_code == 403
    assert "fleet.change_powerbudget" in detail(refused)
    client.login(username="otto", password="x")
    took = client.put("/api/v1/facility/budgets", body, content_type="application/json")
    assert took.status_code == 200
    assert budgets() == [("rack", "r1", 100.0)]


# Through the reconciler.


def test_the_reconciler_places_within_a_racks_budget_and_says_why_not(api, no_settle):
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={RACK: "r1"})
        powered(node_id)
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 2000})
    model_added(gpu_model("chat", scaling={"min": 3}))

    reconcile_once(now=T0)

    assert Replica.objects.count() == 2
    state = ModelState.objects.get(pk="chat")
    assert state.unplaceable
    said = [r for e in state.explanation for r in e["reasons"]]
    assert any("is in rack r1: 1,400 of 2,000 W held, this replica needs ~700 W" in r for r in said)
    (rack,) = api.call("GET", "/facility").json()
    assert (rack["nodes"], rack["gpus"], rack["estimated_w"], rack["said"]) == (
        2,
        4,
        1400.0,
        "1.4 of 2 kW",
    )


def test_the_reconciler_counts_a_declared_draw_and_cpu_cores_at_the_settings_figure(
    api, no_settle, settings
):
    from dataclasses import replace

    settings.LLMGW = replace(settings.LLMGW, power=replace(settings.LLMGW.power, core_watts=100))
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("cpu-a", now=T0, gpus=(), labels={RACK: "r1"})
    powered("gpu-a")
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 2000})
    declared = gpu_model("chat", scaling={"min": 2})
    declared["profiles"][0]["power_watts"] = 900  # not the GPU's 700 W limit
    model_added(declared)
    model_added(cpu_model("tiny", cores=2, scaling={"min": 2}))  # 200 W each

    reconcile_once(now=T0)

    held = sorted(Replica.objects.values_list("model", flat=True))
    # 900 + 900 leaves 200 W: one CPU replica, not two.
    assert held == ["chat", "chat", "tiny"]
    said = [r for e in ModelState.objects.get(pk="tiny").explanation for r in e["reasons"]]
    assert any("2,000 of 2,000 W held, this replica needs ~200 W" in r for r in said), said
    # The listing counts what placement counts: the declared draws and the cores.
    (rack,) = api.call("GET", "/facility").json()
    assert (rack["reserved_w"], rack["said"]) == (2000.0, "2 of 2 kW")
    from fleet.metrics.collector import fleet_text

    assert 'llmgw_domain_reserved_watts{kind="rack",name="r1"} 2000.0' in fleet_text()


def test_without_readings_a_budget_blocks_nothing(api, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 1})
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    assert Replica.objects.count() == 2
    reasons = set(Replica.objects.values_list("reason", flat=True))
    assert all("its draw is unknown" in r for r in reasons), reasons
    (rack,) = api.call("GET", "/facility").json()
    # Nothing it holds reports its power: what it draws is unknown, not 0 W.
    assert (rack["estimated_w"], rack["unknown_gpus"]) == (None, 2)
    assert rack["said"].startswith("unknown of ")
    from fleet.metrics.collector import fleet_text

    text = fleet_text()
    assert 'llmgw_domain_power_budget_watts{kind="rack",name="r1"} 1.0' in text
    assert "llmgw_domain_power_held_watts" not in text


def test_replicas_spread_over_racks_through_the_shell(no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("gpu-b", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("gpu-c", now=T0, gpus=(H100, H100), labels={RACK: "r2"})
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    nodes = sorted(Replica.objects.values_list("shards__node_id", flat=True))
    assert nodes == ["gpu-a", "gpu-c"]
    second = Replica.objects.get(shards__node_id="gpu-c")
    assert "spread over racks: r2 holds 0, r1 holds 1" in second.reason


# The pages.


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create_user("root", password="x", is_staff=True)
    user.is_superuser = True
    user.save()
    client.force_login(user)
    return client


def test_the_cluster_page_shows_each_racks_draw_against_its_budget(staff, api, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    powered("gpu-a", limit=700, draw=650)
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000})
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    staff.get("/")
    with CaptureQueriesContext(connection) as seen:
        body = staff.get("/").content.decode()
    assert 'id="racks"' in body
    assert 'data-rack="r1"' in body
    assert "1.4 of 16 kW" in body
    assert "1,300 W measured" in body
    # The racks and their conditions are two queries beside the page's others, and none
    # without racks or budgets.
    PowerBudget.objects.all().delete()
    Node.objects.update(labels={})
    with CaptureQueriesContext(connection) as without:
        assert 'id="racks"' not in staff.get("/").content.decode()
    assert len(seen) == len(without) + 2 <= CLUSTER_QUERIES + 2


def test_a_rack_counts_every_gpu_that_reports_no_power_held_or_not(staff, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("gpu-b", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("gpu-c", now=T0, gpus=(H100, H100), labels={RACK: "r2"})
    powered("gpu-b", limit=700)
    model_added(gpu_model("chat", scaling={"min": 1}))
    reconcile_once(now=T0)
    held = Replica.objects.get().shards.get().node_id
    assert held in ("gpu-a", "gpu-c")  # placement avoids nothing here; either is silent
    body = staff.get("/").content.decode()
    r1 = re.search(r'<tr data-rack="r1">(.*?)</tr>', body).group(1)
    r2 = re.search(r'<tr data-rack="r2">(.*?)</tr>', body).group(1)
    # gpu-a's two say nothing of their power, gpu-b's two do: held or not, two of four.
    assert "2 of its 4 GPUs not reporting power" in r1
    assert "2 of its 2 GPUs not reporting power" in r2
    held_row, other = (r1, r2) if held == "gpu-a" else (r2, r1)
    assert "of them held by replicas" in held_row and "held by replicas" not in other


def test_no_racks_table_without_racks_or_budgets(staff):
    node_add("gpu-a", now=T0, labels={"zone-ish": "r1"})
    staff.get("/")
    with CaptureQueriesContext(connection) as seen:
        body = staff.get("/").content.decode()
    assert 'id="racks"' not in body
    assert len(seen) <= CLUSTER_QUERIES


def test_a_budget_alone_shows_the_racks_table(staff, api):
    node_add("gpu-a", now=T0)
    api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "p1", "watts": 7400})
    body = staff.get("/").content.decode()
    assert 'id="racks"' in body and 'data-pdu="p1"' in body


def test_a_node_page_says_where_the_node_is(staff):
    node_add("gpu-a", now=T0, labels={RACK: "r1", "llmgw.io/zone": "z1", "llmgw.io/pdu": "p-a"})
    body = staff.get("/nodes/gpu-a").content.decode()
    assert 'id="location"' in body
    for want in ("zone z1", "rack r1", "PDU p-a"):
        assert want in body


def test_the_racks_table_needs_the_power_budget_view_permission(client, django_user_model):
    from django.contrib.auth.models import Permission

    node_add("gpu-a", now=T0, labels={RACK: "r1"})
    user = django_user_model.objects.create_user("pat", password="x", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["view_node", "view_model"],
            content_type__app_label__in=["fleet", "catalog"],
        )
    )
    client.force_login(user)
    assert 'id="racks"' not in client.get("/").content.decode()
    user.user_permissions.add(Permission.objects.get(codename="view_powerbudget"))
    client.force_login(django_user_model.objects.get(pk=user.pk))
    assert 'data-rack="r1"' in client.get("/").content.decode()


def test_the_nodes_api_gives_where_a_node_is(api):
    node_add("gpu-a", now=T0, labels={RACK: "r1", "llmgw.io/pdu": "p-a,p-b", "team": "ml"})
    node_add("gpu-b", now=T0)
    assert api.call("GET", "/nodes/gpu-a").json()["location"] == {"rack": "r1", "pdu": "p-a,p-b"}
    assert api.call("GET", "/nodes/gpu-b").json()["location"] == {}


@pytest.mark.parametrize("chunk", [500, 1])
def test_the_snapshot_reads_power_only_for_nodes_under_a_budget(api, monkeypatch, chunk):
    from fleet.domain.power import GpuPower
    from fleet.selectors import facility
    from fleet.selectors.state import node_views

    monkeypatch.setattr(facility, "_CHUNK", chunk)  # 1: many nodes, read all at once
    node_add("gpu-a", now=T0, labels={RACK: "r1"})
    node_add("gpu-b", now=T0, labels={RACK: "r2"})
    node_add("gpu-c", now=T0)
    for node_id in ("gpu-a", "gpu-b", "gpu-c"):
        powered(node_id, limit=700, draw=90)
    assert facility.power_load(node_views()).budgets == ()
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 5000})
    power = facility.power_load(node_views())
    assert [b.name for b in power.budgets] == ["r1"]
    assert power.gpus == {"gpu-a": {0: GpuPower(700, 90), 1: GpuPower(700, 90)}}


def test_a_nodes_own_reported_draw_is_in_its_racks_measured_draw(api, no_settle, settings):
    from dataclasses import replace

    from fleet.metrics.collector import fleet_text

    settings.LLMGW = replace(settings.LLMGW, power=replace(settings.LLMGW.power, node_watts=200))
    node_add("gpu-a", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("gpu-b", now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000})
    gpus = [{"index": i, "power_limit_w": 700, "power_w": 300} for i in range(2)]
    # gpu-a reports its CPU packages' draw (RAPL); gpu-b does not, so it counts its share.
    Node.objects.filter(pk="gpu-a").update(load={"gpus": gpus, "cpu_power_w": 150})
    Node.objects.filter(pk="gpu-b").update(load={"gpus": gpus})
    model_added(gpu_model("chat", scaling={"min": 1}))
    reconcile_once(now=T0)
    Node.objects.update(last_seen=clock.now())  # heard just now: the readings are fresh
    assert Replica.objects.get().shards.get().node_id in ("gpu-a", "gpu-b")

    (rack,) = api.call("GET", "/facility").json()
    # The replica's GPU's 300 W, gpu-a's own 150 W, gpu-b's share of 200 W.
    assert rack["measured_w"] == 650.0
    # What placement reserves is unchanged: the 700 W GPU and the two nodes' shares.
    assert rack["reserved_w"] == 1100.0
    assert 'llmgw_domain_measured_watts{kind="rack",name="r1"} 650.0' in fleet_text()


def test_a_nodes_whole_draw_from_its_bmc_stands_for_it_in_its_racks_measured_draw(
    api, no_settle, settings
):
    from dataclasses import replace

    from fleet.metrics.collector import fleet_text
    from fleet.nodes.heard import node_live_flush
    from fleet.nodes.live import NodeWrite
    from fleet.protocol import Load

    def heard(node_id: str, load: dict) -> None:
        """A heartbeat validated and written behind, as the agents' consumer does, now."""
        now = clock.now()
        write = NodeWrite(
            node_id=node_id,
            session=f"session-{node_id}",
            last_seen=now,
            sample=Load.model_validate(load),
            engines={},
            memory_total_mb=None,
            cpu_count=None,
            used_replicas=frozenset(),
        )
        node_live_flush(writes=[write], now=now)

    settings.LLMGW = replace(settings.LLMGW, power=replace(settings.LLMGW.power, node_watts=200))
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000})
    gpus = [{"index": i, "power_limit_w": 700, "power_w": 300} for i in range(2)]
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    assert Replica.objects.count() == 2  # a GPU held on each node
    # gpu-a's BMC reads its whole draw, its RAPL 150 W beside; gpu-b has no BMC reading.
    heard("gpu-a", {"gpus": gpus, "cpu_power_w": 150, "node_power_w": 1180})
    heard("gpu-b", {"gpus": gpus, "cpu_power_w": 150})
    assert Node.objects.get(pk="gpu-a").load["node_power_w"] == 1180

    (rack,) = api.call("GET", "/facility").json()
    # gpu-a's 1,180 W from its BMC alone; gpu-b's held GPU 300 W and its RAPL 150 W.
    assert rack["measured_w"] == 1630.0
    assert rack["reserved_w"] == 1800.0  # two 700 W GPUs and two shares: no reading moves it
    assert 'llmgw_domain_measured_watts{kind="rack",name="r1"} 1630.0' in fleet_text()


def test_a_node_away_or_not_heard_from_lately_adds_nothing_to_its_racks_measured_draw(
    api, no_settle, settings
):
    from dataclasses import replace

    from fleet.metrics.collector import fleet_text

    settings.LLMGW = replace(settings.LLMGW, power=replace(settings.LLMGW.power, node_watts=200))
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={RACK: "r1"})
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000})
    now = clock.now()
    # gpu-a's BMC read 1,800 W and its RAPL 150 W; gpu-b's RAPL reads 90 W.
    Node.objects.filter(pk="gpu-a").update(
        load={"cpu_power_w": 150, "node_power_w": 1800}, last_seen=now
    )
    Node.objects.filter(pk="gpu-b").update(load={"cpu_power_w": 90}, last_seen=now)

    def measured(at) -> float | None:
        (rack,) = api.call("GET", "/facility").json()
        text = fleet_text(now=at)
        line = 'llmgw_domain_measured_watts{kind="rack",name="r1"}'
        assert (rack["measured_w"] is None) is (line not in text)
        return rack["measured_w"]

    assert measured(now) == 1890.0  # gpu-a's BMC 1,800 W and gpu-b's 90 W
    # gpu-a is powered off: not heard from for 5 minutes, past LLMGW_UNREACHABLE_SECONDS.
    Node.objects.filter(pk="gpu-a").update(last_seen=now - timedelta(minutes=5))
    assert measured(now) == 90.0  # its last 1,800 W is no reading now, nor its share
    # Marked unreachable, even with a recent heartbeat on record: its figures are not counted.
    Node.objects.filter(pk="gpu-a").update(last_seen=now, state=Node.UNREACHABLE)
    assert measured(now) == 90.0
    Node.objects.update(state=Node.UNREACHABLE)
    assert measured(now) is None  # no node heard from: nothing measured, not 0 W


def test_a_racks_metered_draw_is_listed_and_counted_by_placement(
    api, no_settle, settings, tmp_path, monkeypatch
):
    import time
    from dataclasses import replace

    from fleet.facility import prometheus
    from fleet.metrics.collector import fleet_text

    (tmp_path / "sources.yml").write_text(
        "facility:\n"
        "  prometheus: http://monitoring:9090\n"
        "  signals:\n"
        "    power_watts: {query: sum by (rack) (pdu_outlet_power_watts), domain_label: rack}\n"
    )
    settings.LLMGW = replace(settings.LLMGW, facility_sources=tmp_path / "sources.yml")
    draw = {"w": 1900.0}
    monkeypatch.setattr(
        prometheus, "instant", lambda url, query: [({"rack": "r1"}, time.time(), draw["w"])]
    )
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={RACK: "r1"})
        powered(node_id, draw=300)  # the agents see 300 W a GPU; the meter sees the rack
    api.call("PUT", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 2000})
    model_added(gpu_model("chat", scaling={"min": 1}))

    reconcile_once(now=T0)

    # 1,900 W metered of 2,000: a 700 W replica does not fit, though none is counted yet.
    assert Replica.objects.count() == 0
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert any("1,900 of 2,000 W held (as its meter reads), this replica" in r for r in said), said
    (rack,) = api.call("GET", "/facility").json()
    assert (rack["measured_w"], rack["over"]) == (1900.0, False)
    assert 'llmgw_domain_measured_watts{kind="rack",name="r1"} 1900.0' in fleet_text()

    draw["w"] = 800.0  # the meter reads less: placement counts what it reserves
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert Replica.objects.count() == 1


def test_a_row_room_or_site_budget_is_set_listed_and_binds_placement_over_its_racks(api, no_settle):
    for node_id, rack in (("gpu-a", "r1"), ("gpu-b", "r2")):
        node_add(
            node_id,
            now=T0,
            gpus=(H100, H100),
            labels={RACK: rack, "llmgw.io/row": "b", "llmgw.io/site": "sto1"},
        )
        powered(node_id)
    for kind, name, w in (("row", "b", 2000), ("room", "hall-b", 9000), ("site", "sto1", 10**6)):
        answer = api.call("PUT", "/facility/budgets", {"kind": kind, "name": name, "watts": w})
        assert answer.status_code == 200, answer.content
    model_added(gpu_model("chat", scaling={"min": 4}))

    reconcile_once(now=T0)

    # Each rack alone has room for two; the row they share, 2,000 W, for two in all.
    assert Replica.objects.count() == 2
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert any("is in row b: 1,400 of 2,000 W held, this replica needs ~700 W" in r for r in said)
    listed = api.call("GET", "/facility").json()
    # Racks, then the row, room and site budgeted; a room no node is in holds nothing.
    assert [(d["kind"], d["name"], d["nodes"], d["estimated_w"]) for d in listed] == [
        ("rack", "r1", 1, 700.0),  # spread over the racks: one each
        ("rack", "r2", 1, 700.0),
        ("row", "b", 2, 1400.0),
        ("room", "hall-b", 0, 0.0),
        ("site", "sto1", 2, 1400.0),
    ]
    assert api.call("DELETE", "/facility/budgets/row/b").status_code == 200
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert Replica.objects.count() == 4


def test_a_models_ready_replicas_draw_is_what_their_nodes_last_said(api, no_settle):
    from llmgw.core import clock

    now = clock.now()
    node_add("gpu-a", now=now, gpus=(H100, H100), labels={RACK: "r1"})
    node_add("cpu-a", now=now, gpus=(), labels={"pool": "cpu"})
    model_added(gpu_model("chat", scaling={"min": 1}))
    model_added(cpu_model("tiny", selector={"pool": "cpu"}, scaling={"min": 2}))
    reconcile_once(now=now)
    Replica.objects.update(state="ready")
    gpus = [
        {"index": 0, "power_limit_w": 560, "power_default_w": 700, "power_w": 412.5},
        {"index": 1, "temp_c": 40},
    ]
    Node.objects.filter(pk="gpu-a").update(load={"gpus": gpus}, last_seen=now)
    Node.objects.filter(pk="cpu-a").update(load={"cpu_power_w": 180}, last_seen=now)
    index = Replica.objects.get(model="chat").shards.get().gpu_indices[0]
    assert index == 0  # the GPU that says all

    chat = api.call("GET", "/models/chat/power")
    assert chat.status_code == 200, chat.content
    (replica,) = chat.json()["replicas"]
    assert replica["profile"] == "gpu"
    said = {"power_w": 412.5, "power_limit_w": 560.0, "power_default_w": 700.0}
    unsaid = {"power_w": None, "power_limit_w": None, "power_default_w": None}
    assert replica["shards"] == [
        {
            "node": "gpu-a",
            "gpus": [{"index": 0} | said],
            "cpu_power_w": None,  # gpu-a reports no RAPL: absent, not 0
        }
    ]
    # Not heard from within LLMGW_UNREACHABLE_SECONDS: its limits are stale as its draw is.
    Node.objects.filter(pk="gpu-a").update(last_seen=now - timedelta(minutes=5))
    (replica,) = api.call("GET", "/models/chat/power").json()["replicas"]
    assert replica["shards"][0]["gpus"] == [{"index": 0} | unsaid]
    tiny = api.call("GET", "/models/tiny/power").json()["replicas"]
    assert [r["shards"] for r in tiny] == [
        [{"node": "cpu-a", "gpus": [], "cpu_power_w": 180.0}]
    ] * 2

    # A node not heard from within LLMGW_UNREACHABLE_SECONDS: its last figures are stale.
    Node.objects.filter(pk="cpu-a").update(last_seen=now - timedelta(minutes=5))
    tiny = api.call("GET", "/models/tiny/power").json()["replicas"]
    assert {s["cpu_power_w"] for r in tiny for s in r["shards"]} == {None}

    # Only ready replicas; a model by no such name is 404.
    Replica.objects.filter(model="tiny").update(state="starting")
    assert api.call("GET", "/models/tiny/power").json() == {"model": "tiny", "replicas": []}
    missing = api.call("GET", "/models/nope/power")
    assert (missing.status_code, detail(missing)) == (404, "There is no model 'nope'.")
