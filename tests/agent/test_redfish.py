"""A node's whole draw through its BMC's Redfish service: which chassis is the machine, what
it reads, and the reader against a real local HTTP(S) server (tests/agent/redfish_bmc.py),
whose resources are shaped as DMTF's public mockups."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from fleet.agent.bmc import BmcReader
from fleet.agent.client import AgentSettings, bmc_reader
from fleet.agent.credentials import Credentials
from fleet.agent.discovery import Machine
from fleet.agent.main import build_parser, main
from fleet.agent.redfish import (
    CHASSIS,
    LARGEST_ANSWER,
    Chassis,
    RedfishConfig,
    RedfishSource,
    link_refusal,
    metrics_reading,
    parse_chassis,
    power_reading,
    read_credentials,
    redfish_config,
    redfish_url,
    whole_machines,
)
from fleet.agent.sensors import SensorSampler
from fleet.protocol import Load

from .redfish_bmc import (
    BmcServer,
    chassis,
    collection,
    environment_metrics,
    gpu_server,
    power,
    rackmount,
    self_signed,
    server_tls,
)

PASSWORD = "0penBmc:s3cret"


def c(name: str, kind: str | None = "RackMount", within: str | None = None) -> Chassis:
    return Chassis(
        f"/redfish/v1/Chassis/{name}", name, kind, within and f"/redfish/v1/Chassis/{within}"
    )


@pytest.mark.parametrize(
    ("tree", "machines"),
    [
        ([c("1U")], ["1U"]),
        # An 8-GPU server: the GPU baseboard and each GPU are chassis inside it.
        (
            [
                c("HGX_Baseboard_0", "Module", "1U"),
                c("GPU_SXM_1", "Module", "HGX_Baseboard_0"),
                c("1U"),
            ],
            ["1U"],
        ),
        # A Dell: the backplane an Enclosure inside System.Embedded.1.
        (
            [c("System.Embedded.1"), c("Enclosure.Internal.0-1", "Enclosure", "System.Embedded.1")],
            ["System.Embedded.1"],
        ),
        # public-smartnic: the card a Card inside the 1U.
        ([c("1U"), c("Card1", "Card", "1U")], ["1U"]),
        ([c("Tower", "StandAlone")], ["Tower"]),
        # public-bladed: blades inside an enclosure; the enclosure's draw is all four.
        (
            [
                c("MultiBladeEncl", "Enclosure"),
                c("Blade1", "Blade", "MultiBladeEncl"),
                c("Blade2", "Blade", "MultiBladeEncl"),
            ],
            ["Blade1", "Blade2"],
        ),
        # A sled inside a multi-node chassis that is itself typed a machine: the outer one.
        ([c("Chassis2U"), c("Sled1", "Sled", "Chassis2U")], ["Chassis2U"]),
        # No machine's type at all (an OpenBMC's): the chassis inside no other.
        ([c("chassis", None), c("board", "Component", "chassis")], ["chassis"]),
        ([], []),
    ],
)
def test_the_machine_is_the_outermost_chassis_of_a_machines_type_never_a_part_of_it(tree, machines):
    assert [m.name for m in whole_machines(tree)] == machines


def test_a_chassis_resource_is_read_for_its_type_its_container_and_its_power():
    got = parse_chassis("/redfish/v1/Chassis/Card1", chassis("Card1", "Card", within="1U"))
    assert got == Chassis(
        "/redfish/v1/Chassis/Card1",
        "Card1",
        "Card",
        "/redfish/v1/Chassis/1U",
        "/redfish/v1/Chassis/Card1/EnvironmentMetrics",
        "/redfish/v1/Chassis/Card1/Power",
    )
    bare = parse_chassis("/redfish/v1/Chassis/x", {"Links": None, "ChassisType": 3})
    assert bare == Chassis("/redfish/v1/Chassis/x", "x")


def test_a_chassis_that_names_itself_badly_is_named_by_its_path():
    doc = {"Id": "1U\n" * 40, "@odata.id": "//evil.example/redfish/v1/Chassis/1U"}
    got = parse_chassis("/redfish/v1/Chassis/1U", doc)
    assert got.path == "/redfish/v1/Chassis/1U"  # its own link is not one to follow
    assert got.name == "1U?" * 21 + "1…"  # printable, 64 characters at most


@pytest.mark.parametrize(
    "path",
    [
        "/redfish/v1/Chassis/1U",
        "/redfish/v1/Chassis/1U/EnvironmentMetrics",
        "/redfish/v1/Chassis/System.Embedded.1/",
        "/redfish/v1/Chassis/Blade%201",
    ],
)
def test_a_link_under_the_redfish_root_is_followed(path):
    assert link_refusal(path) == ""


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("1/redfish/v1/Chassis/1U", "it is not a path under /redfish/v1/"),  # another port
        (".evil.example/redfish/v1/Chassis/1U", "it is not a path under /redfish/v1/"),
        ("//evil.example/redfish/v1/Chassis/1U", "it is not a path under /redfish/v1/"),
        ("https://evil.example/redfish/v1/", "it is not a path under /redfish/v1/"),
        ("/redfish/v1/Chassis/\u00e9", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/a b", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/1U\r\nX-Evil: 1", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/1U?$expand=*", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/1U#/x", "it holds characters a URL's path may not"),
        ("/redfish/v1/" + "a" * 2000, "it is longer than a Redfish path is"),
        ("/redfish/v1/Chassis/../../../x", "it has an empty, . or .. step"),
        ("/redfish/v1/Chassis/%2e%2e/x", "it has an empty, . or .. step"),
        ("/redfish/v1//Chassis", "it has an empty, . or .. step"),
        ("/redfish/v1/Chassis/./1U", "it has an empty, . or .. step"),
    ],
)
def test_a_link_elsewhere_is_refused_with_its_reason(path, why):
    assert link_refusal(path) == why


@pytest.mark.parametrize(
    ("doc", "watts", "why"),
    [
        (environment_metrics("1U", 374), 374.0, ""),
        (environment_metrics("1U", 6843.5), 6843.5, ""),
        (environment_metrics("1U", None), None, "EnvironmentMetrics PowerWatts has no reading"),
        (
            environment_metrics("1U", 0),
            None,
            "EnvironmentMetrics PowerWatts reads 0 W, which is no reading",
        ),
        (
            environment_metrics("1U", "374"),
            None,
            "EnvironmentMetrics PowerWatts reads '374', which is not a number",
        ),
        (
            environment_metrics("1U", 2_000_000),
            None,
            "EnvironmentMetrics PowerWatts reads 2e+06 W, past the 1,000,000 W a reading may be",
        ),
        ({"Name": "Chassis Environment Metrics"}, None, "EnvironmentMetrics has no PowerWatts"),
        # What a broken BMC sends: none of it may raise on the reader's thread.
        (
            environment_metrics("1U", 10**400),
            None,
            "EnvironmentMetrics PowerWatts reads more than 1e+308 W, past the 1,000,000 W a "
            "reading may be",
        ),
        (
            environment_metrics("1U", -(10**400)),
            None,
            "EnvironmentMetrics PowerWatts reads less than -1e+308 W, which is no reading",
        ),
        (
            environment_metrics("1U", float("inf")),
            None,
            "EnvironmentMetrics PowerWatts reads inf W, which is no reading",
        ),
        (
            environment_metrics("1U", float("nan")),
            None,
            "EnvironmentMetrics PowerWatts reads nan W, which is no reading",
        ),
        (
            environment_metrics("1U", [374]),
            None,
            "EnvironmentMetrics PowerWatts reads an array, which is not a number",
        ),
        (
            environment_metrics("1U", True),
            None,
            "EnvironmentMetrics PowerWatts reads true, which is not a number",
        ),
        (
            environment_metrics("1U", "3\n" * 100),
            None,
            f"EnvironmentMetrics PowerWatts reads '{'3?' * 32}…', which is not a number",
        ),
    ],
)
def test_environment_metrics_give_power_watts_reading(doc, watts, why):
    assert metrics_reading(doc) == (watts, why, False)


def two_controls() -> dict:
    doc = power("1U", None)
    second = dict(doc["PowerControl"][0], MemberId="1", PowerConsumedWatts=512)
    doc["PowerControl"].append(second)
    return doc


@pytest.mark.parametrize(
    ("doc", "watts", "why"),
    [
        (power("1U", 344), 344.0, ""),
        (two_controls(), 512.0, ""),  # the first member with a reading
        (
            power("1U", 344, "UnavailableOffline"),
            None,
            "Power PowerControl 0's state is UnavailableOffline, not Enabled",
        ),
        (
            power("1U", 344, "Disabled"),
            None,
            "Power PowerControl 0's state is Disabled, not Enabled",
        ),
        (power("1U", 0), None, "Power PowerControl 0 reads 0 W, which is no reading"),
        (power("1U", None), None, "Power has no PowerControl with PowerConsumedWatts"),
        ({"PowerControl": []}, None, "Power has no PowerControl with PowerConsumedWatts"),
        (
            power("1U", 344, {"State": "Enabled"}),  # type: ignore[arg-type]
            None,
            "Power PowerControl 0's state is an object, not Enabled",
        ),
        (
            power("1U", 344, "Standby\nOffline"),
            None,
            "Power PowerControl 0's state is Standby?Offline, not Enabled",
        ),
    ],
)
def test_the_deprecated_power_resource_gives_the_first_power_consumed_watts(doc, watts, why):
    assert power_reading(doc) == (watts, why, False)


@pytest.mark.parametrize(
    ("url", "base", "named"),
    [
        ("https://10.0.0.5", "https://10.0.0.5", None),
        ("https://10.0.0.5/", "https://10.0.0.5", None),
        ("https://bmc-gpu-7.mgmt:8443/redfish/v1", "https://bmc-gpu-7.mgmt:8443", None),
        ("http://169.254.0.17", "http://169.254.0.17", None),  # a host interface
        ("https://[fe80::1]", "https://[fe80::1]", None),
        (
            "https://10.0.0.5/redfish/v1/Chassis/Blade2",
            "https://10.0.0.5",
            "/redfish/v1/Chassis/Blade2",
        ),
        ("https://10.0.0.5/redfish/v1/Chassis/1/", "https://10.0.0.5", "/redfish/v1/Chassis/1"),
        ("https://BMC-7.mgmt:8443", "https://bmc-7.mgmt:8443", None),
    ],
)
def test_the_redfish_url_is_the_bmcs_address_or_one_of_its_chassis(url, base, named):
    assert redfish_url(url) == (base, named)


@pytest.mark.parametrize(
    "url",
    [
        "10.0.0.5",
        "ftp://10.0.0.5",
        "https://",
        "https://10.0.0.5/redfish/v1/Systems/1",
        "https://10.0.0.5/redfish/v1/Chassis/1U/Power",
        "https://10.0.0.5/redfish/v1/Chassis",
        "https://10.0.0.5/?a=1",
        "https://10.0.0.5:99999",
        "https://bmc-\u00fc.example",
        "https://10.0.0.5/redfish/v1/Chassis/\u00e9",
        "https://10.0.0.5/redfish/v1/Chassis/%2e%2e",
        "https://10.0.0.5/redfish/v1/Chassis/a\tb",
    ],
)
def test_anything_but_a_bmcs_address_or_chassis_is_refused(url):
    with pytest.raises(ValueError, match="--bmc-redfish: "):
        redfish_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://root:S3cret@10.0.0.5",
        "https://root:S3cret@10.0.0.5/redfish/v1/Systems/1",  # refused for this first
        "https://root@10.0.0.5",
        "root:S3cret@10.0.0.5",
        "https://root:S3cret@bmc-\u00fc.example",
    ],
)
def test_a_url_with_a_user_or_password_is_refused_without_showing_it(url):
    with pytest.raises(ValueError, match="--bmc-redfish-credentials") as refused:
        redfish_url(url)
    assert "S3cret" not in str(refused.value) and "root" not in str(refused.value)


@pytest.mark.parametrize(
    ("text", "pair"),
    [
        ("root:0penBmc\n", ("root", "0penBmc")),
        ("root:0penBmc:s3cret\n", ("root", "0penBmc:s3cret")),  # a colon in the password
        ("root\n0penBmc:s3cret\n", ("root", "0penBmc:s3cret")),
        ("root\r\n0penBmc\r\n", ("root", "0penBmc")),
    ],
)
def test_the_credentials_are_user_colon_password_or_two_lines(tmp_path, text, pair):
    (tmp_path / "bmc").write_text(text)
    assert read_credentials(tmp_path / "bmc") == pair


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "holds neither user:password"),
        ("root\n", "holds neither user:password"),
        ("a\nb\nc\n", "holds neither user:password"),
        (":0penBmc\n", "has an empty user or password"),
        ("root:\n", "has an empty user or password"),
    ],
)
def test_a_credentials_file_without_them_is_refused_without_showing_it(tmp_path, text, said):
    (tmp_path / "bmc").write_text(text)
    with pytest.raises(ValueError, match=said) as refused:
        read_credentials(tmp_path / "bmc")
    assert "0penBmc" not in str(refused.value)


def test_a_credentials_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(
        ValueError,
        match=f"the BMC credentials file {tmp_path / 'none'} cannot be read: No such file",
    ):
        read_credentials(tmp_path / "none")


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "bmc-credentials"
    path.write_text(f"root:{PASSWORD}\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def cert(tmp_path):
    pytest.importorskip("cryptography")
    return self_signed(tmp_path)


def source(server: BmcServer, secret, **kw) -> RedfishSource:
    timeout_s = kw.pop("timeout_s", 5.0)
    return RedfishSource(RedfishConfig(server.url, secret, **kw), timeout_s=timeout_s)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def reader(src: RedfishSource, clock: Clock | None = None) -> BmcReader:
    return BmcReader(source=src, clock=clock or Clock(), spawn=lambda read: read())


def read_nothing(bmc: BmcServer, secret, *, every_s: float) -> tuple[BmcReader, Clock]:
    """A reader of ``bmc`` asked three times, ``every_s`` apart, and given no figure."""
    clock = Clock()
    rf = reader(source(bmc, secret), clock)
    for _ in range(3):
        assert rf.read() is None
        clock.t += every_s
    return rf, clock


def test_a_bmc_over_https_gives_its_draw_and_is_asked_one_get_a_time_after(cert, secret):
    with BmcServer(rackmount(), tls=server_tls(*cert)) as bmc:
        clock = Clock()
        src = source(bmc, secret, ca=cert[0])
        rf = reader(src, clock)
        assert rf.read() == 374  # EnvironmentMetrics, before the deprecated Power's 344
        assert bmc.gets == [
            "/redfish/v1/Chassis",
            "/redfish/v1/Chassis/1U",
            "/redfish/v1/Chassis/1U/EnvironmentMetrics",
        ]
        bmc.tree["/redfish/v1/Chassis/1U/EnvironmentMetrics"]["PowerWatts"]["Reading"] = 402
        clock.t += 29
        assert rf.read() == 374 and len(bmc.gets) == 3  # at most every 30 s
        clock.t += 1
        assert rf.read() == 402
        assert bmc.gets[3:] == ["/redfish/v1/Chassis/1U/EnvironmentMetrics"]
        bmc.tree["/redfish/v1/Chassis/1U/EnvironmentMetrics"]["PowerWatts"]["Reading"] = None
        clock.t += 30
        assert rf.read() is None  # no reading now: absent, its reason as when it was found
        assert src() == (
            None,
            "chassis 1U's EnvironmentMetrics PowerWatts has no reading",
            False,
        )


def test_a_bmc_without_environment_metrics_is_read_through_its_power_resource(secret):
    tree = rackmount()
    tree["/redfish/v1/Chassis/1U"] = chassis("1U", metrics=False)
    with BmcServer(tree) as bmc:
        assert reader(source(bmc, secret)).read() == 344


def test_a_gpu_baseboard_inside_the_machine_is_not_counted_twice(secret):
    with BmcServer(gpu_server()) as bmc:
        assert reader(source(bmc, secret)).read() == 7140  # the 1U's; not 5,600, not 12,740
        assert "/redfish/v1/Chassis/HGX_Baseboard_0/EnvironmentMetrics" not in bmc.gets


def test_refused_credentials_are_said_once_and_not_tried_again(secret, caplog):
    with BmcServer(rackmount(), password="another") as bmc:
        with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
            read_nothing(bmc, secret, every_s=60)
        assert bmc.gets == ["/redfish/v1/Chassis"]
    assert len(caplog.records) == 1
    assert f"the BMC refused the credentials in {secret} (HTTP 401)" in caplog.text
    assert "asks again when it restarts" in caplog.text
    assert PASSWORD not in caplog.text and "0penBmc" not in caplog.text


def test_a_hung_bmc_times_out_and_is_asked_again(secret, caplog):
    with BmcServer(rackmount()) as bmc:
        bmc.hang = threading.Event()
        clock = Clock()
        rf = reader(source(bmc, secret, timeout_s=0.3), clock)
        with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
            assert rf.read() is None
            clock.t += 30
            assert rf.read() is None
        assert len(bmc.gets) == 2  # asked again: a timeout is not lasting
        assert len(caplog.records) == 1
        assert (
            "the BMC did not answer /redfish/v1/Chassis in 0.3 s" in caplog.text
            and "asked again every 30 s" in caplog.text
        )
        bmc.hang.set()
        bmc.hang = None
        clock.t += 30
        assert rf.read() == 374


def test_a_bmc_not_listening_is_asked_again(secret):
    with BmcServer(rackmount()) as bmc:
        url = bmc.url
    got = RedfishSource(RedfishConfig(url, secret), timeout_s=2)()
    assert got.watts is None and not got.lasting
    assert f"the BMC at {url} cannot be reached" in got.why


def test_an_unreadable_credentials_file_is_lasting(secret):
    with BmcServer(rackmount()) as bmc:
        rf = source(bmc, secret)
        secret.unlink()
        got = rf()
    assert got == (
        None,
        f"the BMC credentials file {secret} cannot be read: No such file or directory",
        True,
    )
    assert bmc.gets == []


def test_a_self_signed_certificate_is_refused_unless_given_or_accepted(cert, secret):
    with BmcServer(rackmount(), tls=server_tls(*cert)) as bmc:
        got = source(bmc, secret)()  # the system's CAs only
        assert got.watts is None and got.lasting
        assert "the BMC's certificate is not trusted" in got.why and "--bmc-redfish-ca" in got.why
        assert source(bmc, secret, insecure=True)() == (374.0, "", False)


def blades(blade1: object = 410, blade2: object = 390, *, blade1_metered: bool = True) -> dict:
    """A blade enclosure's manager (public-bladed): two blades, each with its own draw; the
    first's as given, or no link to a draw at all."""
    return {
        "/redfish/v1/Chassis": collection(
            "/redfish/v1/Chassis/Blade1", "/redfish/v1/Chassis/Blade2"
        ),
        "/redfish/v1/Chassis/Blade1": chassis(
            "Blade1", "Blade", metrics=blade1_metered, power=False
        ),
        "/redfish/v1/Chassis/Blade1/EnvironmentMetrics": environment_metrics("Blade1", blade1),
        "/redfish/v1/Chassis/Blade2": chassis("Blade2", "Blade", power=False),
        "/redfish/v1/Chassis/Blade2/EnvironmentMetrics": environment_metrics("Blade2", blade2),
    }


