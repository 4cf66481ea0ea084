"""The nodes' own sensors as facility readings: each node's inlet air and GPUs (heat and
thermal throttling, docs/sensors.md), from its last heartbeat, counted in every domain its
location labels put it in. A node's readings are as old as its last heartbeat."""

from __future__ import annotations

from django.db.models.fields.json import KeyTransform

from ..domain.conditions import ROOM_LABEL, ROW_LABEL, Readings, Sample, domains_of, gpu_readings
from ..domain.power import PDU_LABEL, RACK_LABEL, ZONE_LABEL
from ..models import Node

LOCATION = [RACK_LABEL, PDU_LABEL, ZONE_LABEL, ROW_LABEL, ROOM_LABEL]


def _inlet(value: object) -> float | None:
    """A plausible inlet temperature, else None: absent, never zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < 100 else None


def agents_samples(*, stale_after: float) -> list[Sample]:
    """What every located node's sensors last said, one sample per domain it is in: one
    query, over the nodes that carry a location label."""
    rows = (
        Node.objects.filter(labels__has_any_keys=LOCATION)
        .annotate(
            gpu_sensors=KeyTransform("gpus", "load"), inlet=KeyTransform("inlet_temp_c", "load")
        )
        .order_by()
        .values_list("labels", "gpu_sensors", "inlet", "last_seen")
    )
    out = []
    for labels, gpus, inlet, seen in rows:
        if not isinstance(labels, dict):
            continue
        gpu = gpu_readings(gpus if isinstance(gpus, list) else ())
        readings = Readings(_inlet(inlet), None, gpu.gpus, gpu.throttled, gpu.hottest_gpu_c)
        if readings.empty:
            continue
        at = seen.timestamp()
        out.extend(Sample(d, readings, at, stale_after) for d in domains_of(labels))
    return out
