"""A BMC's Redfish service for the agent's tests: resources shaped as DMTF's public mockups
shape them (Redfish-Publications mockups/public-rackmount1 and public-smartnic), served by a
real local HTTP(S) server that checks basic authentication."""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COPYRIGHT = "Copyright 2014-2025 DMTF. For the full DMTF copyright policy, see http://www.dmtf.org/about/policies/copyright."


def collection(*paths: str) -> dict[str, Any]:
    return {
        "@odata.type": "#ChassisCollection.ChassisCollection",
        "Name": "Chassis Collection",
        "Members@odata.count": len(paths),
        "Members": [{"@odata.id": p} for p in paths],
        "@odata.id": "/redfish/v1/Chassis",
        "@Redfish.Copyright": COPYRIGHT,
    }


def chassis(
    name: str,
    kind: str = "RackMount",
    *,
    within: str | None = None,
    contains: tuple[str, ...] = (),
    metrics: bool = True,
    power: bool = True,
) -> dict[str, Any]:
    """A Chassis resource as public-rackmount1's 1U (or public-smartnic's Card1 inside one)."""
    path = f"/redfish/v1/Chassis/{name}"
    doc: dict[str, Any] = {
        "@odata.type": "#Chassis.v1_22_0.Chassis",
        "Id": name,
        "Name": "Computer System Chassis" if kind == "RackMount" else f"{name} Chassis",
        "ChassisType": kind,
        "Manufacturer": "Contoso",
        "Model": "3500RX",
        "SerialNumber": "437XR1138R2",
        "PowerState": "On",
        "Status": {"State": "Enabled", "Health": "OK"},
        "ThermalSubsystem": {"@odata.id": f"{path}/ThermalSubsystem"},
        "PowerSubsystem": {"@odata.id": f"{path}/PowerSubsystem"},
        "Sensors": {"@odata.id": f"{path}/Sensors"},
        "Links": {
            "ComputerSystems": [{"@odata.id": "/redfish/v1/Systems/437XR1138R2"}],
            "ManagedBy": [{"@odata.id": "/redfish/v1/Managers/BMC"}],
        },
        "@odata.id": path,
        "@Redfish.Copyright": COPYRIGHT,
    }
    if metrics:
        doc["EnvironmentMetrics"] = {"@odata.id": f"{path}/EnvironmentMetrics"}
    if power:
        doc["Power@Redfish.Deprecated"] = f"Please migrate to use {path}/PowerSubsystem"
        doc["Power"] = {"@odata.id": f"{path}/Power"}
    if within:
        doc["Links"]["ContainedBy"] = {"@odata.id": f"/redfish/v1/Chassis/{within}"}
    if contains:
        doc["Links"]["Contains"] = [{"@odata.id": f"/redfish/v1/Chassis/{c}"} for c in contains]
    return doc


def environment_metrics(name: str, reading: Any) -> dict[str, Any]:
    """public-rackmount1's Chassis/1U/EnvironmentMetrics, its PowerWatts reading as given."""
    path = f"/redfish/v1/Chassis/{name}"
    return {
        "@odata.type": "#EnvironmentMetrics.v1_3_0.EnvironmentMetrics",
        "Name": "Chassis Environment Metrics",
        "TemperatureCelsius": {"Reading": 39, "DataSourceUri": f"{path}/Sensors/CPU1Temp"},
        "PowerWatts": {"Reading": reading, "DataSourceUri": f"{path}/Sensors/TotalPower"},
        "PowerLimitWatts": {
            "SetPoint": 500,
            "AllowableMax": 1000,
            "AllowableMin": 150,
            "ControlMode": "Automatic",
            "DataSourceUri": f"{path}/Controls/PowerLimit",
        },
        "FanSpeedsPercent": [
            {
                "DeviceName": "Chassis Fan #1",
                "Reading": 45,
                "SpeedRPM": 1900,
                "DataSourceUri": f"{path}/Sensors/FanBay1",
            }
        ],
        "Oem": {},
        "@odata.id": f"{path}/EnvironmentMetrics",
        "@Redfish.Copyright": COPYRIGHT,
    }


