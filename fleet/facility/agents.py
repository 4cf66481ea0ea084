"""The nodes' own sensors as facility readings: each node's inlet air and GPUs (heat and
thermal throttling, docs/sensors.md), from its last heartbeat, counted in its rack. A
node's readings are as old as its last heartbeat.

Only the rack: the air a node takes in is its rack's, and a row, room, zone or PDU is not
made hot by one hot rack in it (it would take every rack there out). Their conditions come
from sources that name them (a cooling unit's alarm per row, from Prometheus)."""

from __future__ import annotations

from django.db.models.fields.json import KeyTransform

from ..domain.conditions import Readings, Sample, gpu_readings
from ..domain.power import RACK_LABEL
from ..models import Node


def _inlet(value: object) -> float | None:
    """A plausible inlet temperature, else None: absent, never zero."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < 100 else None


def agents_samples(*, stale_after: float) -> list[Sample]:
    """What every racked node's sensors last said, a sample of its rack each: one query,
    over the nodes that carry a rack label."""
    rows = (
        Node.objects.filter(labels__has_key=RACK_LABEL)
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
        if rack := str(labels.get(RACK_LABEL) or "").strip():
            out.append(Sample(("rack", rack), readings, at, stale_after))
    return out
