"""What a GPU's fabric report means for placement (fleet/domain/fabric.py): each cause's
sentence with its figures; healthy and unknown say nothing."""

import pytest

from fleet.domain.fabric import XIDS_NEEDING_RESET, gpu_domain, gpu_problem, nvlink_peers

UUID = "5f1c0a9e3b7d4e21a8c6f0b2d4e6a8c0"


def report(**parts) -> dict:
    """One GPU's report as the agent sends it (GpuFabricReport.model_dump()), index 3."""
    return {"index": 3, **parts}


@pytest.mark.parametrize(
    ("parts", "said"),
    [
        (
            {"ecc": {"uncorrected_volatile": 2}},
            "GPU 3 of node n1 has 2 uncorrected ECC errors",
        ),
        ({"ecc": {"uncorrected_volatile": 1}}, "GPU 3 of node n1 has 1 uncorrected ECC error"),
        ({"ecc": {"remap_pending": True}}, "GPU 3 of node n1 has row remapping pending"),
        ({"ecc": {"remap_failure": True}}, "GPU 3 of node n1 had a row remapping fail"),
        ({"ecc": {"retired_pending": True}}, "GPU 3 of node n1 has retired pages pending"),
        (
            {"xids": [79]},
            "GPU 3 of node n1 had Xid 79 (fallen off the bus), which needs a reset",
        ),
        (
            {"xids": [48, 13, 119]},
            "GPU 3 of node n1 had Xid 119 (GSP RPC timeout), which needs a reset",
        ),
        (
            {"fabric": {"state": "in_progress"}},
            "GPU 3 of node n1 has its fabric registration not completed (in_progress)",
        ),
        (
            {"fabric": {"state": "not_started"}},
            "GPU 3 of node n1 has its fabric registration not completed (not_started)",
        ),
        (
            {"fabric": {"state": "completed", "status": 3}},
            "GPU 3 of node n1 failed its fabric registration (NVML status 3)",
        ),
        # The first cause speaks: an Xid before the counters, the counters before the fabric.
        (
            {"xids": [74], "ecc": {"uncorrected_volatile": 5}},
            "GPU 3 of node n1 had Xid 74 (NVLink error), which needs a reset",
        ),
        (
            {"ecc": {"uncorrected_volatile": 5}, "fabric": {"state": "in_progress"}},
            "GPU 3 of node n1 has 5 uncorrected ECC errors",
        ),
    ],
)
def test_each_cause_is_said_with_its_figures(parts, said):
    assert gpu_problem(report(**parts), node_id="n1") == said


@pytest.mark.parametrize(
    "parts",
    [
        {},  # nothing reported: unknown
        {"fabric": None, "ecc": None, "nvlinks": None, "xids": []},
        {"ecc": {"enabled": True, "corrected_volatile": 120, "uncorrected_volatile": 0}},
        # Lifetime counts are not today's: one error years ago is no reason to refuse.
        {"ecc": {"uncorrected_aggregate": 4}},
        {"ecc": {"remap_pending": False, "remap_failure": False, "retired_pending": False}},
        {"ecc": {"uncorrected_volatile": None}},
        {"xids": [13, 31, 43]},  # an application's faults: no reset needed
        {"fabric": {"state": "not_supported"}},  # no fabric: a PCIe card, an HGX board
        {"fabric": {"state": "completed", "status": 0, "cluster_uuid": UUID, "clique_id": 1}},
        {"fabric": {"state": None}},
    ],
)
def test_healthy_and_unknown_say_nothing(parts):
    assert gpu_problem(report(**parts), node_id="n1") is None


def test_every_xid_needing_a_reset_is_said():
    for xid, words in XIDS_NEEDING_RESET.items():
        said = gpu_problem(report(xids=[xid]), node_id="n1")
        assert said == f"GPU 3 of node n1 had Xid {xid} ({words}), which needs a reset"
    assert set(XIDS_NEEDING_RESET) == {48, 63, 64, 74, 79, 92, 93, 94, 95, 119, 120}


@pytest.mark.parametrize(
    ("fabric", "domain"),
    [
        ({"state": "completed", "status": 0, "cluster_uuid": UUID, "clique_id": 1}, (UUID, 1)),
        ({"state": "completed", "cluster_uuid": UUID, "clique_id": 0}, (UUID, 0)),
        ({"state": "in_progress", "cluster_uuid": UUID, "clique_id": 1}, None),
        ({"state": "completed", "status": 3, "cluster_uuid": UUID, "clique_id": 1}, None),
        ({"state": "completed", "cluster_uuid": "0" * 32, "clique_id": 1}, None),
        ({"state": "completed", "cluster_uuid": "", "clique_id": 1}, None),
        ({"state": "completed", "cluster_uuid": UUID, "clique_id": None}, None),
        ({"state": "not_supported"}, None),
        (None, None),
    ],
)
def test_the_domain_is_known_once_registration_completed(fabric, domain):
    assert gpu_domain(report(fabric=fabric)) == domain


def test_the_peers_are_the_gpus_at_the_other_end_of_links_that_are_up():
    links = [
        {"link": 0, "up": True, "peer_index": 1},
        {"link": 1, "up": True, "peer_index": 1},
        {"link": 2, "up": False, "peer_index": 2},  # down
        {"link": 3, "up": None, "peer_index": 4},  # unknown is not up
        {"link": 4, "up": True, "peer_index": None},  # an NVSwitch, or another node
        {"link": 5, "up": True, "peer_index": 3},  # itself
        {"link": 6, "up": True, "peer_index": 6},
    ]
    assert nvlink_peers(report(nvlinks=links)) == frozenset({1, 6})
    assert nvlink_peers(report(nvlinks=None)) == frozenset()
    assert nvlink_peers(report()) == frozenset()
