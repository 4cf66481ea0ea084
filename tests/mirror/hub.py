"""A hub that is not the internet: the few routes of the Hugging Face hub that
huggingface_hub and the mirror use, on loopback, over HTTP or HTTPS.

- ``GET /api/models/ORG/REPO[/revision/REV]`` with ``siblings`` (size, and
  ``lfs.sha256`` for files marked LFS), as ``model_info(files_metadata=True)`` reads it;
  unknown repositories and revisions answer 404 with the hub's ``X-Error-Code``.
- ``GET|HEAD /ORG/REPO/resolve/REV/PATH`` with ``Range``; ``cut_after`` ends a
  response after that many bytes, once, to test a resumed download.
- ``GET|HEAD /files/NAME`` for plain https sources.

Every file request is counted in ``gets`` and ``ranges`` (the Range header asked).
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class HubFile:
    data: bytes
    lfs: bool = True
    # What the hub claims the digest is; the true one unless a test lies.
    claimed_sha256: str | None = None

    @property
    def sha256(self) -> str:
        return self.claimed_sha256 or hashlib.sha256(self.data).hexdigest()


@dataclass
class Hub:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    plain: dict[str, bytes] = field(default_factory=dict)
    gets: dict[str, int] = field(default_factory=dict)
    ranges: list[str | None] = field(default_factory=list)
    cut_after: dict[str, int] = field(default_factory=dict)
    token: str | None = None
    seen_auth: list[str | None] = field(default_factory=list)
    url: str = ""
    server: ThreadingHTTPServer | None = None
    # Set to make every file request wait until the test lets it go.
    hold: threading.Event | None = None
    # Bytes a second a file is sent at, to catch a download mid-way; None: at once.
    rate: float | None = None

    def start(self, tls: ssl.SSLContext | None = None) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._files(head=True)

            def do_GET(self):
                if self.path.startswith("/api/models/"):
                    self._info()
                else:
                    self._files(head=False)

            def _json(self, status, body, code=None):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if code:
                    self.send_header("X-Error-Code", code)
                self.end_headers()
                self.wfile.write(data)

            def _info(self):
                hub.seen_auth.append(self.headers.get("Authorization"))
                m = re.match(r"^/api/models/([^/]+/[^/?]+)(?:/revision/([^?]+))?", self.path)
                repo = m[1] if m else ""
                files = hub.repos.get(repo)
                if files is None or (
                    hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}"
                ):
                    self._json(404, {"error": "Repository not found"}, "RepoNotFound")
                    return
                rev = m[2]
                if rev not in (None, "main", COMMIT):
                    self._json(404, {"error": f"Invalid rev id: {rev}"}, "RevisionNotFound")
                    return
                siblings = []
                for name, f in sorted(files.items()):
                    entry = {"rfilename": name, "size": len(f.data), "blobId": "b" * 40}
                    if f.lfs:
                        entry["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": 134}
                    siblings.append(entry)
                self._json(
                    200,
                    {
                        "id": repo,
                        "modelId": repo,
                        "sha": COMMIT,
                        "siblings": siblings,
                        "private": False,
                    },
                )

            def _files(self, head):
                m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
                if m:
                    key = f"{m[1]}/{m[3]}"
                    f = hub.repos.get(m[1], {}).get(m[3])
                    data = f.data if f else None
                elif self.path.startswith("/files/"):
                    key = self.path[len("/files/") :]
                    data = hub.plain.get(key)
                else:
                    key, data = self.path, None
                if data is None:
                    self._json(404, {"error": "Entry not found"}, "EntryNotFound")
                    return
                if not head:
                    hub.gets[key] = hub.gets.get(key, 0) + 1
                    hub.ranges.append(self.headers.get("Range"))
                    if hub.hold is not None:
                        hub.hold.wait(30)
                start, status = 0, 200
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng)[1])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                body = data[start:]
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                cut = hub.cut_after.pop(key, None)
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if hub.rate:
                    step = 65536
                    for i in range(0, len(body), step):
                        self.wfile.write(body[i : i + step])
                        time.sleep(step / hub.rate)
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
