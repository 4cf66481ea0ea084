"""What guards the console and the REST API as a web site, and the files of LLMGW_HOME.

Read from the environment with the other settings (llmgw.core.config): the host names
pages answer to, whether llmgw sits behind a TLS proxy, secure cookies; and the
owner-only permissions of LLMGW_HOME and the database in it. docs/settings.md
lists the variables.
"""

from __future__ import annotations

import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

# What the pages answer to when LLMGW_ALLOWED_HOSTS is unset, besides the address
# `llmgw serve` binds: a page asked for by any other name, as a DNS rebinding attack
# asks for it, is refused with a 400.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# Django's forms: a name, `.example.com` for it and every subdomain, an address, or `*`.
_HOST = re.compile(r"^(\*|\.?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\])$")
_WILDCARD_BINDS = ("0.0.0.0", "::", "[::]", "")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Web:
    """`allowed_hosts` None: loopback names and the address `llmgw serve` binds."""

    allowed_hosts: tuple[str, ...] | None = None
    behind_tls_proxy: bool = False
    secure_cookies: bool = False


def flag(env: dict[str, str], name: str, default: bool, error: type[Exception]) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise error(f"{name} must be 1 or 0 (true or false), not {env[name]!r}.")


def web_load(env: dict[str, str], error: type[Exception]) -> Web:
    """LLMGW_ALLOWED_HOSTS, LLMGW_BEHIND_TLS_PROXY and LLMGW_SECURE_COOKIES; `error` (the
    settings' SettingError) names the first bad one."""
    hosts = None
    raw = env.get("LLMGW_ALLOWED_HOSTS", "").strip()
    if raw:
        hosts = tuple(h for h in re.split(r"[,\s]+", raw) if h)
        for h in hosts:
            if not _HOST.match(h):
                raise error(
                    "LLMGW_ALLOWED_HOSTS must list host names or addresses without a port "
                    f"(llmgw.example.com, .example.com, 10.0.0.5, [::1] or *), not {h!r}."
                )
    behind = flag(env, "LLMGW_BEHIND_TLS_PROXY", False, error)
    return Web(
        allowed_hosts=hosts,
        behind_tls_proxy=behind,
        secure_cookies=flag(env, "LLMGW_SECURE_COOKIES", behind, error),
    )


def served_hosts(bind: str) -> tuple[str, ...]:
    """The names a page may be asked for on the address `llmgw serve` binds: that address;
    for every address (0.0.0.0, ::), this machine's host names and their addresses."""
    if bind not in _WILDCARD_BINDS:
        return (f"[{bind.strip('[]')}]" if ":" in bind else bind,)
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            for *_, addr in socket.getaddrinfo(name, None):
                host = str(addr[0])
                names.add(f"[{host}]" if ":" in host else host)
        except OSError:
            pass
    return tuple(sorted(n for n in names if n))


def private(path: Path, mode: int) -> None:
    """Take from `path` whatever permission `mode` does not give (0700, 0600), when this
    user owns it: the home holds the secret key, the database and the mirror's files."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    now = stat.S_IMODE(st.st_mode)
    if st.st_uid == os.getuid() and now & ~mode:
        os.chmod(path, now & mode)


def private_database(path: Path) -> None:
    """The SQLite database made 0600 before SQLite opens it. SQLite creates its -wal,
    -shm and -journal files with the database's own permissions; any left looser by an
    older llmgw are made 0600 as well."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for suffix in ("", "-wal", "-shm", "-journal"):
        private(path.with_name(path.name + suffix), 0o600)
