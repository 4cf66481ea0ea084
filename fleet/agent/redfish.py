"""A node's whole draw through its BMC's Redfish service (HTTPS and JSON), for the BMCs that
answer Redfish and not DCMI; the operator names the BMC (``llmgw agent --bmc-redfish``).

Which chassis is the node. A BMC lists every chassis it manages under
``/redfish/v1/Chassis``, and a GPU server lists parts of itself there too (a GPU baseboard,
each GPU, a SmartNIC card, a drive enclosure), some with a power reading of their own that
is already in the machine's: reading one of them would see only its GPUs, and adding it
would count them twice. The machine is the chassis whose ``ChassisType`` is one a whole
machine has (RackMount, StandAlone, Blade, Sled) and that is not inside another such
chassis (``Links.ContainedBy``); where no chassis has one of those types, the chassis
inside no other. Of those, exactly one must link to a draw (EnvironmentMetrics or Power;
whether it reads now does not count): a BMC that reports several machines' (a blade
enclosure's manager) cannot say which of them is this node, so it gives no figure until
the operator names the node's chassis in the URL
(``https://10.0.0.5/redfish/v1/Chassis/Blade2``), which is then read alone.

Its draw: the chassis' ``EnvironmentMetrics`` (``PowerWatts.Reading``, the resource Redfish
2020.4 brought), else its deprecated ``Power`` resource (``PowerConsumedWatts`` of the first
``PowerControl`` member that has one). The resource that answered is remembered, so later
asks are one GET; one that goes (404) is looked for again at the next ask.

Each GET has a deadline on the clock (connecting, the request and the whole answer, which a
BMC trickling a byte at a time cannot stretch), finding the chassis one over all, and uses
HTTP basic authentication with the user and password in the operator's file, which is read
once and never logged; no proxy is used and no redirect followed, and a link the BMC sends
is followed only where it is a path under ``/redfish/v1/`` on the BMC itself, so they go to
the BMC alone. Refused credentials (401, 403), a certificate the agent does not trust, a
redirect, a bad credentials file, a BMC without Redfish chassis or one that reports several
machines are lasting: the agent does not ask again until it restarts. A BMC that does not
answer, answers an error or what is not Redfish JSON, lists no chassis (as some do for a
while after a reset), or reports no reading now (null, 0 W, a sensor whose
``Status.State`` is not Enabled) is asked again later. The figure is absent, never 0.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import math
import re
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from fleet.agent.bmc import BMC_TIMEOUT_S, MAX_READING, Reading

log = logging.getLogger(__name__)

CHASSIS = "/redfish/v1/Chassis"
# The ChassisType of a chassis that is a whole machine, not a part or an enclosure of many.
MACHINE_TYPES = ("RackMount", "StandAlone", "Blade", "Sled")
# A BMC's answer is a few kilobytes; more is not a Redfish resource.
LARGEST_ANSWER = 1024 * 1024
# A link the agent follows: a path under the Redfish root, in the characters a URL's path
# may hold (RFC 3986), so that nothing in it can name another host or port.
REDFISH_ROOT = "/redfish/v1/"
_LINK = re.compile(r"/redfish/v1/[A-Za-z0-9\-._~!$&'()*+,;=:@%/]*")
LONGEST_LINK = 1024
# Finding the node's chassis asks the BMC for each of them; all of that within this.
FIND_TIMEOUT_S = 60.0
_NAMED_CHASSIS = re.compile(r"/redfish/v1/Chassis/[^/]+")


@dataclass(frozen=True)
class RedfishConfig:
    """Where the BMC's Redfish service is and how to ask it: ``base`` is scheme://host[:port],
    ``credentials`` the file holding the user and password, ``ca`` a CA file to verify the
    BMC's certificate against (None: the system's), ``insecure`` not to verify it,
    ``chassis`` the path of the node's chassis where the operator named it (None: found)."""

    base: str
    credentials: Path
    ca: Path | None = None
    insecure: bool = False
    chassis: str | None = None


