"""Power caps kept (docs/facility.md, "Power capping"): a GPU's reported limit compared with
the one wanted, the cap sent again where they differ, never more than once per interval,
and nothing for a GPU that does not say its limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fleet.domain.capping import RESEND_S, Limit, Resend, off, resends, said, wanted

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
    assert resends(nodes, 0.8, {"a1": (0.8, 940.0)}, 1000.0) == []
    assert [r.node for r in resends(nodes, 0.8, {"a1": (0.8, 1000.0 - RESEND_S)}, 1000.0)] == ["a1"]
    # What was sent last was a let-go: the cap now wanted goes at once.
    assert [r.node for r in resends(nodes, 0.8, {"a1": (None, 990.0)}, 1000.0)] == ["a1"]


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
        for r in resends({"a1": (want, [g])}, 0.8, sent, now):
            assert g.limit_w is not None and r.share == want
            if "a1" in sent and sent["a1"][0] == r.share:
                assert now - sent["a1"][1] >= RESEND_S
            sent["a1"] = (r.share, now)
            if applies:
                held = gpu(700.0 if r.share is None else 560.0)
                assert resends({"a1": (want, [held])}, 0.8, {}, now) == []
