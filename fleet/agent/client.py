"""The agent's websocket session with the control plane.

One connection at a time: ``register``, wait for ``registered``, then
heartbeats and engine load on a timer, shard status as it changes, and the
control plane's ``start_shard`` / ``stop_shard`` as they come,
``engine_log`` answered with the engine's last log lines, and ``load_adapter`` /
``unload_adapter`` answered with an ``adapter_status``. Any
disconnect is followed by a reconnect with backoff; engines keep running
meanwhile and are listed in the next ``register``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from fleet.agent import AGENT_VERSION
from fleet.agent.bmc import BmcReader
from fleet.agent.credentials import Credentials
from fleet.agent.discovery import LoadSampler, Machine
from fleet.agent.gpu_holders import gpu_holders
from fleet.agent.redfish import RedfishConfig, RedfishSource
from fleet.agent.sensors import SensorSampler, sim_power_path
from fleet.agent.supervisor import Supervisor
from fleet.agent.upgrade import UpgradeError, Upgrader, restart_argv
from mirror.domain.platforms import this_platform

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 30.0
FLUSH_ON_EXIT_S = 2.0


class RegisterRefused(Exception):
    """The control plane answered ``register`` with an ``error``."""


@dataclass
class AgentSettings:
    """How this agent reaches the control plane and what it calls itself."""

    ws_url: str
    # The join token, then the node's own credential once the control plane issued it.
    credentials: Credentials
    node_id: str
    advertise_addr: str
    labels: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = 5.0
    # Whether heartbeats carry the node's whole draw from its BMC (`--no-bmc` turns it off).
    read_bmc: bool = True
    # The BMC's Redfish service to read it from (`--bmc-redfish`); None: ipmitool's DCMI.
    bmc_redfish: RedfishConfig | None = None
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0


def bmc_reader(settings: AgentSettings, machine: Machine) -> BmcReader | None:
    """What reads the node's whole draw from its BMC; none when turned off, or when the
    node's GPUs or memory are simulated: the BMC here reads the real machine, which is not
    the node registered (and one machine may play several). It asks the BMC's Redfish
    service where the operator named one, else ipmitool's DCMI."""
    if not settings.read_bmc or machine.gpus_simulated or machine.memory_simulated:
        return None
    if settings.bmc_redfish is not None:
        return BmcReader(source=RedfishSource(settings.bmc_redfish))
    return BmcReader()


class Backoff:
    """Exponential backoff with jitter: base, doubling, up to max."""

    def __init__(self, base_s: float, max_s: float) -> None:
        self.base_s, self.max_s = base_s, max_s
        self._next = base_s

    def reset(self) -> None:
        """Start again from the base delay."""
        self._next = self.base_s

    def delay(self) -> float:
        """The next delay to wait, and double the one after."""
        d = self._next
        self._next = min(self._next * 2, self.max_s)
        # Half fixed, half random: agents cut off together (a control plane
        # restart) come back spread out instead of all at once.
        return d / 2 + random.uniform(0, d / 2)