@pytest.mark.parametrize(
    ("tree", "why", "lasting"),
    [
        (
            rackmount(metrics_w=None, power_w=None),
            "chassis 1U's EnvironmentMetrics PowerWatts has no reading; "
            "chassis 1U's Power has no PowerControl with PowerConsumedWatts",
            False,
        ),
        (
            rackmount(metrics_w=0, power_w=0),
            "chassis 1U's EnvironmentMetrics PowerWatts reads 0 W, which is no reading; "
            "chassis 1U's Power PowerControl 0 reads 0 W, which is no reading",
            False,
        ),
        (
            rackmount(metrics_w=None)
            | {"/redfish/v1/Chassis/1U/Power": power("1U", 344, "StandbyOffline")},
            "chassis 1U's EnvironmentMetrics PowerWatts has no reading; "
            "chassis 1U's Power PowerControl 0's state is StandbyOffline, not Enabled",
            False,
        ),
        (
            blades(),
            "the BMC reports the draw of 2 machines (Blade1, Blade2) and which of them is this node "
            "cannot be told: name its chassis, such as --bmc-redfish http://127.0.0.1:",
            True,
        ),
        # One blade without a reading at the first look is still one of several machines:
        # the other's draw must not be taken for this node's.
        (
            blades(blade1=None),
            "the BMC reports the draw of 2 machines (Blade1, Blade2)",
            True,
        ),
        # After a reset or a firmware update a BMC lists no chassis for a while.
        (
            {"/redfish/v1/Chassis": collection()},
            "the BMC lists no chassis at /redfish/v1/Chassis",
            False,
        ),
        ({}, "has no Redfish chassis at /redfish/v1/Chassis (HTTP 404)", True),
    ],
)
def test_a_bmc_without_one_reading_of_the_machine_says_why(secret, tree, why, lasting):
    with BmcServer(tree) as bmc:
        got = source(bmc, secret)()
    assert got.watts is None and why in got.why and got.lasting is lasting


