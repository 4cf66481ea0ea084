"""GPUs that processes the agent does not know hold, for ``register.gpus[].unknown_processes``.

An engine of an agent whose state folder was lost, or someone's own job, holds
a GPU's memory as much as a shard does: the control plane must not place a
replica there. NVML lists each GPU's compute processes; on a GPU one of this
agent's shards was given they are taken to be that shard's (NVML's pids are the
host's, which inside a container are not the agent's own), and on any other GPU
every one is unknown. Where NVML cannot tell (no driver, simulated GPUs) nothing
is reported: absent is unknown, never "free".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)


def nvml_compute_pids(nvml: Any = None) -> dict[int, list[int]] | None:
    """Per GPU index, the pids of the compute processes NVML lists on it; None when NVML
    cannot say for every GPU. ``nvml``: the ``pynvml`` module, or a stand-in."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]  # the parameter, given the module
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        found = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            found[i] = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return found
    except Exception as exc:
        log.info("cannot list the GPUs' processes (%s); none are reported", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def unknown_processes(
    pids: Mapping[int, Sequence[int]] | None, given: Collection[int]
) -> dict[int, int]:
    """Per GPU NVML could read: how many compute processes on it are none of this agent's
    shards' (those on a GPU a shard was given are taken to be the shard's)."""
    if pids is None:
        return {}
    return {i: 0 if i in given else len(set(found)) for i, found in pids.items()}


def gpu_holders(simulated: bool, given: Collection[int], nvml: Any = None) -> dict[int, int]:
    """``unknown_processes`` for each GPU of the node, as ``register`` reports it; nothing for
    simulated GPUs (the real cards' processes are not theirs) or where NVML cannot tell."""
    if simulated:
        return {}
    found = unknown_processes(nvml_compute_pids(nvml), given)
    for index, count in sorted(found.items()):
        if count:
            log.warning(
                "GPU %d runs %d processes this agent did not start; the control plane "
                "places nothing there until this agent registers again without them",
                index,
                count,
            )
    return found
