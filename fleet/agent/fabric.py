"""The node's GPU fabric as the machine itself says: NVLink, IMEX, InfiniBand, ECC, Xids.

Per GPU through NVML (``pynvml``): its place in an NVLink fabric (cluster UUID, clique,
registration state and health), its NVLinks (up, the GPU of this node at the other end,
error counters), its memory errors (ECC counts, pages and rows waiting to be repaired)
and the Xid errors NVML's events told of since the agent started. Per node: the IMEX
service (``nvidia-imex-ctl``, absent where not installed) and the InfiniBand ports
(sysfs). Each is read only where the machine has it: a call NVML does not support is
absent, never 0, and so is everything of a machine without NVML, IMEX or InfiniBand.

What comes out is the protocol's ``Fabric`` (fleet/protocol.py) as a dict, unknowns
left out, cut to ``FABRIC_BYTES``; the agent sends it at register and in a heartbeat
when it changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import shutil
import subprocess
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.protocol import MAX_FRAME_BYTES, NVLINK_ERRORS, XIDS_KEPT

log = logging.getLogger(__name__)

# Heartbeats come every few seconds; the fabric is read at most this often (an
# nvidia-imex-ctl run, a few hundred NVML calls).
FABRIC_EVERY_S = 10.0
# What a register may spend on the fabric, leaving the rest of the frame to the others.
FABRIC_BYTES = MAX_FRAME_BYTES // 4
IMEX_TIMEOUT_S = 5.0
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")
# NVML's data-link error counters by the protocol's names: replay_errors is
# NVML_NVLINK_ERROR_DL_REPLAY, crc_flit_errors NVML_NVLINK_ERROR_DL_CRC_FLIT, and so on.
NVLINK_COUNTERS = tuple(
    (key, f"NVML_NVLINK_ERROR_DL_{key.removesuffix('_errors').upper()}") for key in NVLINK_ERRORS
)
IB_COUNTERS = (
    ("link_downed", "link_downed"),
    ("symbol_errors", "symbol_error"),
    ("port_rcv_errors", "port_rcv_errors"),
)
# The health mask's fields that say the GPU's fabric is worse than it should be:
# (shift, the value meaning "yes").
_DEGRADED_BW = (0, 1)
_ROUTE_UNHEALTHY = (4, 1)

Imexctl = Callable[[list[str]], str]


def run_imex_ctl(args: list[str]) -> str:
    """``nvidia-imex-ctl ARGS``'s output; raises OSError (not installed), CalledProcessError
    or TimeoutExpired."""
    binary = shutil.which("nvidia-imex-ctl")
    if binary is None:
        raise FileNotFoundError("nvidia-imex-ctl is not installed")
    return subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=IMEX_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=True,
    ).stdout


def _ask(fn: Callable[..., Any], *args: Any) -> Any:
    """What an NVML call answers, or None where the GPU or driver does not say."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported, NoPermission, GpuIsLost, FunctionNotFound...
        return None


