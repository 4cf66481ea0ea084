"""Writes of a model's last failure that come from agents rather than from a pass."""

from __future__ import annotations

from ..models import ModelState


def failure_log_attach(*, model: str, replica_id: str, detail: str) -> bool:
    """Add the engine's log lines from a stopped shard's `detail` to the model's last
    failure, when that failure is this replica's and carries no log yet; True if it did.

    A replica the control plane gave up on (its startup timed out) is stopped by its
    agent, which then says what the engine logged meanwhile: that is why it never
    answered, and the failure the pass recorded had only its own sentence.
    """
    lines = detail.strip().splitlines()[1:]
    if not lines:
        return False
    mine = ModelState.objects.filter(pk=model, last_failure__replica=replica_id)
    kept = mine.values_list("last_failure", flat=True).first()
    if not isinstance(kept, dict) or "\n" in str(kept.get("detail") or ""):
        return False
    joined = "\n".join([str(kept.get("detail") or ""), *lines]).strip()
    return mine.update(last_failure={**kept, "detail": joined}) == 1
