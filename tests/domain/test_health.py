"""No ghost replicas: which ready replicas stop being routed to, and when they are again."""

from datetime import datetime

import pytest

from fleet.domain.health import HealthChange, health_changes
from fleet.domain.types import NodeView

from .builders import NOW, ago, replica

WINDOW = 15.0


def node(node_id: str, state: str = "ready", seen: float = 1) -> tuple[NodeView, datetime]:
    """A node as liveness left it, and when it was last heard from."""
    return NodeView(id=node_id, state=state), ago(seen)


def changes(replicas, nodes, floor=None) -> list[HealthChange]:
    views = {n.id: n for n, _ in nodes}
    heard = {n.id: seen for n, seen in nodes}
    return health_changes(replicas, views, heard, NOW, unreachable=WINDOW, floor=floor)


@pytest.mark.parametrize(
    ("case", "nodes", "kw", "floor", "expected"),
    [
        ("a heard node's replica stays routed", [node("n1")], {}, None, []),
        (
            "its node unheard for the window: not routed",
            [node("n1", "unreachable", seen=16)],
            {},
            None,
            [HealthChange("r1", "node n1 not heard from for 16 s")],
        ),
        (
            "its connection just closed: still routed within the window",
            [node("n1", "unreachable", seen=3)],
            {},
            None,
            [],
        ),
        (
            "after a restart, silence counts from the restart: not yet",
            [node("n1", "unreachable", seen=600)],
            {},
            ago(10),
            [],
        ),
        (
            "after a restart, unconfirmed for the window: not routed",
            [node("n1", "unreachable", seen=600)],
            {},
            ago(15),
            [HealthChange("r1", "node n1 not heard from for 15 s")],
        ),
        (
            "marked, its agent heard since: routed again",
            [node("n1", seen=1)],
            {"unhealthy_since": ago(4)},
            None,
            [HealthChange("r1", None)],
        ),
        (
            "marked by a gateway, not heard since: stays out",
            [node("n1", seen=5)],
            {"unhealthy_since": ago(2)},
            None,
            [],
        ),
        (
            "marked, its node still unreachable: stays out",
            [node("n1", "unreachable", seen=30)],
            {"unhealthy_since": ago(10)},
            None,
            [],
        ),
        (
            "a starting replica is no business of this",
            [node("n1", "unreachable", seen=60)],
            {"state": "starting"},
            None,
            [],
        ),
    ],
)
def test_what_is_routed_follows_what_agents_confirm(case, nodes, kw, floor, expected):
    replicas = (replica("r1", "llama", on="n1", **kw),)

    assert changes(replicas, nodes, floor) == expected, case


def test_a_replica_over_two_nodes_is_out_when_either_is_unheard_and_back_when_both_are():
    spread = (replica("r1", "llama", on=["n1", "n2"]),)
    nodes = [node("n1"), node("n2", "unreachable", seen=20)]

    assert changes(spread, nodes) == [HealthChange("r1", "node n2 not heard from for 20 s")]

    marked = (replica("r1", "llama", on=["n1", "n2"], unhealthy_since=ago(5)),)
    assert changes(marked, [node("n1"), node("n2", seen=8)]) == []
    assert changes(marked, [node("n1"), node("n2", seen=1)]) == [HealthChange("r1", None)]