def power(name: str, consumed: Any, state: str = "Enabled") -> dict[str, Any]:
    """public-rackmount1's (deprecated) Chassis/1U/Power, its PowerControl as given."""
    path = f"/redfish/v1/Chassis/{name}"
    return {
        "@odata.type": "#Power.v1_7_1.Power",
        "Id": "Power",
        "Name": "Power",
        "PowerControl": [
            {
                "@odata.id": f"{path}/Power#/PowerControl/0",
                "MemberId": "0",
                "Name": "System Input Power",
                "PowerConsumedWatts": consumed,
                "PowerRequestedWatts": 800,
                "PowerAvailableWatts": 0,
                "PowerCapacityWatts": 800,
                "PowerAllocatedWatts": 800,
                "PowerMetrics": {
                    "IntervalInMin": 30,
                    "MinConsumedWatts": 271,
                    "MaxConsumedWatts": 489,
                    "AverageConsumedWatts": 319,
                },
                "PowerLimit": {
                    "LimitInWatts": 500,
                    "LimitException": "LogEventOnly",
                    "CorrectionInMs": 50,
                },
                "RelatedItem": [
                    {"@odata.id": "/redfish/v1/Systems/437XR1138R2"},
                    {"@odata.id": path},
                ],
                "Status": {"State": state, "Health": "OK"},
                "Oem": {},
            }
        ],
        "Voltages": [
            {
                "@odata.id": f"{path}/Power#/Voltages/0",
                "MemberId": "0",
                "Name": "VRM1 Voltage",
                "Status": {"State": "Enabled", "Health": "OK"},
                "ReadingVolts": 12,
            }
        ],
        "Oem": {},
        "@odata.id": f"{path}/Power",
        "@Redfish.Copyright": COPYRIGHT,
    }


def rackmount(metrics_w: Any = 374, power_w: Any = 344) -> dict[str, Any]:
    """public-rackmount1: one 1U chassis with both EnvironmentMetrics and Power."""
    return {
        "/redfish/v1/Chassis": collection("/redfish/v1/Chassis/1U"),
        "/redfish/v1/Chassis/1U": chassis("1U"),
        "/redfish/v1/Chassis/1U/EnvironmentMetrics": environment_metrics("1U", metrics_w),
        "/redfish/v1/Chassis/1U/Power": power("1U", power_w),
    }


def gpu_server() -> dict[str, Any]:
    """An 8-GPU server: its GPU baseboard a chassis of its own inside the machine (as
    public-smartnic's Card1 is), listed first and reporting the GPUs' 5,600 W."""
    tree = {
        "/redfish/v1/Chassis": collection(
            "/redfish/v1/Chassis/HGX_Baseboard_0", "/redfish/v1/Chassis/1U"
        ),
        "/redfish/v1/Chassis/1U": chassis("1U", contains=("HGX_Baseboard_0",), power=False),
        "/redfish/v1/Chassis/1U/EnvironmentMetrics": environment_metrics("1U", 7140),
        "/redfish/v1/Chassis/HGX_Baseboard_0": chassis(
            "HGX_Baseboard_0", "Module", within="1U", power=False
        ),
        "/redfish/v1/Chassis/HGX_Baseboard_0/EnvironmentMetrics": environment_metrics(
            "HGX_Baseboard_0", 5600
        ),
    }
    return tree


class _QuietServer(ThreadingHTTPServer):
    """Says nothing of a client gone before its answer (the hung BMC's, timed out)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class BmcServer:
    """A local Redfish service: ``tree`` maps paths to JSON (or to bytes, sent as they are);
    ``hang`` holds every answer until set; ``redirect`` sends every GET on there;
    ``trickle_s`` sends each answer a byte at a time, one every so many seconds; ``on_get`` is
    called with each path; ``gets`` lists the paths asked for. Basic auth must be user
    ``root`` and the ``password``, as a BMC's is."""

    def __init__(self, tree: dict[str, Any], *, password: str = "0penBmc:s3cret", tls=None):
        self.tree = copy.deepcopy(tree)
        self.password = password
        self.gets: list[str] = []
        self.hang: threading.Event | None = None
        self.redirect: str | None = None  # where every GET is sent on to
        self.trickle_s: float | None = None
        self.on_get: Callable[[str], object] = lambda path: None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                server.gets.append(self.path)
                server.on_get(self.path)
                if server.hang is not None:
                    server.hang.wait(10)
                if server.redirect is not None:
                    self.send_response(308)
                    self.send_header("Location", server.redirect + self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                token = base64.b64encode(f"root:{server.password}".encode()).decode()
                if self.headers.get("Authorization") != f"Basic {token}":
                    self._answer(401, {"error": {"code": "Base.1.8.GeneralError"}})
                elif self.path in server.tree:
                    self._answer(200, server.tree[self.path])
                else:
                    self._answer(404, {"error": {"code": "Base.1.8.ResourceMissingAtURI"}})

            def _answer(self, status: int, doc: Any) -> None:
                body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
                if server.trickle_s is not None:
                    self._trickle(status, body, server.trickle_s)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self, status: int, body: bytes, every_s: float) -> None:
                head = f"HTTP/1.1 {status} OK\r\nContent-Length: {len(body)}\r\n\r\n"
                for byte in head.encode() + body:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(every_s)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.scheme = "https" if tls is not None else "http"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> BmcServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hang is not None:
            self.hang.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A BMC's self-signed certificate for 127.0.0.1 and its key, as files (cryptography)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bmc.example")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "bmc.crt", folder / "bmc.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def server_tls(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return context
