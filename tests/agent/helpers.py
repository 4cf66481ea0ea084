"""What the agent tests share: a fake engine, a bound on waits, free ports, fake sensors."""

import socket
import sys
from pathlib import Path
from types import SimpleNamespace

FAKE_ENGINE = [sys.executable, str(Path(__file__).with_name("fake_engine.py"))]
# A bound on waits so a broken agent fails the test instead of hanging it.
PATIENCE_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def put(root: Path, rel: str, body: str) -> None:
    """Write ``body`` (and a newline, as sysfs and procfs do) to ``root/rel``."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + "\n")


class FakeNVML:
    """Stands in for the ``pynvml`` module over a list of cards.

    A card is a dict: ``temp``, ``mem_temp``, ``power_mw``, ``limit_mw``,
    ``default_mw``, ``limits_mw`` (the least and most it allows), ``reasons`` (clock event bits), ``util`` (percent), ``used`` (bytes) and
    ``procs`` (the pids of its compute processes);
    a key left out is a figure the card does not support.
    """

    NVML_TEMPERATURE_GPU = 0
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_SUCCESS, NVML_ERROR_NOT_SUPPORTED = 0, 3
    NVML_VALUE_TYPE_UNSIGNED_INT = 1

    class NVMLError(Exception):
        pass

    def __init__(self, cards=(), init_error=None):
        self.cards = list(cards)
        self.init_error = init_error
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.cards[i]

    def _get(self, card, key):
        if key not in card:
            raise self.NVMLError("Not Supported")
        return card[key]

    def nvmlDeviceGetTemperature(self, card, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._get(card, "temp")

    def nvmlDeviceGetPowerUsage(self, card):
        return self._get(card, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, card):
        return self._get(card, "limit_mw")

    def nvmlDeviceGetPowerManagementDefaultLimit(self, card):
        return self._get(card, "default_mw")

    def nvmlDeviceGetPowerManagementLimitConstraints(self, card):
        return list(self._get(card, "limits_mw"))  # pynvml answers [min, max]

    def nvmlDeviceGetUtilizationRates(self, card):
        return SimpleNamespace(gpu=self._get(card, "util"), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, card):
        return [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in self._get(card, "procs")]

    def nvmlDeviceGetMemoryInfo(self, card):
        return SimpleNamespace(used=self._get(card, "used"), total=80 << 30, free=0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, card):
        return self._get(card, "reasons")

    def nvmlDeviceGetFieldValues(self, card, field_ids):
        assert field_ids == [self.NVML_FI_DEV_MEMORY_TEMP]
        if "mem_temp" not in card:
            return [SimpleNamespace(nvmlReturn=self.NVML_ERROR_NOT_SUPPORTED, valueType=0, value=0)]
        value = SimpleNamespace(uiVal=card["mem_temp"])
        return [
            SimpleNamespace(
                nvmlReturn=self.NVML_SUCCESS,
                valueType=self.NVML_VALUE_TYPE_UNSIGNED_INT,
                value=value,
            )
        ]
