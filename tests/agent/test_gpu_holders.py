"""GPUs held by processes the agent did not start, as `register` reports them (issue 12, item 7).

NVML is the fake one over a list of cards; what the agent makes of its answers is real.
"""

import pytest

from fleet.agent.gpu_holders import gpu_holders, nvml_compute_pids, unknown_processes

from .helpers import FakeNVML


@pytest.mark.parametrize(
    ("pids", "given", "expected"),
    [
        # No NVML: nothing is said, which the control plane reads as unknown, not free.
        (None, set(), {}),
        ({0: [], 1: []}, set(), {0: 0, 1: 0}),
        ({0: [101], 1: []}, set(), {0: 1, 1: 0}),
        # On a GPU one of its shards was given, the processes are taken to be that shard's.
        ({0: [101, 102], 1: [103]}, {0}, {0: 0, 1: 1}),
        # A process listed twice (one per context) is one process.
        ({0: [101, 101]}, set(), {0: 1}),
    ],
)
def test_unknown_processes_per_gpu(pids, given, expected):
    assert unknown_processes(pids, given) == expected


def test_nvml_lists_each_gpus_compute_processes():
    nvml = FakeNVML([{"procs": [7, 8]}, {"procs": []}])
    assert nvml_compute_pids(nvml) == {0: [7, 8], 1: []}
    assert nvml.inits == nvml.shutdowns == 1


@pytest.mark.parametrize(
    "nvml",
    [FakeNVML(init_error="NVML Shared Library Not Found"), FakeNVML([{"procs": [1]}, {}])],
    ids=["no driver", "a card that cannot list them"],
)
def test_where_nvml_cannot_tell_nothing_is_reported(nvml):
    assert nvml_compute_pids(nvml) is None
    assert gpu_holders(False, set(), nvml) == {}


def test_simulated_gpus_report_nothing_whatever_the_real_cards_run():
    nvml = FakeNVML([{"procs": [7]}])
    assert gpu_holders(True, set(), nvml) == {}
    assert nvml.inits == 0


def test_a_gpu_held_by_an_unknown_process_is_said_and_logged(caplog):
    nvml = FakeNVML([{"procs": [7, 8]}, {"procs": [9]}, {"procs": []}])
    assert gpu_holders(False, {1}, nvml) == {0: 2, 1: 0, 2: 0}
    assert "GPU 0 runs 2 processes this agent did not start" in caplog.text
