"""`llmgw serve` as a process: its home and database owner-only, the host names its pages
answer to, cookies and CSRF behind a TLS proxy, and the console's Content-Security-Policy."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import subprocess
import sys
import time

import httpx
import pytest

from llmgw.core.config import SettingError, load
from tests.agent.helpers import free_port


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


class Served:
    def __init__(self, home, port, proc):
        self.home, self.port, self.proc = home, port, proc
        self.url = f"http://127.0.0.1:{port}"

    def get(self, path: str, host: str | None = None, **headers) -> httpx.Response:
        if host:
            headers["Host"] = host
        return httpx.get(self.url + path, headers=headers, timeout=10)


def serve(tmp_path, **env) -> Served:
    home, port = tmp_path / "home", free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    base.pop("DATABASE_URL", None)
    base.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "serve", "--port", str(port)],
        env={**base, "LLMGW_HOME": str(home), **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    served = Served(home, port, proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "llmgw serve exited"
        try:
            served.get("/login/")
            return served
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("llmgw serve did not answer in 60 s")


@pytest.fixture
def started(tmp_path):
    running = []

    def start(**env) -> Served:
        s = serve(tmp_path, **env)
        running.append(s)
        return s

    yield start
    for s in running:
        s.proc.terminate()
        s.proc.wait(timeout=30)


def test_the_home_the_database_and_the_secret_are_the_owners_alone(tmp_path, started):
    # As an older llmgw left them: readable by everyone.
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    (home / "secret_key").write_text("k" * 48)
    os.chmod(home / "secret_key", 0o644)
    old_umask = os.umask(0o022)
    try:
        s = started()
        db = home / "llmgw.sqlite3"
        # A writer holds the WAL open, as serve's own connections do between requests.
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
            conn.execute("INSERT INTO t VALUES (1)")
            conn.commit()
            modes = {p.name: mode(p) for p in home.iterdir() if p.name.startswith("llmgw.sqlite3")}
    finally:
        os.umask(old_umask)

    assert mode(home) == 0o700
    assert mode(home / "secret_key") == 0o600
    assert set(modes) >= {"llmgw.sqlite3", "llmgw.sqlite3-wal", "llmgw.sqlite3-shm"}
    assert set(modes.values()) == {0o600}, modes
    assert s.get("/login/").status_code == 200


def test_pages_answer_only_to_loopback_names_and_the_address_served(started):
    s = started()

    for host in (f"127.0.0.1:{s.port}", f"localhost:{s.port}"):
        assert s.get("/login/", host).status_code == 200, host
    # A name pointed at 127.0.0.1 by someone else's DNS (rebinding) is not this server.
    for host in ("attacker.example", f"attacker.example:{s.port}"):
        assert s.get("/login/", host).status_code == 400
        assert s.get("/api/v1/models", host).status_code == 400


def test_behind_a_tls_proxy_cookies_are_secure_and_its_origin_passes_csrf(started):
    s = started(LLMGW_ALLOWED_HOSTS="llmgw.example, .internal", LLMGW_BEHIND_TLS_PROXY="1")
    tls = {"X-Forwarded-Proto": "https"}

    page = s.get("/login/", "llmgw.example", **tls)
    assert page.status_code == 200
    assert re.search(r"csrftoken=[^;]+;.*Secure", page.headers["set-cookie"])
    assert s.get("/login/", "ops.internal", **tls).status_code == 200
    assert s.get("/login/", f"127.0.0.1:{s.port}").status_code == 400, "the list replaces loopback"

    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
    cookie = page.cookies["csrftoken"]

    def login(**headers) -> int:
        return httpx.post(
            s.url + "/login/",
            data={"csrfmiddlewaretoken": token, "username": "x", "password": "y"},
            headers={"Host": "llmgw.example", "Origin": "https://llmgw.example",
                     "Cookie": f"csrftoken={cookie}", **headers},
            timeout=10,
        ).status_code  # fmt: skip

    # The browser's https:// origin is the request's own once the proxy says it came over TLS.
    assert login(**tls) == 200  # the form again, with its error: CSRF passed
    assert login() == 403


def test_the_consoles_pages_carry_a_content_security_policy(started):
    s = started()

    policy = s.get("/login/").headers["content-security-policy"]

    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert "frame-ancestors 'none'" in policy


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"LLMGW_ALLOWED_HOSTS": "llmgw.example:8000"}, "LLMGW_ALLOWED_HOSTS"),
        ({"LLMGW_ALLOWED_HOSTS": "http://llmgw.example"}, "LLMGW_ALLOWED_HOSTS"),
        ({"LLMGW_BEHIND_TLS_PROXY": "maybe"}, "LLMGW_BEHIND_TLS_PROXY must be 1 or 0"),
        ({"LLMGW_SECURE_COOKIES": "2"}, "LLMGW_SECURE_COOKIES must be 1 or 0"),
    ],
)
def test_a_bad_web_setting_is_refused_naming_it(tmp_path, env, says):
    with pytest.raises(SettingError, match=says):
        load({"LLMGW_HOME": str(tmp_path / "home"), **env})


def test_the_web_settings_default_to_loopback_and_plain_http(tmp_path):
    web = load({"LLMGW_HOME": str(tmp_path / "home")}).web
    assert (web.allowed_hosts, web.behind_tls_proxy, web.secure_cookies) == (None, False, False)
    behind = load({"LLMGW_HOME": str(tmp_path / "home"), "LLMGW_BEHIND_TLS_PROXY": "yes"}).web
    assert (behind.behind_tls_proxy, behind.secure_cookies) == (True, True)
