"""What the console's pages show, each thing once and as it is: a node's badges, the
actions that apply to it, whether its GPUs' charts would show anything, and a model whose
requests a fallback answers. Pure: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .power import PDU_LABEL, RACK_LABEL, ZONE_LABEL
from .spread import ROOM_LABEL, ROW_LABEL, SITE_LABEL

# The labels the page shows as its location badges (site, room, row, zone, rack, PDU).
_LOCATION_LABELS = {
    SITE_LABEL: "site",
    ROOM_LABEL: "room",
    ROW_LABEL: "row",
    ZONE_LABEL: "zone",
    RACK_LABEL: "rack",
    PDU_LABEL: "pdu",
}
# What a GPU may report, any of which its charts draw.
GPU_READINGS = ("utilization", "memory_used_mb", "temp_c", "power_w")


def labels_shown(labels: Mapping[str, str], location: Mapping[str, str]) -> list[str]:
    """The node's labels as `key=value`, less those its location badges already say."""
    return [
        f"{key}={value}"
        for key, value in labels.items()
        if not (key in _LOCATION_LABELS and location.get(_LOCATION_LABELS[key]) == value.strip())
    ]


def installs_shown(engines: Mapping[str, str], installs: Iterable[dict]) -> list[dict]:
    """The engine installs worth a chip of their own: an engine installed at the version the
    node already reports is that engine's chip, not a second one."""
    return [
        i
        for i in installs
        if not (i.get("state") == "installed" and _reported(engines, i) == i.get("version"))
    ]


def _reported(engines: Mapping[str, str], install: dict) -> str | None:
    """The version the node reports of this install's engine; None where it reports none
    (or the install names no engine)."""
    engine = install.get("engine")
    return engines.get(engine) if engine is not None else None


def schedule_actions(*, cordoned: bool, draining: bool) -> tuple[str, ...]:
    """The schedule actions that change something: uncordon ends a cordon or a drain;
    cordon and drain only what is not already so."""
    if draining:
        return ("uncordon",)
    if cordoned:
        return ("uncordon", "drain")
    return ("cordon", "drain")


def gpu_charts_said(gpu_count: int, readings: Iterable[Mapping]) -> str:
    """Why the node page draws no GPU charts, in a sentence; "" when it draws them (some GPU
    reports some reading)."""
    if not gpu_count:
        return "It has no GPUs: no GPU charts."
    if any(r.get(k) is not None for r in readings for k in GPU_READINGS):
        return ""
    gpus = "its GPU reports" if gpu_count == 1 else f"none of its {gpu_count} GPUs reports"
    return (
        f"No GPU charts: {gpus} utilisation, memory, temperature or power "
        "(a simulated node, or one without NVIDIA's driver)."
    )


# The statuses of a model that wants replicas and may have none serving (a parked one waits
# for an operator, and is said as parked).
_WANTING = frozenset({"unplaceable", "waiting", "starting", "failing"})


def answering_fallback(
    status: str, ready: int, fallbacks: Iterable[str], ready_of: Mapping[str, int]
) -> str | None:
    """The fallback that answers a model's requests while it wants replicas and has none
    serving: its first with a replica serving; None when it has some or none answers.
    `ready` and `ready_of` count the replicas that serve, retiring ones included."""
    if status not in _WANTING or ready:
        return None
    return next((f for f in fallbacks if ready_of.get(f)), None)


def fallback_shown(
    status: str, reason: str, ready: int, fallbacks: Iterable[str], ready_of: Mapping[str, int]
) -> tuple[str, str]:
    """A model's status and sentence as the models table shows them: "fallback" (not an
    outage) while a fallback answers its requests, naming which and why; else as given."""
    serving = answering_fallback(status, ready, fallbacks, ready_of)
    if serving is None:
        return status, reason
    why = f"it is {status}" + (f": {reason}" if reason else "")
    return "fallback", f"its requests are answered by {serving} while {why}"
