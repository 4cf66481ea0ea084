"""What the agents' websocket refuses, per process: a frame budget per connection, and a
count of refusals by reason on `/metrics`, logged with a count rather than per attempt."""

from __future__ import annotations

import enum
import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, generate_latest

from llmgw.core.secrets import digest

log = logging.getLogger("llmgw.agents")

REGISTRY = CollectorRegistry(auto_describe=True)
REFUSED = Counter(
    "llmgw_agent_refused",
    "Agent connections, registrations and reports refused, by why: unknown_credential, "
    "node_has_credential (a join token for a node that has its own), wrong_node, forgotten, "
    "join_rate, handshakes (an address over its handshake budget), frames (a connection "
    "over its frame budget), shard_* (a shard a node reported that was not placed on it, "
    "or cannot be believed: docs/nodes.md).",
    ["reason"],
    registry=REGISTRY,
)
FRAMES_DROPPED = Counter(
    "llmgw_agent_frames_dropped",
    "Frames from agents dropped unread because their connection was over its budget.",
    registry=REGISTRY,
)

# A refusal of one kind is logged at most this often; the lines between are counted.
LOG_EVERY_S = 10.0
_said: dict[str, tuple[float, int]] = {}
_said_lock = threading.Lock()


def refused(reason: str, sentence: str = "", *, count: int = 1) -> None:
    """Count a refusal (or `count` of them), and log the sentence unless one of its kind
    was logged in the last LOG_EVERY_S seconds (then the next line says how many there
    were meanwhile). Without a sentence it is only counted: its caller logs it."""
    REFUSED.labels(reason).inc(count)
    if not sentence:
        return
    now = time.monotonic()
    with _said_lock:
        last, quiet = _said.get(reason, (-LOG_EVERY_S, 0))
        if now - last < LOG_EVERY_S:
            _said[reason] = (last, quiet + 1)
            return
        _said[reason] = (now, 0)
    more = f" ({quiet} more like it in the last {LOG_EVERY_S:.0f} s)" if quiet else ""
    log.warning("%s%s", sentence, more)


class _Counted:
    """The families that counted something: nothing is said of a process that refused none."""

    def collect(self):
        return (
            f
            for f in REGISTRY.collect()
            if any(s.name.endswith("_total") and s.value for s in f.samples)
        )


def agents_text() -> str:
    """These series in Prometheus' text format, for `/metrics`."""
    return generate_latest(_Counted()).decode()


class FrameBudget:
    """A token bucket of frames for one connection: `per_second` on average, bursts of
    BURST_SECONDS' worth. A frame over budget is dropped unread; once a connection has
    dropped another burst's worth without slowing down, it is to be closed.

    A well-behaved agent sends a heartbeat and an engine_load every few seconds and a
    status per shard change: a small fraction of the default 20 a second.
    """

    BURST_SECONDS = 5.0

    class Verdict(enum.Enum):
        OK = "ok"
        DROP = "drop"
        CLOSE = "close"

    OK, DROP, CLOSE = Verdict.OK, Verdict.DROP, Verdict.CLOSE

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self.burst = per_second * self.BURST_SECONDS
        self.tokens = self.burst
        self.dropped = 0
        self.at: float | None = None

    def take(self, now: float) -> Verdict:
        """Spend one frame at monotonic time `now`."""
        if self.at is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            # Paid back once it keeps to its budget again.
            self.dropped = max(0, self.dropped - 1)
            return self.OK
        self.dropped += 1
        FRAMES_DROPPED.inc()
        return self.CLOSE if self.dropped >= self.burst else self.DROP

    def sentence(self, node_id: str | None) -> str:
        return (
            f"closed agent {node_id or '(not registered)'}'s connection: it kept sending over "
            f"{self.per_second:g} frames a second (LLMGW_AGENT_FRAMES_PER_SECOND) and "
            f"{self.dropped} were dropped unread"
        )


class PenaltyBox:
    """Bearers whose connection was closed for flooding, kept out for PENALTY_S: their
    reconnections are accepted and closed at once, before any database lookup, instead of
    being let flood again. Keyed by the bearer's digest; at most MAX_HELD are kept."""

    PENALTY_S = 10.0
    MAX_HELD = 10_000

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    @staticmethod
    def key(secret: str) -> str:
        return digest(secret)

    def hold(self, key: str, now: float) -> None:
        if len(self._until) >= self.MAX_HELD:
            self._until = {k: t for k, t in self._until.items() if t > now}
        self._until[key] = now + self.PENALTY_S

    def holds(self, key: str, now: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= now:
            del self._until[key]
            return False
        return True


PENALTY = PenaltyBox()


class AddressGate:
    """Failed handshakes per remote address: once an address has failed `most` in a minute
    (LLMGW_AGENT_HANDSHAKE_FAILURES_PER_MINUTE), its handshakes are refused before any
    database lookup until that minute is over, so one machine trying credentials cannot
    keep the database busy. A bearer that authenticated as a node in this process is never
    kept out: behind a proxy every agent shares the proxy's address, and another's storm
    must not lock them out. Keys are bounded: at most MAX_KEPT addresses and bearers."""

    WINDOW_S = 60.0
    MAX_KEPT = 100_000

    def __init__(self) -> None:
        # address -> (when its minute began, failures in it)
        self._failed: dict[str, tuple[float, int]] = {}
        self._trusted: dict[str, None] = {}

    def holds(self, address: str, bearer_key: str, most: int, now: float) -> bool:
        """Whether a handshake from `address` with this bearer (its digest) is refused."""
        if bearer_key in self._trusted:
            return False
        began, failures = self._failed.get(address, (now, 0))
        if now - began >= self.WINDOW_S:
            self._failed.pop(address, None)
            return False
        return failures >= most

    def failed(self, address: str, now: float) -> None:
        began, failures = self._failed.get(address, (now, 0))
        if now - began >= self.WINDOW_S:
            began, failures = now, 0
        if len(self._failed) >= self.MAX_KEPT and address not in self._failed:
            self._failed = {a: v for a, v in self._failed.items() if now - v[0] < self.WINDOW_S}
        self._failed[address] = (began, failures + 1)

    def trusted(self, bearer_key: str) -> None:
        """This bearer is a node's own credential that worked: never held by its address."""
        if len(self._trusted) >= self.MAX_KEPT:
            self._trusted.clear()
        self._trusted[bearer_key] = None


GATE = AddressGate()
