"""``llmgw agent``: the command line, and running the agent until stopped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from fleet.agent import AGENT_VERSION
from fleet.agent.cache import WeightCache
from fleet.agent.client import Agent, AgentSettings
from fleet.agent.contain import MemoryReader, kernel_limits, real_nvml
from fleet.agent.credentials import Credentials
from fleet.agent.discovery import Machine, advertise_address, parse_gpu_spec, simulated_gpus
from fleet.agent.engines import use_binary
from fleet.agent.fabric import FabricReader, SimulatedFabric, parse_fabric_spec
from fleet.agent.install import Installer
from fleet.agent.redfish import RedfishConfig, redfish_config
from fleet.agent.sensors import sim_power_path
from fleet.agent.supervisor import Supervisor
from fleet.agent.upgrade import Upgrader
from fleet.domain.power import (
    PDU_LABEL,
    PHASE_LABEL,
    RACK_LABEL,
    ROOM_LABEL,
    ROW_LABEL,
    SITE_LABEL,
    ZONE_LABEL,
    name_refusal,
    phase_refusal,
    phase_token_refusal,
)

log = logging.getLogger("fleet.agent")

# Replaces `python -m llmgw sim-engine` for the sim engine (tests, demos).
SIM_COMMAND_ENV = "LLMGW_AGENT_SIM_COMMAND"

T = TypeVar("T")


def ws_url(server: str) -> str:
    """The agent websocket URL for a server URL: http→ws, https→wss, path /ws/agent/."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"{server!r} is not an http(s) URL of the control plane")
    path = parts.path.rstrip("/") + "/ws/agent/"
    return urlunsplit((schemes[parts.scheme], parts.netloc, path, "", ""))


def parse_labels(values: list[str]) -> dict[str, str]:
    """``["a=1,b=2", "c=3"]`` → ``{"a": "1", "b": "2", "c": "3"}``."""
    labels: dict[str, str] = {}
    for value in values:
        for item in value.split(","):
            if not item.strip():
                continue
            key, val = _key_value(item, f"label {item!r} is not key=value")
            labels[key] = val
    return labels


def _key_value(item: str, refusal: str) -> tuple[str, str]:
    """A label's key and value from ``key=value``; ValueError(`refusal`) for anything else."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(refusal)
    return key.strip(), value.strip()


def location_labels(
    *,
    zone: str | None,
    rack: str | None,
    pdu: str | None,
    row: str | None = None,
    room: str | None = None,
    site: str | None = None,
    pdu_phase: str | None = None,
) -> dict[str, str]:
    """The well-known labels for ``--zone``, ``--rack``, ``--pdu`` (several PDUs comma
    separated, for a dual-fed rack), ``--pdu-phase`` (the phase of each, in their order),
    ``--row``, ``--room`` and ``--site``; ValueError, with a sentence, for a name a budget
    could not name (docs/facility.md)."""
    out: dict[str, str] = {}
    named = (
        ("zone", ZONE_LABEL, zone),
        ("rack", RACK_LABEL, rack),
        ("row", ROW_LABEL, row),
        ("room", ROOM_LABEL, room),
        ("site", SITE_LABEL, site),
    )
    for what, label, value in named:
        if value is not None:
            if why := name_refusal(what, value.strip()):
                raise ValueError(f"--{what}: {why.rstrip('.')}")
            out[label] = value.strip()
    if pdu is not None:
        names = [p.strip() for p in pdu.split(",")]
        for name in names:
            if why := name_refusal("PDU", name):
                raise ValueError(f"--pdu: {why.rstrip('.')}")
        out[PDU_LABEL] = ",".join(dict.fromkeys(names))
    if pdu_phase is not None:
        phases = [p.strip() for p in pdu_phase.split(",")]
        for phase in phases:
            if why := phase_token_refusal(phase):
                raise ValueError(f"--pdu-phase: {why.rstrip('.')}")
        out[PHASE_LABEL] = ",".join(phases)
    return out


def labels_checked(labels: dict[str, str]) -> dict[str, str]:
    """The node's labels, all given; ValueError, with the sentence, where its
    ``llmgw.io/pdu-phase`` cannot be read against its ``llmgw.io/pdu`` (power.phase_refusal):
    the server would ignore such phases, so the agent is stopped before it connects."""
    if why := phase_refusal(labels):
        raise ValueError(why.rstrip("."))
    return labels


def labels_file(path: Path) -> dict[str, str]:
    """The labels in a file, one ``key=value`` a line (blank lines and ``#`` comments left
    out); ValueError, with a sentence naming the file, when it cannot be read or a line is
    not key=value."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"the labels file {path} cannot be read: {exc.strerror}") from None
    labels: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, value = _key_value(line, f"line {number} of the labels file {path} is not key=value")
        labels[key] = value
    return labels


