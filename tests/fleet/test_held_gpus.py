"""A GPU that processes llmgw did not start hold is given to no replica (issue 12, item 7).

Over real rows: the agent's `register` says per GPU how many such processes it found
(`unknown_processes`); the node is registered, a pass runs, and placement goes around
them; the API shows them; an agent that cannot tell (the field absent) constrains nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.models import Gpu, Replica
from fleet.reconciler.run import reconcile_once
from fleet.selectors.listings import nodes_list
from fleet.selectors.state import node_views

from .builders import H100, T0, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db


def _gpus(*counts: int | None) -> tuple[dict, ...]:
    return tuple(H100 if c is None else {**H100, "unknown_processes": c} for c in counts)


def test_a_gpu_held_by_unknown_processes_is_not_given_out(no_settle, caplog):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0, gpus=_gpus(2, 0))

    assert reconcile_once(now=T0)["starts"] == 1
    assert Replica.objects.get().shards.get().gpu_indices == [1]
    assert [(g.index, g.unknown_processes) for g in Gpu.objects.order_by("index")] == [
        (0, 2),
        (1, 0),
    ]
    assert "GPU 0 runs 2 processes llmgw did not start" in caplog.text
    [held, free] = node_views()["gpu-a"].gpus
    assert (held.held, free.held) == (True, False)
    [node] = nodes_list()
    assert node["gpu_free"] == 0  # one held by others, one by the replica
    assert [g["unknown_processes"] for g in node["gpus"]] == [2, 0]


def test_a_node_whose_only_gpu_is_held_is_refused_saying_so(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0, gpus=_gpus(1))

    result = reconcile_once(now=T0)

    assert result["starts"] == 0
    explained = " ".join(str(e) for e in result["events"])
    assert "1 held by other processes" in explained


def test_once_the_agent_registers_without_them_the_gpu_is_given_out_again(no_settle, caplog):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0, gpus=_gpus(1))
    reconcile_once(now=T0)
    later = T0 + timedelta(seconds=10)
    node_add("gpu-a", now=later, gpus=_gpus(0))

    assert reconcile_once(now=later)["starts"] == 1
    assert "GPU 0 no longer runs processes llmgw did not start" in caplog.text


def test_an_agent_that_cannot_tell_constrains_nothing(no_settle):
    # No NVML, or simulated GPUs: the field is absent, which is unknown, not held.
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0, gpus=_gpus(None))

    assert reconcile_once(now=T0)["starts"] == 1
    assert Gpu.objects.get().unknown_processes is None