class Chassis(NamedTuple):
    """What a chassis resource says about itself: its path (``@odata.id``), its ``Id``, its
    ``ChassisType``, the chassis it is inside and where its power is read."""

    path: str
    name: str
    kind: str | None = None
    within: str | None = None
    metrics: str | None = None
    power: str | None = None


def redfish_url(url: str) -> tuple[str, str | None]:
    """scheme://host[:port] of a BMC's Redfish URL (``https://10.0.0.5``, or with
    ``/redfish/v1``), and the path of the chassis it names, if it names one
    (``https://10.0.0.5/redfish/v1/Chassis/Blade2``); ValueError, with a sentence, for
    anything else."""
    url = url.strip()
    # Before anything echoes the URL: a user or password in it must not reach the log.
    if "@" in url.split("//", 1)[-1].split("/", 1)[0]:
        raise ValueError(
            "--bmc-redfish: the URL holds a user or password, which every user of the machine "
            "could read (ps); give the BMC's address alone, such as https://10.0.0.5, and the "
            "user and password in the file --bmc-redfish-credentials names"
        )
    if not url.isascii() or not url.isprintable():
        raise ValueError(
            f"--bmc-redfish: {url!r} holds characters a URL may not: give the BMC's address "
            "in ASCII (its IP address, or its name as the DNS holds it)"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"--bmc-redfish: {url!r} is not an https URL of a BMC")
    path = parts.path.rstrip("/")
    named = _NAMED_CHASSIS.fullmatch(path)
    if (
        (path not in ("", "/redfish/v1") and (named is None or link_refusal(path)))
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"--bmc-redfish: {url!r} should be the BMC's address, such as https://10.0.0.5, "
            "or one of its chassis, such as https://10.0.0.5/redfish/v1/Chassis/1"
        )
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"--bmc-redfish: {url!r} has a port that is not one") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}{'' if port is None else f':{port}'}", path if named else None


def read_credentials(path: Path) -> tuple[str, str]:
    """The user and password in ``path``: ``user:password`` on one line, or the user on the
    first line and the password on the second. ValueError, with a sentence naming the file
    and never its contents, when it cannot be read or holds neither."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not text"
        raise ValueError(f"the BMC credentials file {path} cannot be read: {why}") from None
    lines = [line.rstrip("\r") for line in text.splitlines() if line.strip()]
    if len(lines) == 1 and ":" in lines[0]:
        user, _, password = lines[0].partition(":")
    elif len(lines) == 2:
        user, password = lines
    else:
        raise ValueError(
            f"the BMC credentials file {path} holds neither user:password on one line "
            "nor the user and the password on two"
        )
    if not user.strip() or not password:
        raise ValueError(f"the BMC credentials file {path} has an empty user or password")
    return user.strip(), password


def tls_context(ca: Path | None, insecure: bool) -> ssl.SSLContext:
    """How the BMC's certificate is checked: against ``ca`` (else the system's CAs), or not
    at all when ``insecure``. ValueError, with a sentence, for a CA file that is not one."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=str(ca) if ca else None)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"--bmc-redfish-ca: {ca} holds no CA certificate: {why}") from None


def redfish_config(
    url: str, *, credentials: Path | None, ca: Path | None, insecure: bool
) -> RedfishConfig:
    """The agent's Redfish options checked together, as the agent starts: the URL, the
    credentials file read once, the CA file loaded. ValueError, with a sentence."""
    base, chassis = redfish_url(url)
    if credentials is None:
        raise ValueError("--bmc-redfish needs --bmc-redfish-credentials FILE (user:password)")
    if ca is not None and insecure:
        raise ValueError("--bmc-redfish-ca and --bmc-redfish-insecure contradict each other")
    if base.startswith("http:") and (ca is not None or insecure):
        raise ValueError("--bmc-redfish-ca and --bmc-redfish-insecure are for an https URL")
    read_credentials(credentials)
    tls_context(ca, insecure)
    return RedfishConfig(base, credentials, ca, insecure, chassis)


