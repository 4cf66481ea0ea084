"""PDU phases' budgets over REST, through the reconciler's shell, on the cluster page and in
/metrics (docs/facility.md, "Phases of a PDU")."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.models import DomainCondition, Event, ModelState, PowerBudget, Replica
from fleet.reconciler.run import reconcile_once
from tests.helpers import detail

from .builders import H100, T0, gpu_model, model_added, node_add
from .test_facility import powered

pytestmark = pytest.mark.django_db

PDU, PHASE = "llmgw.io/pdu", "llmgw.io/pdu-phase"


def budgets() -> list[tuple]:
    return list(PowerBudget.objects.values_list("kind", "name", "watts"))


def test_a_phase_budget_is_set_listed_after_its_pdu_and_cleared(api):
    node_add("gpu-a", now=T0, gpus=(H100,), labels={PDU: "r12-a", PHASE: "L2"})
    node_add("gpu-b", now=T0, gpus=(H100,), labels={PDU: "r12-a", PHASE: "L1"})
    body = {"kind": "phase", "name": "r12-a/L2", "watts": 7400, "margin": 0.1}
    answer = api.call("PUT", "/facility/budgets", body)
    assert answer.status_code == 200, answer.content
    assert answer.json()["name"] == "r12-a/L2" and answer.json()["watts"] == 7400.0

    listed = api.call("GET", "/facility").json()
    assert [(d["kind"], d["name"], d["nodes"], d["budget_w"], d["limit_w"]) for d in listed] == [
        ("pdu", "r12-a", 2, None, None),
        ("phase", "r12-a/L1", 1, None, None),
        ("phase", "r12-a/L2", 1, 7400.0, 6660.0),
    ]

    gone = api.call("DELETE", "/facility/budgets/phase/r12-a/L2")
    assert gone.status_code == 200, gone.content
    assert gone.json()["name"] == "r12-a/L2"
    assert budgets() == []
    # The slash escaped, as `llmgw ctl facility clear` sends it, names the same phase.
    api.call("PUT", "/facility/budgets", body)
    assert api.call("DELETE", "/facility/budgets/phase/r12-a%2FL2").status_code == 200
    again = api.call("DELETE", "/facility/budgets/phase/r12-a/L2")
    assert again.status_code == 404
    assert detail(again) == "phase r12-a/L2 has no power budget."


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("r12-a", "a phase is named by its PDU and its phase, as r12-a/L2, not 'r12-a'."),
        ("r12-a/L 2", "'L 2' is not a phase: L1, L2 or L3, or a short token"),
        ("r12-a/phase-one", "'phase-one' is not a phase"),
        ("r 12/L2", "'r 12' is not a PDU's name"),
        ("/L2", "a PDU needs a name."),
    ],
)
def test_a_phase_budget_by_a_name_no_label_could_carry_is_refused_and_changes_nothing(
    api, name, said
):
    api.call("PUT", "/facility/budgets", {"kind": "phase", "name": "r12-a/L1", "watts": 7400})
    answer = api.call("PUT", "/facility/budgets", {"kind": "phase", "name": name, "watts": 100})
    assert answer.status_code == 400, answer.content
    assert said in detail(answer)
    assert budgets() == [("phase", "r12-a/L1", 7400.0)]
    # A budget for a pdu takes no slash: a phase is its own kind.
    pdu = api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "r12-a/L1", "watts": 1})
    assert pdu.status_code == 400 and "is not a pdu's name" in detail(pdu)


def test_the_reconciler_keeps_a_phase_under_its_cap_while_its_pdu_has_room(api, no_settle):
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={PDU: "r12-a", PHASE: "L2"})
        powered(node_id)
    api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "r12-a", "watts": 22000})
    api.call("PUT", "/facility/budgets", {"kind": "phase", "name": "r12-a/L2", "watts": 1500})
    model_added(gpu_model("chat", scaling={"min": 3}))

    reconcile_once(now=T0)

    assert Replica.objects.count() == 2  # 1,400 W of L2's 1,500; the PDU's 22 kW has room
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert any(
        "is in pdu r12-a phase L2: 1,400 of 1,500 W held, this replica needs ~700 W" in r
        for r in said
    ), said
    phase = next(d for d in api.call("GET", "/facility").json() if d["kind"] == "phase")
    assert (phase["name"], phase["nodes"], phase["gpus"], phase["said"]) == (
        "r12-a/L2",
        2,
        4,
        "1.4 of 1.5 kW",
    )
    from fleet.metrics.collector import fleet_text

    text = fleet_text()
    assert 'llmgw_domain_power_budget_watts{kind="phase",name="r12-a/L2"} 1500.0' in text
    assert 'llmgw_domain_reserved_watts{kind="phase",name="r12-a/L2"} 1400.0' in text


def test_the_racks_table_names_a_phase_by_its_pdu(client, django_user_model, api):
    user = django_user_model.objects.create_user("root", password="x", is_staff=True)
    user.is_superuser = True
    user.save()
    client.force_login(user)
    node_add("gpu-a", now=T0, gpus=(H100,), labels={PDU: "r12-a", PHASE: "L3"})
    api.call("PUT", "/facility/budgets", {"kind": "phase", "name": "r12-a/L3", "watts": 7400})
    body = client.get("/").content.decode()
    assert 'data-phase="r12-a/L3"' in body
    assert "PDU r12-a phase L3" in body
    assert "0 of 7.4 kW" in body
    phase_row = body.split('data-phase="r12-a/L3"')[1].split("</tr>")[0]
    assert 'data-condition="unknown"' in phase_row  # its PDU never read

    # A phase has no condition of its own: its row shows its PDU's.
    api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "r12-a", "watts": 20000})
    DomainCondition.objects.create(kind="pdu", name="r12-a", condition="warm", why="inlet 29 °C",
                                   since=T0, read_at=T0)  # fmt: skip
    body = client.get("/").content.decode()
    phase_row = body.split('data-phase="r12-a/L3"')[1].split("</tr>")[0]
    assert 'data-condition="warm"' in phase_row
    assert "pdu r12-a is warm (inlet 29 °C" in phase_row


def test_phases_an_agent_sends_that_do_not_match_its_pdus_are_ignored_with_a_sentence(api):
    node_add("gpu-a", now=T0, gpus=(H100,), labels={PDU: "r12-a,r12-b", PHASE: "L2"})
    (event,) = Event.objects.filter(kind="phases_ignored")
    assert event.node == "gpu-a"
    assert event.message == (
        "node gpu-a's PDU phases are ignored: llmgw.io/pdu-phase names 1 phase for 2 PDUs "
        "(r12-a, r12-b): it gives one phase per PDU of llmgw.io/pdu, in the same order "
        "(L2,L2 for a node on L2 of two)."
    )
    # The node is under its PDUs alone: no phase is listed for it.
    listed = api.call("GET", "/facility").json()
    assert [(d["kind"], d["name"]) for d in listed] == [("pdu", "r12-a"), ("pdu", "r12-b")]
    # Registering again as it was says nothing more; phases that match say nothing at all.
    node_add("gpu-b", now=T0, gpus=(H100,), labels={PDU: "r12-a,r12-b", PHASE: "L2,L2"})
    assert Event.objects.filter(kind="phases_ignored").count() == 1


def test_a_phases_metered_draw_is_listed_and_counted_by_placement(
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
        "    power_watts:\n"
        "      query: sum by (pdu, phase) (pdu_phase_power_watts)\n"
        "      domain_kind: phase\n"
        "      domain_label: pdu\n"
        "      phase_label: phase\n"
    )
    settings.LLMGW = replace(settings.LLMGW, facility_sources=tmp_path / "sources.yml")
    draw = {"w": 1900.0}
    monkeypatch.setattr(
        prometheus,
        "instant",
        lambda url, query: [
            ({"pdu": "r12-a", "phase": "L2"}, time.time(), draw["w"]),
            ({"pdu": "r12-a", "phase": "L1"}, time.time(), 400.0),
        ],
    )
    for node_id in ("gpu-a", "gpu-b"):
        node_add(node_id, now=T0, gpus=(H100, H100), labels={PDU: "r12-a", PHASE: "L2"})
        powered(node_id, draw=300)
    api.call("PUT", "/facility/budgets", {"kind": "pdu", "name": "r12-a", "watts": 22000})
    api.call("PUT", "/facility/budgets", {"kind": "phase", "name": "r12-a/L2", "watts": 2000})
    model_added(gpu_model("chat", scaling={"min": 1}))

    reconcile_once(now=T0)

    # 1,900 W metered on L2 of its 2,000: a 700 W replica does not fit, though the PDU has room.
    assert Replica.objects.count() == 0
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert any(
        "is in pdu r12-a phase L2: 1,900 of 2,000 W held (as its meter reads), this replica" in r
        for r in said
    ), said
    listed = {(d["kind"], d["name"]): d for d in api.call("GET", "/facility").json()}
    assert listed[("phase", "r12-a/L2")]["measured_w"] == 1900.0
    assert listed[("pdu", "r12-a")]["measured_w"] is None  # a phase's meter is not its PDU's
    assert 'llmgw_domain_measured_watts{kind="phase",name="r12-a/L2"} 1900.0' in fleet_text()

    draw["w"] = 800.0  # the meter reads less: placement counts what it reserves
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert Replica.objects.count() == 1


def test_a_held_phase_takes_no_new_replicas_on_its_nodes_audited_listed_and_released(
    api, no_settle, client, django_user_model
):
    from fleet.models import DomainHold
    from tenancy.models import AuditEvent

    node_add("gpu-a", now=T0, gpus=(H100,), labels={PDU: "r12-a", PHASE: "L2"})
    body = {"kind": "phase", "name": "r12-a/L2", "reason": "breaker work"}
    held = api.call("PUT", "/facility/holds", body)
    assert held.status_code == 200, held.content
    assert (held.json()["name"], held.json()["held_by"]) == ("r12-a/L2", "ops")

    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    assert Replica.objects.count() == 0
    said = [r for e in ModelState.objects.get(pk="chat").explanation for r in e["reasons"]]
    assert said == ["node gpu-a: pdu r12-a phase L2 is held by ops: breaker work"]
    # A node on another phase of the same PDU is not held.
    node_add("gpu-b", now=T0, gpus=(H100,), labels={PDU: "r12-a", PHASE: "L1"})
    reconcile_once(now=T0 + timedelta(seconds=30))
    assert list(Replica.objects.values_list("shards__node", flat=True)) == ["gpu-b"]

    (listed,) = api.call("GET", "/facility/conditions").json()
    assert (listed["kind"], listed["name"], listed["held"], listed["hold_reason"]) == (
        "phase",
        "r12-a/L2",
        True,
        "breaker work",
    )
    assert listed["said"] == "pdu r12-a phase L2 has no condition of its own: it takes pdu r12-a's"
    user = django_user_model.objects.create_user("root", password="x", is_staff=True)
    user.is_superuser = True
    user.save()
    client.force_login(user)
    page = client.get("/").content.decode()
    row = page.split('data-phase="r12-a/L2"')[1].split("</tr>")[0]
    assert "held by ops: breaker work" in row

    # Its name holds a slash: released as written, or escaped as ctl sends it.
    gone = api.call("DELETE", "/facility/holds/phase/r12-a/L2")
    assert gone.status_code == 200, gone.content
    api.call("PUT", "/facility/holds", body)
    assert api.call("DELETE", "/facility/holds/phase/r12-a%2FL2").status_code == 200
    again = api.call("DELETE", "/facility/holds/phase/r12-a/L2")
    assert (again.status_code, detail(again)) == (404, "phase r12-a/L2 is not held.")
    assert not DomainHold.objects.exists()
    actions = list(AuditEvent.objects.values_list("action", "target"))
    assert actions.count(("facility_hold.set", "phase:r12-a/L2")) == 2
    assert actions.count(("facility_hold.release", "phase:r12-a/L2")) == 2
    reconcile_once(now=T0 + timedelta(seconds=60))
    assert Replica.objects.count() == 2


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("r12-a", "a phase is named by its PDU and its phase, as r12-a/L2, not 'r12-a'."),
        ("r12-a/L 2", "'L 2' is not a phase"),
        ("r 12/L2", "'r 12' is not a PDU's name"),
    ],
)
def test_a_hold_on_a_phase_no_label_could_name_is_refused_and_changes_nothing(api, name, said):
    from fleet.models import DomainCondition, DomainHold

    answer = api.call("PUT", "/facility/holds", {"kind": "phase", "name": name})
    assert answer.status_code == 400, answer.content
    assert said in detail(answer)
    assert not DomainHold.objects.exists() and not DomainCondition.objects.exists()