def test_a_blade_that_links_to_no_draw_is_not_one_of_the_machines(secret):
    with BmcServer(blades(blade1_metered=False)) as bmc:
        assert source(bmc, secret)() == (390.0, "", False)


def test_a_bmc_that_lists_no_chassis_yet_is_asked_again_and_said_once(secret, caplog):
    with (
        BmcServer({"/redfish/v1/Chassis": collection()}) as bmc,
        caplog.at_level(logging.INFO, logger="fleet.agent"),
    ):
        rf, _ = read_nothing(bmc, secret, every_s=30)
        bmc.tree.update(rackmount())  # the BMC is up again
        assert rf.read() == 374
    assert bmc.gets.count("/redfish/v1/Chassis") == 4
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == (
        "The BMC gave no reading of the node's draw: the BMC lists no chassis at "
        "/redfish/v1/Chassis. It is asked again every 30 s."
    )
    assert len(said) == 3  # that, the chassis chosen and the first reading


NOT_JSON = "the BMC's answer to /redfish/v1/Chassis is not Redfish JSON"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"[" * 200_000, NOT_JSON),  # json.loads: RecursionError
        (b'{"Members": ' + b"1" * 5000 + b"}", NOT_JSON),  # past an int's digits as text
        (b"\xff\xfe{}", NOT_JSON),
        (b"{'Members': []}", NOT_JSON),
        (
            b" " * (LARGEST_ANSWER + 1),
            "the BMC's answer to /redfish/v1/Chassis is larger than a Redfish resource (1 MiB)",
        ),
    ],
)
def test_an_answer_that_is_not_redfish_json_is_said_and_asked_again(secret, body, why):
    with BmcServer(rackmount() | {CHASSIS: body}) as bmc:
        assert reader(source(bmc, secret)).read() is None  # the reader's thread lives on
        assert source(bmc, secret)() == (None, why, False)


