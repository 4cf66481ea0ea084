"""One slow client cannot hold `llmgw serve`: a request's headers must arrive within
LLMGW_HEADER_TIMEOUT_SECONDS, while answers, streams included, take as long as they take
(issue 12, item 6). Real server, agent and sim engine."""

from __future__ import annotations

import socket
import time

from .test_graceful_stop import STREAMS, _slow_chat, _streams


def _closed_after(port: int, sent: bytes) -> float:
    """Send `sent` and nothing more; how long until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        began = time.monotonic()
        s.sendall(sent)
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:  # aborted, as a slow client is
            pass
        return time.monotonic() - began


def test_headers_sent_slowly_are_cut_off_and_a_long_stream_is_not(cluster):
    cluster.stop("serve")
    cluster.env["LLMGW_HEADER_TIMEOUT_SECONDS"] = "1"
    cluster.start_server()

    # Half a request, then silence: closed at the deadline, not after Twisted's 60 s idle.
    assert _closed_after(cluster.port, b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: 127") < 5
    # An answered request on a connection kept alive, then silence: the same.
    whole = b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    assert _closed_after(cluster.port, whole) < 5

    # Streams of about 2 s each, twice the deadline, all end whole.
    secret = _slow_chat(cluster, tokens_per_sec=20)
    results, threads = _streams(cluster, secret, max_tokens=40)
    for t in threads:
        t.join(timeout=60)
    assert results == [("ok", 40)] * STREAMS