def link_refusal(path: str) -> str:
    """Why the agent does not follow a link the BMC sent, in a sentence; "" when it does. It
    follows a path under /redfish/v1/ alone, in a URL path's characters, with no empty, "."
    or ".." step: the credentials go with it, and must reach the BMC and nowhere else."""
    if not path.startswith(REDFISH_ROOT):
        return f"it is not a path under {REDFISH_ROOT}"
    if len(path) > LONGEST_LINK:
        return "it is longer than a Redfish path is"
    if not path.isascii() or _LINK.fullmatch(path) is None:
        return "it holds characters a URL's path may not"
    steps = unquote(path).split("/")[1:]
    if "" in steps[:-1] or {".", ".."} & set(steps):
        return "it has an empty, . or .. step"
    return ""


def said(value: Any, most: int = 64) -> str:
    """What a BMC sent, as a log line may show it: a string printable and cut to ``most``
    characters, a number as a figure, anything else as JSON names it."""
    if isinstance(value, str):
        shown = "".join(ch if ch.isprintable() else "?" for ch in value[:most])
        return shown + ("…" if len(value) > most else "")
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return _figure(value)
    return "an object" if isinstance(value, dict) else "an array"


def _figure(value: float) -> str:
    try:
        return f"{value:g}"
    except OverflowError:  # an integer past any float: a BMC's garbage, said by its sign
        return "more than 1e+308" if value > 0 else "less than -1e+308"


def _link(value: Any) -> str | None:
    """The ``@odata.id`` of a link object, or None."""
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return value["@odata.id"]
    return None


def chassis_members(doc: Any) -> list[str]:
    """The paths of the chassis a ChassisCollection lists."""
    members = doc.get("Members") if isinstance(doc, dict) else None
    return [p for p in map(_link, members if isinstance(members, list) else []) if p]


def parse_chassis(path: str, doc: Any) -> Chassis:
    """A chassis resource as :class:`Chassis`; what it lacks is None."""
    doc = doc if isinstance(doc, dict) else {}
    links = doc.get("Links") if isinstance(doc.get("Links"), dict) else {}
    kind = doc.get("ChassisType")
    own = _link(doc)
    name = doc.get("Id")
    return Chassis(
        path=own if own and not link_refusal(own) else path,
        name=said(name) if isinstance(name, str) and name else path.rstrip("/").rsplit("/")[-1],
        kind=kind if isinstance(kind, str) else None,
        within=_link(links.get("ContainedBy")),
        metrics=_link(doc.get("EnvironmentMetrics")),
        power=_link(doc.get("Power")),
    )


def whole_machines(chassis: Sequence[Chassis]) -> list[Chassis]:
    """The chassis that may be the whole machine, in the BMC's order: those of a machine's
    type inside no other of a machine's type; where none has such a type, those inside no
    chassis. A part of the machine (a GPU baseboard, a card) is never one."""
    machines = [c for c in chassis if c.kind in MACHINE_TYPES]
    if not machines:
        return [c for c in chassis if c.within is None]
    paths = {c.path for c in machines}
    return [c for c in machines if c.within not in paths]


def watts(value: Any, where: str) -> Reading:
    """A draw in watts from ``value`` as ``where`` reports it: absent when there is none,
    it is not a number, 0 or less (no reading), or past what the protocol takes."""
    if value is None:
        return Reading(None, f"{where} has no reading")
    if isinstance(value, bool) or not isinstance(value, int | float):
        what = repr(said(value)) if isinstance(value, str) else said(value)
        return Reading(None, f"{where} reads {what}, which is not a number")
    # An integer is compared as it is: one past a float's range would raise OverflowError.
    if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
        return Reading(None, f"{where} reads {_figure(value)} W, which is no reading")
    if value > MAX_READING:
        return Reading(
            None,
            f"{where} reads {_figure(value)} W, past the {MAX_READING:,.0f} W a reading may be",
        )
    return Reading(float(value))


def metrics_reading(doc: Any, where: str = "EnvironmentMetrics") -> Reading:
    """The draw in an EnvironmentMetrics resource: ``PowerWatts.Reading``."""
    power = doc.get("PowerWatts") if isinstance(doc, dict) else None
    if not isinstance(power, dict):
        return Reading(None, f"{where} has no PowerWatts")
    return watts(power.get("Reading"), f"{where} PowerWatts")


