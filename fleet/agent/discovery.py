"""What the machine has, and how loaded it is.

Everything here is read from the machine itself: /proc, the state
directory's filesystem, the engines on PATH and the GPUs through NVML;
sensors.py reads heat and power, shard_use.py each engine's use.
The ``--simulate-*`` flags replace what they name, so one machine can play
many nodes. A figure that cannot be read is ``None`` and is left out of the
messages: the control plane reads a zero as a machine that has nothing, and
an absent figure as one that constrains nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.agent import AGENT_VERSION
from fleet.agent.engines import engine_binaries
from fleet.agent.sensors import SensorSampler
from fleet.agent.shard_use import ShardUseSampler

log = logging.getLogger(__name__)

MIB = 1024 * 1024
GIB = 1024 * MIB

# vllm --version imports torch, which takes seconds on a cold cache.
PROBE_TIMEOUT_S = 10.0

# Simulated GPU classes and the real card each stands for, so that the
# control plane's class derivation gives back the class that was asked for.
KNOWN_GPUS: dict[str, tuple[str, int]] = {
    "h100-80g": ("NVIDIA H100 80GB HBM3", 81559),
    "a100-80g": ("NVIDIA A100-SXM4-80GB", 81920),
    "rtx4090-24g": ("NVIDIA GeForce RTX 4090", 24564),
    "h200-141g": ("NVIDIA H200", 143771),
    "l40s-48g": ("NVIDIA L40S", 46068),
}
_SIM_CLASS = re.compile(r"^(?:(\d+)x)?([a-z0-9]+(?:-[a-z0-9]+)*)-(\d+)g$")


@dataclass(frozen=True)
class GPU:
    """One GPU as the register message describes it."""

    index: int
    uuid: str
    name: str
    memory_total_mb: int

    def to_message(self) -> dict[str, Any]:
        """The GPU's entry in ``register.gpus``."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total_mb": self.memory_total_mb,
        }


def parse_gpu_spec(spec: str) -> list[tuple[int, str]]:
    """Parse ``8xh100-80g,2xa100-80g`` into ``[(8, "h100-80g"), (2, "a100-80g")]``.

    A part without a count is one GPU. Raises ValueError on anything else.
    """
    parts = []
    for raw in spec.split(","):
        part = raw.strip().lower()
        if not part:
            continue
        m = _SIM_CLASS.match(part)
        if m is None:
            raise ValueError(
                f"{raw.strip()!r} is not a GPU spec: expected COUNTxCLASS such as 8xh100-80g"
            )
        count = int(m.group(1) or 1)
        if count < 1:
            raise ValueError(f"{raw.strip()!r} asks for no GPUs")
        parts.append((count, f"{m.group(2)}-{m.group(3)}g"))
    if not parts:
        raise ValueError("an empty GPU spec")
    return parts


def simulated_gpus(spec: str, node_id: str) -> list[GPU]:
    """The GPUs ``--simulate-gpus SPEC`` stands for on node ``node_id``.

    Known classes get the real card's name and memory; others are named
    ``NVIDIA <MODEL>`` with the class's GiB as MiB, which the control plane
    derives back to the same class.
    """
    gpus: list[GPU] = []
    for count, cls in parse_gpu_spec(spec):
        if cls in KNOWN_GPUS:
            name, memory_mb = KNOWN_GPUS[cls]
        else:
            model, _, memory = cls.rpartition("-")
            name, memory_mb = f"NVIDIA {model.upper()}", int(memory[:-1]) * 1024
        for _ in range(count):
            i = len(gpus)
            gpus.append(
                GPU(index=i, uuid=f"SIM-{node_id}-{i}", name=name, memory_total_mb=memory_mb)
            )
    return gpus


_nvml_failure_logged = False


