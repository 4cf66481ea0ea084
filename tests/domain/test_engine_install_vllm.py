"""Placement and the vLLM agents install with pip: a GPU node lacking vLLM is a candidate
for a vLLM profile when the control plane pins a version it would install (``installable``),
unless installing that very version failed there."""

from dataclasses import replace

import pytest

from fleet.domain.placement import could_ever_run, engine_refusal
from fleet.domain.types import EngineInstall

from .builders import gpu_node, gpu_profile, nodes_of, place, reasons_of

PINNED = {"vllm": "0.33.0"}
FAILED = EngineInstall(
    "vllm", "0.33.0", "failed", "vllm 0.33.0: `pip install` exited 1; no matching distribution"
)


def node(*, engines=("sim",), installable=None, installs=(), gpus=2):
    return replace(
        gpu_node("g1", gpus=gpus, engines=engines),
        platform="linux-x86_64",
        installable=installable or {},
        installs=tuple(installs),
    )


@pytest.mark.parametrize(
    ("case", "n", "refused"),
    [
        ("has vLLM", node(engines=("vllm",)), None),
        ("a version is pinned", node(installable=PINNED), None),
        (
            "installing it now",
            node(installable=PINNED, installs=[EngineInstall("vllm", "0.33.0", "installing")]),
            None,
        ),
        ("nothing pinned", node(), "node g1 has no vllm engine installed"),
        (
            "only a llama.cpp build is offered",
            node(installable={"llamacpp": "b6000"}),
            "node g1 has no vllm engine installed",
        ),
        (
            "that version failed to install",
            node(installable=PINNED, installs=[FAILED]),
            f"node g1 could not install vllm 0.33.0: {FAILED.detail}",
        ),
        (
            "a newer pin than the one that failed",
            node(installable={"vllm": "0.34.0"}, installs=[FAILED]),
            None,
        ),
        (
            "installed, as the node now says",
            node(engines=("vllm",), installs=[EngineInstall("vllm", "0.33.0", "installed")]),
            None,
        ),
    ],
)
def test_whether_a_gpu_node_can_run_vllm(case, n, refused):
    assert engine_refusal(n, "vllm") == refused, case
    result = place([n], gpu_profile())
    if refused is None:
        assert nodes_of(result) == ["g1"], case
        assert could_ever_run(n, gpu_profile())
    else:
        assert reasons_of(result) == [refused], case
        assert not could_ever_run(n, gpu_profile())


def test_a_pinned_vllm_does_not_make_up_for_gpus_the_node_lacks():
    # Installable or not, a tp2 profile needs two GPUs of its class.
    result = place([node(installable=PINNED, gpus=1)], gpu_profile(tp=2))
    assert reasons_of(result) == ["node g1 has 1 free h100-80g GPUs of 1, needs 2"]