def power_reading(doc: Any, where: str = "Power") -> Reading:
    """The draw in a (deprecated) Power resource: ``PowerConsumedWatts`` of the first
    PowerControl member that has one; absent when that member's sensor is not Enabled."""
    controls = doc.get("PowerControl") if isinstance(doc, dict) else None
    for control in controls if isinstance(controls, list) else []:
        if not isinstance(control, dict) or control.get("PowerConsumedWatts") is None:
            continue
        name = f"{where} PowerControl {said(control.get('MemberId', '?'))}"
        status = control.get("Status")
        state = status.get("State") if isinstance(status, dict) else None
        if state is not None and state != "Enabled":
            return Reading(None, f"{name}'s state is {said(state)}, not Enabled")
        return watts(control.get("PowerConsumedWatts"), name)
    return Reading(None, f"{where} has no PowerControl with PowerConsumedWatts")


def pick_machine(machines: Sequence[Chassis], base: str) -> Chassis | Reading:
    """Of the whole machines a BMC lists, the chassis whose draw is the node's, or why there
    is none. Decided from the links each has to EnvironmentMetrics or Power, never from which
    reads now: a blade without a reading at one look would leave another's draw taken for
    this node's. Several is lasting (a blade enclosure's manager: which is this node cannot be
    told); none is asked again (a BMC lists no chassis for a while after a reset)."""
    if not machines:
        return Reading(None, f"the BMC lists no chassis at {CHASSIS}")
    metered = [m for m in machines if m.metrics or m.power]
    if not metered:
        return Reading(
            None,
            "; ".join(
                f"chassis {m.name} has neither EnvironmentMetrics nor Power" for m in machines
            ),
        )
    if len(metered) > 1:
        return Reading(
            None,
            f"the BMC reports the draw of {len(metered)} machines "
            f"({', '.join(m.name for m in metered)}) and which of them is this node cannot be "
            f"told: name its chassis, such as --bmc-redfish {base}{metered[0].path}",
            lasting=True,
        )
    return metered[0]


class Source(NamedTuple):
    """Where the node's draw was found: the chassis (its Id), the resource (its path and
    kind) and how to read it."""

    chassis: str
    path: str
    kind: str
    read: Callable[[Any, str], Reading]


class NoAnswer(Exception):
    """A GET that gave nothing to read: why, in a sentence, and whether it is lasting."""

    def __init__(
        self, why: str, *, lasting: bool = False, status: int | None = None, link: bool = False
    ) -> None:
        super().__init__(why)
        self.why, self.lasting, self.status = why, lasting, status
        self.link = link  # a link the agent does not follow: nothing was asked


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (monotonic); TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the GET's deadline passed")
    return left


class _Timed:
    """A connected socket whose every send and receive ends by one deadline (monotonic
    seconds): a socket's own timeout is for each receive, which a BMC sending a byte at a
    time would stretch without end. Only what http.client uses of a socket."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(_left(self.deadline))
        self.sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self.sock.settimeout(_left(self.deadline))
        return self.sock.recv_into(buffer)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Received(self))

    def close(self) -> None:
        """Nothing: http.client closes a connection that will not be kept while the answer
        is still read from it (a socket waits for the files made from it); the socket is
        closed when the GET ends (:meth:`_Connection.end`)."""


class _Received(io.RawIOBase):
    """The answer as http.client reads it, each read through :class:`_Timed`."""

    def __init__(self, sock: _Timed) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.sock.recv_into(buffer)


class _Connection(http.client.HTTPConnection):
    """One GET's connection to the BMC (over TLS given ``tls``) that ends by ``deadline`` in
    all: connecting, the TLS handshake, the request and each read of the answer. http.client
    uses no proxy and follows no redirect, and asks this host and port alone whatever the
    path, so the credentials go to the BMC and nowhere else."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, deadline: float):
        super().__init__(host, port)
        self.default_port = 443 if tls is not None else 80  # the Host header's
        self.tls, self.deadline = tls, deadline
        self.raw: socket.socket | None = None

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), _left(self.deadline))
        try:
            sock.settimeout(_left(self.deadline))  # the TLS handshake's, in all
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self.raw, self.sock = sock, _Timed(sock, self.deadline)

    def end(self) -> None:
        """Close the connection and its socket."""
        self.close()
        if self.raw is not None:
            self.raw.close()


