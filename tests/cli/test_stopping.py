"""What a stopping `llmgw serve` tells the agents connected to it."""

from types import SimpleNamespace

from daphne.ws_protocol import WebSocketProtocol

from llmgw.cli.stopping import _going_away


def _agent(state: int, path: bytes = b"/ws/agent/") -> WebSocketProtocol:
    protocol = WebSocketProtocol.__new__(WebSocketProtocol)
    protocol.state, protocol.path, protocol.closed_with = state, path, []
    protocol.sendCloseFrame = lambda code, reasonUtf8: protocol.closed_with.append(code)
    return protocol


def test_open_agents_are_told_to_go_and_one_mid_handshake_is_left_to_the_stop():
    # A connection still in its handshake cannot be closed with a frame: Autobahn raised,
    # and the whole graceful stop ended there.
    open_, joining = (
        _agent(WebSocketProtocol.STATE_OPEN),
        _agent(WebSocketProtocol.STATE_CONNECTING),
    )
    other = _agent(WebSocketProtocol.STATE_OPEN, path=b"/ws/elsewhere/")
    server = SimpleNamespace(connections={open_: {}, joining: {}, other: {}})

    assert _going_away(server) == 1
    assert (open_.closed_with, joining.closed_with, other.closed_with) == ([1001], [], [])
