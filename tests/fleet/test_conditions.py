"""Facility conditions and holds through the shell (docs/facility.md, "Conditions"): holds
over REST, audited; a thermal event replayed by the simulated source through real passes,
enforced and observed; the agents' own sensors."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from fleet.models import DomainCondition, DomainHold, ModelState, Node, Replica
from fleet.reconciler.run import reconcile_once
from llmgw.core.config import Shedding
from llmgw.core.permissions import OPERATORS, VIEWERS
from tenancy.models import AuditEvent
from tests.helpers import detail

from .builders import H100, T0, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db

RACK = "llmgw.io/rack"

# Rack r1 warms (above 27 °C from 1 min), goes hot (above 32 °C from 4 min), cools at 10 min.
EVENT = """\
start: {start}
readings:
  - at: 0s
    rack/r1: {{inlet_c: 24}}
    rack/r2: {{inlet_c: 22}}
  - at: 1m
    rack/r1: {{inlet_c: 29}}
  - at: 4m
    rack/r1: {{inlet_c: 34}}
  - at: 10m
    rack/r1: {{inlet_c: 22}}
"""


def facility(settings, tmp_path, *, enforce: bool, event: str = EVENT):
    (tmp_path / "event.yml").write_text(event.format(start=T0.isoformat()))
    (tmp_path / "sources.yml").write_text("facility:\n  simulated: {file: event.yml}\n")
    settings.LLMGW = replace(
        settings.LLMGW, facility_sources=tmp_path / "sources.yml", facility_enforce=enforce
    )


def two_racks():
    node_add("gpu-a", now=T0, gpus=(H100,) * 4, labels={RACK: "r1"})
    node_add("gpu-b", now=T0, gpus=(H100,) * 4, labels={RACK: "r2"})


def pass_at(seconds: float) -> None:
    now = T0 + timedelta(seconds=seconds)
    Node.objects.update(last_seen=now)  # the agents keep reporting
    reconcile_once(now=now)


def condition(kind: str, name: str) -> str:
    return DomainCondition.objects.get(kind=kind, name=name).condition


def on_rack(rack: str) -> int:
    node = {"r1": "gpu-a", "r2": "gpu-b"}[rack]
    return Replica.objects.filter(shards__node_id=node).count()


def scale(model: str, n: int) -> None:
    from catalog.selectors import catalog_load
    from catalog.services import model_replace

    if model not in catalog_load():
        model_added(gpu_model(model, scaling={"min": n}))
        return
    model_replace(name=model, data=gpu_model(model, scaling={"min": n}), actor="test")


def test_a_thermal_event_replayed_warms_then_heats_a_rack_and_placements_move_away(
    settings, tmp_path, no_settle
):
    facility(settings, tmp_path, enforce=True)
    two_racks()
    for t in range(0, 60, 20):
        pass_at(t)
    assert condition("rack", "r1") == "ok"

    for t in range(60, 200, 20):  # above warm from 60 s: warm at 180 s
        pass_at(t)
    assert condition("rack", "r1") == "warm"
    scale("chat", 1)
    pass_at(200)
    assert (on_rack("r1"), on_rack("r2")) == (0, 1)  # warm: the other rack first

    for t in range(220, 400, 20):  # above hot from 240 s: hot at 360 s
        pass_at(t)
    assert condition("rack", "r1") == "hot"
    scale("chat", 5)  # r2 holds 4: the fifth has nowhere to go
    pass_at(400)
    assert (on_rack("r1"), on_rack("r2")) == (0, 4)
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert any(r.startswith("node gpu-a: rack r1 is hot (inlet 34 °C for") for r in said), said

    for t in range(420, 920, 20):  # below warm from 600 s: ok at 900 s
        pass_at(t)
    assert condition("rack", "r1") == "ok"
    assert on_rack("r1") == 1  # the rack came back
    said = [e.message for e in _events()]
    assert "rack r1 went from ok to warm (inlet 29 °C)" in said
    assert "rack r1 went from warm to hot (inlet 34 °C)" in said
    assert "rack r1 went from hot to ok" in said


def _events():
    from fleet.models import Event

    return Event.objects.order_by("at")


def test_observe_only_places_in_a_hot_rack_and_says_it_would_have_refused(
    settings, tmp_path, no_settle
):
    facility(settings, tmp_path, enforce=False)
    node_add("gpu-a", now=T0, gpus=(H100,) * 4, labels={RACK: "r1"})
    for t in range(0, 400, 20):
        pass_at(t)
    assert condition("rack", "r1") == "hot"

    scale("chat", 1)
    pass_at(400)

    (replica,) = Replica.objects.all()
    assert "would have refused node gpu-a: rack r1 is hot (inlet 34 °C for" in replica.reason


def test_a_rack_whose_readings_stop_is_unknown_and_placed_as_ok(settings, tmp_path, no_settle):
    silent = EVENT.replace(
        "  - at: 10m\n    rack/r1: {{inlet_c: 22}}\n", "  - at: 7m\n    rack/r1: null\n"
    )
    facility(settings, tmp_path, enforce=True, event=silent)
    node_add("gpu-a", now=T0, gpus=(H100,) * 4, labels={RACK: "r1"})
    for t in range(0, 440, 20):
        pass_at(t)
    assert condition("rack", "r1") == "unknown"

    scale("chat", 1)
    pass_at(440)

    assert on_rack("r1") == 1


def test_the_agents_throttled_gpus_warm_their_rack(settings, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100,) * 8, labels={RACK: "r1"})
    gpus = [
        {"index": i, "temp_c": 70, "throttle": ["sw_thermal"] if i == 0 else []} for i in range(8)
    ]
    Node.objects.update(load={"gpus": gpus, "inlet_temp_c": 24})
    for t in range(0, 140, 20):
        pass_at(t)

    row = DomainCondition.objects.get(kind="rack", name="r1")
    assert (row.condition, row.why) == ("warm", "1 of 8 GPUs thermally throttled")


# Holds.


def test_a_hold_is_set_listed_and_released_each_audited(api, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100,), labels={RACK: "r1"})
    held = api.call("PUT", "/facility/holds", {"kind": "rack", "name": "r1", "reason": "PDU swap"})
    assert held.status_code == 200, held.content
    assert (held.json()["held_by"], held.json()["reason"]) == ("ops", "PDU swap")

    model_added(gpu_model("chat", scaling={"min": 1}))
    reconcile_once(now=T0)
    assert Replica.objects.count() == 0
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert said == ["node gpu-a: rack r1 is held by ops: PDU swap"]
    (listed,) = api.call("GET", "/facility/conditions").json()
    assert (listed["held"], listed["condition"], listed["enforced"]) == (True, "unknown", False)

    gone = api.call("DELETE", "/facility/holds/rack/r1")
    assert gone.status_code == 200
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert Replica.objects.count() == 1
    actions = list(AuditEvent.objects.order_by("at").values_list("action", "target"))
    assert ("facility_hold.set", "rack:r1") in actions
    assert ("facility_hold.release", "rack:r1") in actions
    again = api.call("DELETE", "/facility/holds/rack/r1")
    assert (again.status_code, detail(again)) == (404, "rack r1 is not held.")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"kind": "aisle", "name": "a1"}, "a domain is a rack, pdu, phase, row, room or zone, not 'aisle'"),
        ({"kind": "rack", "name": "r 1"}, "is not a rack's name"),
        ({"kind": "rack", "name": "r1", "reason": "x" * 301}, "at most 300 characters"),
        ({"kind": "rack", "name": "r1", "until": "never"}, "until"),
        ({"kind": "rack"}, "name"),
    ],
)  # fmt: skip
def test_a_bad_hold_is_refused_and_changes_nothing(api, body, said):
    answer = api.call("PUT", "/facility/holds", body)

    assert answer.status_code == 400
    assert said in str(answer.json())
    assert not DomainHold.objects.exists()


def test_a_viewer_may_read_conditions_but_not_hold(client, django_user_model):
    from django.contrib.auth.models import Group

    for name, group in (("vera", VIEWERS), ("otto", OPERATORS)):
        user = django_user_model.objects.create_user(name, password="x", is_staff=True)
        user.groups.add(Group.objects.get(name=group))
    body = {"kind": "pdu", "name": "p1"}
    client.login(username="vera", password="x")
    assert client.get("/api/v1/facility/conditions").status_code == 200
    refused = client.put("/api/v1/facility/holds", body, content_type="application/json")
    assert refused.status_code == 403
    client.login(username="otto", password="x")
    took = client.put("/api/v1/facility/holds", body, content_type="application/json")
    assert took.status_code == 200
    assert list(DomainHold.objects.values_list("kind", "name", "held_by")) == [
        ("pdu", "p1", "otto")
    ]


def test_metrics_say_each_domains_condition_its_readings_age_and_its_hold(
    settings, tmp_path, no_settle
):
    from fleet.metrics.collector import fleet_text
    from fleet.services import domain_hold

    facility(settings, tmp_path, enforce=True)
    for t in range(0, 400, 20):
        pass_at(t)
    domain_hold(kind="pdu", name="p1", reason="", actor="ops", now=T0)

    text = fleet_text()

    assert 'llmgw_domain_condition{condition="hot",kind="rack",name="r1"} 1.0' in text
    assert 'llmgw_domain_condition{condition="ok",kind="rack",name="r1"} 0.0' in text
    assert 'llmgw_domain_condition{condition="ok",kind="rack",name="r2"} 1.0' in text
    assert 'llmgw_domain_condition{condition="unknown",kind="pdu",name="p1"} 1.0' in text
    assert 'llmgw_domain_held{kind="pdu",name="p1"} 1.0' in text
    assert "llmgw_facility_conditions_enforced 1.0" in text
    assert 'llmgw_domain_reading_age_seconds{kind="rack",name="r1"}' in text
    assert 'llmgw_domain_reading_age_seconds{kind="pdu"' not in text  # never read: no age


def test_the_racks_table_shows_each_racks_condition_and_hold(
    settings, tmp_path, no_settle, client, django_user_model
):
    import re

    from fleet.services import domain_hold

    user = django_user_model.objects.create_user("root", password="x", is_staff=True)
    user.is_superuser = True
    user.save()
    client.login(username="root", password="x")
    facility(settings, tmp_path, enforce=True)
    two_racks()
    for t in range(0, 400, 20):
        pass_at(t)
    domain_hold(kind="rack", name="r2", reason="PDU swap", actor="fac-team", now=T0)

    body = client.get("/").content.decode()

    r1 = re.search(r'<tr data-rack="r1">(.*?)</tr>', body).group(1)
    r2 = re.search(r'<tr data-rack="r2">(.*?)</tr>', body).group(1)
    assert 'data-condition="hot"' in r1 and "rack r1 is hot (inlet 34 °C for" in r1
    assert 'data-condition="ok"' in r2 and "held by fac-team: PDU swap" in r2


def test_a_source_that_breaks_does_not_stop_the_pass(
    settings, tmp_path, no_settle, monkeypatch, caplog
):
    from fleet.facility import observe

    def broken(config, now):
        raise RuntimeError("the DCIM exporter sent nonsense")

    monkeypatch.setattr(observe, "samples_read", broken)
    node_add("gpu-a", now=T0, gpus=(H100,), labels={RACK: "r1"})
    model_added(gpu_model("chat", scaling={"min": 1}))

    reconcile_once(now=T0)

    assert Replica.objects.count() == 1
    assert (
        "facility conditions not observed this pass: the DCIM exporter sent nonsense" in caplog.text
    )


def agents_act(now) -> None:
    """What the agents would do: a starting replica comes up, a stopping one goes."""
    Replica.objects.filter(state__in=("pending", "starting")).update(
        state="ready", ready_at=now, state_since=now
    )
    Replica.objects.filter(state="stopping").delete()


# Rack r1 goes hot (above 32 °C from 4 min: hot at 6 min) and stays so until 15 min.
LONG_EVENT = EVENT.replace("at: 10m", "at: 15m")


def test_a_rack_hot_past_its_shed_delay_sheds_one_replica_at_a_time_and_comes_back(
    settings, tmp_path, no_settle
):
    facility(settings, tmp_path, enforce=True, event=LONG_EVENT)
    settings.LLMGW = replace(settings.LLMGW, facility_shed=Shedding(True, delay=60, interval=120))
    node_add("gpu-a", now=T0, gpus=(H100,) * 4, labels={RACK: "r1"})
    model_added(gpu_model("guard", scaling={"min": 1}, **{"class": "critical"}))
    model_added(gpu_model("batch", scaling={"min": 1}, **{"class": "opportunistic"}))
    model_added(gpu_model("chat", scaling={"min": 2}))
    pass_at(0)
    agents_act(T0)
    assert on_rack("r1") == 4
    node_add("gpu-b", now=T0, gpus=(H100,) * 4, labels={RACK: "r2"})

    sheds: list[tuple[int, str]] = []
    for t in range(20, 1200, 20):  # hot at 360 s, cooler from 900 s, ok at 1200 s
        now = T0 + timedelta(seconds=t)
        Node.objects.update(last_seen=now)
        done = reconcile_once(now=now)
        sheds += [(t, e) for e in done["events"] if e.startswith("shed ")]
        if t == 540:  # the move is in the model's explanation (`ctl model explain`)
            said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
            assert said == [sheds[-1][1]], said
        agents_act(now)
    assert condition("rack", "r1") == "hot"

    # Hot from 360 s, shed from 420 s: the opportunistic model first, then the standard one's
    # two replicas, one an interval apart; the critical model's minimum never.
    assert [t for t, _ in sheds] == [420, 540, 660], sheds
    assert [e.split()[3] for _, e in sheds] == ["batch", "chat", "chat"]
    assert all(" off rack r1 to gpu-b: hot for " in e and "(inlet" in e for _, e in sheds)
    assert sheds[0][1].endswith("hot for 60 s (inlet 34 °C)")
    # Then only the critical minimum is left: said once per interval, nothing moves.
    blocked = [e.message for e in _events() if "nothing that may be shed" in e.message]
    assert blocked == ["rack r1 is hot and has nothing that may be shed"]
    assert _events().get(message=blocked[0]).count == 1  # at 780 s; at 900 s it cools
    models_on_a = set(
        Replica.objects.filter(shards__node_id="gpu-a").values_list("model", flat=True)
    )
    assert models_on_a == {"guard"}
    assert Replica.objects.filter(shards__node_id="gpu-b").count() == 3

    pass_at(1200)
    assert condition("rack", "r1") == "ok"
    scale("late", 2)  # the rack came back: it takes work again
    pass_at(1220)
    assert Replica.objects.filter(model="late", shards__node_id="gpu-a").count() == 1


def test_observe_only_says_it_would_have_shed_and_moves_nothing(settings, tmp_path, no_settle):
    facility(settings, tmp_path, enforce=False)
    settings.LLMGW = replace(
        settings.LLMGW, facility_shed=Shedding(False, frozenset({("rack", "r1")}), 60, 120)
    )
    node_add("gpu-a", now=T0, gpus=(H100,) * 4, labels={RACK: "r1"})
    model_added(gpu_model("chat", scaling={"min": 2}))
    pass_at(0)
    agents_act(T0)
    node_add("gpu-b", now=T0, gpus=(H100,) * 4, labels={RACK: "r2"})

    said = []
    for t in range(20, 600, 20):
        now = T0 + timedelta(seconds=t)
        Node.objects.update(last_seen=now)
        said += [(t, e) for e in reconcile_once(now=now)["events"] if "shed " in e]

    assert [t for t, _ in said] == [420, 540], said
    assert said[0][1].startswith("would have shed chat-")
    assert said[0][1].endswith("(LLMGW_FACILITY_ENFORCE is off)")
    assert Replica.objects.filter(shards__node_id="gpu-a").count() == 2
    assert not Replica.objects.filter(retiring=True).exists()


def test_a_failing_source_is_said_by_the_api_with_why_and_since_when(
    settings, tmp_path, api, no_settle
):
    (tmp_path / "sources.yml").write_text(
        "facility:\n"
        "  prometheus: http://127.0.0.1:9\n"
        "  signals:\n"
        "    inlet_temp_c: {query: max by (rack) (inlet), domain_label: rack}\n"
    )
    settings.LLMGW = replace(settings.LLMGW, facility_sources=tmp_path / "sources.yml")
    assert api.call("GET", "/facility/sources").json() == {"checked_at": None, "failed": []}

    reconcile_once(now=T0)

    said = api.call("GET", "/facility/sources").json()
    (failed,) = said["failed"]
    assert failed["source"] == "prometheus (signal inlet_temp_c)"
    assert failed["why"].startswith("Prometheus at http://127.0.0.1:9 could not be reached")
    assert failed["since"].startswith(T0.strftime("%Y-%m-%dT%H:%M:%S"))

    (tmp_path / "sources.yml").write_text("facility: {}\n")  # Prometheus no longer asked
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert api.call("GET", "/facility/sources").json()["failed"] == []


def test_a_facility_step_that_breaks_is_said_by_the_api(settings, monkeypatch, api, no_settle):
    from fleet.facility import observe

    def broken(config, now):
        raise RuntimeError("the DCIM exporter sent nonsense")

    monkeypatch.setattr(observe, "samples_read", broken)
    reconcile_once(now=T0)

    (failed,) = api.call("GET", "/facility/sources").json()["failed"]
    assert (failed["source"], failed["why"]) == (
        "pass",
        "the facility step failed: the DCIM exporter sent nonsense",
    )


@pytest.mark.parametrize("enforce", [True, False])
def test_a_warm_racks_gpus_are_power_capped_and_let_go_once_it_cools(
    settings, tmp_path, no_settle, monkeypatch, enforce
):
    from fleet.reconciler import run

    sent = []
    monkeypatch.setattr(run, "dispatch", lambda commands: sent.extend(commands))
    facility(settings, tmp_path, enforce=enforce)
    settings.LLMGW = replace(settings.LLMGW, facility_power_cap=0.8)
    two_racks()

    for t in range(0, 920, 20):  # warm at 180 s, hot at 360 s, ok at 900 s
        pass_at(t)

    said = [
        (int((e.at - T0).total_seconds()), e.message)
        for e in _events()
        if "power limit" in e.message
    ]

    cap = (
        "held node gpu-a's GPUs to 80% of their default power limit: it is in a warm or hot domain"
    )
    back = "let node gpu-a's GPUs back to their default power limit: none of its domains is warm or hot"
    if enforce:
        assert said == [(180, cap), (900, back)]
        assert [(c.node_id, c.payload) for c in sent if c.payload["type"] == "power_cap"] == [
            ("gpu-a", {"type": "power_cap", "share": 0.8}),
            ("gpu-a", {"type": "power_cap", "share": None}),
        ]
    else:
        off = " (LLMGW_FACILITY_ENFORCE is off)"
        assert said == [(180, f"would have {cap}{off}"), (900, f"would have {back}{off}")]
        assert not [c for c in sent if c.payload["type"] == "power_cap"]


def test_a_cap_is_kept_on_a_node_that_joins_the_warm_rack_or_whose_driver_reloads(
    settings, tmp_path, no_settle, monkeypatch
):
    """Each heartbeat's limits are compared with the cap wanted: a node reporting its
    default in a warm rack is sent the cap again, once per interval until it holds."""
    from fleet.domain.capping import RESEND_S
    from fleet.reconciler import run

    sent: list = []
    monkeypatch.setattr(
        run,
        "dispatch",
        lambda commands: sent.extend(c for c in commands if c.payload["type"] == "power_cap"),
    )
    facility(settings, tmp_path, enforce=True)
    settings.LLMGW = replace(settings.LLMGW, facility_power_cap=0.8)
    two_racks()

    def report(node: str, limit: float | None) -> None:
        gpu = {"index": 0, "power_default_w": 700.0, "power_min_w": 200.0}
        if limit is not None:
            gpu["power_limit_w"] = limit
        Node.objects.filter(id=node).update(load={"gpus": [gpu]})

    def sends(start: int, end: int) -> list:
        sent.clear()
        for t in range(start, end, 20):
            pass_at(t)
        return [(c.node_id, c.payload["share"]) for c in sent]

    report("gpu-a", 700)
    report("gpu-b", 700)
    # r1 warms at 180 s: gpu-a is sent its cap on the change, and not again while its
    # heartbeat has not shown it yet (within the interval).
    assert sends(0, 180 + int(RESEND_S) - 20) == [("gpu-a", 0.8)]
    report("gpu-a", 560)
    assert sends(300, 340) == []
    # A node joins the warm rack: its GPUs report their default, and it is sent the cap.
    node_add("gpu-c", now=T0 + timedelta(seconds=340), gpus=(H100,) * 4, labels={RACK: "r1"})
    report("gpu-c", 700)
    assert sends(340, 360) == [("gpu-c", 0.8)]
    report("gpu-c", 560)
    # gpu-a's driver reloads: back at its default, and sent its cap again.
    report("gpu-a", 700)
    assert sends(360, 400) == [("gpu-a", 0.8)]
    report("gpu-a", None)  # a heartbeat that says no limit: unknown, nothing is sent
    assert sends(400, 600) == []
    said = [e.message for e in _events() if "again" in e.message]
    assert said[0] == (
        "held node gpu-c's GPUs to 80% of their default power limit again: GPU 0 reports a "
        "limit of 700 W, over the 560 W wanted (it is in a warm or hot domain)"
    )
    assert len(said) == 2


def test_a_limit_llmgw_did_not_set_is_left_alone_and_its_own_let_go_kept_until_seen(
    settings, tmp_path, no_settle, monkeypatch
):
    """An operator's `nvidia-smi -pl 560` on a 700 W card in the cool rack is the cap's
    figure to the watt, but llmgw never held that node: it is never let go. The node llmgw
    did hold is let go again until its heartbeat shows it; after that, a limit set there is
    someone else's too."""
    from fleet.domain.capping import RESEND_S
    from fleet.reconciler import run

    sent: list = []
    monkeypatch.setattr(
        run,
        "dispatch",
        lambda commands: sent.extend(c for c in commands if c.payload["type"] == "power_cap"),
    )
    facility(settings, tmp_path, enforce=True)
    settings.LLMGW = replace(settings.LLMGW, facility_power_cap=0.8)
    two_racks()

    def report(node: str, limit: float) -> None:
        gpu = {"index": 0, "power_limit_w": limit, "power_default_w": 700.0, "power_min_w": 200.0}
        Node.objects.filter(id=node).update(load={"gpus": [gpu]})

    def sends(start: int, end: int) -> list:
        sent.clear()
        for t in range(start, end, 20):
            pass_at(t)
        return [(c.node_id, c.payload["share"]) for c in sent]

    report("gpu-a", 700)
    report("gpu-b", 560)  # r2 stays cool: the operator's own limit
    assert sends(0, 200) == [("gpu-a", 0.8)]  # r1 warms at 180 s
    report("gpu-a", 560)
    # r1 cools at 900 s: let go on the change, and again while it still reports the cap.
    resent = 900 + int(RESEND_S)
    assert sends(200, resent) == [("gpu-a", None)]
    assert sends(resent, resent + 20) == [("gpu-a", None)]
    said = [e.message for e in _events() if "again" in e.message]
    assert said == [
        "let node gpu-a's GPUs back to their default power limit again: GPU 0 is still held "
        "to 560 W of its 700 W default (none of its domains is warm or hot)"
    ]
    report("gpu-a", 700)  # seen let go: llmgw's record of holding it goes
    assert sends(resent + 20, resent + 40) == []
    report("gpu-a", 560)  # a limit set there since is someone else's
    assert sends(resent + 40, resent + 400) == []