class Agent:
    """Keeps one session with the control plane and serves its commands."""

    def __init__(
        self,
        settings: AgentSettings,
        machine: Machine,
        supervisor: Supervisor,
        load_sampler: LoadSampler | None = None,
        fabric: Any = None,
    ) -> None:
        self.settings = settings
        self.machine = machine
        self.supervisor = supervisor
        self.load_sampler = load_sampler or LoadSampler(
            include_memory=not machine.memory_simulated,
            sensors=SensorSampler(
                read_gpus=not machine.gpus_simulated,
                sim_power=sim_power_path(machine.state_dir) if machine.gpus_simulated else None,
                bmc=bmc_reader(settings, machine),
            ),
        )
        # Reads the node's GPU fabric (fleet/agent/fabric.py FabricReader); None: none.
        self.fabric = fabric
        self._fabric_sent: dict[str, Any] | None = None
        self._fabric_failed = False
        self.supervisor.on_change = self._queue_status
        # shard_status messages not yet sent; kept across disconnects.
        self._outbox: deque[dict[str, Any]] = deque()
        self._outbox_ready = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.connected = asyncio.Event()  # set while registered
        # The weights the control plane was last told of (register, or a heartbeat).
        self._weights_sent: list[dict[str, Any]] | None = None
        self._disk_sent: dict[str, float] | None = None
        self._installs_sent: list[dict[str, str]] | None = None
        # Set by main: installs releases the control plane names (fleet/agent/upgrade.py).
        self.upgrader: Upgrader | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then stop every engine and return."""
        session = asyncio.create_task(self.connect_forever(), name="agent-session")
        try:
            await stop.wait()
        finally:
            log.info("stopping: stopping every engine first")
            await self.supervisor.stop_all()
            await self._flush(FLUSH_ON_EXIT_S)
            if self._ws is not None:
                # A clean goodbye, so the control plane marks the node
                # unreachable now rather than after a missed heartbeat.
                with contextlib.suppress(WebSocketException, OSError):
                    await asyncio.wait_for(self._ws.close(1001, "agent stopping"), 2.0)
            session.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await session
            for task in list(self._tasks):
                task.cancel()
            await self.supervisor.close()
            self.load_sampler.close()
            if self.fabric is not None:
                self.fabric.close()

    async def connect_forever(self) -> None:
        """Connect, serve the session, and reconnect with backoff, forever."""
        backoff = Backoff(self.settings.backoff_base_s, self.settings.backoff_max_s)
        credentials = self.settings.credentials
        while True:
            registered = False
            headers = {"Authorization": f"Bearer {credentials()}"}
            try:
                async with connect(self.settings.ws_url, additional_headers=headers) as ws:
                    registered = await self._session(ws)
            except RegisterRefused as exc:
                log.error("the control plane refused to register this node: %s", exc)
            except InvalidStatus as exc:
                status = exc.response.status_code
                if status in (401, 403) and credentials.joined:
                    if credentials.refused():
                        backoff.reset()  # join again at once, with the join token
                elif status in (401, 403):
                    log.error("the control plane refused this agent's join token (HTTP %d)", status)
                else:
                    log.warning("control plane %s answered HTTP %d", self.settings.ws_url, status)
            except (OSError, WebSocketException, TimeoutError) as exc:
                log.warning("control plane %s: %s", self.settings.ws_url, exc or type(exc).__name__)
            except Exception:
                # A bug in one session must not leave the node silent for good.
                log.exception("the session with the control plane failed")
            finally:
                self._ws = None
                self.connected.clear()
            if registered:
                backoff.reset()
            delay = backoff.delay()
            log.info("reconnecting in %.1f s", delay)
            await asyncio.sleep(delay)

    async def _session(self, ws: ClientConnection) -> bool:
        """One connection's life; whether it got as far as ``registered``."""
        self._ws = ws
        # Built and sent before anything else can change the shards, so the
        # outbox is trimmed against exactly the list the server is given.
        # In a thread: NVML takes seconds to load on a card without persistence mode.
        register = self.register_message(await asyncio.to_thread(self.fabric_read))
        self._trim_outbox({s["shard_id"] for s in register["shards"]})
        await self._send(register)
        try:
            await self._await_registered(ws)
        except (RegisterRefused, TimeoutError):
            # Say goodbye properly rather than as a crash (1011).
            with contextlib.suppress(WebSocketException, OSError):
                await ws.close()
            raise
        log.info("registered as %s with %s", self.settings.node_id, self.settings.ws_url)
        self.connected.set()
        workers = [
            asyncio.create_task(self._heartbeats(), name="heartbeats"),
            asyncio.create_task(self._send_statuses(), name="statuses"),
        ]
        for task in workers:
            task.add_done_callback(lambda t: _close_on_failure(t, ws))
        try:
            async for raw in ws:
                msg = _decode(raw)
                if msg is not None:
                    await self._dispatch(msg)
            # A clean close: 1001 when the server stops (connect again at once, maybe to
            # another), 4403 when this node was refused or forgotten.
            log.info(
                "the control plane closed the connection (%s %s)", ws.close_code, ws.close_reason
            )
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        return True

    async def _await_registered(self, ws: ClientConnection) -> None:
        async with asyncio.timeout(REGISTER_TIMEOUT_S):
            while True:
                msg = _decode(await ws.recv())
                if msg is None:
                    continue
                if msg.get("type") == "registered":
                    self._registered(msg)
                    return
                if msg.get("type") == "error":
                    raise RegisterRefused(msg.get("detail") or "no detail given")
                log.warning("ignoring %r before registered", msg.get("type"))

    def _registered(self, msg: dict[str, Any]) -> None:
        """Keep the node's own credential when this registration issued one, and say when the
        node waits for an operator to approve it."""
        if "node_token" in msg:
            self.settings.credentials.keep(msg["node_token"])
        if msg.get("approved") is False:
            log.warning(
                "node %s waits for an operator's approval before anything is placed on it "
                "(llmgw ctl node approve %s)",
                self.settings.node_id,
                self.settings.node_id,
            )

    def register_message(self, fabric: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``register`` message for this node as it is now; ``fabric`` is one read
        already (`fabric_read`), without it one is read here."""
        m = self.machine
        shards = self.supervisor.shards()
        # GPUs that processes this agent did not start hold: placement leaves them alone.
        held = gpu_holders(m.gpus_simulated, {i for s in shards for i in s.spec.gpu_indices})
        msg: dict[str, Any] = {
            "type": "register",
            "node_id": self.settings.node_id,
            "hostname": m.hostname,
            "mgmt_addr": self.settings.advertise_addr,
            "labels": dict(self.settings.labels),
            "agent_version": AGENT_VERSION,
            "gpus": [
                {
                    **g.to_message(),
                    **({"unknown_processes": held[g.index]} if g.index in held else {}),
                }
                for g in m.gpus
            ],
            "engines": self._engines(),
            "engines_probed": True,
            "weights": self._weights_held(),
            "shards": [s.register_entry() for s in shards],
        }
        self._disk_sent = m.disk()
        _put_known(
            msg, memory_total_mb=m.memory_total_mb(), cpu_count=m.cpu_count(), disk=self._disk_sent
        )
        installer = self.supervisor.installer
        if installer is not None:
            # Only an agent that installs engines says its platform: what the mirror's
            # builds are matched against.
            msg["platform"] = this_platform()
            msg["engine_installs"] = self._installs_sent = installer.reports()
        self._fabric_sent = fabric if fabric is not None else self.fabric_read()
        if self._fabric_sent:
            msg["fabric"] = self._fabric_sent
        return msg

    def fabric_read(self) -> dict[str, Any]:
        """The node's GPU fabric now; empty without a reader, or when reading it failed
        (logged once: a bug reading it must cost the fabric, not the heartbeat)."""
        if self.fabric is None:
            return {}
        try:
            return self.fabric.read()
        except Exception:
            if not self._fabric_failed:
                self._fabric_failed = True
                log.exception("cannot read the GPU fabric; it goes unreported")
            return {}

    def _engines(self) -> dict[str, str]:
        """The engines probed at start and those installed since."""
        installer = self.supervisor.installer
        return {**self.machine.engines, **(installer.engines() if installer else {})}

    def heartbeat_message(
        self, seq: int, load: dict[str, Any] | None = None, fabric: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The ``heartbeat`` message number ``seq`` of this connection.

        ``load`` and ``fabric`` are read already; without them they are read here.
        """
        if load is None:
            load = self.load_sampler.sample_load(self.supervisor.process_groups())
        msg: dict[str, Any] = {
            "type": "heartbeat",
            "seq": seq,
            "load": load,
            "shards": [
                {"shard_id": s.spec.shard_id, "state": s.state} for s in self.supervisor.shards()
            ],
        }
        _put_known(
            msg, memory_total_mb=self.machine.memory_total_mb(), cpu_count=self.machine.cpu_count()
        )
        last, disk_last = self._weights_sent, self._disk_sent
        held = self._weights_held()
        disk = self.machine.disk()
        if held != last or _moved(disk, disk_last):
            # Only when it changed: absent is "as last said", and the list may be long.
            # The free disk goes with it: what reclaim weighs the cache against.
            msg["weights"] = held
            _put_known(msg, disk=disk)
            self._disk_sent = disk
        installer = self.supervisor.installer
        installs = installer.reports() if installer is not None else None
        if installs is not None and installs != self._installs_sent:
            # An install moved on; once installed, its engine is one the node has.
            msg["engine_installs"] = self._installs_sent = installs
            msg["engines"] = self._engines()
        fabric = fabric if fabric is not None else self.fabric_read()
        if fabric != (self._fabric_sent or {}):
            # Only when it changed (a link went down, an Xid, IMEX stopped): absent is "as
            # last said", and it may be long.
            msg["fabric"] = self._fabric_sent = fabric
        return msg

    def _weights_held(self) -> list[dict[str, Any]]:
        """What the weight cache holds, noted as what the control plane was last told."""
        cache = self.supervisor.cache
        held = cache.held() if cache is not None else []
        self._weights_sent = held
        return held

    async def _heartbeats(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.heartbeat_interval_s
        # The first beat at a random point of the interval: agents answered together (a
        # batch of registrations after a control plane restart) would beat together for
        # good, each beat a burst the control plane's loop serves the others behind.
        next_at = loop.time() + random.uniform(0, interval)
        await asyncio.sleep(next_at - loop.time())
        seq = 0
        while True:
            seq += 1
            # Sampled in a thread: nvidia-smi and /proc take a moment, and
            # the event loop serves the control plane's commands meanwhile.
            load = await asyncio.to_thread(
                self.load_sampler.sample_load, self.supervisor.process_groups()
            )
            fabric = await asyncio.to_thread(self.fabric_read)
            await self._send(self.heartbeat_message(seq, load, fabric))
            loads = await self.supervisor.engine_loads()
            if loads:
                await self._send({"type": "engine_load", "shards": loads})
            # On a fixed beat, so slow metrics do not stretch the interval.
            next_at = max(next_at + interval, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "start_shard":
            await self.supervisor.start(msg)
        elif kind == "stop_shard":
            shard_id = msg.get("shard_id")
            if not isinstance(shard_id, str) or not shard_id:
                log.warning("stop_shard without a shard_id: %r", msg)
                return
            grace = _float(msg.get("grace_s"), default=10.0)
            # A stop waits out its grace; the session must keep reading.
            self._spawn(self.supervisor.stop(shard_id, grace), f"stop-{shard_id}")
        elif kind == "load_adapter":
            # Loading reads the adapter's weights: seconds the session keeps serving through.
            self._spawn(self.supervisor.load_adapter(msg), "load-adapter")
        elif kind == "unload_adapter":
            self._spawn(self.supervisor.unload_adapter(msg), "unload-adapter")
        elif kind == "delete_weights":
            self._delete_weights(msg)
        elif kind == "engine_log":
            self._spawn(self._answer_engine_log(msg), "engine-log")
        elif kind == "upgrade":
            self._spawn(self._upgrade(msg), "upgrade")
        elif kind == "power_cap":
            self._spawn(self._power_cap(msg), "power-cap")
        elif kind == "error":
            log.warning("control plane error: %s", msg.get("detail"))
        elif kind == "registered":
            pass
        else:
            log.debug("ignoring a %r message", kind)

    async def _power_cap(self, msg: dict[str, Any]) -> None:
        """Hold the GPUs to a share of their default power limit (`share` null: back to the
        default), each GPU's outcome said in the log (docs/facility.md, "Power capping")."""
        share = msg.get("share")
        valid = isinstance(share, int | float) and not isinstance(share, bool)
        if share is not None and not (valid and 0.1 <= share <= 1):
            log.warning("power_cap with a share that is not from 0.1 to 1: %r", share)
            return
        sensors = getattr(self.load_sampler, "sensors", None)
        if sensors is None:
            log.warning("power_cap: this agent does not read its GPUs")
            return
        for line in await asyncio.to_thread(sensors.power_cap, share):
            log.info("power cap: %s", line)

    async def _upgrade(self, msg: dict[str, Any]) -> None:
        """Install the release the control plane names and re-execute into it, engines left
        running for the new agent to adopt; or say why not, and go on as before."""
        upgrader = self.upgrader
        version = str(msg.get("version"))[:40]
        if upgrader is None:
            await self._say_upgrade(
                version, "failed", "this agent was not started to upgrade itself"
            )
            return
        await self._say_upgrade(version, "installing")
        try:
            await upgrader.install(msg)
        except Exception as exc:  # noqa: BLE001 - whatever it was, said, and the agent goes on
            why = str(exc) if isinstance(exc, UpgradeError) else f"{type(exc).__name__}: {exc}"
            log.error("upgrade to llmgw %s failed: %s", version, why)
            await self._say_upgrade(version, "failed", why)
            return
        log.info("llmgw %s installed; restarting into it, engines left running", version)
        await self._say_upgrade(version, "restarting into")
        await self._flush(FLUSH_ON_EXIT_S)
        if self._ws is not None:
            with contextlib.suppress(WebSocketException, OSError, TimeoutError):
                await asyncio.wait_for(self._ws.close(1012, "agent upgrading"), 2.0)
        self.supervisor.ledger_flush()
        os.execv(sys.executable, restart_argv())

    async def _say_upgrade(self, version: str, state: str, detail: str = "") -> None:
        with contextlib.suppress(ConnectionError, WebSocketException, OSError):
            await self._send(
                {
                    "type": "upgrade_status",
                    "version": version,
                    "state": state,
                    "detail": detail[:2000],
                }
            )

    def _delete_weights(self, msg: dict[str, Any]) -> None:
        """Delete cached weights the control plane says nothing here uses; a file a shard
        of this node still runs on (or is fetching) is kept whatever it says."""
        cache = self.supervisor.cache
        digests = msg.get("sha256")
        if cache is None or not isinstance(digests, list):
            log.warning("delete_weights without a sha256 list: %r", msg)
            return
        in_use = self.supervisor.weights_in_use()
        gone = cache.delete([d for d in digests if isinstance(d, str)], in_use=in_use)
        for digest in gone:
            log.info("deleted cached weights %s: no shard here uses them", digest)

    async def _answer_engine_log(self, msg: dict[str, Any]) -> None:
        """Answer ``engine_log`` with the shard's last log lines (``found`` false when this
        node has no log of it); a request without its ids is not answered."""
        request_id, shard_id, lines = msg.get("request_id"), msg.get("shard_id"), msg.get("lines")
        if not (isinstance(request_id, str) and request_id and isinstance(shard_id, str)):
            log.warning("engine_log without a request_id or shard_id: %r", msg)
            return
        count = lines if isinstance(lines, int) and not isinstance(lines, bool) else 100
        # The file is read in a thread: the session keeps serving meanwhile.
        found = await asyncio.to_thread(self.supervisor.log_lines, shard_id, count)
        with contextlib.suppress(ConnectionError, WebSocketException, OSError):
            await self._send(
                {
                    "type": "engine_log_lines",
                    "request_id": request_id,
                    "shard_id": shard_id,
                    "found": found is not None,
                    "lines": found or [],
                }
            )

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _queue_status(self, msg: dict[str, Any]) -> None:
        self._outbox.append(msg)
        self._outbox_ready.set()

    def _trim_outbox(self, listed: set[str]) -> None:
        """Keep, for shards the register does not list, only their last status.

        A listed shard's state is in the register already; one that ended
        while we were away is reported by its final status alone.
        """
        last: dict[str, dict[str, Any]] = {}
        answers: list[dict[str, Any]] = []
        for msg in self._outbox:
            if msg.get("type") == "adapter_status":
                # The answer to a command, which the register does not carry; moot for a
                # shard that ended.
                if msg["shard_id"] in listed:
                    answers.append(msg)
            elif msg["shard_id"] not in listed:
                last.pop(msg["shard_id"], None)
                last[msg["shard_id"]] = msg
        self._outbox = deque([*last.values(), *answers])

    async def _send_statuses(self) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                # Removed only once sent: one lost with the connection is
                # sent again after the next register.
                await self._send(self._outbox[0])
                self._outbox.popleft()

    async def _flush(self, timeout_s: float) -> None:
        """Give queued statuses a moment to reach the control plane."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._outbox and self.connected.is_set() and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def _send(self, msg: dict[str, Any]) -> None:
        ws = self._ws
        if ws is None:
            raise ConnectionError("not connected")
        async with self._send_lock:
            await ws.send(json.dumps(msg))


def _close_on_failure(task: asyncio.Task[Any], ws: ClientConnection) -> None:
    # A sender that died leaves a session that looks alive but says nothing;
    # closing it makes the agent reconnect and start afresh.
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    if not isinstance(exc, WebSocketException | ConnectionError):
        log.error("%s failed", task.get_name(), exc_info=exc)
    asyncio.ensure_future(ws.close())


def _moved(disk: dict[str, float] | None, last: dict[str, float] | None) -> bool:
    """Whether the free disk moved by a gigabyte or more since it was last said."""
    if disk is None or last is None:
        return disk is not last
    return abs((disk.get("free_gb") or 0) - (last.get("free_gb") or 0)) >= 1.0


def _put_known(msg: dict[str, Any], **values: Any) -> None:
    # Unknown figures are left out: the control plane reads absent as
    # unknown, and a zero as a machine with none.
    for key, value in values.items():
        if value is not None:
            msg[key] = value


def _float(value: Any, *, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _decode(raw: str | bytes) -> dict[str, Any] | None:
    try:
        msg = json.loads(raw)
    except ValueError:
        log.warning("ignoring a frame that is not JSON")
        return None
    if not isinstance(msg, dict):
        log.warning("ignoring a frame that is not an object")
        return None
    return msg
