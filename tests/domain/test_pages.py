"""What the console's pages show, each thing once and as it is (fleet/domain/pages.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from fleet.domain.pages import (
    answering_fallback,
    fallback_shown,
    gpu_charts_said,
    installs_shown,
    labels_shown,
    schedule_actions,
)
from fleet.domain.power import PDU_LABEL, RACK_LABEL, ZONE_LABEL


def test_the_location_labels_its_badges_say_are_not_shown_again_and_the_others_are():
    labels = {ZONE_LABEL: "a", RACK_LABEL: "r1", "kind": "cpu"}
    assert labels_shown(labels, {"zone": "a", "rack": "r1"}) == ["kind=cpu"]


def test_a_location_label_its_badges_do_not_say_is_kept():
    # A PDU label the location left out (blank after stripping, say) is still a label.
    labels = {PDU_LABEL: "p7", RACK_LABEL: "r1"}
    assert labels_shown(labels, {"rack": "r1"}) == [f"{PDU_LABEL}=p7"]
    assert labels_shown(labels, {"rack": "r2", "pdu": "p7"}) == [f"{RACK_LABEL}=r1"]


@given(st.dictionaries(st.sampled_from(["kind", "team", ZONE_LABEL, "gpu"]), st.text(max_size=5)))
def test_with_no_location_every_label_is_shown_once(labels):
    shown = labels_shown(labels, {})
    assert shown == [f"{k}={v}" for k, v in labels.items()]


@pytest.mark.parametrize(
    ("engines", "install", "shown"),
    [
        ({"llamacpp": "b4000"}, {"engine": "llamacpp", "version": "b4000", "state": "installed"}, False),
        ({"llamacpp": "b3000"}, {"engine": "llamacpp", "version": "b4000", "state": "installed"}, True),
        ({}, {"engine": "llamacpp", "version": "b4000", "state": "installed"}, True),
        ({"llamacpp": "b4000"}, {"engine": "llamacpp", "version": "b4000", "state": "failed"}, True),
        ({}, {"engine": "vllm", "version": "0.9", "state": "installing"}, True),
    ],
)  # fmt: skip
def test_an_engine_installed_at_the_version_the_node_reports_is_one_chip(engines, install, shown):
    assert installs_shown(engines, [install]) == ([install] if shown else [])


@pytest.mark.parametrize(
    ("cordoned", "draining", "offered"),
    [
        (False, False, ("cordon", "drain")),
        (True, False, ("uncordon", "drain")),
        (True, True, ("uncordon",)),
        (False, True, ("uncordon",)),
    ],
)
def test_only_the_schedule_actions_that_change_something_are_offered(cordoned, draining, offered):
    assert schedule_actions(cordoned=cordoned, draining=draining) == offered


def test_a_node_without_gpus_or_whose_gpus_report_nothing_draws_no_gpu_charts_and_says_why():
    assert gpu_charts_said(0, []) == "It has no GPUs: no GPU charts."
    said = gpu_charts_said(8, [{"index": 0}, {"index": 1, "throttle": []}])
    assert said.startswith("No GPU charts: none of its 8 GPUs reports utilisation")
    assert "its GPU reports" in gpu_charts_said(1, [])


@pytest.mark.parametrize("reading", ["utilization", "memory_used_mb", "temp_c", "power_w"])
def test_one_reading_from_one_gpu_draws_the_gpu_charts(reading):
    assert gpu_charts_said(2, [{"index": 0}, {"index": 1, reading: 0}]) == ""


def test_a_model_whose_fallback_answers_is_shown_as_answered_not_as_an_outage():
    status, reason = fallback_shown(
        "unplaceable", "node cpu-1 has no h100-80g GPUs", 0, ("chat-70b",), {"chat-70b": 2}
    )
    assert status == "fallback"
    assert reason == (
        "its requests are answered by chat-70b while it is unplaceable: "
        "node cpu-1 has no h100-80g GPUs"
    )


@pytest.mark.parametrize(
    ("status", "ready", "ready_of", "answered_by"),
    [
        ("waiting", 0, {"b": 1}, "b"),  # the first fallback with a ready replica
        ("starting", 0, {"a": 0, "b": 3}, "b"),
        ("failing", 0, {"a": 1}, "a"),  # a crash loop: its fallback answers meanwhile
        ("unplaceable", 0, {}, None),  # no fallback ready: an outage it is
        ("unplaceable", 1, {"a": 1}, None),  # some of its own ready
        ("ready", 0, {"a": 1}, None),
        ("parked", 0, {"a": 1}, None),  # parked is said as parked
        ("idle", 0, {"a": 1}, None),  # wants nothing
    ],
)
def test_which_fallback_answers_for_a_model(status, ready, ready_of, answered_by):
    assert answering_fallback(status, ready, ("a", "b"), ready_of) == answered_by
    shown, _ = fallback_shown(status, "", ready, ("a", "b"), ready_of)
    assert shown == ("fallback" if answered_by else status)


def test_a_model_whose_retiring_replica_still_serves_is_not_said_to_fall_back():
    from catalog.views import _shown_status

    view = {"status": "starting", "reason": "", "ready": 0, "retiring": 1, "fallbacks": ["a"]}
    assert _shown_status(view, {"a": 1})["status"] == "starting"
    assert _shown_status(view | {"retiring": 0}, {"a": 1})["status"] == "fallback"
