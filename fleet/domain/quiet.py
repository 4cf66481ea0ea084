"""Models a pass need not look at again: their step did nothing, and nothing it reads moved.

A model's step (`reconcile._reconcile_model`) is a function of its spec, its replicas
as housekeeping left them, its state at its turn, its load, what the whole pass shares
(the timings, whether it settles, the measurements, the weights being fetched, the
nodes being drained) and `now`. When a step added nothing to the plan and took nothing
from the room or the quota picture, `QuietModels` keeps its inputs and the state it
returned, with the time up to which no clock of the model could change what it decides
(a backoff ending, an on-demand model's idle timeout, a drain's deadline). The next
pass whose inputs are the very same, before that time, takes the kept state instead of
running the step again: the same inputs give the same decision, and a decision that
did nothing does nothing again.

Steps that read more than their own model are never kept: a model placed or preempted
for (its step reads every node's room and every replica), one held back for another
(it reads that model's state and replicas), one whose replicas retire (they are taken
from the pass's preemption), and one scaling from a load whose clocks run. The shell
keeps one `QuietModels` a process; it holds no decision that was not worked out by a
full step from the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from catalog.domain import ModelSpec

from .types import Load, ModelState, ReplicaView


@dataclass(frozen=True)
class Quiet:
    """One step that did nothing: what it read, what it returned, and until when."""

    spec: ModelSpec
    # A list, compared with the pass's own in C (each view first by identity: the
    # snapshot reuses the views of unchanged rows).
    replicas: list[ReplicaView]
    state_in: ModelState
    load: Load | None
    state_out: ModelState
    since: datetime
    # The first moment one of its clocks could decide otherwise; None: none runs.
    until: datetime | None


class QuietModels:
    """Per model, its last step that did nothing, for the next pass to reuse while its
    inputs stay the same (see the module's docstring). Not thread-safe: one pass at a
    time uses it, as passes run one at a time."""

    def __init__(self) -> None:
        self._kept: dict[str, Quiet] = {}
        self._shared: object = None
        self._order: tuple[object, list[ModelSpec]] | None = None
        # What the last pass did: steps skipped and steps run (for tests and benchmarks).
        self.skipped = 0
        self.ran = 0

    def begin(self, shared: object) -> None:
        """Start a pass: what every step shares; when it changed, nothing kept holds."""
        if shared != self._shared:
            self._kept.clear()
            self._shared = shared
        self.skipped = self.ran = 0

    def get(
        self,
        spec: ModelSpec,
        replicas: list[ReplicaView],
        state: ModelState,
        load: Load | None,
        now: datetime,
    ) -> ModelState | None:
        """The state its step returned from the same inputs, while no clock of it ran out;
        None: run the step."""
        kept = self._kept.get(spec.name)
        if (
            kept is None
            or not (kept.since <= now and (kept.until is None or now < kept.until))
            or not (kept.spec is spec or kept.spec == spec)
            or not (kept.state_in is state or kept.state_in == state)
            or kept.load != load
            or kept.replicas != replicas
        ):
            return None
        self.skipped += 1
        return kept.state_out

    def put(self, quiet: Quiet | None, name: str) -> None:
        """Keep a step that did nothing (`quiet`), or forget the model's (None)."""
        self.ran += 1
        if quiet is None:
            self._kept.pop(name, None)
        else:
            self._kept[name] = quiet

    def ordered(self, key: object, order: Callable[[], list[ModelSpec]]) -> list[ModelSpec]:
        """The pass's order of models (`order()`), worked out again only when what it is
        worked out from (`key`) changed."""
        if self._order is None or self._order[0] != key:
            self._order = (key, order())
        return self._order[1]

    def trim(self, names: Collection[str]) -> None:
        """Forget models that are gone."""
        if len(self._kept) > len(names):
            for gone in self._kept.keys() - set(names):
                del self._kept[gone]