class FabricReader:
    """Reads the node's ``Fabric``; safe from any thread.

    ``nvml``: the ``pynvml`` module, or a stand-in shaped like it (tests/agent/
    fake_nvml.py); None reads no GPU (a node whose GPUs are simulated, or none).
    ``sys_root`` is /sys or a test's tree; ``etc_root`` holds nvidia-imex/nodes_config.cfg;
    ``imex`` runs nvidia-imex-ctl; ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        *,
        nvml: Any = None,
        sys_root: str | Path = "/sys",
        etc_root: str | Path = "/etc",
        imex: Imexctl | None = run_imex_ctl,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = FABRIC_EVERY_S,
    ) -> None:
        self.nvml = nvml
        self.sys_root = Path(sys_root)
        self.etc_root = Path(etc_root)
        self.imex = imex
        self._lock = threading.Lock()
        self._nvml_state: str | None = None  # None untried, "up" or "down"
        self._events: Any = None
        self._xids: dict[int, deque[int]] = {}
        self._clock, self.every_s = clock, every_s
        self._last: dict[str, Any] | None = None
        self._last_at = 0.0

    def read(self) -> dict[str, Any]:
        """The node's ``Fabric`` now, or as read within ``every_s``: unknowns left out,
        within FABRIC_BYTES."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last_at < self.every_s:
                return self._last
            fabric: dict[str, Any] = {}
            nvml = self._load_nvml()
            gpus = self._gpus(nvml) if nvml is not None else []
            if gpus:
                fabric["gpus"] = gpus
            imex = self._imex()
            if imex is not None:
                fabric["imex"] = imex
            ports = ib_ports(self.sys_root)
            if ports is not None:
                fabric["ib_ports"] = ports
            self._last, self._last_at = fit(fabric, FABRIC_BYTES), now
            return self._last

    def close(self) -> None:
        """Release NVML and its event set, if they were taken."""
        with self._lock:
            if self._nvml_state != "up":
                return
            if self._events is not None:
                with contextlib.suppress(Exception):
                    self.nvml.nvmlEventSetFree(self._events)
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self._nvml_state, self._events = None, None

    def _load_nvml(self) -> Any:
        if self._nvml_state != "up" and (self._nvml_state == "down" or self.nvml is None):
            return None
        if self._nvml_state == "up":
            return self.nvml
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            log.info("GPU fabric: NVML is not available (%s)", exc)
            self._nvml_state = "down"
            return None
        self._nvml_state = "up"
        self._events = self._xid_events()
        return self.nvml

    def _xid_events(self) -> Any:
        """An event set every GPU's critical Xids are registered with, or None."""
        nvml = self.nvml
        events = _ask(nvml.nvmlEventSetCreate)
        if events is None:
            return None
        registered = 0
        for i in range(_ask(nvml.nvmlDeviceGetCount) or 0):
            h = _ask(nvml.nvmlDeviceGetHandleByIndex, i)
            if h is None:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
            except Exception as exc:
                log.debug("GPU %d: no Xid events (%s)", i, exc)
                continue
            registered += 1
            self._xids.setdefault(i, deque(maxlen=XIDS_KEPT))
        if not registered:
            with contextlib.suppress(Exception):
                nvml.nvmlEventSetFree(events)
            return None
        return events

    def _poll_xids(self) -> None:
        """Take every Xid NVML queued since the last poll, without waiting."""
        nvml, events = self.nvml, self._events
        if events is None:
            return
        for _ in range(1000):  # a storm of events must not hold the heartbeat
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)
            except Exception:  # NVMLError_Timeout: nothing more queued
                return
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            index = _ask(nvml.nvmlDeviceGetIndex, data.device)
            if index is not None:
                self._xids.setdefault(index, deque(maxlen=XIDS_KEPT)).append(int(data.eventData))

    def _gpus(self, nvml: Any) -> list[dict[str, Any]]:
        self._poll_xids()
        handles = {}
        for i in range(_ask(nvml.nvmlDeviceGetCount) or 0):
            h = _ask(nvml.nvmlDeviceGetHandleByIndex, i)
            if h is not None:
                handles[i] = h
        # Each GPU's PCI bus id, to name the GPU of this node at the other end of a link.
        bus = {}
        for i, h in handles.items():
            pci = _ask(nvml.nvmlDeviceGetPciInfo, h)
            if pci is not None:
                bus[_bus_id(pci)] = i
        gpus = []
        for i, h in handles.items():
            report: dict[str, Any] = {"index": i}
            fabric = gpu_fabric(nvml, h)
            if fabric is not None:
                report["fabric"] = fabric
            links = nvlinks(nvml, h, bus)
            if links is not None:
                report["nvlinks"] = links
            ecc = gpu_ecc(nvml, h)
            if ecc is not None:
                report["ecc"] = ecc
            if self._xids.get(i):
                report["xids"] = list(self._xids[i])
            gpus.append(report)
        return gpus

    def _imex(self) -> dict[str, str] | None:
        if self.imex is None:
            return None
        return imex_state(self.imex, self.etc_root)


def gpu_fabric(nvml: Any, h: Any) -> dict[str, Any] | None:
    """The GPU's ``GpuFabric``; None where NVML has no fabric info or says it is not
    supported (a GPU on no NVLink fabric: nothing to say, rather than a state to judge)."""
    struct = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    if struct is None:
        return None
    info = struct()
    if _ask(nvml.nvmlDeviceGetGpuFabricInfoV, h, ctypes.byref(info)) is None:
        return None
    state = int(info.state)
    if state == nvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED or not 0 <= state < len(FABRIC_STATES):
        return None
    out: dict[str, Any] = {"state": FABRIC_STATES[state], "status": int(info.status)}
    raw = bytes(info.clusterUuid)
    if any(raw):
        out["cluster_uuid"] = str(uuid.UUID(bytes=raw))
    if state == nvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        out["clique_id"] = int(info.cliqueId)
    degraded = _health_degraded(int(getattr(info, "healthMask", 0)))
    if degraded is not None:
        out["health_degraded"] = degraded
    return out


