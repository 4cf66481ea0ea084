"""PDU phases in power budgets (docs/facility.md, "Phases of a PDU"): a three-phase PDU's
breakers trip per phase, so each phase named `<pdu>/<phase>` has a budget of its own; a
node on L2 takes nothing that would pass L2's cap even when the PDU has room, load leans
towards the phase with most headroom, and a phase with no budget changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fleet.domain.placement import Inventory, Placement, inventory as placement
from fleet.domain.power import (
    PDU_LABEL,
    PHASE_LABEL,
    RACK_LABEL,
    Budget,
    GpuPower,
    Ledger,
    Power,
    domain_said,
    domains_of,
    phase_name_refusal,
    phase_refusal,
    phases_of,
)

from .builders import gpu_node, gpu_profile

ONE = gpu_profile("one", tp=1)
TWO = gpu_profile("two", tp=2)


def on(pdus: str, phases: str | None = None, rack: str = "r12") -> dict[str, str]:
    labels = {RACK_LABEL: rack, PDU_LABEL: pdus}
    if phases is not None:
        labels[PHASE_LABEL] = phases
    return labels


def limits(*nodes, watts: float = 700.0, gpus: int = 8) -> dict:
    return {n: {i: GpuPower(watts) for i in range(gpus)} for n in nodes}


@pytest.mark.parametrize(
    ("labels", "phases", "says"),
    [
        (on("r12-a", "L2"), ("r12-a/L2",), None),
        (on("r12-a,r12-b", "L2,L3"), ("r12-a/L2", "r12-b/L3"), None),
        (on("r12-a, r12-b", " L2 , L2 "), ("r12-a/L2", "r12-b/L2"), None),
        (on("r12-a", "B"), ("r12-a/B",), None),  # a PDU naming its phases A, B, C
        (on("r12-a"), (), None),  # no phase label: the PDU's budget alone
        (on("r12-a", " "), (), None),  # an empty label is none
        (
            on("r12-a,r12-b", "L2"),
            (),
            "llmgw.io/pdu-phase names 1 phase for 2 PDUs (r12-a, r12-b): it gives one phase "
            "per PDU of llmgw.io/pdu, in the same order (L2,L2 for a node on L2 of two).",
        ),
        (
            {PHASE_LABEL: "L1"},
            (),
            "llmgw.io/pdu-phase names 1 phase for 0 PDUs: it gives one phase per PDU of "
            "llmgw.io/pdu, in the same order (L2,L2 for a node on L2 of two).",
        ),
        (on("r12-a", "L 2"), (), "llmgw.io/pdu-phase: 'L 2' is not a phase: L1, L2 or L3"),
        (on("r12-a", "phase-one"), (), "'phase-one' is not a phase"),  # 9 characters
        (on("r12-a", "-1"), (), "'-1' is not a phase"),
    ],
)
def test_a_nodes_phases_are_its_pdus_paired_with_its_phase_label_in_order(labels, phases, says):
    assert phases_of(labels) == phases
    said = phase_refusal(labels)
    assert said is None if says is None else said is not None and says in said


def test_a_node_is_under_its_phases_after_its_pdus():
    labels = on("r12-a,r12-b", "L2,L1") | {"llmgw.io/row": "b"}
    assert domains_of(labels) == (
        ("rack", "r12"),
        ("pdu", "r12-a"),
        ("pdu", "r12-b"),
        ("phase", "r12-a/L2"),
        ("phase", "r12-b/L1"),
        ("row", "b"),
    )
    # Unreadable phases are ignored: the node is under its rack and PDUs as before.
    assert domains_of(on("r12-a,r12-b", "L2")) == (
        ("rack", "r12"),
        ("pdu", "r12-a"),
        ("pdu", "r12-b"),
    )


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("r12-a/L2", None),
        ("r12-a/C", None),
        ("r12-a", "a phase is named by its PDU and its phase, as r12-a/L2, not 'r12-a'."),
        ("/L2", "a PDU needs a name."),
        ("r12 a/L2", "'r12 a' is not a PDU's name"),
        ("r12-a/", "'' is not a phase"),
        ("r12-a/L2/x", "'r12-a/L2' is not a PDU's name"),
        ("r12-a/L 2", "'L 2' is not a phase"),
        (7, "a phase is named by its PDU and its phase"),
    ],
)
def test_a_phase_budget_is_named_by_its_pdu_a_slash_and_its_phase(name, says):
    said = phase_name_refusal(name)
    assert said is None if says is None else said is not None and says in said


def test_a_phase_is_said_as_its_pdu_and_phase():
    assert domain_said(("phase", "r12-a/L2")) == "pdu r12-a phase L2"
    assert domain_said(("rack", "r12")) == "rack r12"


def test_a_full_phase_refuses_though_its_pdu_has_room_and_names_the_phase():
    nodes = {"n1": on("r12-a", "L2"), "n2": on("r12-a", "L1")}
    book = Ledger.of(
        Power(
            (
                Budget("pdu", "r12-a", 22000),
                Budget("phase", "r12-a/L2", 7400, margin=0.1, other_w=4960),
            ),
            limits("n1", "n2"),
        ),
        nodes,
    )
    assert book is not None
    book.take("n1", (0, 1))  # 1,400 W: L2 holds 6,360 of 6,660
    assert book.refusal("n1", (2,)) == (
        "node n1 is in pdu r12-a phase L2: 6,360 of 6,660 W held "
        "(7,400 W less a 10 % margin), this replica needs ~700 W"
    )
    assert book.refusal("n2", (0,)) is None  # L1 has no budget: the PDU's 22 kW alone
    assert book.left_in([("pdu", "r12-a")]) == pytest.approx(22000 - 1400)


def test_a_replica_goes_to_the_node_whose_phase_has_room():
    nodes = {
        "a": gpu_node("a", labels=on("r12-a", "L2")),
        "b": gpu_node("b", labels=on("r12-a", "L1")),
    }
    power = Power(
        (
            Budget("pdu", "r12-a", 22000),
            Budget("phase", "r12-a/L1", 7400),
            Budget("phase", "r12-a/L2", 7400, other_w=7000),
        ),
        limits("a", "b"),
    )
    placed = Inventory(nodes, (), power=power).place([ONE])
    assert isinstance(placed, Placement) and placed.shards[0].node_id == "b"
    inv = Inventory({"a": nodes["a"]}, (), power=power)
    refused = inv.place([ONE])
    assert not isinstance(refused, Placement)
    assert "pdu r12-a phase L2: 7,000 of 7,400 W held, this replica needs ~700 W" in str(
        refused.reasons
    )


@pytest.mark.parametrize("index_from", [0, 10**9])  # through the index, and judging all
def test_load_leans_to_the_phase_with_most_headroom_when_the_rack_binds_alike(
    index_from, monkeypatch
):
    monkeypatch.setattr(placement, "INDEX_FROM", index_from)
    # The rack's 4 kW binds every node alike; L3 has most left, then L2, then L1.
    nodes = {
        "a": gpu_node("a", labels=on("r12-a", "L1")),
        "b": gpu_node("b", labels=on("r12-a", "L2")),
        "c": gpu_node("c", labels=on("r12-a", "L3")),
    }
    budgets = (
        Budget("rack", "r12", 4000),
        Budget("phase", "r12-a/L1", 7400, other_w=3000),
        Budget("phase", "r12-a/L2", 7400, other_w=1000),
        Budget("phase", "r12-a/L3", 7400),
    )
    placed = Inventory(nodes, (), power=Power(budgets, limits("a", "b", "c"))).place([ONE])
    assert isinstance(placed, Placement) and placed.shards[0].node_id == "c"
    # Without phase budgets nothing orders them but the id.
    plain = Inventory(nodes, (), power=Power(budgets[:1], limits("a", "b", "c"))).place([ONE])
    assert isinstance(plain, Placement) and plain.shards[0].node_id == "a"


def test_placements_level_over_the_three_phases():
    nodes = {
        f"{p}{i}": gpu_node(f"{p}{i}", gpus=2, labels=on("r12-a", p))
        for p in ("L1", "L2", "L3")
        for i in range(3)
    }
    budgets = tuple(Budget("phase", f"r12-a/{p}", 7400) for p in ("L1", "L2", "L3"))
    inv = Inventory(nodes, (), power=Power(budgets, limits(*nodes, gpus=2)))
    held = {"L1": 0, "L2": 0, "L3": 0}
    for n in range(6):
        placed = inv.place([TWO], model=f"m{n}")
        assert isinstance(placed, Placement)
        inv.reserve(f"m{n}", placed)
        held[placed.shards[0].node_id[:2]] += 1400
        assert max(held.values()) - min(held.values()) <= 1400


PHASES = ("L1", "L2", "L3")


@st.composite
def phased_fleets(draw):
    """Nodes on the phases of two PDUs (some dual-fed), phase budgets on some phases, a
    rack budget or none, and asks."""
    nodes = {}
    for i in range(draw(st.integers(2, 6))):
        pdus = draw(st.sampled_from(["pa", "pb", "pa,pb"]))
        phases = ",".join(draw(st.sampled_from(PHASES)) for _ in pdus.split(","))
        nodes[f"n{i}"] = on(pdus, phases)
    budgets = [
        Budget(
            "phase",
            f"{pdu}/{p}",
            draw(st.integers(700, 6000)),
            margin=draw(st.sampled_from([0.0, 0.1])),
            other_w=draw(st.sampled_from([0.0, 500.0])),
        )
        for pdu in ("pa", "pb")
        for p in PHASES
        if draw(st.booleans())
    ]
    if draw(st.booleans()):
        budgets.append(Budget("rack", "r12", draw(st.integers(2000, 20000))))
    asks = draw(st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=12))
    return nodes, tuple(budgets), asks


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=phased_fleets())
def test_no_placement_takes_a_phase_past_its_cap_less_its_margin(case):
    labels, budgets, asks = case
    nodes = {n: gpu_node(n, labels=ls) for n, ls in labels.items()}
    inv = Inventory(nodes, (), power=Power(budgets, limits(*nodes)))
    # Figured here, not by the ledger: each phase's base and what its nodes' replicas hold.
    phases = {b.name: b for b in budgets if b.kind == "phase"}
    held = {name: b.other_w for name, b in phases.items()}
    for i, tp in enumerate(asks):
        placed = inv.place([gpu_profile(f"p{tp}", tp=tp)], model=f"m{i}")
        if not isinstance(placed, Placement):
            continue
        inv.reserve(f"m{i}", placed)
        for shard in placed.shards:
            for name in phases_of(labels[shard.node_id]):
                if name in held:
                    held[name] += 700.0 * len(shard.gpu_indices)
        for name, b in phases.items():
            limit = b.watts * (1 - b.margin)
            # A phase over its limit from the start (its other equipment) takes nothing.
            assert held[name] <= max(limit, b.other_w) + 1e-6, f"{name}: {held[name]} of {limit}"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=phased_fleets())
def test_without_phase_budgets_placement_is_what_it_was_without_phase_labels(case):
    labels, budgets, asks = case
    others = tuple(b for b in budgets if b.kind != "phase") + (Budget("pdu", "pa", 9000),)

    def placements(with_phases: bool) -> list:
        nodes = {
            n: gpu_node(
                n, labels=ls if with_phases else {k: v for k, v in ls.items() if k != PHASE_LABEL}
            )
            for n, ls in labels.items()
        }
        inv = Inventory(nodes, (), power=Power(others, limits(*nodes)))
        out = []
        for i, tp in enumerate(asks):
            placed = inv.place([gpu_profile(f"p{tp}", tp=tp)], model=f"m{i}")
            if isinstance(placed, Placement):
                inv.reserve(f"m{i}", placed)
                out.append(tuple((s.node_id, s.gpu_indices) for s in placed.shards))
            else:
                out.append(None)
        return out

    assert placements(True) == placements(False)
