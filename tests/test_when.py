"""`|when`: a time on a page, relative, with the exact time on hover."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from llmgw.core import clock
from llmgw.core.when import when


def test_a_time_is_said_relative_with_the_exact_one_on_hover(monkeypatch):
    now = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
    monkeypatch.setattr(clock, "now", lambda: now)
    assert when(now - timedelta(minutes=3, seconds=5)) == (
        '<time datetime="2026-12-02T09:26:55+00:00" title="2026-12-02 09:26:55 UTC">3 min ago</time>'
    )
    assert ">in 2 h</time>" in when(now + timedelta(hours=2, minutes=1))
    # The API's views keep times as text.
    assert ">5 d ago</time>" in when("2026-11-27T09:30:00+00:00")
    assert ">just now</time>" in when("2026-12-02T09:30:00")


def test_what_is_not_a_time_is_a_dash():
    for value in (None, "", "yesterday", 12, object()):
        assert when(value) == "–"