def test_a_reading_past_any_float_is_refused_not_raised(secret):
    tree = rackmount()
    tree["/redfish/v1/Chassis/1U"] = chassis("1U", power=False)
    tree["/redfish/v1/Chassis/1U/EnvironmentMetrics"] = (
        b'{"PowerWatts": {"Reading": 1' + b"0" * 400 + b"}}"
    )
    with BmcServer(tree) as bmc:
        assert reader(source(bmc, secret)).read() is None
        got = source(bmc, secret)()
    assert got == (
        None,
        "chassis 1U's EnvironmentMetrics PowerWatts reads more than 1e+308 W, past the "
        "1,000,000 W a reading may be",
        False,
    )


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ("1/redfish/v1/Chassis/1U", "it is not a path under /redfish/v1/"),
        (".evil.example/redfish/v1/Chassis/1U", "it is not a path under /redfish/v1/"),
        ("/redfish/v1/Chassis/\u00e9", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/a b", "it holds characters a URL's path may not"),
        ("/redfish/v1/Chassis/../../../etc", "it has an empty, . or .. step"),
    ],
)
def test_a_chassis_link_elsewhere_is_skipped_with_its_reason(secret, caplog, link, why):
    said = f"the BMC links to {link!r}, which the agent does not follow: {why}"
    with BmcServer(rackmount() | {CHASSIS: collection(link)}) as bmc:
        got = source(bmc, secret)()
        assert got == (None, said, False)
        bmc.tree[CHASSIS] = collection(link, "/redfish/v1/Chassis/1U")
        with caplog.at_level(logging.INFO, logger="fleet.agent"):
            assert source(bmc, secret)() == (374.0, "", False)
    assert bmc.gets.count(CHASSIS) == 2 and len(bmc.gets) == 4  # nothing but the BMC's own
    assert said in caplog.text


