"""A node's whole draw, as its BMC reads it at the power supplies' input.

RAPL sees the CPU packages and NVML each GPU; the board's management controller sees the
whole machine (GPUs, CPUs, memory, fans, disks and the supplies' own losses), which is
what a rack's breaker carries. It is asked through ``ipmitool dcmi power reading`` (DCMI's
Get Power Reading, over the kernel's /dev/ipmi0), at most every ``BMC_EVERY_S`` seconds,
since a BMC answers slowly and some hang: each run has a timeout.

A machine without ipmitool, without a BMC device, or whose agent may not open it gives no
figure, and is not asked again: none of that changes while the agent runs. A BMC that
answers without a reading (its power measurement deactivated, a DCMI error, 0 W) is asked
again later. Either way the figure is absent, never 0, and each reason is logged once. An
ask that runs past its timeout drops the figure before it (heartbeats carry none rather than
a stale one), and one that fails in a way not foreseen gives no figure and is asked again:
the reading's thread never dies of it.

Where the operator names the BMC's Redfish service (``llmgw agent --bmc-redfish``), the
same reader asks it instead, over the network (fleet/agent/redfish.py), on the same terms.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

# A BMC's reading is an average the BMC keeps itself; more often than this adds nothing.
BMC_EVERY_S = 30.0
BMC_TIMEOUT_S = 10.0
COMMAND = ("ipmitool", "dcmi", "power", "reading")
# Where the kernel's IPMI driver puts the BMC, in the order ipmitool opens them.
DEVICES = ("ipmi0", "ipmi/0", "ipmidev/0")
# The largest reading the protocol takes (fleet/protocol.py, Reading).
MAX_READING = 1_000_000.0

_INSTANT = re.compile(
    r"^\s*Instantaneous power reading\s*:\s*(-?\d+(?:\.\d+)?)\s*Watts", re.I | re.M
)
_STATE = re.compile(r"^\s*Power reading state is\s*:\s*(\w+)", re.I | re.M)
_DCMI_FAILED = re.compile(r"DCMI request failed because:\s*(.+?)\s*$", re.I | re.M)


class Answer(NamedTuple):
    """What one run of ipmitool said: its exit status and its two streams."""

    rc: int
    out: str
    err: str


Ipmi = Callable[[], Answer]


class Reading(NamedTuple):
    """The node's draw in watts, or None and why not in a sentence; `lasting` when asking
    again cannot change the answer while the agent runs."""

    watts: float | None
    why: str = ""
    lasting: bool = False


def run_ipmitool() -> Answer:
    """``ipmitool dcmi power reading``'s answer; raises OSError or TimeoutExpired."""
    done = subprocess.run(
        COMMAND,
        capture_output=True,
        text=True,
        timeout=BMC_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Answer(done.returncode, done.stdout, done.stderr)


def parse_reading(out: str) -> Reading:
    """The instantaneous reading in ipmitool's answer to ``dcmi power reading``: absent
    when its power measurement is deactivated (the figure is then not the node's draw), at
    0 W or less (no reading), past what the protocol takes, or not in the answer at all."""
    found = _INSTANT.search(out)
    if found is None:
        return Reading(None, "ipmitool's answer has no instantaneous power reading")
    state = _STATE.search(out)
    if state is not None and state.group(1).lower() != "activated":
        return Reading(None, f"the BMC's power reading is {state.group(1).lower()}")
    watts = float(found.group(1))
    if not math.isfinite(watts) or not 0 < watts <= MAX_READING:
        return Reading(None, f"the BMC reads {found.group(1)} W, which is no reading")
    return Reading(watts)


def failed_reading(answer: Answer) -> Reading:
    """Why ipmitool gave no reading when it exited with an error, from what it said."""
    said = f"{answer.err}\n{answer.out}"
    if dcmi := _DCMI_FAILED.search(said):
        return Reading(None, f"the BMC refuses DCMI's power reading: {dcmi.group(1)}")
    if "could not open device" in said.lower():
        return Reading(None, f"ipmitool cannot open the BMC: {_last_line(said)}", lasting=True)
    last = _last_line(said) or "nothing"
    return Reading(None, f"ipmitool exited with status {answer.rc} and said {last!r}")


def device_refusal(dev_root: Path, access: Callable[[Path, int], bool] = os.access) -> str:
    """Why this agent cannot reach a BMC through the kernel, in a sentence; "" when it can
    open one of its devices for reading and writing (as ipmitool must). Checked here
    rather than read from ipmitool's error, which names the errno of the last device it
    tried: "No such file or directory" for a /dev/ipmi0 it may not open."""
    found = [dev_root / d for d in DEVICES if (dev_root / d).exists()]
    if not found:
        return (
            f"there is no BMC device ({dev_root / DEVICES[0]}): the machine has no BMC, or the "
            "ipmi_si and ipmi_devintf kernel modules are not loaded"
        )
    if not any(access(p, os.R_OK | os.W_OK) for p in found):
        return f"the agent may not open {found[0]}: ipmitool needs root, or read and write on it"
    return ""


def _on_its_own_thread(read: Callable[[], object]) -> None:
    threading.Thread(target=read, name="llmgw-bmc", daemon=True).start()


class BmcReader:
    """The node's whole draw from its BMC, at most every ``every_s`` seconds (the last
    figure in between); None when there is none. ``ipmi`` runs ipmitool, ``which`` finds
    it, ``dev_root`` is /dev (or a test's), ``clock`` is monotonic seconds, ``spawn`` runs
    a reading for ``latest`` (on its own thread; a test's may run it at once). ``source``,
    when given, answers each ask in ipmitool's place (the BMC's Redfish service). Safe to
    call from any thread: one ask at a time, and no lock is held while it runs. An ask that
    has run past ``timeout_s`` drops the last figure."""

    def __init__(
        self,
        *,
        ipmi: Ipmi = run_ipmitool,
        which: Callable[[str], str | None] = shutil.which,
        dev_root: str | Path = "/dev",
        clock: Callable[[], float] = time.monotonic,
        every_s: float = BMC_EVERY_S,
        spawn: Callable[[Callable[[], object]], None] = _on_its_own_thread,
        source: Callable[[], Reading] | None = None,
        timeout_s: float = BMC_TIMEOUT_S,
    ) -> None:
        self._ipmi = ipmi
        self._source = source
        self._which = which
        self.dev_root = Path(dev_root)
        self._clock = clock
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._spawn = spawn
        self._lock = threading.Lock()
        self._last: float | None = None
        self._asked_at: float | None = None
        self._asking = False  # an ask (ipmitool, or Redfish) is under way
        self._off = False  # set for good once asking again cannot help
        self._said: set[str] = set()

    def latest(self) -> float | None:
        """The last figure, without waiting on the BMC: ipmitool may take BMC_TIMEOUT_S,
        and a heartbeat (or a power cap behind it) must not wait that long. A reading due
        is asked for through ``spawn``; until it answers, the figure before it stands."""
        with self._lock:
            now = self._clock()
            self._drop_stale(now)
            due = self._due(now)
        if due:
            self._spawn(self.read)
        with self._lock:
            return None if self._off else self._last

    def read(self) -> float | None:
        """The node's draw in watts, or None: not read, or not readable now. Asks the BMC
        when a reading is due and none is under way; otherwise the last figure."""
        with self._lock:
            now = self._clock()
            self._drop_stale(now)
            if not self._due(now):
                return None if self._off else self._last
            self._asked_at, self._asking = now, True
        try:
            reading = self._ask()
        except Exception as exc:  # a fault in reading must not end the reading's thread
            log.debug("Reading the BMC failed.", exc_info=True)
            reading = Reading(None, f"reading it failed ({type(exc).__name__}: {str(exc)[:200]})")
        finally:
            with self._lock:
                self._asking = False
        with self._lock:
            self._last = reading.watts
            self._off = self._off or reading.lasting
            self._say(reading)
        return reading.watts

    def _drop_stale(self, now: float) -> None:
        """Drop the last figure once the ask after it has run past ``timeout_s``: the node's
        draw may have changed since, and heartbeats must not carry it as now's. Called with
        the lock held."""
        asked_at = self._asked_at
        if not self._asking or self._last is None or asked_at is None:
            return
        if now - asked_at > self.timeout_s:
            self._last = None
            self._say(Reading(None, f"the BMC has not answered for more than {self.timeout_s:g} s"))

    def _due(self, now: float) -> bool:
        """Whether to ask the BMC now: it can answer, no one is asking it, and the last
        question was `every_s` ago or never. Called with the lock held."""
        if self._off or self._asking:
            return False
        return self._asked_at is None or now - self._asked_at >= self.every_s

    def _ask(self) -> Reading:
        if self._source is not None:
            return self._source()
        if self._which(COMMAND[0]) is None:
            return Reading(
                None, "ipmitool is not installed (its package is ipmitool)", lasting=True
            )
        if why := device_refusal(self.dev_root):
            return Reading(None, why, lasting=True)
        try:
            answer = self._ipmi()
        except subprocess.TimeoutExpired:
            return Reading(None, f"ipmitool did not answer in {BMC_TIMEOUT_S:g} s")
        except OSError as exc:
            return Reading(None, f"ipmitool cannot be run: {exc}", lasting=True)
        if answer.rc != 0:
            return failed_reading(answer)
        return parse_reading(answer.out)

    def _say(self, reading: Reading) -> None:
        """One log line per reason, the first time it is met, and one for the first
        reading: a BMC that keeps failing the same way must not fill the log."""
        if reading.watts is not None:
            key = "read"
            line = f"The BMC reads the node drawing {reading.watts:g} W; heartbeats carry it."
        elif reading.lasting:
            key = reading.why
            line = (
                f"The node's draw is not read from its BMC: {reading.why}. "
                "The agent asks again when it restarts."
            )
        else:
            key = reading.why
            line = (
                f"The BMC gave no reading of the node's draw: {reading.why}. "
                f"It is asked again every {self.every_s:g} s."
            )
        if key not in self._said:
            self._said.add(key)
            log.info("%s", line)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