def _health_degraded(mask: int) -> bool | None:
    """Whether the health mask says degraded bandwidth or an unhealthy route; None where it
    says neither way (0 in both fields: not supported)."""
    said = [(mask >> shift) & 0x3 for shift, _ in (_DEGRADED_BW, _ROUTE_UNHEALTHY)]
    if not any(said):
        return None
    return any(v == yes for v, (_, yes) in zip(said, (_DEGRADED_BW, _ROUTE_UNHEALTHY), strict=True))


def nvlinks(nvml: Any, h: Any, bus: dict[str, int]) -> list[dict[str, Any]] | None:
    """The GPU's NVLinks; None where NVML says nothing of any (no NVLink)."""
    links = []
    for link in range(min(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)), 64)):
        state = _ask(nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue  # no such link on this GPU
        entry: dict[str, Any] = {"link": link, "up": state == nvml.NVML_FEATURE_ENABLED}
        if entry["up"]:
            remote = _ask(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            peer = bus.get(_bus_id(remote)) if remote is not None else None
            if peer is not None:
                entry["peer_index"] = peer
        for key, name in NVLINK_COUNTERS:
            counter = getattr(nvml, name)
            value = _ask(
                lambda link=link, c=counter: nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
            )
            if value is not None:
                entry[key] = int(value)
        links.append(entry)
    return links or None


def gpu_ecc(nvml: Any, h: Any) -> dict[str, Any] | None:
    """The GPU's ``Ecc``; None where NVML says nothing of its memory errors."""
    out: dict[str, Any] = {}
    mode = _ask(nvml.nvmlDeviceGetEccMode, h)
    if mode is not None:
        out["enabled"] = mode[0] == nvml.NVML_FEATURE_ENABLED
    for key, kind, scope in (
        ("corrected_volatile", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
        ("uncorrected_volatile", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        ("corrected_aggregate", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
        ("uncorrected_aggregate", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
    ):
        k, s = getattr(nvml, kind), getattr(nvml, scope)
        value = _ask(nvml.nvmlDeviceGetTotalEccErrors, h, k, s)
        if value is not None:
            out[key] = int(value)
    pending = _ask(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if pending is not None:
        out["retired_pending"] = pending == nvml.NVML_FEATURE_ENABLED
    rows = _ask(nvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        out["remap_pending"], out["remap_failure"] = bool(rows[2]), bool(rows[3])
    return out or None


def _bus_id(pci: Any) -> str:
    raw = pci.busId
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return text.strip().lower()


def imex_state(run: Imexctl, etc_root: Path) -> dict[str, str] | None:
    """The IMEX service's ``Imex``; None where nvidia-imex-ctl is not installed.

    ``nvidia-imex-ctl -N -j`` answers with the domain's nodes and their state; the
    service is up when it answers and names itself up or ready. The domain is the
    nodes_config the service runs with, as a digest of its addresses: the nodes of one
    IMEX domain share it.
    """
    try:
        text = run(["-N", "-j"])
    except FileNotFoundError:
        return None
    except Exception as exc:  # installed but not answering: the service is down
        log.debug("nvidia-imex-ctl did not answer (%s)", exc)
        out = {"state": "down"}
    else:
        out = {"state": "up" if _imex_up(text) else "down"}
    domain = imex_domain(etc_root / "nvidia-imex" / "nodes_config.cfg")
    if domain:
        out["domain"] = domain
    return out


def _imex_up(text: str) -> bool:
    try:
        said = json.loads(text)
    except ValueError:
        return False
    if not isinstance(said, dict):
        return False
    status = next(
        (said[k] for k in ("status", "state", "domainStatus", "domain_status") if k in said), None
    )
    return str(status).strip().upper() in ("UP", "READY", "HEALTHY")


def imex_domain(path: Path) -> str:
    """``imex-`` and 12 hex digits of the nodes_config's addresses, sorted; "" without one."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    addresses = sorted({ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")})
    if not addresses:
        return ""
    return "imex-" + hashlib.sha256("\n".join(addresses).encode()).hexdigest()[:12]


def ib_ports(sys_root: Path) -> list[dict[str, Any]] | None:
    """Every InfiniBand port under ``sys_root``/class/infiniband; None without any."""
    ports = []
    for dev in sorted((sys_root / "class" / "infiniband").glob("*")):
        for port_dir in sorted((dev / "ports").glob("*")):
            try:
                port = int(port_dir.name)
            except ValueError:
                continue
            entry: dict[str, Any] = {"device": dev.name[:255], "port": port}
            # "4: ACTIVE": the words after the number.
            state = _read(port_dir / "state").partition(":")[2].strip()
            if state:
                entry["state"] = state[:255]
            rate = _number(_read(port_dir / "rate").split(" ", 1)[0])  # "400 Gb/sec (4X NDR)"
            if rate is not None:
                entry["rate_gbps"] = rate
            for key, name in IB_COUNTERS:
                value = _number(_read(port_dir / "counters" / name))
                if value is not None:
                    entry[key] = int(value)
            ports.append(entry)
    return ports or None


def fit(fabric: dict[str, Any], budget: int) -> dict[str, Any]:
    """``fabric`` within ``budget`` bytes of JSON: first the links' error counters are left
    unknown, then the links themselves; a node with that many GPUs and links is rare,
    and what placement needs (each GPU's fabric and memory errors) stays."""
    if _size(fabric) <= budget:
        return fabric
    for drop in (_counters_dropped, _links_dropped):
        fabric = {**fabric, "gpus": [drop(g) for g in fabric.get("gpus", [])]}
        if _size(fabric) <= budget:
            break
    log.warning("the GPU fabric report is over %d bytes; its NVLink details are left out", budget)
    return fabric


def _counters_dropped(gpu: dict[str, Any]) -> dict[str, Any]:
    if "nvlinks" not in gpu:
        return gpu
    keep = ("link", "up", "peer_index")
    return {**gpu, "nvlinks": [{k: v for k, v in ln.items() if k in keep} for ln in gpu["nvlinks"]]}


def _links_dropped(gpu: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in gpu.items() if k != "nvlinks"}


def _size(fabric: dict[str, Any]) -> int:
    return len(json.dumps(fabric, separators=(",", ":")))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < 1e18 else None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


class SimulatedFabric:
    """The fabric ``--simulate-fabric DOMAIN:CLIQUE`` stands for: every simulated GPU joined
    to clique CLIQUE of an NVLink domain named DOMAIN, neighbours paired by an NVLink, and
    IMEX up for the domain; so that nodes given the same DOMAIN:CLIQUE share a clique."""

    def __init__(self, spec: str, gpu_count: int) -> None:
        self.report = simulated_fabric(spec, gpu_count)

    def read(self) -> dict[str, Any]:
        return self.report

    def close(self) -> None:
        pass


def parse_fabric_spec(spec: str) -> tuple[str, int]:
    """``nvl72-a:1`` into ``("nvl72-a", 1)``; ValueError on anything else."""
    name, sep, clique = spec.strip().rpartition(":")
    if not sep or not name or not clique.isdigit():
        raise ValueError(f"{spec!r} is not a fabric: expected DOMAIN:CLIQUE such as nvl72-a:1")
    return name, int(clique)


def simulated_fabric(spec: str, gpu_count: int) -> dict[str, Any]:
    """See SimulatedFabric; the domain's cluster UUID is derived from its name."""
    name, clique = parse_fabric_spec(spec)
    cluster = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.fabric.llmgw"))
    gpus = []
    for i in range(gpu_count):
        peer = i ^ 1
        link: dict[str, Any] = {"link": 0, "up": True, **_zero_counters()}
        if peer < gpu_count:
            link["peer_index"] = peer
        gpus.append(
            {
                "index": i,
                "fabric": {
                    "cluster_uuid": cluster,
                    "clique_id": clique,
                    "state": "completed",
                    "status": 0,
                    "health_degraded": False,
                },
                "nvlinks": [link],
                "ecc": {
                    "enabled": True,
                    **dict.fromkeys(
                        (
                            "corrected_volatile",
                            "uncorrected_volatile",
                            "corrected_aggregate",
                            "uncorrected_aggregate",
                        ),
                        0,
                    ),
                    "remap_pending": False,
                    "remap_failure": False,
                },
            }
        )
    return {"gpus": gpus, "imex": {"state": "up", "domain": name}}


def _zero_counters() -> dict[str, int]:
    return {key: 0 for key, _ in NVLINK_COUNTERS}
