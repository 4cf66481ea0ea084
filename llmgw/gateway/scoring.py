"""How loaded a replica is for the next request: what this gateway has in flight to it,
and what its engine says it runs and queues (issue 36: the engines' own signals).

Several gateway processes share an engine, and other clients may reach it: a replica this
gateway sends little to may still have requests queued, or its KV cache nearly full, and
then it is not the least loaded. Its agent reads the engine's metrics every few seconds
and the gateway reads them from the control plane (`State.readings`), so a reading is
seconds old; what this gateway has sent since counts from its own in-flight count. A
replica whose engine said nothing is judged by the in-flight count alone, as before.
Pure: no clock, no I/O; `State.pick` calls it, `prefixes.choose` compares its answers.
"""

from __future__ import annotations

from fleet.domain.readings import Reading
from llmgw.core.config import Routing

# A KV cache this full admits a new request only as others finish (vLLM queues it, or
# preempts one): the replica counts as holding twice its requests. LLMGW_ROUTING_KV_FULL's
# default, said once in llmgw.core.config.
KV_FULL = Routing.kv_full


def replica_load(
    inflight: int,
    weight: int,
    reading: Reading | None,
    ours_then: int | None = None,
    kv_full: float = KV_FULL,
) -> float:
    """The load a request adds itself to on this replica, per unit of its weight.

    The requests it holds are what this gateway has in flight to it now, and the others'
    (other gateways', other clients'): what its engine said it runs and queues, less what
    this gateway had in flight to it when the reading was taken (`ours_then`; not known,
    the larger of the two is taken). Each request queued in the engine counts once more (a
    new one waits behind it, where a running one only shares the batch); a KV cache at or
    past `kv_full` doubles the lot. With no reading, the requests in flight here and this
    one, as routing by in-flight counts was."""
    held = inflight
    penalty = 0
    if reading is not None:
        if ours_then is None:
            held = max(inflight, reading.queued)
        else:
            held = inflight + max(reading.queued - ours_then, 0)
        penalty = reading.waiting or 0
        if reading.kv_cache is not None and reading.kv_cache >= kv_full:
            penalty += held + 1
    return (held + 1 + penalty) / max(weight, 1)


def reading_words(reading: Reading | None) -> str:
    """What an engine said, for routing's reasons: "its engine runs 4, queues 2, KV 93 %
    full"; empty when it said nothing."""
    if reading is None:
        return ""
    parts = []
    if reading.running is not None:
        parts.append(f"runs {reading.running}")
    if reading.waiting is not None:
        parts.append(f"queues {reading.waiting}")
    if reading.kv_cache is not None:
        parts.append(f"KV {reading.kv_cache:.0%} full")
    return "its engine " + ", ".join(parts) if parts else ""
