"""A stand-in for ``pynvml`` (nvidia-ml-py) and the kernel's InfiniBand sysfs, for the
agent's fabric discovery (fleet/agent/fabric.py).

`FakeNvml` has pynvml's function names, takes and returns pynvml's own structures
(c_nvmlGpuFabricInfoV_t filled through ``byref``, nvmlPciInfo_t, c_nvmlEventData_t) and
raises pynvml's own exception classes (NVMLError_NotSupported, NVMLError_Timeout): every
constant and class is pynvml's, only the calls answer from `FakeGpu`s. `nvl72_tray` gives
one compute tray of a GB200 NVL72 rack (4 GPUs, 18 NVLinks each to the NVSwitch trays);
`ib_tree` writes /sys/class/infiniband as the kernel does.
"""

from __future__ import annotations

import ctypes
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


def _error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # pynvml makes it the code's own subclass


@dataclass
class FakeLink:
    up: bool = True
    # The PCI bus id at the other end: another GPU's, an NVSwitch's, or None (not said).
    remote_bus: str | None = None
    counters: dict[int, int] = field(default_factory=dict)  # NVML_NVLINK_ERROR_DL_* -> count


@dataclass
class FakeGpu:
    """One GPU as NVML would answer for it; None for a call it does not support."""

    bus_id: str
    cluster: uuid.UUID | None = None
    clique: int = 0
    fabric_state: int | None = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    fabric_status: int = pynvml.NVML_SUCCESS
    health_mask: int = 0
    links: list[FakeLink] | None = None
    ecc_enabled: bool | None = True
    # (NVML_MEMORY_ERROR_TYPE_*, NVML_*_ECC) -> count; a GPU without ECC counts has None.
    ecc: dict[tuple[int, int], int] | None = field(default_factory=dict)
    retired_pending: bool | None = None  # Hopper and Blackwell remap rows instead
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    xid_events: bool = True
    # Power management, in milliwatts as NVML says it; None: the card does not support it.
    power_default_mw: int | None = 700_000
    power_limits_mw: tuple[int, int] = (200_000, 700_000)  # the least and most it allows
    power_limit_mw: int = 700_000
    may_set_power: bool = True  # False: not root (NVML_ERROR_NO_PERMISSION)


