"""A node's whole draw through its BMC's Redfish service (HTTPS and JSON), for the BMCs that
answer Redfish and not DCMI; the operator names the BMC (``llmgw agent --bmc-redfish``).

Which chassis is the node. A BMC lists every chassis it manages under
``/redfish/v1/Chassis``, and a GPU server lists parts of itself there too (a GPU baseboard,
each GPU, a SmartNIC card, a drive enclosure), some with a power reading of their own that
is already in the machine's: reading one of them would see only its GPUs, and adding it
would count them twice. The machine is the chassis whose ``ChassisType`` is one a whole
machine has (RackMount, StandAlone, Blade, Sled) and that is not inside another such
chassis (``Links.ContainedBy``); where no chassis has one of those types, the chassis
inside no other. Of those, exactly one must report a draw: a BMC that reports several
machines' (a blade enclosure's manager) cannot say which of them is this node, so it gives
no figure until the operator names the node's chassis in the URL
(``https://10.0.0.5/redfish/v1/Chassis/Blade2``), which is then read alone.

Its draw: the chassis' ``EnvironmentMetrics`` (``PowerWatts.Reading``, the resource Redfish
2020.4 brought), else its deprecated ``Power`` resource (``PowerConsumedWatts`` of the first
``PowerControl`` member that has one). The resource that answered is remembered, so later
asks are one GET; one that goes (404) is looked for again at the next ask.

Each GET has a timeout (and finding the chassis, which asks for each, one over all) and uses
HTTP basic authentication with the user and password in the operator's file, which is read
once and never logged; no proxy is used and no redirect followed, so they go to the BMC
alone. Refused credentials (401, 403), a certificate the agent does not trust, a redirect,
a bad credentials file or a BMC without Redfish chassis are lasting: the agent does not ask
again until it restarts. A BMC that does not
answer, answers an error, or reports no reading now (null, 0 W, a sensor whose
``Status.State`` is not Enabled) is asked again later. The figure is absent, never 0.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import math
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from fleet.agent.bmc import BMC_TIMEOUT_S, MAX_READING, Reading

log = logging.getLogger(__name__)

CHASSIS = "/redfish/v1/Chassis"
# The ChassisType of a chassis that is a whole machine, not a part or an enclosure of many.
MACHINE_TYPES = ("RackMount", "StandAlone", "Blade", "Sled")
# A BMC's answer is a few kilobytes; more is not a Redfish resource.
LARGEST_ANSWER = 4 * 1024 * 1024
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
    parts = urlsplit(url.strip())
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"--bmc-redfish: {url!r} is not an https URL of a BMC")
    path = parts.path.rstrip("/")
    named = _NAMED_CHASSIS.fullmatch(path)
    if (path not in ("", "/redfish/v1") and named is None) or parts.query or parts.fragment:
        raise ValueError(
            f"--bmc-redfish: {url!r} should be the BMC's address, such as https://10.0.0.5, "
            "or one of its chassis, such as https://10.0.0.5/redfish/v1/Chassis/1"
        )
    try:
        parts.port  # noqa: B018 -- only to refuse a port that is not one
    except ValueError:
        raise ValueError(f"--bmc-redfish: {url!r} has a port that is not one") from None
    return f"{parts.scheme}://{parts.netloc}", path if named else None


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
    return Chassis(
        path=_link(doc) or path,
        name=str(doc.get("Id") or path.rstrip("/").rsplit("/", 1)[-1]),
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
        return Reading(None, f"{where} reads {value!r}, which is not a number")
    if not math.isfinite(value) or value <= 0:
        return Reading(None, f"{where} reads {value:g} W, which is no reading")
    if value > MAX_READING:
        return Reading(
            None, f"{where} reads {value:g} W, past the {MAX_READING:,.0f} W a reading may be"
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
        name = f"{where} PowerControl {control.get('MemberId', '?')}"
        status = control.get("Status")
        state = status.get("State") if isinstance(status, dict) else None
        if state is not None and state != "Enabled":
            return Reading(None, f"{name}'s state is {state}, not Enabled")
        return watts(control.get("PowerConsumedWatts"), name)
    return Reading(None, f"{where} has no PowerControl with PowerConsumedWatts")


class Source(NamedTuple):
    """Where the node's draw was found: the chassis (its Id and path), the resource (its
    path and kind) and how to read it."""

    chassis: str
    chassis_path: str
    path: str
    kind: str
    read: Callable[[Any, str], Reading]


class NoAnswer(Exception):
    """A GET that gave nothing to read: why, in a sentence, and whether it is lasting."""

    def __init__(self, why: str, *, lasting: bool = False, status: int | None = None) -> None:
        super().__init__(why)
        self.why, self.lasting, self.status = why, lasting, status


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
        self._opener: urllib.request.OpenerDirector | None = None
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
            paths = chassis_members(self._get(CHASSIS))
            machines = whole_machines([parse_chassis(p, self._get(p)) for p in paths])
        if not machines:
            return Reading(None, f"the BMC lists no chassis at {CHASSIS}", lasting=True)
        found: list[tuple[Source, Reading]] = []
        why: list[str] = []
        for chassis in machines:
            source, reading = self._chassis_reading(chassis)
            if source is not None:
                found.append((source, reading))
            else:
                why.append(reading.why)
        if len(found) > 1:
            names = ", ".join(s.chassis for s, _ in found)
            return Reading(
                None,
                f"the BMC reports the draw of {len(found)} machines ({names}) and which of "
                "them is this node cannot be told: name its chassis, such as --bmc-redfish "
                f"{self.config.base}{found[0][0].chassis_path}",
                lasting=True,
            )
        if not found:
            return Reading(None, "; ".join(why))
        self._found = found[0][0]
        self._say_found(self._found)
        return found[0][1]

    def _say_found(self, found: Source) -> None:
        """Which chassis and resource the draw is read from, logged once for each."""
        if found.path not in self._said:
            self._said.add(found.path)
            log.info(
                "The node's draw is read through Redfish from chassis %s (%s%s).",
                found.chassis,
                self.config.base,
                found.path,
            )

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
                if no.status != 404:
                    raise
                reading = Reading(None, f"{where} is not there (HTTP 404)")
            if reading.watts is not None:
                return Source(chassis.name, chassis.path, path, kind, read), reading
            why.append(reading.why)
        if not why:
            why.append(f"chassis {chassis.name} has neither EnvironmentMetrics nor Power")
        return None, Reading(None, "; ".join(why))

    def _get(self, path: str) -> Any:
        """The JSON at ``path`` on the BMC; raises NoAnswer with why."""
        url = self.config.base + path
        request = urllib.request.Request(
            url,
            headers={
                "Authorization": self._authorization(),
                "Accept": "application/json",
                "OData-Version": "4.0",
            },
        )
        timeout_s = self.timeout_s
        if self._deadline is not None:
            timeout_s = min(timeout_s, self._deadline - self._clock())
            if timeout_s <= 0:
                raise NoAnswer(
                    f"the BMC did not show where the node's draw is in {self.find_timeout_s:g} s"
                )
        try:
            with self._opener_now().open(request, timeout=timeout_s) as answer:
                body = answer.read(LARGEST_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc.code, path, exc.headers.get("Location")) from None
        except urllib.error.URLError as exc:
            raise self._unreached(exc.reason) from None
        except TimeoutError:
            raise NoAnswer(f"the BMC did not answer {path} in {self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise NoAnswer(f"the BMC's answer to {path} broke off: {exc}") from None
        if len(body) > LARGEST_ANSWER:
            raise NoAnswer(f"the BMC's answer to {path} is larger than a Redfish resource")
        try:
            return json.loads(body)
        except ValueError:
            raise NoAnswer(f"the BMC's answer to {path} is not JSON") from None

    def _opener_now(self) -> urllib.request.OpenerDirector:
        if self._opener is None:
            try:
                context = tls_context(self.config.ca, self.config.insecure)
            except ValueError as exc:
                raise NoAnswer(str(exc), lasting=True) from None
            # No proxy: the BMC is on the machine's own network, never behind HTTPS_PROXY.
            self._opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}),
                urllib.request.HTTPSHandler(context=context),
                _NoRedirect(),
            )
        return self._opener

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
                f"the BMC sends {path} elsewhere ({location or 'nowhere said'}): give "
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

    def _unreached(self, reason: Any) -> NoAnswer:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return NoAnswer(
                f"the BMC's certificate is not trusted ({reason.verify_message}): give its CA "
                "with --bmc-redfish-ca, or accept any with --bmc-redfish-insecure",
                lasting=True,
            )
        if isinstance(reason, TimeoutError):
            return NoAnswer(f"the BMC at {self.config.base} did not answer in {self.timeout_s:g} s")
        return NoAnswer(f"the BMC at {self.config.base} cannot be reached: {reason}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib would send the BMC's credentials on to wherever it
    points, another host included."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None
