"""Heat and power, as the node's own hardware reports them.

GPUs through NVML, or ``nvidia-smi`` where NVML cannot be loaded; the CPU
package and the board's inlet air from hwmon, which is what lm_sensors
reads, with nothing to install; the CPU packages' power from RAPL's energy
counters; the whole node's draw from its BMC (fleet/agent/bmc.py). A
sensor the machine does not have is ``None`` and left out of the
heartbeat, never zero: a VM has none of these, and must not look like a
machine running at 0 °C on no power. (The seed's ``discovery/sensors.go``.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.agent.bmc import BmcReader

log = logging.getLogger(__name__)

# Heartbeats come more often than temperatures change, and a run of
# nvidia-smi costs a few hundred milliseconds.
SENSOR_EVERY_S = 10.0
SMI_TIMEOUT_S = 5.0
MIB = 1024 * 1024
# The largest reading the protocol takes (fleet/protocol.py, Reading).
MAX_READING = 1_000_000.0

# What holds a card's clocks down, as NVML's clock event reason bits. Idle,
# application clocks and sync boost are left out: they are not the card
# being held back.
THROTTLE_BITS = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "power_brake"),
)

# hwmon drivers whose sensors are the CPU's own.
_CPU_DRIVERS = frozenset({"coretemp", "k10temp", "zenpower", "cpu_thermal"})

# nvidia-smi fields, in the order asked. temperature.memory is last so it can
# be dropped: a field the driver does not know fails the whole query.
_SMI_FIELDS = (
    "index",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "clocks_throttle_reasons.active",
    "utilization.gpu",
    "memory.used",
    "temperature.memory",
)
_SMI_ABSENT = frozenset({"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]"})

Smi = Callable[[str], str]


@dataclass(frozen=True)
class GpuSensor:
    """One card's heat, power, use and what is holding it back; None is unknown."""

    index: int
    temp_c: float | None = None
    memory_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    # Its default power limit and the least it allows (NVML only): what the control plane
    # compares power_limit_w with to keep a power cap (docs/facility.md, "Power capping").
    power_default_w: float | None = None
    power_min_w: float | None = None
    # None when the reasons could not be read; empty when the card runs free.
    throttle: tuple[str, ...] | None = None
    utilization: float | None = None
    memory_used_mb: int | None = None

    def to_message(self) -> dict[str, Any]:
        """The card's entry in the heartbeat's ``load.gpus``, unknowns left out."""
        msg: dict[str, Any] = {"index": self.index}
        for key in (
            "temp_c",
            "memory_temp_c",
            "power_w",
            "power_limit_w",
            "power_default_w",
            "power_min_w",
            "utilization",
        ):
            value = getattr(self, key)
            if value is not None:
                msg[key] = value
        if self.memory_used_mb is not None:
            msg["memory_used_mb"] = self.memory_used_mb
        if self.throttle is not None:
            msg["throttle"] = list(self.throttle)
        return msg


@dataclass(frozen=True)
class Sensors:
    """What the machine's sensors say; None is not measured."""

    # The CPU package, or the hottest core where there is no package reading.
    cpu_temp_c: float | None = None
    # The CPU packages' draw: the change in their energy counters over time.
    cpu_power_w: float | None = None
    # The air coming in, where the board has a sensor it calls that. Most do
    # not, and a CPU's temperature is no substitute: it follows the load.
    inlet_temp_c: float | None = None
    # The whole node's input power, as its BMC reads it (fleet/agent/bmc.py).
    node_power_w: float | None = None
    gpus: tuple[GpuSensor, ...] = field(default_factory=tuple)

    def to_load(self) -> dict[str, Any]:
        """The sensor fields of the heartbeat's ``load``, unknowns left out."""
        load: dict[str, Any] = {}
        for key in ("cpu_temp_c", "cpu_power_w", "inlet_temp_c", "node_power_w"):
            value = getattr(self, key)
            if value is not None:
                load[key] = value
        if self.gpus:
            load["gpus"] = [g.to_message() for g in self.gpus]
        return load


def run_smi(fields: str) -> str:
    """``nvidia-smi``'s CSV answer for ``fields``; raises OSError or CalledProcessError."""
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=SMI_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=True,
    )
    return done.stdout