def parse_port_range(value: str) -> tuple[int, int]:
    """``"20000-29999"`` → ``(20000, 29999)``."""
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
    if not m:
        raise ValueError(f"{value!r} is not a port range such as 20000-29999")
    low, high = int(m.group(1)), int(m.group(2))
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{value!r} is not a port range within 1-65535")
    return low, high


def node_id_for(state_dir: Path, given: str | None) -> str:
    """The node id: given, else the one kept in ``<state-dir>/node-id``, made once."""
    if given:
        return given
    path = state_dir / "node-id"
    try:
        existing = path.read_text().strip()
    except FileNotFoundError:
        existing = ""
    if existing:
        return existing
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "node"
    node_id = f"{host}-{secrets.token_hex(3)}"
    state_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(node_id + "\n")
    return node_id


def _arg(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises ValueError with a sentence."""

    def convert(value: str) -> T:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def _gpu_spec(value: str) -> str:
    parse_gpu_spec(value)  # only to refuse a bad one at the command line
    return value


def _fabric_spec(value: str) -> str:
    parse_fabric_spec(value)  # only to refuse a bad one at the command line
    return value


def executable_file(value: str) -> str:
    """``value`` as an absolute path, if it names a file this user may run."""
    path = Path(value).expanduser()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"{value} is not an executable file")
    return str(path.resolve())


def build_parser() -> argparse.ArgumentParser:
    """The ``llmgw agent`` argument parser."""
    home = os.environ.get("LLMGW_HOME")
    p = argparse.ArgumentParser(
        prog="llmgw agent",
        description="Run this machine as a node of an llmgw cluster.",
    )
    p.add_argument(
        "--server",
        default=os.environ.get("LLMGW_SERVER", "http://127.0.0.1:8000"),
        help="control plane URL (env LLMGW_SERVER; default %(default)s)",
    )
    # The token by the environment or a file: on the command line every user of the
    # machine can read it (ps, /proc/PID/cmdline).
    p.add_argument(
        "--token",
        default=os.environ.get("LLMGW_TOKEN"),
        help="cluster join token; better given by env LLMGW_TOKEN or --token-file",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=os.environ.get("LLMGW_TOKEN_FILE") or None,
        metavar="PATH",
        help="a file holding the cluster join token (env LLMGW_TOKEN_FILE)",
    )
    p.add_argument("--node-id", help="default: kept in <state-dir>/node-id, made once")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(home) / "agent" if home else Path("var/agent"),
        help="node id, engine logs (default $LLMGW_HOME/agent or ./var/agent)",
    )
    p.add_argument(
        "--advertise-addr",
        help="address engines are reached at (default: the one that reaches the server)",
    )
    p.add_argument(
        "--labels", action="append", default=[], metavar="K=V[,K=V]", help="node labels; repeatable"
    )
    p.add_argument(
        "--labels-file",
        type=Path,
        metavar="PATH",
        help="node labels from a file, one key=value a line; --labels and the flags below win",
    )
    p.add_argument("--zone", help="the zone the node is in (the label llmgw.io/zone)")
    p.add_argument("--rack", help="the rack the node is in (the label llmgw.io/rack)")
    p.add_argument("--row", help="the row of racks the node is in (the label llmgw.io/row)")
    p.add_argument("--room", help="the room or hall the node is in (the label llmgw.io/room)")
    p.add_argument("--site", help="the site the node is in (the label llmgw.io/site)")
    p.add_argument(
        "--pdu",
        metavar="PDU[,PDU]",
        help="the PDUs the node draws from, both feeds of a dual-fed rack (llmgw.io/pdu)",
    )
    p.add_argument(
        "--pdu-phase",
        metavar="PHASE[,PHASE]",
        help="the phase of each of those PDUs it is plugged into, in their order: L2, or L2,L1 "
        "(llmgw.io/pdu-phase)",
    )
    p.add_argument(
        "--simulate-gpus",
        metavar="SPEC",
        type=_arg(_gpu_spec),
        help="pretend to have these GPUs, e.g. 8xh100-80g or 2xa100-80g,1xl40s-48g",
    )
    p.add_argument(
        "--simulate-fabric",
        metavar="DOMAIN:CLIQUE",
        type=_arg(_fabric_spec),
        help="with --simulate-gpus: pretend those GPUs are joined to clique CLIQUE of the "
        "NVLink domain DOMAIN, IMEX up (nodes given the same share a clique), e.g. nvl72-a:1",
    )
    p.add_argument("--memory-gb", type=float, help="pretend to have this much memory")
    p.add_argument("--cpus", type=int, help="pretend to have this many CPUs")
    p.add_argument("--disk-gb", type=float, help="pretend to have this much disk, all free")
    p.add_argument(
        "--llama-server",
        type=_arg(executable_file),
        metavar="PATH",
        help="run llama.cpp shards with this llama-server, as it is (default: llama-server "
        "on PATH, else one installed from the mirror's engine builds into "
        "<state-dir>/engines)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="where weights fetched from the mirror are kept (default <state-dir>/weights)",
    )
    p.add_argument("--heartbeat-interval", type=float, default=5.0, metavar="SECONDS")
    p.add_argument(
        "--no-bmc",
        action="store_true",
        help="do not read the node's whole draw from its BMC (ipmitool dcmi power reading, "
        "or Redfish with --bmc-redfish, every 30 s); without ipmitool or a BMC it is not "
        "read anyway",
    )
    p.add_argument(
        "--bmc-redfish",
        metavar="URL",
        help="read the node's whole draw from its BMC's Redfish service at URL (e.g. "
        "https://10.0.0.5, or the host interface's address) instead of ipmitool's DCMI; no "
        "user or password in it: they go in --bmc-redfish-credentials",
    )
    # From a file only: on the command line every user of the machine could read it.
    p.add_argument(
        "--bmc-redfish-credentials",
        type=Path,
        metavar="FILE",
        help="the BMC user and password for --bmc-redfish: user:password on one line, or "
        "the user and the password on two; keep it readable by the agent alone",
    )
    p.add_argument(
        "--bmc-redfish-ca",
        type=Path,
        metavar="FILE",
        help="verify the BMC's certificate against the CA certificates in FILE (default: "
        "the system's)",
    )
    p.add_argument(
        "--bmc-redfish-insecure",
        action="store_true",
        help="accept any certificate from the BMC (a BMC's own self-signed one): anyone on "
        "the path to the BMC can then pose as it and learn its user and password",
    )
    p.add_argument(
        "--port-range",
        type=_arg(parse_port_range),
        default=(20000, 29999),
        help="ports for engines (default 20000-29999)",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper
    )
    return p


def join_token(args: argparse.Namespace) -> str | None:
    """The join token: --token (or LLMGW_TOKEN), else the first line of --token-file (or
    LLMGW_TOKEN_FILE); None when neither is given. ValueError, with a sentence naming the
    file, when it cannot be read or holds nothing."""
    if args.token:
        return args.token
    if args.token_file is None:
        return None
    try:
        words = Path(args.token_file).read_text().split()
    except OSError as exc:
        raise ValueError(
            f"the token file {args.token_file} cannot be read: {exc.strerror}."
        ) from None
    if not words:
        raise ValueError(f"the token file {args.token_file} is empty.")
    return words[0]


def bmc_redfish(args: argparse.Namespace) -> RedfishConfig | None:
    """The BMC's Redfish service from --bmc-redfish and its options, checked (the
    credentials file read, the CA file loaded); None without --bmc-redfish. ValueError, with
    a sentence, for options that do not go together or a file that will not do."""
    if args.bmc_redfish is None:
        given = [
            flag
            for flag, value in (
                ("--bmc-redfish-credentials", args.bmc_redfish_credentials),
                ("--bmc-redfish-ca", args.bmc_redfish_ca),
                ("--bmc-redfish-insecure", args.bmc_redfish_insecure),
            )
            if value
        ]
        if given:
            raise ValueError(f"{given[0]} is for --bmc-redfish URL, which is not given")
        return None
    if args.no_bmc:
        raise ValueError("--no-bmc and --bmc-redfish contradict each other")
    return redfish_config(
        args.bmc_redfish,
        credentials=args.bmc_redfish_credentials,
        ca=args.bmc_redfish_ca,
        insecure=args.bmc_redfish_insecure,
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``llmgw agent``; the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Health and metrics polls every few seconds would drown what the agent decides.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    state_dir: Path = args.state_dir
    try:
        args.token = join_token(args)
    except ValueError as exc:
        print(f"llmgw agent: {exc}", file=sys.stderr)
        return 2
    credentials = Credentials(state_dir, args.token)
    if not args.token and not credentials.joined:
        print(
            "llmgw agent needs the cluster's join token to join: set LLMGW_TOKEN, or "
            "LLMGW_TOKEN_FILE to a file holding it (`llmgw createtoken --agent NAME` makes "
            "one); once joined, the node's own "
            f"credential is kept in {credentials.path}.",
            file=sys.stderr,
        )
        return 2
    try:
        url = ws_url(args.server)
        labels = labels_file(args.labels_file) if args.labels_file else {}
        labels |= parse_labels(args.labels)
        labels |= location_labels(
            zone=args.zone,
            rack=args.rack,
            pdu=args.pdu,
            row=args.row,
            room=args.room,
            site=args.site,
            pdu_phase=args.pdu_phase,
        )
        labels = labels_checked(labels)
        redfish = bmc_redfish(args)
    except ValueError as exc:
        print(f"llmgw agent: {exc}.", file=sys.stderr)
        return 2
    for name in ("memory_gb", "cpus", "disk_gb", "heartbeat_interval"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            print(f"llmgw agent: --{name.replace('_', '-')} must be more than 0.", file=sys.stderr)
            return 2

    if args.llama_server:
        use_binary("llamacpp", args.llama_server)
    # Engines installed from the mirror by an earlier run, where none was given or is on PATH.
    installer = Installer(state_dir / "engines", server=args.server, bearer=credentials)
    installer.adopt()
    node_id = node_id_for(state_dir, args.node_id)
    server = urlsplit(url)
    advertise = args.advertise_addr or advertise_address(server.hostname or "", server.port or 80)
    machine = Machine(
        state_dir,
        gpus=simulated_gpus(args.simulate_gpus, node_id) if args.simulate_gpus else None,
        memory_gb=args.memory_gb,
        cpus=args.cpus,
        disk_gb=args.disk_gb,
    )
    sim_command = shlex.split(os.environ.get(SIM_COMMAND_ENV, "")) or None
    # Engines held to their room: by the kernel where a cgroup is delegated, watched always.
    kernel, held = kernel_limits()
    log.info("%s", held)
    supervisor = Supervisor(
        state_dir,
        advertise_addr=advertise,
        port_range=args.port_range,
        cpu_count=machine.cpu_count(),
        sim_command=sim_command,
        sim_power_file=sim_power_path(state_dir) if machine.gpus_simulated else None,
        cache=WeightCache(
            args.cache_dir or state_dir / "weights", server=args.server, bearer=credentials
        ),
        installer=installer,
        memory=MemoryReader(nvml=None if args.simulate_gpus else real_nvml()),
        kernel=kernel,
    )
    settings = AgentSettings(
        ws_url=url,
        credentials=credentials,
        node_id=node_id,
        advertise_addr=advertise,
        labels=labels,
        heartbeat_interval_s=args.heartbeat_interval,
        read_bmc=not args.no_bmc,
        bmc_redfish=redfish,
    )
    log.info(
        "llmgw agent %s: node %s, %d GPUs, engines %s, advertising %s, server %s",
        AGENT_VERSION,
        node_id,
        len(machine.gpus),
        ", ".join(machine.engines),
        advertise,
        url,
    )
    agent = Agent(settings, machine, supervisor, fabric=fabric_reader(args, machine))
    agent.upgrader = Upgrader(state_dir, server=args.server, bearer=credentials)
    asyncio.run(_run(agent))
    return 0


def fabric_reader(
    args: argparse.Namespace, machine: Machine
) -> FabricReader | SimulatedFabric | None:
    """What reads the node's GPU fabric: the simulated one asked for; none for simulated
    GPUs without one (the real cards, ports and IMEX here are not the node registered,
    and one machine plays many nodes); else the machine's own, through NVML and sysfs."""
    if args.simulate_fabric and machine.gpus_simulated:
        return SimulatedFabric(args.simulate_fabric, len(machine.gpus))
    if machine.gpus_simulated:
        return None
    return FabricReader(nvml=real_nvml())


async def _run(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Engines an earlier run left behind (it was killed): adopted or stopped before the first
    # register, which lists those adopted.
    adopted = await agent.supervisor.adopt()
    if adopted:
        log.info("adopted %d engines from an earlier run: %s", len(adopted), ", ".join(adopted))
    await agent.run(stop)
