"""One slow client cannot hold `llmgw serve`: a request's headers must arrive within
LLMGW_HEADER_TIMEOUT_SECONDS, while answers, streams included, take as long as they take
(issue 12, item 6). Real server, agent and sim engine."""

from __future__ import annotations

import contextlib
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

    # Half a request, then silence: closed at the deadline, not after the 60 s idle; on
    # daphne's side (the API) and on the gateway's (uvicorn's, llmgw/cli/front.py), and
    # before the first line says which (the front holds it).
    for half in (
        b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: 127",
        b"GET /v1/models HTTP/1.1\r\nHost: 127",
        b"GET /v1/mod",
    ):
        assert _closed_after(cluster.port, half) < 5, half
    # An answered request on a connection kept alive, then silence: the same.
    for path in (b"/api/v1/openapi.json", b"/v1/models"):
        whole = b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % path
        assert _closed_after(cluster.port, whole) < 5, path

    # Streams of about 2 s each, twice the deadline, all end whole.
    secret = _slow_chat(cluster, tokens_per_sec=20)
    results, threads = _streams(cluster, secret, max_tokens=40)
    for t in threads:
        t.join(timeout=60)
    assert results == [("ok", 40)] * STREAMS


def test_a_kept_alive_connection_is_answered_on_every_path_whoever_took_it_first(cluster):
    """The front gives a connection to uvicorn (its first request asks for /v1/) or to
    daphne (anything else); whichever took it answers every later request on it, the
    gateway's and the API's alike. uvicorn's answers carry a Date header, daphne's not:
    that tells which served them."""
    for first, second, uvicorn in (
        ("/v1/models", "/api/v1/openapi.json", True),
        ("/api/v1/openapi.json", "/v1/models", False),
    ):
        with socket.create_connection(("127.0.0.1", cluster.port), timeout=30) as s:
            answers = dict([_asked(s, first), _asked(s, second)])
        assert set(answers) == {first, second}
        assert answers["/v1/models"][0] == 401
        assert b"invalid_api_key" in answers["/v1/models"][1]
        assert answers["/api/v1/openapi.json"][0] == 200
        dated = [b"\r\ndate: " in got.lower() for _, got in answers.values()]
        assert dated == [uvicorn, uvicorn], (first, answers)


def _asked(s: socket.socket, path: str) -> tuple[str, tuple[int, bytes]]:
    """One GET on a kept-alive connection: the path, its status and what was read."""
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    head, _, body = got.partition(b"\r\n\r\n")
    lowered = head.lower()
    if b"content-length:" in lowered:
        length = int(lowered.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += s.recv(65536)
    else:  # chunked: read to the last chunk
        while not body.endswith(b"0\r\n\r\n"):
            body += s.recv(65536)
    return path, (int(head.split(b" ")[1]), head + b"\r\n" + body)


def test_a_gateway_request_with_a_head_too_large_is_refused_as_it_comes(cluster):
    """uvicorn's protocol keeps every header it is sent; the front bounds a request's head
    as Twisted does daphne's (front.py): too many headers, or a header that never ends,
    is a 400 with the sentence and the connection closed, not memory held."""
    many = "".join(f"X-Pad-{i}: {i}\r\n" for i in range(600))
    endless = "X-Pad: " + "a" * 200_000
    for head in (f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{many}\r\n", endless):
        with socket.create_connection(("127.0.0.1", cluster.port), timeout=30) as s:
            if head is endless:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                s.sendall(head.encode())  # it may be closed while it is sent
            got = b""
            try:
                while chunk := s.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass
        assert got.startswith(b"HTTP/1.1 400 "), got[:200]
        assert b"The request's head is larger than llmgw takes: at most 24,576 bytes" in got
