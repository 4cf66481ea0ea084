"""What the reconciler reads besides the fleet and the catalog: the capacity quota policy
and the benchmark measurements (domain.md: a change reaches the next pass and every dry
run). Each is kept per process and read again only when its revision, one small query,
says it changed; when the store fails, the last good value is kept (a database hiccup must
not drop every guarantee and limit at once)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError

from catalog.selectors import measurements_load, measurements_revision
from llmgw.core.errors import cause
from tenancy.quota import Policy
from tenancy.selectors import quota_policy_load, quota_policy_revision

from ..domain.types import Measured

log = logging.getLogger("llmgw.reconciler")


class Revised:
    """A value read again when its revision moved since the last good read."""

    def __init__(self, name: str, revision: Callable[[], int], read: Callable[[], Any], empty: Any):
        self.name, self.revision, self.read, self.empty = name, revision, read, empty
        # (revision, value) of the last good read, replaced as one (a pass and a dry run may
        # ask at once); None: never read.
        self._last: tuple[int, Any] | None = None
        self._failing = False

    def get(self) -> Any:
        last = self._last
        try:
            revision = self.revision()
            if last is None or last[0] != revision:
                # Read after the revision: a change committed in between is read again next time.
                self._last = last = (revision, self.read())
        except DatabaseError as exc:
            if not self._failing:
                # The cause in the sentence, no traceback: a pass the outage fails logs its
                # own, once (llmgw.core.outage), and this would be a second for the same cause.
                log.warning("could not read %s (%s); keeping the last ones", self.name, cause(exc))
            self._failing = True
        else:
            if self._failing:
                log.info("reading %s again", self.name)
            self._failing = False
        return last[1] if last is not None else self.empty

    def clear(self) -> None:
        self._last, self._failing = None, False


def measured_load() -> dict[tuple[str, str], Measured]:
    """Every usable benchmark result, keyed (model, profile)."""
    return {
        k: Measured(c, t, w or None, s or None)
        for k, (c, t, w, s) in measurements_load().items()
        if c > 0 and t > 0
    }


POLICY = Revised("capacity quotas", quota_policy_revision, quota_policy_load, Policy())
MEASUREMENTS = Revised("benchmark results", measurements_revision, measured_load, {})