class RedfishSource:
    """The node's draw from its BMC's Redfish service, one :class:`Reading` a call (for
    ``BmcReader(source=...)``, which calls it at most every 30 s and one at a time).
    ``timeout_s`` bounds each GET, and
    ``find_timeout_s`` all of those that find the node's chassis; ``clock`` is monotonic
    seconds."""

    def __init__(
        self,
        config: RedfishConfig,
        *,
        timeout_s: float = BMC_TIMEOUT_S,
        find_timeout_s: float = FIND_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self.find_timeout_s = find_timeout_s
        parts = urlsplit(config.base)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls: ssl.SSLContext | None = None
        self._clock = clock
        self._deadline: float | None = None  # while finding the node's chassis
        self._auth: str | None = None
        self._found: Source | None = None
        self._said: set[str] = set()

    def __call__(self) -> Reading:
        try:
            if self._found is None:
                self._deadline = self._clock() + self.find_timeout_s
                try:
                    return self._find()
                finally:
                    self._deadline = None
            found = self._found
            return found.read(self._get(found.path), f"chassis {found.chassis}'s {found.kind}")
        except NoAnswer as no:
            if no.status == 404:
                self._found = None  # gone (a BMC's firmware changed): looked for again
            return Reading(None, no.why, lasting=no.lasting)

    def _find(self) -> Reading:
        """Read every chassis (or the one named), pick the whole machine and its draw;
        remember where."""
        if self.config.chassis is not None:
            machines = [parse_chassis(self.config.chassis, self._get(self.config.chassis))]
        else:
            listed, skipped = self._chassis()
            machines = whole_machines(listed)
            if not listed and skipped:
                return Reading(None, "; ".join(skipped))
        chosen = pick_machine(machines, self.config.base)
        if isinstance(chosen, Reading):
            return chosen
        source, reading = self._chassis_reading(chosen)
        if source is not None:
            self._found = source
            self._say_found(source)
        return reading

    def _chassis(self) -> tuple[list[Chassis], list[str]]:
        """Every chassis the BMC lists, and why any link to one was not followed (each
        reason logged once)."""
        listed: list[Chassis] = []
        skipped: list[str] = []
        for path in chassis_members(self._get(CHASSIS)):
            try:
                listed.append(parse_chassis(path, self._get(path)))
            except NoAnswer as no:
                if not no.link:
                    raise
                skipped.append(no.why)
                self._say_once(f"A chassis is skipped: {no.why}.")
        return listed, skipped

    def _say_found(self, found: Source) -> None:
        """Which chassis and resource the draw is read from, logged once for each."""
        self._say_once(
            f"The node's draw is read through Redfish from chassis {found.chassis} "
            f"({self.config.base}{found.path}).",
            level=logging.INFO,
        )

    def _say_once(self, line: str, level: int = logging.WARNING) -> None:
        if line not in self._said:
            self._said.add(line)
            log.log(level, "%s", line)

    def _chassis_reading(self, chassis: Chassis) -> tuple[Source | None, Reading]:
        """The chassis' draw and where it was read; (None, why) when it reports none."""
        asks = (
            (chassis.metrics, metrics_reading, "EnvironmentMetrics"),
            (chassis.power, power_reading, "Power"),
        )
        why: list[str] = []
        for path, read, kind in asks:
            if path is None:
                continue
            where = f"chassis {chassis.name}'s {kind}"
            try:
                reading = read(self._get(path), where)
            except NoAnswer as no:
                if no.link:
                    reading = Reading(None, f"{where}: {no.why}")
                elif no.status == 404:
                    reading = Reading(None, f"{where} is not there (HTTP 404)")
                else:
                    raise
            if reading.watts is not None:
                return Source(chassis.name, path, kind, read), reading
            why.append(reading.why)
        if not why:
            why.append(f"chassis {chassis.name} has neither EnvironmentMetrics nor Power")
        return None, Reading(None, "; ".join(why))

    def _get(self, path: str) -> Any:
        """The JSON at ``path`` on the BMC; raises NoAnswer with why."""
        if why := link_refusal(path):
            raise NoAnswer(
                f"the BMC links to {said(path, LONGEST_LINK)!r}, which the agent does not "
                f"follow: {why}",
                link=True,
            )
        headers = self._headers()
        timeout_s = self._time_left()
        connection = _Connection(
            self._host, self._port, self._tls_now(), time.monotonic() + timeout_s
        )
        try:
            self._connect(connection, timeout_s)
            status, location, body = self._exchange(connection, path, headers, timeout_s)
        finally:
            connection.end()
        if status >= 300:
            raise self._refusal(status, path, location)
        try:
            return json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            raise NoAnswer(f"the BMC's answer to {path} is not Redfish JSON") from None

    def _time_left(self) -> float:
        """This GET's timeout: ``timeout_s``, or less while finding the node's chassis."""
        if self._deadline is None:
            return self.timeout_s
        left = min(self.timeout_s, self._deadline - self._clock())
        if left <= 0:
            raise NoAnswer(
                f"the BMC did not show where the node's draw is in {self.find_timeout_s:g} s"
            )
        return left

    def _connect(self, connection: _Connection, timeout_s: float) -> None:
        try:
            connection.connect()
        except ssl.SSLCertVerificationError as exc:
            raise NoAnswer(
                f"the BMC's certificate is not trusted ({exc.verify_message}): give its CA "
                "with --bmc-redfish-ca, or accept any with --bmc-redfish-insecure",
                lasting=True,
            ) from None
        except TimeoutError:
            raise NoAnswer(
                f"the BMC at {self.config.base} did not answer in {timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise NoAnswer(f"the BMC at {self.config.base} cannot be reached: {exc}") from None

    def _exchange(
        self, connection: _Connection, path: str, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, str | None, bytes]:
        """The status, Location and body of the BMC's answer to GET ``path``."""
        try:
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            if answer.status >= 300:
                return answer.status, answer.getheader("Location"), b""
            body = answer.read(LARGEST_ANSWER + 1)
        except TimeoutError:
            raise NoAnswer(f"the BMC did not answer {path} in {timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise NoAnswer(f"the BMC's answer to {path} broke off: {exc}") from None
        if len(body) > LARGEST_ANSWER:
            raise NoAnswer(
                f"the BMC's answer to {path} is larger than a Redfish resource "
                f"({LARGEST_ANSWER // 1024 // 1024} MiB)"
            )
        return answer.status, None, body

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": self._authorization(),
            "Accept": "application/json",
            "OData-Version": "4.0",
        }

    def _tls_now(self) -> ssl.SSLContext | None:
        """How the BMC's certificate is checked, made at the first ask; None over http."""
        if self._tls is None and self.config.base.startswith("https:"):
            try:
                self._tls = tls_context(self.config.ca, self.config.insecure)
            except ValueError as exc:
                raise NoAnswer(str(exc), lasting=True) from None
        return self._tls

    def _authorization(self) -> str:
        """The basic-auth header's value, from the credentials file read at the first ask."""
        if self._auth is None:
            try:
                user, password = read_credentials(self.config.credentials)
            except ValueError as exc:
                raise NoAnswer(str(exc), lasting=True) from None
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            self._auth = f"Basic {token}"
        return self._auth

    def _refusal(self, status: int, path: str, location: str | None) -> NoAnswer:
        if status in (401, 403):
            return NoAnswer(
                f"the BMC refused the credentials in {self.config.credentials} (HTTP {status})",
                lasting=True,
                status=status,
            )
        if 300 <= status < 400:
            return NoAnswer(
                f"the BMC sends {path} elsewhere ({said(location or 'nowhere said', 200)}): give "
                "--bmc-redfish the address it answers at",
                lasting=True,
                status=status,
            )
        if status == 404 and path in (CHASSIS, self.config.chassis):
            return NoAnswer(
                f"the BMC at {self.config.base} has no Redfish chassis at {path} (HTTP 404)",
                lasting=True,
                status=status,
            )
        return NoAnswer(f"the BMC answered {path} with HTTP {status}", status=status)
