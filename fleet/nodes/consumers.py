"""The agents' websocket (`/ws/agent/`): authenticate, validate each frame, call one service, answer."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError

from llmgw.core import clock
from llmgw.core.db import Abandoned, Batched, database_call
from llmgw.core.outage import Outage

from .. import protocol
from ..domain.types import parse_shard_id
from ..reconciler.wake import wake
from .connections import GATE, PENALTY, FrameBudget, refused
from .dispatch import Command, node_group, send_commands
from .fabric import node_fabric_record
from .heard import (
    node_disconnected,
    node_engines_record,
    node_live_flush,
    node_running_unknown,
    node_silent_mark,
)
from .identity import AgentCredential, Refused, agents_authenticate, register_refusal
from .live import LIVE, OutOfOrder
from .registration import registrations_write
from .reports import adapter_status_record, node_weights_record, shard_status_record
from .upgrades import upgrade_reported

log = logging.getLogger("llmgw.agents")

# Invalid frames in a row after which the connection is closed: a broken or hostile agent.
MAX_INVALID_IN_A_ROW = 10
CLOSE_UNAUTHORIZED = 4401
CLOSE_INVALID = 4400
CLOSE_REFUSED = 4403
CLOSE_SUPERSEDED = 4409
CLOSE_FLOOD = 4429
CLOSE_TRY_AGAIN = 4503
FLUSH_EVERY_S = 1.0
# engine_log requests a connection remembers the askers of; older ones are given up on.
MAX_LOG_REQUESTS = 64

_flusher: asyncio.Task | None = None
_handshakes = Outage("authenticating agents' connections against the database", log)
_layer = Outage("joining agents to their nodes' groups on the channel layer (Redis)", log)
JOIN_RETRY_S = 2.0


def _remote(scope) -> str:
    """The address this connection came from; "" when the server could not say (a socket
    file): then nothing a node declares of its address is believed unless approved."""
    client = scope.get("client")
    return str(client[0]) if client and client[0] else ""


def _bearer(scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                return text[7:].strip()
    return ""


async def _flush_forever() -> None:
    """Write heartbeats behind: every second, one bulk write of the nodes that are due, and
    the nodes silent for the unreachable window marked so (this process heard them last, to
    the second). A database outage is logged when it starts and when it ends, not every
    second."""
    outage = Outage("writing the agents' heartbeats to the database", log)
    while True:
        await asyncio.sleep(FLUSH_EVERY_S)
        writes = LIVE.due()
        silent = LIVE.silent(clock.now(), settings.LLMGW.timings.unreachable)
        if writes or silent:
            try:
                await _write_behind(writes, silent)
            except Exception as exc:
                LIVE.unsilenced(silent)  # and the writes go on their nodes' next heartbeats
                outage.failed(exc)
            else:
                outage.worked()


def _flush(writes, silent) -> tuple[list[str], list[Command]]:
    now = clock.now()
    if node_silent_mark(silent=silent, now=now):
        wake()  # a pass soon takes their replicas out of routing (from this thread: no wait)
    return node_live_flush(writes=writes, now=now), node_running_unknown(writes=writes)


# The heartbeats' writes have a thread of their own: behind the registrations of a whole
# fleet reconnecting they waited long enough for nodes to look silent.
_WRITE_BEHIND = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-write-behind")
# And the handshakes' credential look-ups: behind a fleet's registrations they waited past
# the agents' open timeout, the agents gave up and tried again, and a restart collapsed.
_HANDSHAKES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmgw-handshakes")
# Looked up together, those that came while the batch before was looked up.
_CREDENTIALS = Batched(agents_authenticate, most=100, executor=_HANDSHAKES)


async def _write_behind(writes, silent=()) -> None:
    """Write heartbeats and silences, then act on what they showed: lost nodes register
    again, engines nobody knows of are stopped."""
    lost, stops = await database_call(_flush, executor=_WRITE_BEHIND)(writes, silent)
    await _ask_to_register_again(lost)
    await send_commands(stops)


async def _ask_to_register_again(node_ids: list[str]) -> None:
    """Close these nodes' connections: their agents reconnect and report what they run."""
    layer = get_channel_layer()
    for node_id in node_ids:
        log.info("node %s was lost but is still connected; asking it to register again", node_id)
        await layer.group_send(node_group(node_id), {"type": "agent.superseded", "session": ""})


def ensure_flusher() -> None:
    global _flusher
    # Written often enough that the database never looks silent to the reconciler.
    LIVE.write_every = min(5.0, settings.LLMGW.timings.unreachable / 4)
    if _flusher is None or _flusher.done():
        _flusher = asyncio.get_running_loop().create_task(_flush_forever())


