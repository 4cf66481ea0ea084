"""What a node may say it runs (fleet/domain/adoption.py): kept when placed there, adopted
only as a control plane that lost its state takes back what still runs, stopped otherwise
(issue 35, item 1). And whose address a node's engines may be at (endpoints.py, item 3)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, strategies as st

from fleet.domain.adoption import (
    ADOPT,
    KEEP,
    STOP,
    Claim,
    Ground,
    Terms,
    Verdict,
    adoption_window_open,
    judge,
)
from fleet.domain.endpoints import address_refusal, same_address

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
FP = "0123456789ab"
TERMS = {("llama", "gpu"): Terms(FP, nodes=1, gpus=1), ("big", "tp2x2"): Terms(FP, 2, 2)}
HERE = Ground(
    node_id="evil",
    placed=frozenset({"mine-0"}),
    elsewhere={"victim-0": "gpu-a"},
    replicas=frozenset({"victim", "mine"}),
    catalog=TERMS,
    gpus=frozenset({0, 1}),
    held=frozenset({0}),
    address="10.0.0.9",
)


def claim(shard_id: str = "fresh-0", replica_id: str = "fresh", **fields) -> Claim:
    base = dict(model="llama", profile="gpu", profile_fp=FP, gpu_indices=(1,))
    base["endpoint"] = "http://10.0.0.9:20000"
    return Claim(shard_id=shard_id, replica_id=replica_id, **(base | fields))


def one(c: Claim, ground: Ground = HERE) -> Verdict:
    [verdict] = judge([c], ground)
    return verdict


@pytest.mark.parametrize(
    ("reported", "action", "reason"),
    [
        # Its own shard: kept, whatever it says of it.
        (claim("mine-0", "mine", gpu_indices=(0,)), KEEP, ""),
        # What a lost state leaves: a replica nobody knows, as the catalog has it.
        (claim(), ADOPT, ""),
        # The report's attack: another node's shard, or another shard of its replica.
        (claim("victim-0", "victim"), STOP, "elsewhere"),
        (claim("victim-00", "victim"), STOP, "not_placed"),
        (claim("victim-1", "victim"), STOP, "not_placed"),
        (claim("mine-1", "mine"), STOP, "not_placed"),
        # A shard id that is not the replica's first shard as the control plane makes them.
        (claim("fresh-00"), STOP, "shard_id"),
        (claim("fresh-1"), STOP, "shard_id"),
        (claim("other-0"), STOP, "shard_id"),
        # Not as the catalog has it.
        (claim(model="ghost"), STOP, "catalog"),
        (claim(profile="cpu"), STOP, "catalog"),
        (claim(profile_fp=""), STOP, "catalog"),
        (claim(profile_fp="ffffffffffff"), STOP, "catalog"),
        # A replica over several nodes is never adopted piecemeal.
        (claim(model="big", profile="tp2x2", gpu_indices=(0, 1)), STOP, "multi_node"),
        # GPUs: as many as the profile takes, its own, and none another shard holds.
        (claim(gpu_indices=()), STOP, "gpus"),
        (claim(gpu_indices=(1, 1)), STOP, "gpus"),
        (claim(gpu_indices=(7,)), STOP, "gpus"),
        (claim(gpu_indices=(0,)), STOP, "gpus"),
        # Only a running engine is adopted.
        (claim(state="pending"), STOP, "not_running"),
        # Its engine somewhere else than this node: stopped, even its own shard.
        (claim(endpoint="http://203.0.113.7:20000"), STOP, "endpoint"),
        (claim("mine-0", "mine", endpoint="http://203.0.113.7:1"), STOP, "endpoint"),
    ],
)
def test_each_reported_shard_is_kept_adopted_or_stopped_with_its_reason(reported, action, reason):
    verdict = one(reported)
    assert (verdict.action, verdict.reason) == (action, reason)
    assert bool(verdict.why) == (action == STOP)


def test_the_sentence_names_the_node_that_holds_the_shard():
    assert one(claim("victim-0", "victim")).why == (
        "shard victim-0 is placed on node gpu-a, not on node evil"
    )


def test_a_control_plane_that_ran_all_along_adopts_nothing():
    verdict = one(claim(), replace(HERE, adopting=False))
    assert (verdict.action, verdict.reason) == (STOP, "late")
    assert "LLMGW_ADOPT_WINDOW_SECONDS" in verdict.why
    # Its own shards are still its own.
    assert (
        one(claim("mine-0", "mine", gpu_indices=(0,)), replace(HERE, adopting=False)).action == KEEP
    )


def test_a_registration_brings_at_most_its_share_of_shards_not_placed():
    many = [claim(f"r{i}-0", f"r{i}", gpu_indices=()) for i in range(5)]
    ground = replace(HERE, catalog={("llama", "gpu"): Terms(FP, 1, 0)}, most=3)
    verdicts = judge(many, ground)
    assert [v.action for v in verdicts] == [ADOPT] * 3 + [STOP] * 2
    assert {v.reason for v in verdicts[3:]} == {"too_many"}
    assert "at most 3" in verdicts[3].why


def test_two_shards_of_one_replica_or_on_one_gpu_in_one_report_are_adopted_once():
    verdicts = judge([claim(), claim("other-0", "other")], HERE)
    assert [(v.action, v.reason) for v in verdicts] == [(ADOPT, ""), (STOP, "gpus")]
    twice = judge([claim(), claim(gpu_indices=(1,))], replace(HERE, gpus=frozenset({0, 1, 2})))
    assert [(v.action, v.reason) for v in twice] == [(ADOPT, ""), (STOP, "not_placed")]


def test_with_its_address_refused_no_endpoint_of_a_node_is_believed():
    ground = replace(HERE, address_refusal="node evil says its engines are at 10.0.0.9 …")
    verdict = one(claim("mine-0", "mine", gpu_indices=(0,)), ground)
    assert (verdict.action, verdict.reason) == (STOP, "endpoint")
    assert verdict.why.endswith("node evil says its engines are at 10.0.0.9 …")
    # A shard with no endpoint yet says nothing of where it is.
    assert one(claim("mine-0", "mine", endpoint=""), ground).action == KEEP


@pytest.mark.parametrize(
    ("last_pass", "settled", "served", "open_"),
    [
        (None, None, None, True),  # a new database: no pass ever
        (T0 - timedelta(hours=3), None, None, True),  # a restored one: no pass for hours
        (T0 - timedelta(seconds=2), None, T0 - timedelta(seconds=30), True),  # serve started
        (T0 - timedelta(seconds=2), T0 - timedelta(seconds=60), None, True),  # a pass settled
        (T0 - timedelta(seconds=2), T0 - timedelta(hours=1), T0 - timedelta(hours=1), False),
        (T0 - timedelta(seconds=2), T0 - timedelta(seconds=120), None, False),  # the edge
    ],
)
def test_the_control_plane_takes_back_what_it_did_not_place_only_as_it_starts(
    last_pass, settled, served, open_
):
    assert (
        adoption_window_open(
            now=T0,
            last_pass_at=last_pass,
            settled_from=settled,
            served_since=served,
            window_s=120,
            gap_s=15,
        )
        is open_
    )


NODES = ("evil", "gpu-a", "gpu-b")


@st.composite
def grounds_and_claims(draw):
    """A fleet where each replica's shards are placed on some nodes, and a report from
    node "evil" of any shards at all: its own, others', made up."""
    replicas = {f"r{i}": draw(st.sets(st.sampled_from(NODES), max_size=2)) for i in range(4)}
    placed = {f"{r}-{rank}": n for r, ns in replicas.items() for rank, n in enumerate(sorted(ns))}
    ids = st.sampled_from([*placed, "r0-00", "r1-1", "new-0", "new-1", "x"])
    claims = [
        claim(
            shard,
            draw(st.sampled_from([*replicas, "new", shard.rpartition("-")[0]])),
            model=draw(st.sampled_from(["llama", "ghost"])),
            profile_fp=draw(st.sampled_from([FP, ""])),
            gpu_indices=tuple(draw(st.lists(st.integers(0, 3), max_size=2))),
            endpoint=draw(st.sampled_from(["", "http://10.0.0.9:1", "http://6.6.6.6:1"])),
            state=draw(st.sampled_from(["starting", "ready", "failed"])),
        )
        for shard in draw(st.lists(ids, max_size=8))
    ]
    ground = Ground(
        node_id="evil",
        placed=frozenset(s for s, n in placed.items() if n == "evil"),
        elsewhere={s: n for s, n in placed.items() if n != "evil"},
        replicas=frozenset(r for r, ns in replicas.items() if ns),
        catalog=TERMS,
        gpus=frozenset(range(4)),
        address="10.0.0.9",
        adopting=draw(st.booleans()),
        most=draw(st.integers(1, 3)),
    )
    return ground, claims


