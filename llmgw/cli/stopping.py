"""`llmgw serve` stopping gracefully on SIGTERM or SIGINT.

It stops accepting connections, closes the agents' websockets with 1001 (going away) so
they reconnect at once, to another server where there is one, lets the gateway's requests
in flight finish for up to LLMGW_SHUTDOWN_GRACE_SECONDS, ends the streams it must cut with
an error event and writes their usage, and only then stops the reactor (whose shutdown
writes the last usage tallied). A second signal stops it at once; one within a second of
the first is the same ask (systemd signals every process of the service, and a worker's
`llmgw serve` passes the stop on too).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

log = logging.getLogger("llmgw.serve")

SAME_ASK_S = 1.0


def stop_on_signals(server, grace_s: float) -> None:
    """Install the handlers on the reactor's loop (called once it runs)."""
    from twisted.internet import reactor

    loop = asyncio.get_event_loop()
    state = {"stopping": False, "at": 0.0}

    def asked(signum: int) -> None:
        if state["stopping"]:
            if time.monotonic() - state["at"] < SAME_ASK_S:
                return
            _say("llmgw serve: asked again; stopping now")
            reactor.stop()
            return
        state["stopping"], state["at"] = True, time.monotonic()
        task = loop.create_task(_stop(server, grace_s))
        task.add_done_callback(lambda _t: reactor.stop())

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, asked, signum)


def _going_away(server) -> int:
    """Send every agent websocket a close frame with 1001 (going away); how many. Straight
    to the protocol: Autobahn lets an application close only with 1000 or 3000-4999."""
    from daphne.ws_protocol import WebSocketProtocol

    told = 0
    for protocol in list(server.connections):
        if not (isinstance(protocol, WebSocketProtocol) and protocol.path.startswith(b"/ws/agent")):
            continue
        if protocol.state != WebSocketProtocol.STATE_OPEN:
            # Still in its handshake (or closing already): Autobahn cannot close it with a
            # frame; stopping the server ends it, and its agent connects again.
            continue
        protocol.sendCloseFrame(code=1001, reasonUtf8=b"llmgw serve is stopping")
        told += 1
    return told


async def _stop(server, grace_s: float) -> None:
    from llmgw.asgi import gateway

    started = time.monotonic()
    for port in getattr(server, "ports", ()):
        port.stopListening()
    agents = _going_away(server)
    rt = gateway.runtime
    inflight = cut = 0
    if rt is not None:
        _say(
            f"llmgw serve: stopping; {len(rt.requests)} gateway requests in flight get up to "
            f"{grace_s:g} s (LLMGW_SHUTDOWN_GRACE_SECONDS), {agents} agents were told to "
            "connect again"
        )
        try:
            inflight, cut = await rt.drain(grace_s)
        except Exception:  # stopping must end whatever happens
            log.exception("draining the gateway failed")
    _say(
        f"llmgw serve: stopped after {time.monotonic() - started:.1f} s: {inflight - cut} of "
        f"{inflight} requests in flight finished, {cut} cut with an error event"
    )


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