async def _refusal(credential: AgentCredential, node_id: str) -> None:
    """register_refusal, on the database thread only for a join token: a node's own
    credential is checked without it (a fleet registering again at once is all such)."""
    if credential.joining:
        await database_call(register_refusal)(
            credential=credential, node_id=node_id, now=clock.now()
        )
    else:
        register_refusal(credential=credential, node_id=node_id, now=clock.now())


# Registrations, gathered while the one batch before is written (registration.registrations_write).
# Each is stamped when written, not when its frame came: in a fleet's restart a register
# waits seconds, and a node stamped with its frame's time looked silent for those seconds
# (the reconciler marked it unreachable).
_REGISTRATIONS = Batched(registrations_write, most=50)


class AgentConsumer(AsyncWebsocketConsumer):
    """One agent's connection. The first message must be `register`."""

    node_id: str | None = None
    credential: AgentCredential | None = None
    node_key: str | None = None
    # Set once this side decided to close: frames still queued behind are not even looked at.
    closing = False
    _inbox = None

    async def __call__(self, scope, receive, send):
        # What daphne puts for this connection (llmgw/core/inbox.py), read while a frame's
        # handler waits: a hang-up waits there until the handler ends.
        self._inbox = getattr(receive, "__self__", None)
        return await super().__call__(scope, receive, send)

    def _still_there(self) -> bool:
        """False once the agent hung up, before this connection got to hear it."""
        items = getattr(self._inbox, "items", ())
        return not any(m.get("type") == "websocket.disconnect" for m in items)

    async def dispatch(self, message):
        """Channels closes stale DB connections in a thread before every message; heartbeats
        touch no database, and every service call here (database_call) looks after them
        itself, so that thread hop per frame is skipped."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self):
        secret = _bearer(self.scope)
        # The node credential this connection speaks with (its digest), once it has one.
        self.node_key = PENALTY.key(secret)
        if PENALTY.holds(self.node_key, time.monotonic()):
            # Closed for flooding a moment ago: not let in again yet, and no database asked.
            refused("frames", "an agent closed for flooding tried again before its penalty ended")
            await self.accept()
            await self.close(code=CLOSE_FLOOD, reason="too many frames; wait before connecting")
            return
        address, now = _remote(self.scope), time.monotonic()
        most = settings.LLMGW.agents.handshake_failures_per_minute
        if GATE.holds(address, self.node_key, most, now):
            refused(
                "handshakes",
                f"refused a handshake from {address or 'an unknown address'} before any "
                f"database lookup: it failed {most} in the last minute "
                "(LLMGW_AGENT_HANDSHAKE_FAILURES_PER_MINUTE)",
            )
            await self.accept()
            await self.close(code=CLOSE_FLOOD, reason="too many failed handshakes; wait")
            return
        try:
            self.credential = await _CREDENTIALS(secret, still_wanted=self._still_there)
        except Abandoned:
            return  # the agent gave up on its handshake while it waited: no one to answer
        except (OperationalError, InterfaceError) as exc:
            # Not a refusal (that would make the agent give up its credential): try again.
            _handshakes.failed(exc)
            await self.accept()
            await self.close(code=CLOSE_TRY_AGAIN, reason="the control plane's database is away")
            return
        _handshakes.worked()
        if self.credential is not None and self.credential.joining:
            self.node_key = None
        elif self.credential is not None:
            GATE.trusted(self.node_key)
        if self.credential is None:
            GATE.failed(address, now)
            # Refused before accept: the handshake fails with 403 and nothing says why.
            refused(
                "unknown_credential", "an agent's credential is neither a join token nor a node's"
            )
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        self.session = uuid.uuid4().hex
        self.invalid = 0
        self.budget = FrameBudget(settings.LLMGW.agents.frames_per_second)
        # engine_log requests sent to this agent: request id -> (reply channel, shard id).
        self.log_requests: dict[str, tuple[str, str]] = {}
        ensure_flusher()
        await self.accept()

    async def websocket_disconnect(self, message):
        """channels' own, less its thread hop to close the database connections after every
        disconnect (5,000 of them when a fleet's connections drop together): every call
        here is a `database_call`, which looks after its connection. No `groups` to leave:
        the node's group is left in `disconnect`."""
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def disconnect(self, code):
        self.closing = True  # and a group still being joined is given up
        if self.node_id is None:
            return
        # First what needs neither Redis nor the database: this process stops speaking for
        # the node whatever else is away. Then the database (unreachable at once), then the
        # channel layer; one being away never keeps the others from being told.
        LIVE.disconnected(self.node_id, self.session)
        try:
            await database_call(node_disconnected)(
                node_id=self.node_id, session=self.session, now=clock.now()
            )
        except Exception as exc:  # its heartbeats stop: the reconciler finds it silent
            log.warning("could not mark node %s unreachable: %s", self.node_id, exc)
        try:
            await self.channel_layer.group_discard(node_group(self.node_id), self.channel_name)
        except Exception as exc:  # Redis away: the group entry expires by itself
            log.warning("could not leave node %s's group: %s", self.node_id, exc)

    async def receive(self, text_data=None, bytes_data=None):
        if self.credential is None or self.closing:
            return  # a connection being closed (or whose handshake found no database)
        verdict = self.budget.take(time.monotonic())
        if verdict is not FrameBudget.OK:
            # Over budget: not even parsed. Sustained, the connection is closed.
            if verdict is FrameBudget.CLOSE:
                refused("frames", self.budget.sentence(self.node_id))
                if self.node_key is not None:  # never a join token: others join with it
                    PENALTY.hold(self.node_key, time.monotonic())
                await self._end(CLOSE_FLOOD)
            return
        if text_data is None:
            await self._reject("frames must be JSON text, not binary")
            return
        try:
            msg = protocol.parse(text_data)
        except protocol.BadMessage as exc:
            await self._reject(str(exc))
            return
        if self.node_id is None and msg.type != "register":
            await self._reject(f"{msg.type} before register; the first message must be register")
            return
        if msg.type == "register" and self.node_id not in (None, msg.node_id):
            await self._reject(f"this connection registered as {self.node_id}, not {msg.node_id}")
            return
        try:
            await getattr(self, f"on_{msg.type}")(msg)
        except (OutOfOrder, protocol.BadMessage) as exc:
            await self._reject(str(exc))
            return
        self.invalid = 0

    async def _end(self, code: int) -> None:
        """Close from this side, once: a flooding agent leaves thousands of frames queued."""
        if not self.closing:
            self.closing = True
            await self.close(code=code)

    async def _reject(self, detail: str) -> None:
        """Answer an invalid frame with an error, change nothing, and close on a run of them."""
        self.invalid += 1
        await self.send(text_data=json.dumps({"type": "error", "detail": detail}))
        if self.invalid >= MAX_INVALID_IN_A_ROW:
            log.warning(
                "closing agent %s: %d invalid messages in a row", self.node_id or "?", self.invalid
            )
            await self._end(CLOSE_INVALID)

    async def _send_commands(self, commands: list[Command]) -> None:
        for cmd in commands:
            await self.send(text_data=json.dumps(cmd.payload))

    async def _join(self, group: str) -> None:
        """Take the node's group (its commands, and its older connection giving way), here or
        in another process. With the channel layer (Redis) away the agent stays connected
        (its heartbeats keep its node ready) and the group is taken in the background, as
        soon as the layer answers again."""
        if not await self._take_group(group):
            # Kept: the loop holds its tasks only weakly.
            self._joining = asyncio.get_running_loop().create_task(self._join_later(group))

    async def _join_later(self, group: str) -> None:
        while not self.closing:
            await asyncio.sleep(JOIN_RETRY_S)
            if await self._take_group(group):
                return

    async def _take_group(self, group: str) -> bool:
        try:
            await self.channel_layer.group_send(
                group, {"type": "agent.superseded", "session": self.session}
            )
            await self.channel_layer.group_add(group, self.channel_name)
        except Exception as exc:
            _layer.failed(exc)
            return False
        _layer.worked()
        return True

    async def _refuse(self, exc: Refused, node_id: str) -> None:
        """Refuse a registration: say why, count it, close; the node's own connection, if it
        has one, is not disturbed."""
        refused(exc.reason, f"refused to register node {node_id}: {exc}")
        await self.send(text_data=json.dumps({"type": "error", "detail": f"{exc}."}))
        await self._end(CLOSE_REFUSED)

    async def on_register(self, msg: protocol.Register) -> None:
        group = node_group(msg.node_id)
        if self.node_id is None:
            try:
                await _refusal(self.credential, msg.node_id)
            except Refused as exc:
                await self._refuse(exc, msg.node_id)
                return
            await self._join(group)
        try:
            registration = await _REGISTRATIONS(
                {
                    "msg": msg,
                    "session": self.session,
                    "credential": self.credential,
                    "seen_addr": _remote(self.scope),
                },
                still_wanted=self._still_there,
            )
        except Refused as exc:
            await self._refuse(exc, msg.node_id)
            return
        except Abandoned:
            return  # its agent hung up while it waited: nothing written, no one to answer
        commands = registration.commands
        self.node_id = msg.node_id
        # From here on this connection speaks with the node's own credential.
        self.credential = AgentCredential(node_id=msg.node_id)
        # Seeded with the registered figures, so a heartbeat repeating them is not a change.
        LIVE.connected(
            msg.node_id,
            self.session,
            registration.at,
            memory_total_mb=msg.memory_total_mb,
            cpu_count=msg.cpu_count,
        )
        registered = {"type": "registered", "node_id": msg.node_id}
        if registration.node_token:
            registered["node_token"] = registration.node_token
            self.node_key = PENALTY.key(registration.node_token)
        if not registration.approved:
            registered["approved"] = False
        await self.send(text_data=json.dumps(registered))
        await self._send_commands(commands)

    async def on_heartbeat(self, msg: protocol.Heartbeat) -> None:
        # Heard first: liveness must not wait behind the database thread's queue (a fleet
        # registering again), and a heartbeat out of order changes nothing.
        changed = LIVE.heartbeat(self.node_id, msg, clock.now())
        if msg.weights is not None or msg.disk is not None:
            await database_call(node_weights_record)(
                node_id=self.node_id, weights=msg.weights, disk=msg.disk
            )
        if msg.engines is not None or msg.engine_installs is not None:
            await database_call(node_engines_record)(
                node_id=self.node_id,
                engines=msg.engines,
                installs=msg.engine_installs,
                now=clock.now(),
            )
        if msg.fabric is not None:
            await database_call(node_fabric_record)(
                node_id=self.node_id, fabric=msg.fabric, now=clock.now()
            )
        if changed:
            # Memory or CPUs changed, or it was taken as silent: seen now, not in seconds.
            await _write_behind(LIVE.due(only=self.node_id))

    async def on_engine_load(self, msg: protocol.EngineLoad) -> None:
        # Counted only for shards placed on this node: its readers match each figure to the
        # node it came from (fleet/selectors/routing.py), and so does the last use.
        LIVE.engine_load(
            self.node_id, msg, {s.shard_id: parse_shard_id(s.shard_id)[0] for s in msg.shards}
        )

    async def on_shard_status(self, msg: protocol.ShardStatus) -> None:
        commands = await database_call(shard_status_record)(
            node_id=self.node_id, msg=msg, now=clock.now()
        )
        await self._send_commands(commands)

    async def on_adapter_status(self, msg: protocol.AdapterStatus) -> None:
        await database_call(adapter_status_record)(node_id=self.node_id, msg=msg, now=clock.now())

    async def on_upgrade_status(self, msg: protocol.UpgradeStatus) -> None:
        await database_call(upgrade_reported)(node_id=self.node_id, msg=msg, now=clock.now())

    async def on_engine_log_lines(self, msg: protocol.EngineLogLines) -> None:
        asked = self.log_requests.pop(msg.request_id, None)
        if asked is None or asked[1] != msg.shard_id:
            return  # late, or never asked of this connection: nobody waits for it
        await self.channel_layer.send(
            asked[0],
            {
                "type": "engine.log.lines",
                "request_id": msg.request_id,
                "found": msg.found,
                "lines": list(msg.lines),
            },
        )

    async def agent_engine_log(self, event) -> None:
        """Ask the agent for a shard's last log lines (fleet/nodes/logs.py waits for the answer)."""
        if self.node_id is None:
            return
        while len(self.log_requests) >= MAX_LOG_REQUESTS:
            # The oldest have been given up on by whoever asked.
            self.log_requests.pop(next(iter(self.log_requests)))
        self.log_requests[event["request_id"]] = (event["reply_to"], event["shard_id"])
        frame = {k: event[k] for k in ("request_id", "shard_id", "lines")}
        await self.send(text_data=json.dumps({"type": "engine_log", **frame}))

    async def agent_command(self, event) -> None:
        await self.send(text_data=json.dumps(event["payload"]))

    async def agent_forgotten(self, event) -> None:
        """An operator forgot this node: its credential is revoked, so the connection ends."""
        log.info("node %s was forgotten; closing its connection", self.node_id)
        await self.send(
            text_data=json.dumps(
                {"type": "error", "detail": f"node {self.node_id} was forgotten by an operator."}
            )
        )
        await self._end(CLOSE_REFUSED)

    async def agent_superseded(self, event) -> None:
        if event["session"] != self.session:
            log.info("agent %s connected again; closing its older connection", self.node_id)
            await self._end(CLOSE_SUPERSEDED)
