"""The memo's key follows the snapshot's fields (fleet/domain/quiet.py `shared_key`).

A placement input added to `Snapshot` must make the models kept quiet be looked at again
when it moves, with nothing to remember: the key is derived from the fields, and only
those named with a reason (`KEYED_APART`, `LEFT_OUT`) stay out of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from fleet.domain.quiet import KEYED_APART, LEFT_OUT, QuietModels, shared_fields, shared_key
from fleet.domain.reconcile import decide
from fleet.domain.types import Snapshot

from .builders import TIMINGS, Cluster, gpu_node, gpu_profile, model, snapshot


@dataclass(frozen=True)
class Wider(Snapshot):
    """A snapshot with one more placement input, as the next issue's would add."""

    gpu_conditions: Mapping[str, str] = field(default_factory=dict)


def _settled(snap: Snapshot) -> Cluster:
    """A fleet placed, ready and passed over once with nothing to do."""
    c = Cluster(snap)
    for _ in range(4):
        c.step()
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, "ready")
        c.wait(5)
    return c


def _fleet() -> Snapshot:
    nodes = [gpu_node(f"n{i}", gpus=8) for i in (1, 2)]
    return snapshot(nodes, [model("steady", min=2), model("pair", gpu_profile(tp=2))])


def test_every_field_named_apart_or_left_out_is_the_snapshots_and_named_once():
    names = {f.name for f in fields(Snapshot)}
    assert set(KEYED_APART) <= names
    assert set(LEFT_OUT) <= names
    assert not set(KEYED_APART) & set(LEFT_OUT)
    assert all(KEYED_APART.values()) and all(LEFT_OUT.values())  # each says why


def test_a_field_added_to_the_snapshot_joins_the_shared_key():
    assert "gpu_conditions" in shared_fields(Wider)
    assert set(shared_fields(Wider)) - set(shared_fields(Snapshot)) == {"gpu_conditions"}
    snap = Wider(**{f.name: getattr(_fleet(), f.name) for f in fields(Snapshot)})
    moved = replace(snap, gpu_conditions={"n1": "hot"})
    assert shared_key(snap) == shared_key(replace(snap))
    assert shared_key(snap) != shared_key(moved)


def test_a_model_kept_quiet_is_looked_at_again_when_a_new_input_moves():
    plain = _fleet()
    c = _settled(Wider(**{f.name: getattr(plain, f.name) for f in fields(Snapshot)}))
    quiet = QuietModels()
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    c.wait(5)
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    assert (quiet.skipped, quiet.ran) == (2, 0)  # nothing moved: both kept

    c.change(gpu_conditions={"n1": "hot"})
    c.wait(5)
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    assert (quiet.skipped, quiet.ran) == (0, 2)  # the new input moved: both looked at


def test_a_field_left_out_moving_keeps_the_models_quiet():
    c = _settled(_fleet())
    quiet = QuietModels()
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    c.wait(5)  # every node heard again: `heard` moves
    decide(c.snap, c.now, TIMINGS, quiet=quiet)
    assert (quiet.skipped, quiet.ran) == (2, 0)