def test_a_power_link_elsewhere_is_not_followed(secret):
    tree = rackmount()
    tree["/redfish/v1/Chassis/1U"]["EnvironmentMetrics"] = {
        "@odata.id": "@evil.example/redfish/v1/Chassis/1U/EnvironmentMetrics"
    }
    with BmcServer(tree) as bmc:
        assert source(bmc, secret)() == (344.0, "", False)  # its Power resource
    assert not any("evil" in get for get in bmc.gets)


@pytest.mark.parametrize("finding", [True, False])
def test_a_bmc_that_trickles_its_answer_is_given_up_on_at_the_timeout(secret, finding):
    with BmcServer(rackmount()) as bmc:
        rf = source(bmc, secret, timeout_s=0.5)
        if not finding:
            assert rf() == (374.0, "", False)  # the resource is remembered: one GET
        bmc.trickle_s = 0.1  # a byte every 0.1 s: every read well within the timeout
        start = time.monotonic()
        got = rf()
        took = time.monotonic() - start
    asked = CHASSIS if finding else "/redfish/v1/Chassis/1U/EnvironmentMetrics"
    assert got == (None, f"the BMC did not answer {asked} in 0.5 s", False)
    assert took < 1.5


def test_a_remembered_resource_that_goes_is_looked_for_again(secret):
    with BmcServer(rackmount()) as bmc:
        rf = source(bmc, secret)
        assert rf() == (374.0, "", False)
        del bmc.tree["/redfish/v1/Chassis/1U/EnvironmentMetrics"]
        got = rf()
        assert got.watts is None and "HTTP 404" in got.why and not got.lasting
        assert rf() == (344.0, "", False)  # found again: its Power resource


