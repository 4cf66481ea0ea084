"""Placement and engines the mirror can install: a node lacking a profile's engine is a
candidate when the mirror holds a build of it for the node's platform, unless installing
that very build failed there."""

from dataclasses import replace

import pytest

from fleet.domain.placement import could_ever_run, engine_refusal
from fleet.domain.types import EngineInstall

from .builders import cpu_node, cpu_profile, nodes_of, place, reasons_of

FAILED = EngineInstall("llamacpp", "b6000", "failed", "the digest did not match")


def node(*, engines=("sim",), installable=None, installs=()):
    return replace(
        cpu_node("n1", engines=engines),
        platform="linux-x86_64",
        installable=installable or {},
        installs=tuple(installs),
    )


@pytest.mark.parametrize(
    ("case", "n", "refused"),
    [
        ("has it", node(engines=("llamacpp",)), None),
        ("never probed", node(engines=None), None),
        ("the mirror holds a build", node(installable={"llamacpp": "b6000"}), None),
        (
            "installing it now",
            node(
                installable={"llamacpp": "b6000"},
                installs=[EngineInstall("llamacpp", "b6000", "installing")],
            ),
            None,
        ),
        ("no build for it", node(), "node n1 has no llamacpp engine installed"),
        (
            "a build of another engine only",
            node(installable={"vllm": "0.9"}),
            "node n1 has no llamacpp engine installed",
        ),
        (
            "that build failed to install",
            node(installable={"llamacpp": "b6000"}, installs=[FAILED]),
            "node n1 could not install llamacpp b6000: the digest did not match",
        ),
        (
            "it failed and the mirror no longer holds it",
            node(installs=[FAILED]),
            "node n1 could not install llamacpp b6000: the digest did not match",
        ),
        (
            "a newer build than the one that failed",
            node(installable={"llamacpp": "b6100"}, installs=[FAILED]),
            None,
        ),
    ],
)
def test_whether_a_node_can_run_an_engine(case, n, refused):
    assert engine_refusal(n, "llamacpp") == refused, case
    result = place([n], cpu_profile())
    if refused is None:
        assert nodes_of(result) == ["n1"], case
        assert could_ever_run(n, cpu_profile())
    else:
        assert reasons_of(result) == [refused], case
        assert not could_ever_run(n, cpu_profile())