def nvml_gpus() -> list[GPU]:
    """The GPUs NVML sees; none when there is no driver or NVML fails.

    Any NVML error means no GPUs, logged once: a CPU node has no driver, and
    that must not stop it from serving CPU models.
    """
    global _nvml_failure_logged
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
        if not _nvml_failure_logged:
            log.info("no GPUs: NVML is not available here (%s)", exc)
            _nvml_failure_logged = True
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(
                GPU(
                    index=i,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_total_mb=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                )
            )
        return gpus
    except Exception as exc:
        if not _nvml_failure_logged:
            log.warning("no GPUs: NVML failed while listing them (%s)", exc)
            _nvml_failure_logged = True
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # Older NVML bindings return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def probe_engines(
    timeout_s: float = PROBE_TIMEOUT_S, binaries: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Installed engines and their versions; ``sim`` is always there.

    Each engine's program is the one the agent was given (``--llama-server``)
    or else its name on PATH (fleet.agent.engines.engine_binaries). One whose
    version cannot be read is still installed, with the version ``unknown``.
    """
    engines: dict[str, str] = {}
    for engine, binary in (engine_binaries() if binaries is None else binaries).items():
        path = shutil.which(binary)
        if path is None:
            if os.sep in binary:
                log.warning("%s is not an executable file; no %s here", binary, engine)
            continue
        engines[engine] = _probe_version(path, timeout_s)
    engines["sim"] = AGENT_VERSION
    return engines


def run_version(program: str | os.PathLike[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``PROGRAM --version``, its output kept, no input given; raises OSError when it does not
    run and TimeoutExpired when it does not end within ``timeout_s``."""
    return subprocess.run(
        [str(program), "--version"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def _probe_version(path: str, timeout_s: float) -> str:
    try:
        done = run_version(path, timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s --version did not answer: %s", path, exc)
        return "unknown"
    return parse_version_output(done.stdout + "\n" + done.stderr) or "unknown"


def parse_version_output(text: str) -> str | None:
    """The version in a ``--version`` output.

    llama-server prints ``version: 4589 (abc123)`` among other lines; vllm
    prints the bare version.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        m = re.match(r"^version:\s*(.+)$", line, re.IGNORECASE)
        if m:
            return m.group(1).strip()
    return lines[0] if lines else None


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo as bytes per field; empty where it cannot be read."""
    fields: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if not parts or not parts[0].isdigit():
            continue
        unit = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
        fields[name.strip()] = int(parts[0]) * unit
    return fields


def real_cpu_count() -> int | None:
    """The CPUs this process may run on (its affinity, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):
        return os.cpu_count()


class Machine:
    """What the node has: GPUs, engines, memory, CPUs and disk.

    GPUs and engines are found once, at start; memory, CPUs and disk are
    read each time they are asked for, since a VM can be resized while it
    runs and disk fills up.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        gpus: list[GPU] | None = None,
        memory_gb: float | None = None,
        cpus: int | None = None,
        disk_gb: float | None = None,
        engines: dict[str, str] | None = None,
        meminfo_path: str = "/proc/meminfo",
    ) -> None:
        self.state_dir = state_dir
        self.hostname = socket.gethostname()
        self.gpus = nvml_gpus() if gpus is None else gpus
        # Given GPUs stand for cards this machine may not have: its real
        # cards' sensors would describe others than the ones registered.
        self.gpus_simulated = gpus is not None
        self.engines = probe_engines() if engines is None else engines
        self.memory_simulated = memory_gb is not None
        self._memory_gb = memory_gb
        self._cpus = cpus
        self._disk_gb = disk_gb
        self._meminfo_path = meminfo_path

    def memory_total_mb(self) -> int | None:
        """Total memory in MiB, or None when unknown."""
        if self._memory_gb is not None:
            return int(self._memory_gb * 1024)
        total = read_meminfo(self._meminfo_path).get("MemTotal")
        return total // MIB if total else None

    def cpu_count(self) -> int | None:
        """CPUs this node offers, or None when unknown."""
        return self._cpus if self._cpus is not None else real_cpu_count()

    def disk(self) -> dict[str, float] | None:
        """Free and total GiB where the agent keeps its state, or None."""
        if self._disk_gb is not None:
            return {"free_gb": float(self._disk_gb), "total_gb": float(self._disk_gb)}
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            usage = shutil.disk_usage(self.state_dir)
        except OSError as exc:
            log.warning("cannot read disk usage of %s: %s", self.state_dir, exc)
            return None
        return {"free_gb": round(usage.free / GIB, 1), "total_gb": round(usage.total / GIB, 1)}


@dataclass(frozen=True)
class CpuTimes:
    """The aggregate ``cpu`` line of /proc/stat: busy and total jiffies."""

    idle: int
    total: int


def read_cpu_times(path: str = "/proc/stat") -> CpuTimes | None:
    """The machine's CPU times so far, or None when /proc/stat is unreadable."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal; guest time is already
    # counted in user, so the guest columns are left out of the total.
    values = [int(v) for v in first[1:9]]
    if len(values) < 4:
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return CpuTimes(idle=idle, total=sum(values))


class LoadSampler:
    """Samples the node's load for heartbeats.

    ``sample_load()`` returns the heartbeat's ``load`` object with unknown
    figures left out: the machine's CPU and memory, each engine's use
    (``shards``) and, when given a sensor sampler, heat and power. It may
    run in a worker thread, away from the event loop: nvidia-smi can take
    a moment.
    """

    def __init__(
        self,
        *,
        include_memory: bool = True,
        stat_path: str = "/proc/stat",
        meminfo_path: str = "/proc/meminfo",
        sensors: SensorSampler | None = None,
        shard_use: ShardUseSampler | None = None,
    ) -> None:
        # With simulated memory the real machine's figures would describe a
        # different total than the one registered, so they are left unknown.
        self.include_memory = include_memory
        self._stat_path = stat_path
        self._meminfo_path = meminfo_path
        self._last_cpu: CpuTimes | None = None
        self.sensors = sensors
        self.shard_use = shard_use if shard_use is not None else ShardUseSampler()
        # A sample left running by a session that ended may overlap the next.
        self._lock = threading.Lock()
        self._failures_logged: set[str] = set()

    def sample_load(self, process_groups: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The current load; ``cpu_percent`` and ``cpu_cores`` need a previous sample.

        ``process_groups`` maps each running shard to its engine's pid, which
        is also its process group.
        """
        with self._lock:
            load: dict[str, Any] = {}
            now = read_cpu_times(self._stat_path)
            if now is not None and self._last_cpu is not None:
                d_total = now.total - self._last_cpu.total
                d_idle = now.idle - self._last_cpu.idle
                if d_total > 0:
                    load["cpu_percent"] = round(100.0 * (d_total - d_idle) / d_total, 1)
            self._last_cpu = now
            with contextlib.suppress(OSError):
                load["load1"], load["load5"], load["load15"] = os.getloadavg()
            if self.include_memory:
                mem = read_meminfo(self._meminfo_path)
                if "MemTotal" in mem and "MemAvailable" in mem:
                    load["memory_available_bytes"] = mem["MemAvailable"]
                    load["memory_used_bytes"] = mem["MemTotal"] - mem["MemAvailable"]
            # A bug reading one of these must cost its figures, not the
            # heartbeat that says the node is alive.
            try:
                shards = self.shard_use.sample(process_groups or {})
            except Exception:
                self._failed("each engine's use")
            else:
                if shards:
                    load["shards"] = shards
            if self.sensors is not None:
                try:
                    load.update(self.sensors.sample().to_load())
                except Exception:
                    self._failed("the sensors")
            return load

    def _failed(self, what: str) -> None:
        if what not in self._failures_logged:
            self._failures_logged.add(what)
            log.exception("cannot read %s; heartbeats go without them", what)

    def close(self) -> None:
        """Release what the sensors hold (NVML)."""
        if self.sensors is not None:
            self.sensors.close()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def advertise_address(server_host: str, server_port: int) -> str:
    """The address engines are reached at by the control plane and gateway.

    Loopback when the server is on loopback; else the local address of a UDP
    socket "connected" to the server, which is the interface the kernel
    would route to it by (no packet is sent).
    """
    if is_loopback(server_host):
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(server_host, server_port, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return str(s.getsockname()[0])
    except (OSError, IndexError) as exc:
        log.warning(
            "cannot tell which address reaches %s (%s); advertising 127.0.0.1", server_host, exc
        )
        return "127.0.0.1"