def test_the_redfish_reading_rides_the_heartbeat_as_node_power_w(tmp_path, secret):
    with BmcServer(gpu_server()) as bmc:
        sensors = SensorSampler(
            sys_root=tmp_path / "sys", read_gpus=False, bmc=reader(source(bmc, secret))
        )
        load = sensors.sample().to_load()
    assert load["node_power_w"] == 7140
    assert Load.model_validate(load).node_power_w == 7140


def test_a_node_whose_bmc_gives_no_redfish_reading_leaves_node_power_w_out(tmp_path, secret):
    with BmcServer(rackmount(metrics_w=0, power_w=None)) as bmc:
        sensors = SensorSampler(
            sys_root=tmp_path / "sys", read_gpus=False, bmc=reader(source(bmc, secret))
        )
        assert "node_power_w" not in sensors.sample().to_load()


def test_the_agent_asks_redfish_where_the_operator_named_it(tmp_path, secret):
    args = build_parser().parse_args(
        ["--bmc-redfish", "https://10.0.0.5", "--bmc-redfish-credentials", str(secret)]
    )
    config = redfish_config(
        args.bmc_redfish, credentials=args.bmc_redfish_credentials, ca=None, insecure=False
    )
    settings = AgentSettings(
        ws_url="ws://127.0.0.1:1/agent",
        credentials=Credentials(tmp_path, "t"),
        node_id="n1",
        advertise_addr="127.0.0.1",
        bmc_redfish=config,
    )
    machine = Machine(tmp_path, engines={"sim": "1"}, gpus=[])
    machine.gpus_simulated = False  # given no GPUs: this machine's own, none
    got = bmc_reader(settings, machine)
    assert isinstance(got, BmcReader) and isinstance(got._source, RedfishSource)
    assert got._source.config == RedfishConfig("https://10.0.0.5", secret)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--bmc-redfish", "10.0.0.5", "--bmc-redfish-credentials", "{secret}"],
            "--bmc-redfish: '10.0.0.5' is not an https URL of a BMC",
        ),
        (
            ["--bmc-redfish", "https://10.0.0.5"],
            "--bmc-redfish needs --bmc-redfish-credentials FILE",
        ),
        (
            ["--bmc-redfish", "https://10.0.0.5", "--bmc-redfish-credentials", "{tmp}/none"],
            "the BMC credentials file {tmp}/none cannot be read: No such file or directory",
        ),
        (
            [
                "--bmc-redfish",
                "https://10.0.0.5",
                "--bmc-redfish-credentials",
                "{secret}",
                "--bmc-redfish-ca",
                "{secret}",
            ],
            "--bmc-redfish-ca: {secret} holds no CA certificate",
        ),
        (
            [
                "--bmc-redfish",
                "https://10.0.0.5",
                "--bmc-redfish-credentials",
                "{secret}",
                "--bmc-redfish-ca",
                "{secret}",
                "--bmc-redfish-insecure",
            ],
            "contradict each other",
        ),
        (
            [
                "--bmc-redfish",
                "https://root:" + PASSWORD + "@10.0.0.5",
                "--bmc-redfish-credentials",
                "{secret}",
            ],
            "--bmc-redfish: the URL holds a user or password",
        ),
        (
            [
                "--bmc-redfish",
                "http://10.0.0.5",
                "--bmc-redfish-credentials",
                "{secret}",
                "--bmc-redfish-insecure",
            ],
            "are for an https URL",
        ),
        (
            ["--bmc-redfish-credentials", "{secret}"],
            "--bmc-redfish-credentials is for --bmc-redfish URL, which is not given",
        ),
        (
            [
                "--no-bmc",
                "--bmc-redfish",
                "https://10.0.0.5",
                "--bmc-redfish-credentials",
                "{secret}",
            ],
            "--no-bmc and --bmc-redfish contradict each other",
        ),
    ],
)
def test_the_agent_refuses_redfish_options_that_will_not_do_at_start(
    tmp_path, secret, capsys, argv, said
):
    names = {"secret": secret, "tmp": tmp_path}
    argv = [a.format(**names) for a in argv]
    assert main(["--token", "t", "--state-dir", str(tmp_path / "state"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgw agent: ") and said.format(**names) in err
    assert PASSWORD not in err


def test_a_chassis_named_in_the_url_is_read_alone(secret):
    with BmcServer(blades()) as bmc:
        assert source(bmc, secret, chassis="/redfish/v1/Chassis/Blade2")() == (390.0, "", False)
        assert "/redfish/v1/Chassis" not in bmc.gets
        got = source(bmc, secret, chassis="/redfish/v1/Chassis/Blade9")()
    assert (
        got.lasting and "has no Redfish chassis at /redfish/v1/Chassis/Blade9 (HTTP 404)" in got.why
    )


def test_the_chassis_the_draw_is_read_from_is_logged_once(secret, caplog):
    with BmcServer(gpu_server()) as bmc:
        clock = Clock()
        rf = reader(source(bmc, secret), clock)
        with caplog.at_level(logging.INFO, logger="fleet.agent"):
            for _ in range(3):
                assert rf.read() == 7140
                clock.t += 30
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"The node's draw is read through Redfish from chassis 1U ({bmc.url}/redfish/v1/Chassis/1U/EnvironmentMetrics).",
        "The BMC reads the node drawing 7140 W; heartbeats carry it.",
    ]


def test_a_bmc_that_redirects_is_not_followed_with_the_credentials(secret):
    with BmcServer(rackmount()) as elsewhere, BmcServer(rackmount()) as bmc:
        bmc.redirect = elsewhere.url
        got = source(bmc, secret)()
    assert (
        got.lasting
        and f"the BMC sends /redfish/v1/Chassis elsewhere ({elsewhere.url}/redfish/v1/Chassis)"
        in got.why
    )
    assert elsewhere.gets == []


def test_finding_the_chassis_has_one_timeout_over_all_its_asks(secret):
    clock = Clock()

    with BmcServer(gpu_server()) as bmc:
        rf = RedfishSource(
            RedfishConfig(bmc.url, secret), timeout_s=5, find_timeout_s=60, clock=clock
        )
        bmc.on_get = lambda path: setattr(clock, "t", clock.t + 25)  # each ask 25 s on its clock
        got = rf()
    assert got == (None, "the BMC did not show where the node's draw is in 60 s", False)
    assert len(bmc.gets) == 3
