"""When the reconciler settles for a restart, and when operators are told passes stopped."""

from datetime import UTC, datetime, timedelta

import pytest

from fleet.domain.passes import gap_allowed, restart_at, settles, stale_after, stale_warning
from llmgw.core.config import Timings

T = Timings()  # interval 5 s, unreachable 15 s, settle 30 s
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("case", "last_pass", "served", "settled", "fresh", "restart"),
    [
        ("the first pass ever", None, None, None, False, NOW),
        (
            "the embedded reconciler's first pass: serve just started",
            ago(4),
            ago(1),
            ago(600),
            True,
            NOW,
        ),
        ("a pass one interval after the last", ago(5), ago(600), ago(600), False, None),
        (
            "a worker killed mid-pass, replaced within the window",
            ago(14),
            ago(600),
            ago(600),
            False,
            None,
        ),
        (
            "passes stopped for longer than the unreachable window",
            ago(16),
            ago(600),
            ago(600),
            False,
            NOW,
        ),
        ("llmgw serve started since the last settle", ago(5), ago(3), ago(600), False, ago(3)),
        ("llmgw serve's start already settled for", ago(5), ago(40), ago(40), False, None),
        ("a serve start recorded and no settle yet", ago(5), ago(3), None, False, ago(3)),
    ],
)
def test_a_pass_settles_only_for_a_real_control_plane_restart(
    case, last_pass, served, settled, fresh, restart
):
    got = restart_at(
        now=NOW,
        last_pass_at=last_pass,
        served_since=served,
        settled_from=settled,
        fresh_start=fresh,
        t=T,
    )

    assert got == restart, case


def test_the_gap_allowed_is_the_unreachable_window_or_three_intervals():
    assert gap_allowed(T) == 15
    assert gap_allowed(Timings(reconcile_interval=10)) == 30


@pytest.mark.parametrize(
    ("settled", "expected"),
    [(None, False), (ago(0), True), (ago(29.9), True), (ago(30), False), (ago(300), False)],
)
def test_settling_lasts_the_settle_period_from_the_restart(settled, expected):
    assert settles(now=NOW, settled_from=settled, t=T) is expected


@pytest.mark.parametrize(
    ("case", "last_pass", "served", "embedded", "said"),
    [
        ("nothing ever started", None, None, False, None),
        ("a pass 5 s ago", ago(5), ago(900), False, None),
        ("a pass just at the bound", ago(15), ago(900), False, None),
        (
            "beat stopped 47 s ago",
            ago(47),
            ago(900),
            False,
            "no reconciler pass for 47 s (every 5 s expected): is celery beat running, and a worker?",
        ),
        (
            "no pass since serve started",
            None,
            ago(60),
            False,
            "no reconciler pass since llmgw serve started 60 s ago (every 5 s expected): "
            "is celery beat running, and a worker?",
        ),
        (
            "embedded, its loop stopped",
            ago(20),
            ago(900),
            True,
            "no reconciler pass for 20 s (every 5 s expected): "
            "the reconciler in llmgw serve has stopped; see its log",
        ),
    ],
)
def test_operators_are_told_when_passes_stopped_with_the_figures(
    case, last_pass, served, embedded, said
):
    got = stale_warning(
        now=NOW, last_pass_at=last_pass, served_since=served, embedded=embedded, t=T
    )

    assert got == said, case


def test_stale_means_three_intervals_and_never_under_15_s():
    assert stale_after(T) == 15
    assert stale_after(Timings(reconcile_interval=1)) == 15
    assert stale_after(Timings(reconcile_interval=30)) == 90