class SensorSampler:
    """Reads :class:`Sensors`, at most every ``every_s`` seconds.

    ``sys_root`` is /sys, or a test's copy of it. ``nvml`` is the ``pynvml``
    module (imported on first use when not given), ``smi`` runs nvidia-smi,
    ``clock`` is monotonic seconds. ``read_gpus`` is off for a node whose GPUs
    are simulated: the real cards here are not the ones it registered. The
    first sample has no CPU power, which needs two readings of the counters.
    ``sim_power`` is where simulated GPUs keep the power limit they are held to:
    the sim engines read it (``llmgw sim-engine --power-file``). ``bmc`` reads
    the whole node's draw (None: not read); a sample takes its last figure and never
    waits on ipmitool, so a hung BMC holds up neither a heartbeat nor a power cap. Safe
    to call from any thread.
    """

    def __init__(
        self,
        *,
        sys_root: str | Path = "/sys",
        read_gpus: bool = True,
        sim_power: Path | None = None,
        nvml: Any = None,
        smi: Smi = run_smi,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = SENSOR_EVERY_S,
        bmc: BmcReader | None = None,
    ) -> None:
        self.sys_root = Path(sys_root)
        self.read_gpus = read_gpus
        self.sim_power = sim_power
        self._nvml = nvml
        self._nvml_state: str | None = None  # None untried, "up" or "down"
        self._smi = smi
        self._smi_memory_temp = True  # cleared once the driver is seen not to know it
        self._clock = clock
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: Sensors | None = None
        self._last_at = 0.0
        self._prev_energy: dict[str, int] | None = None
        self._prev_energy_at = 0.0
        self.bmc = bmc

    def sample(self) -> Sensors:
        """The sensors now, or the last reading when it is recent."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last_at < self.every_s:
                return self._last
            cpu, inlet = self._hwmon()
            out = Sensors(
                cpu_temp_c=cpu,
                cpu_power_w=self._rapl(now),
                inlet_temp_c=inlet,
                node_power_w=self.bmc.latest() if self.bmc is not None else None,
                gpus=tuple(self._gpus()) if self.read_gpus else (),
            )
            self._last, self._last_at = out, now
            return out

    def power_cap(self, share: float | None) -> list[str]:
        """Hold each GPU to `share` of its default power limit (None: back to its default),
        within the limits the card allows, through NVML's nvmlDeviceSetPowerManagementLimit
        (root, or the driver's persistence of settings, is needed). Per GPU, a sentence of
        what was done or why not. Simulated GPUs keep the share in `sim_power`, for their
        sim engines to run as slower as it makes them; without it, nothing is done."""
        with self._lock:
            if not self.read_gpus:
                return sim_power_cap(self.sim_power, share) if self.sim_power else []
            nvml = self._load_nvml()
            if nvml is None:
                return ["no GPU's power limit was set: NVML could not be loaded"]
            try:
                count = nvml.nvmlDeviceGetCount()
            except Exception as exc:  # noqa: BLE001 - an NVML error: said
                return [f"no GPU's power limit was set: NVML could not count the GPUs: {exc}"]
            return [_power_cap_one(nvml, i, share) for i in range(count)]

    def close(self) -> None:
        """Release NVML, if it was loaded."""
        with self._lock:
            if self._nvml_state == "up":
                with contextlib.suppress(Exception):
                    self._nvml.nvmlShutdown()
            self._nvml_state = None

    def _hwmon(self) -> tuple[float | None, float | None]:
        """The CPU's temperature and the inlet's, from every hwmon device."""
        pkg = core = inlet = None
        for dev in sorted(self.sys_root.glob("class/hwmon/hwmon*")):
            name = _read(dev / "name")
            cpu_driver = name in _CPU_DRIVERS
            for path in dev.glob("temp*_input"):
                try:
                    c = _positive(float(_read(path)) / 1000)
                except ValueError:
                    continue
                if c is None:
                    continue  # a sensor that is not wired reads 0 or less
                label = _read(path.with_name(path.name.removesuffix("_input") + "_label")).lower()
                if cpu_driver and (label.startswith("package") or label in ("tctl", "tdie")):
                    pkg = _hotter(pkg, c)
                elif cpu_driver or label == "cpu":
                    # A core, or a board's own reading of the CPU (Dell's SMM).
                    core = _hotter(core, c)
                elif label == "systin" or any(w in label for w in ("inlet", "ambient", "intake")):
                    inlet = _hotter(inlet, c)
        # The package rather than a hotter core: it is what the chip itself
        # reports as its temperature.
        return (pkg if pkg is not None else core), inlet

    def _rapl(self, now: float) -> float | None:
        """The CPU packages' power since the last reading, in watts.

        Package domains only: intel-rapl:0:0 and the like (dram, core) are
        parts of a package, and adding them would count its energy twice.
        """
        energy: dict[str, int] = {}
        wrap: dict[str, int] = {}
        for dom in self.sys_root.glob("class/powercap/intel-rapl:*"):
            if dom.name.count(":") != 1:
                continue
            try:
                energy[dom.name] = int(_read(dom / "energy_uj"))
            except ValueError:
                continue  # root-only on kernels since 5.10
            with contextlib.suppress(ValueError):
                wrap[dom.name] = int(_read(dom / "max_energy_range_uj"))
        prev, prev_at = self._prev_energy, self._prev_energy_at
        self._prev_energy, self._prev_energy_at = energy, now
        dt = now - prev_at
        if prev is None or not energy or dt <= 0:
            return None
        joules = 0.0
        for name, e in energy.items():
            if name not in prev:
                return None  # a domain appeared: no fair difference this time
            p = prev[name]
            if e < p:  # the counter wrapped at max_energy_range_uj
                if name not in wrap:
                    return None
                e += wrap[name]
            joules += (e - p) / 1e6
        return _positive(round(joules / dt, 2))

    def _gpus(self) -> list[GpuSensor]:
        nvml = self._load_nvml()
        if nvml is not None:
            return self._nvml_gpus(nvml)
        return self._smi_gpus()

    def _load_nvml(self) -> Any:
        if self._nvml_state == "up":
            return self._nvml
        if self._nvml_state == "down":
            return None
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, ...
            log.info("GPU sensors: NVML is not available (%s); trying nvidia-smi", exc)
            self._nvml_state = "down"
            return None
        # Kept loaded: initialising NVML can take seconds on a card without
        # persistence mode, and this runs every ten.
        self._nvml_state = "up"
        return self._nvml

    def _nvml_gpus(self, nvml: Any) -> list[GpuSensor]:
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            log.warning("GPU sensors: NVML cannot count the GPUs (%s)", exc)
            return []
        gpus = []
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
            except Exception as exc:
                log.debug("GPU %d: no NVML handle (%s)", i, exc)
                continue
            gpus.append(_nvml_gpu(nvml, i, h))
        return gpus

    def _smi_gpus(self) -> list[GpuSensor]:
        fields = list(_SMI_FIELDS if self._smi_memory_temp else _SMI_FIELDS[:-1])
        try:
            text = self._smi(",".join(fields))
        except Exception as first:
            if not self._smi_memory_temp:
                log.debug("GPU sensors: nvidia-smi failed (%s)", first)
                return []
            fields.pop()
            try:
                text = self._smi(",".join(fields))
            except Exception as exc:
                log.debug("GPU sensors: nvidia-smi failed (%s)", exc)
                return []
            # The driver does not know the memory temperature; stop asking.
            self._smi_memory_temp = False
        return parse_smi(text, fields)


def parse_smi(text: str, fields: list[str]) -> list[GpuSensor]:
    """Cards from nvidia-smi's ``csv,noheader,nounits`` answer to ``fields``.

    "[N/A]", "[Not Supported]" and empty cells are absent; a line without a
    card index (an error about one card) is skipped.
    """
    gpus = []
    for line in text.splitlines():
        cells = dict(zip(fields, (c.strip() for c in line.split(",")), strict=False))
        try:
            index = int(cells.get("index", ""))
        except ValueError:
            continue
        throttle_cell = cells.get("clocks_throttle_reasons.active", "")
        try:
            throttle: tuple[str, ...] | None = _throttle_names(int(throttle_cell, 16))
        except ValueError:
            throttle = None
        used = _smi_number(cells.get("memory.used"))
        util = _smi_number(cells.get("utilization.gpu"))
        gpus.append(
            GpuSensor(
                index=index,
                temp_c=_positive(_smi_number(cells.get("temperature.gpu"))),
                memory_temp_c=_positive(_smi_number(cells.get("temperature.memory"))),
                power_w=_positive(_smi_number(cells.get("power.draw"))),
                power_limit_w=_positive(_smi_number(cells.get("enforced.power.limit"))),
                throttle=throttle,
                utilization=util if util is not None and util <= 100 else None,
                memory_used_mb=int(used) if used is not None else None,
            )
        )
    return gpus


def _nvml_gpu(nvml: Any, index: int, h: Any) -> GpuSensor:
    """One card through NVML; a figure the card or driver does not give is None."""

    def ask(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # NVMLError_NotSupported, NoPermission, GpuIsLost, ...
            return None

    temp = ask(lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
    power_mw = ask(lambda: nvml.nvmlDeviceGetPowerUsage(h))
    limit_mw = ask(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
    default_mw = ask(lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(h))
    limits_mw = ask(lambda: nvml.nvmlDeviceGetPowerManagementLimitConstraints(h))
    util = ask(lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    mem = ask(lambda: nvml.nvmlDeviceGetMemoryInfo(h))
    # Renamed "clock event reasons" in newer drivers; the bits are the same.
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    reasons = ask(lambda: reasons_fn(h)) if reasons_fn else None
    return GpuSensor(
        index=index,
        temp_c=_positive(temp),
        memory_temp_c=_positive(ask(lambda: _memory_temp(nvml, h))),
        power_w=_positive(power_mw / 1000 if power_mw is not None else None),
        power_limit_w=_watts(limit_mw),
        power_default_w=_watts(default_mw),
        power_min_w=_watts(limits_mw[0] if limits_mw else None),
        throttle=_throttle_names(int(reasons)) if reasons is not None else None,
        utilization=float(util.gpu) if util is not None else None,
        memory_used_mb=int(mem.used) // MIB if mem is not None else None,
    )


def _watts(milliwatts: Any) -> float | None:
    return _positive(milliwatts / 1000) if isinstance(milliwatts, int | float) else None


_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _memory_temp(nvml: Any, h: Any) -> float | None:
    # HBM temperature has no getter of its own: it is a field value, and
    # cards without it answer NOT_SUPPORTED or 0.
    (value,) = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_MEMORY_TEMP])
    if value.nvmlReturn != 0 or not 0 <= value.valueType < len(_VALUE_FIELDS):
        return None
    return float(getattr(value.value, _VALUE_FIELDS[value.valueType]))


def _throttle_names(bits: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_BITS if bits & bit)


def _smi_number(cell: str | None) -> float | None:
    if cell is None or cell.lower() in _SMI_ABSENT:
        return None
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= MAX_READING else None


def _positive(value: float | None) -> float | None:
    # A temperature or a power of zero is a sensor that is not there; one
    # past what the protocol takes would get the whole heartbeat refused.
    if value is None or not math.isfinite(value) or not 0 < value <= MAX_READING:
        return None
    return float(value)


def _hotter(current: float | None, value: float) -> float:
    return value if current is None else max(current, value)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def sim_power_path(state_dir: Path) -> Path:
    """Where a node's simulated GPUs keep the power limit they are held to."""
    return state_dir / "sim-power"


def sim_power_cap(path: Path, share: float | None) -> list[str]:
    """Hold simulated GPUs to `share` of their default power limit (None: their default):
    written where their sim engines read it, at most once a second."""
    try:
        if share is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(f"{share:g}\n")
            tmp.replace(path)  # a sim engine never reads half a file
    except OSError as exc:
        return [f"the simulated GPUs' power limit was not set: {exc}"]
    if share is None:
        return ["simulated GPUs: power limit back to their default"]
    return [f"simulated GPUs: power limit set to {share:.0%} of their default"]


def _power_cap_one(nvml: Any, index: int, share: float | None) -> str:
    """One GPU held to `share` of its default power limit, clamped to what it allows."""
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
        default_mw = nvml.nvmlDeviceGetPowerManagementDefaultLimit(h)
        low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    except Exception as exc:  # noqa: BLE001 - an NVML error (not supported): said
        return f"GPU {index}: its power limit cannot be read: {exc}"
    want = default_mw if share is None else round(default_mw * share)
    limit_mw = int(min(max(want, low_mw), high_mw))
    try:
        nvml.nvmlDeviceSetPowerManagementLimit(h, limit_mw)
    except Exception as exc:  # noqa: BLE001 - no permission, not supported: said
        return f"GPU {index}: its power limit was not set to {limit_mw / 1000:g} W: {exc}"
    if share is None:
        return f"GPU {index}: power limit back to its default, {limit_mw / 1000:g} W"
    clamp = f" (the card's least is {low_mw / 1000:g} W)" if want < low_mw else ""
    return (
        f"GPU {index}: power limit set to {limit_mw / 1000:g} W, {share:.0%} of its default "
        f"{default_mw / 1000:g} W{clamp}"
    )