class FakeNvml:
    """pynvml, answering for `gpus`. Every NVML name a caller may look up is pynvml's."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.inits = self.shutdowns = 0
        self.calls = 0
        self._queued: deque[tuple[int, int]] = deque()
        self._registered: set[int] = set()

    def __getattr__(self, name: str):
        # Constants, structures and exceptions: pynvml's own. An NVML function not
        # faked here is one this driver does not have.
        if (
            name.startswith("nvml")
            and callable(getattr(pynvml, name, None))
            and name[4:5].isupper()
        ):
            raise AttributeError(f"FakeNvml has no {name}")
        return getattr(pynvml, name)

    # What a test does to the machine.
    def xid(self, index: int, code: int) -> None:
        """The driver raising Xid ``code`` on GPU ``index``."""
        if index in self._registered:
            self._queued.append((index, code))

    # pynvml's calls.
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _error(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return index  # a handle is opaque to callers; NVML gives pointers

    def nvmlDeviceGetIndex(self, handle) -> int:
        if isinstance(handle, int):
            return handle
        return ctypes.cast(handle, ctypes.c_void_p).value - 1  # an event's device pointer

    def _gpu(self, handle: int) -> FakeGpu:
        self.calls += 1
        return self.gpus[handle]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: int) -> int:
        gpu = self._gpu(handle)
        if gpu.power_default_mw is None:
            raise _error(NOT_SUPPORTED)
        return gpu.power_default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: int) -> list[int]:
        gpu = self._gpu(handle)
        if gpu.power_default_mw is None:
            raise _error(NOT_SUPPORTED)
        return list(gpu.power_limits_mw)  # pynvml answers [min, max]

    def nvmlDeviceSetPowerManagementLimit(self, handle: int, limit: int) -> None:
        gpu = self._gpu(handle)
        if gpu.power_default_mw is None:
            raise _error(NOT_SUPPORTED)
        if not gpu.may_set_power:
            raise _error(pynvml.NVML_ERROR_NO_PERMISSION)
        low, high = gpu.power_limits_mw
        if not low <= limit <= high:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu.power_limit_mw = limit  # pynvml answers None

    def nvmlDeviceGetPciInfo(self, handle: int) -> pynvml.nvmlPciInfo_t:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu(handle).bus_id.encode()
        return info

    def nvmlDeviceGetGpuFabricInfoV(self, handle: int, info) -> int:
        gpu = self._gpu(handle)
        if gpu.fabric_state is None:
            raise _error(NOT_SUPPORTED)
        struct = info._obj if isinstance(info, type(ctypes.byref(ctypes.c_int()))) else info
        if gpu.cluster is not None:
            ctypes.memmove(struct.clusterUuid, gpu.cluster.bytes, 16)
        struct.status = gpu.fabric_status
        struct.cliqueId = gpu.clique
        struct.state = gpu.fabric_state
        struct.healthMask = gpu.health_mask
        return pynvml.NVML_SUCCESS

    def _link(self, handle: int, link: int) -> FakeLink:
        links = self._gpu(handle).links
        if links is None:
            raise _error(NOT_SUPPORTED)
        if not 0 <= link < len(links):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        up = self._link(handle, link).up
        return pynvml.NVML_FEATURE_ENABLED if up else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> pynvml.nvmlPciInfo_t:
        remote = self._link(handle, link).remote_bus
        if remote is None:
            raise _error(NOT_SUPPORTED)
        info = pynvml.nvmlPciInfo_t()
        info.busId = remote.encode()
        return info

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        counters = self._link(handle, link).counters
        if counter not in counters:
            raise _error(NOT_SUPPORTED)
        return counters[counter]

    def nvmlDeviceGetEccMode(self, handle: int) -> list[int]:
        enabled = self._gpu(handle).ecc_enabled
        if enabled is None:
            raise _error(NOT_SUPPORTED)
        mode = pynvml.NVML_FEATURE_ENABLED if enabled else pynvml.NVML_FEATURE_DISABLED
        return [mode, mode]

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:
        ecc = self._gpu(handle).ecc
        if ecc is None:
            raise _error(NOT_SUPPORTED)
        return ecc.get((error_type, counter_type), 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        pending = self._gpu(handle).retired_pending
        if pending is None:
            raise _error(NOT_SUPPORTED)
        return pynvml.NVML_FEATURE_ENABLED if pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        rows = self._gpu(handle).remapped
        if rows is None:
            raise _error(NOT_SUPPORTED)
        return rows

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlEventSetFree(self, event_set) -> None:
        return None

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set) -> None:
        if not self._gpu(handle).xid_events:
            raise _error(NOT_SUPPORTED)
        self._registered.add(handle)

    def nvmlEventSetWait_v2(self, event_set, timeoutms: int) -> pynvml.c_nvmlEventData_t:
        if not self._queued:
            raise _error(pynvml.NVML_ERROR_TIMEOUT)
        index, code = self._queued.popleft()
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = code
        # A device pointer, as NVML's; nvmlDeviceGetIndex reads the fake's index back.
        data.device = ctypes.cast(ctypes.c_void_p(index + 1), type(data.device))
        return data


# An NVL72 rack: 18 compute trays of 4 GPUs, each GPU with 18 NVLinks to the switch trays.
TRAYS, GPUS_PER_TRAY, LINKS = 18, 4, 18
RACK_CLUSTER = uuid.UUID("7f3c2a10-5b1e-4c8e-9d2f-0a1b2c3d4e5f")


def nvl72_tray(
    tray: int,
    *,
    clique: int | None = None,
    uncorrected_ecc_gpu: int | None = None,
    link_down: tuple[int, int] | None = None,
) -> FakeNvml:
    """Tray ``tray`` (0-17) of the rack: trays 0-8 in clique 1, 9-17 in clique 2 unless
    ``clique`` says; ``uncorrected_ecc_gpu`` has 2 uncorrected volatile ECC errors;
    ``link_down`` (gpu, link) is a link down."""
    clique = clique if clique is not None else (1 if tray < TRAYS // 2 else 2)
    gpus = []
    for g in range(GPUS_PER_TRAY):
        links = [
            FakeLink(
                up=(g, n) != link_down,
                remote_bus=f"00000000:{0x80 + n:02x}:00.0",  # an NVSwitch, not a GPU here
                counters={c: 0 for c in range(4)},
            )
            for n in range(LINKS)
        ]
        ecc = {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 3,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 12,
        }
        if g == uncorrected_ecc_gpu:
            ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)] = 2
            ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC)] = 2
        gpus.append(
            FakeGpu(
                bus_id=f"00000000:{0x10 + g:02x}:00.0",
                cluster=RACK_CLUSTER,
                clique=clique,
                # Degraded bandwidth: false; route unhealthy: false.
                health_mask=(2 << 0) | (2 << 4),
                links=links,
                ecc=ecc,
            )
        )
    return FakeNvml(gpus)


def ib_tree(root: Path, ports: dict[tuple[str, int], dict[str, str]]) -> Path:
    """Write /sys/class/infiniband under ``root``: per (device, port) its files by name
    (``state``, ``rate``, ``counters/link_downed``...). Returns ``root``."""
    for (device, port), files in ports.items():
        base = root / "class" / "infiniband" / device / "ports" / str(port)
        for name, body in files.items():
            path = base / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body + "\n")
    return root


def ib_port(state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)", **counters: int):
    """One port's files as the kernel writes them."""
    files = {"state": state, "rate": rate, "phys_state": "5: LinkUp"}
    for name in ("link_downed", "symbol_error", "port_rcv_errors", "port_xmit_data"):
        files[f"counters/{name}"] = str(counters.get(name, 0))
    return files