@given(grounds_and_claims())
def test_no_report_from_one_node_ever_takes_what_the_control_plane_placed_elsewhere(drawn):
    ground, claims = drawn
    verdicts = judge(claims, ground)
    assert [v.shard_id for v in verdicts] == [c.shard_id for c in claims]
    adopted = [c for c, v in zip(claims, verdicts, strict=True) if v.action == ADOPT]
    for c, v in zip(claims, verdicts, strict=True):
        if v.action == KEEP:
            assert c.shard_id in ground.placed
        if c.shard_id in ground.elsewhere:
            assert v.action == STOP
    # What is adopted is a replica nobody holds, once, within the window and the cap.
    assert all(c.replica_id not in ground.replicas for c in adopted)
    assert len({c.replica_id for c in adopted}) == len(adopted)
    assert len(adopted) <= (ground.most if ground.adopting else 0)
    gpus = [i for c in adopted for i in c.gpu_indices]
    assert len(gpus) == len(set(gpus))


@pytest.mark.parametrize(
    ("declared", "seen", "approved", "trust", "believed"),
    [
        ("10.0.0.7", "10.0.0.7", "", False, True),
        ("10.0.0.7", "::ffff:10.0.0.7", "", False, True),  # IPv4 mapped into IPv6
        ("fd00::7", "[FD00:0::7]", "", False, True),
        ("203.0.113.7", "127.0.0.1", "", False, False),  # the report's forged address
        ("10.0.0.7", "", "", False, False),  # not known where it connects from
        ("10.0.0.7", "192.0.2.1", "10.0.0.7", False, True),  # behind NAT, approved
        ("10.0.0.8", "192.0.2.1", "10.0.0.7", False, False),  # changed since approved
        ("gpu-a.lab", "10.0.0.7", "", False, False),  # a name is not an address seen
        ("gpu-a.lab", "10.0.0.7", "GPU-A.lab", False, True),
        ("203.0.113.7", "127.0.0.1", "", True, True),  # the operator trusts what nodes say
    ],
)
def test_a_nodes_engines_are_believed_only_at_an_address_it_connects_from_or_was_approved(
    declared, seen, approved, trust, believed
):
    why = address_refusal(
        node_id="gpu-a", declared=declared, seen=seen, approved=approved, trust_declared=trust
    )
    assert (why is None) is believed


def test_a_refused_address_says_where_the_node_connects_from_and_what_to_run():
    why = address_refusal(
        node_id="evil", declared="203.0.113.7", seen="127.0.0.1", approved="", trust_declared=False
    )
    assert why == (
        "node evil says its engines are at 203.0.113.7 but connects from 127.0.0.1: nothing is "
        "placed on it and none of its engines is used until an operator approves that address "
        "(llmgw ctl node approve evil --address 203.0.113.7)"
    )
    changed = address_refusal(
        node_id="n",
        declared="10.0.0.8",
        seen="192.0.2.1",
        approved="10.0.0.7",
        trust_declared=False,
    )
    assert changed.startswith("node n says its engines are at 10.0.0.8, not at 10.0.0.7 as an")


def test_an_empty_address_is_no_address():
    assert not same_address("", "")
