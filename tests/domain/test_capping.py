"""Power caps kept (docs/facility.md, "Power capping"): a GPU's reported limit compared with
the one wanted, the cap sent again where they differ, never more than once per interval,
and nothing for a GPU that does not say its limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.capping import (
    RESEND_S,
    Limit,
    Resend,
    Sent,
    off,
    released,
    resends,
    said,
    wanted,
)

R1, P1 = ("rack", "r1"), ("pdu", "p1")


def gpu(limit, default=700.0, least=200.0, index=0) -> Limit:
    return Limit(index, limit, default, least)


@pytest.mark.parametrize(
    ("g", "want", "expected"),
    [
        (gpu(700), 0.8, True),  # wanted at 560 W, at its default: a driver reload, a new node
        (gpu(560), 0.8, False),  # held as wanted
        (gpu(560.6), 0.8, False),  # within a watt: a card's own rounding
        (gpu(500), 0.8, False),  # held lower by something else: left alone
        (gpu(630), 0.8, True),  # held to an older, larger share
        (gpu(200), 0.2, False),  # 140 W wanted, the card's least is 200 W: as low as it goes
        (gpu(250), 0.2, True),  # above the least
        (gpu(560), None, True),  # still at llmgw's cap: let go
        (gpu(700), None, False),  # at its default
        (gpu(450), None, False),  # a limit someone else set: theirs
        (gpu(None), 0.8, False),  # limit not reported: unknown, the change only
        (gpu(700, default=None), 0.8, False),  # default not reported: unknown
        (gpu(560, default=None), None, False),
        (Limit(0, 700, 700, None), 0.8, True),  # the least not reported: the share's figure
    ],
)
def test_a_gpus_reported_limit_is_held_as_wanted_or_not(g, want, expected):
    assert off(g, want, 0.8 if want is None else want) is expected


def test_a_node_is_capped_while_any_of_its_domains_is_warm_or_hot():
    assert wanted({R1: "warm"}, (R1, P1), 0.8) == 0.8
    assert wanted({P1: "hot"}, (R1, P1), 0.8) == 0.8
    assert wanted({R1: "ok", P1: "unknown"}, (R1, P1), 0.8) is None
    assert wanted({}, (), 0.8) is None


def test_a_cap_is_sent_again_once_per_interval_unless_the_wanted_cap_changed():
    nodes = {"a1": (0.8, [gpu(700)]), "b1": (0.8, [gpu(560)]), "c1": (None, [gpu(700)])}
    assert [r.node for r in resends(nodes, 0.8, {}, 1000.0)] == ["a1"]
    # Sent 60 s ago: not again, however the heartbeat reads, until RESEND_S is past.
    assert resends(nodes, 0.8, {"a1": Sent(0.8, 940.0)}, 1000.0) == []
    again = resends(nodes, 0.8, {"a1": Sent(0.8, 1000.0 - RESEND_S)}, 1000.0)
    assert [r.node for r in again] == ["a1"]
    # What was sent last was a let-go: the cap now wanted goes at once.
    assert [r.node for r in resends(nodes, 0.8, {"a1": Sent(None, 990.0, 0.8)}, 1000.0)] == ["a1"]


def test_a_limit_llmgw_has_no_record_of_setting_is_never_let_go():
    # An operator's `nvidia-smi -pl 560` on a 700 W card in a cool rack, the cap share 0.8:
    # the figure is llmgw's cap to the watt, but llmgw never held this node.
    cool = {"a1": (None, [gpu(560)])}
    assert resends(cool, 0.8, {}, 1000.0) == []
    assert resends(cool, 0.8, {"a1": Sent(None, 0.0)}, 1000.0) == []  # a let-go, nothing held


def test_a_node_llmgw_held_is_let_go_again_until_its_heartbeat_shows_it():
    record = {"a1": Sent(None, 0.0).then(0.8, 0.0).then(None, 100.0)}  # held, let go
    assert record["a1"] == Sent(None, 100.0, 0.8)
    still = {"a1": (None, [gpu(700, index=0), gpu(560, index=1)])}
    assert resends(still, 0.8, record, 100.0 + RESEND_S - 1) == []  # not seen yet: wait
    (r,) = resends(still, 0.8, record, 100.0 + RESEND_S)
    assert (r.node, r.share, r.gpu.index) == ("a1", None, 1)
    assert released(still, record) == []
    seen = {"a1": (None, [gpu(700, index=0), gpu(700, index=1)])}
    assert released(seen, record) == ["a1"]
    # Wanted capped, or never held: nothing to release.
    assert released({"a1": (0.8, [gpu(700)])}, record) == []
    assert released(seen, {"a1": Sent(None, 0.0)}) == []


def test_a_let_go_compares_with_the_share_llmgw_held_not_the_one_set_now():
    record = {"a1": Sent(None, 0.0, 0.6)}  # held to 60 % (420 W); the setting is 80 % now
    (r,) = resends({"a1": (None, [gpu(420)])}, 0.8, record, 1000.0)
    assert r.gpu.limit_w == 420
    assert resends({"a1": (None, [gpu(560)])}, 0.8, record, 1000.0) == []  # not llmgw's


def test_a_cap_sent_again_says_which_gpu_reports_what():
    held = Resend("gpu-a", 0.8, gpu(700, index=3))
    assert said(held) == (
        "held node gpu-a's GPUs to 80% of their default power limit again: GPU 3 reports a "
        "limit of 700 W, over the 560 W wanted (it is in a warm or hot domain)"
    )
    let_go = Resend("gpu-a", None, gpu(560, index=1))
    assert said(let_go) == (
        "let node gpu-a's GPUs back to their default power limit again: GPU 1 is still held "
        "to 560 W of its 700 W default (none of its domains is warm or hot)"
    )


def test_the_first_gpu_off_is_the_one_said():
    (r,) = resends({"a1": (0.8, [gpu(560, index=0), gpu(700, index=1)])}, 0.8, {}, 0.0)
    assert r.gpu.index == 1


LIMITS = st.one_of(st.none(), st.sampled_from([200.0, 450.0, 560.0, 630.0, 700.0]))


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=1, max_value=200),  # seconds to the next pass
            st.sampled_from([0.8, None]),  # the cap wanted then
            LIMITS,  # what the heartbeat reports then
            st.booleans(),  # whether the agent applies what it was sent
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_over_passes_a_node_is_never_sent_the_same_cap_twice_within_an_interval(steps):
    """Passes at any times, the wanted cap and the reported limit changing as they will:
    a cap is never sent again within RESEND_S of the same cap (only a change of what is
    wanted goes at once), a GPU that reports no limit is never sent anything, and a node
    whose agent applies what it is sent is not sent it again."""
    sent: dict = {}
    now = 0.0
    for step, want, reported, applies in steps:
        now += step
        g = gpu(reported)
        last = sent.get("a1")
        for r in resends({"a1": (want, [g])}, 0.8, sent, now):
            assert g.limit_w is not None and r.share == want
            if r.share is None:  # a let-go goes only where llmgw held the node
                assert last is not None and last.held is not None
            if last is not None and last.share == r.share:
                assert now - last.at >= RESEND_S
            sent["a1"] = (last or Sent(None, now)).then(r.share, now)
            if applies:
                held = gpu(700.0 if r.share is None else 560.0)
                assert resends({"a1": (want, [held])}, 0.8, {}, now) == []
