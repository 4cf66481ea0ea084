"""A node's whole draw from its BMC, through a fake ipmitool whose answers are shaped as
ipmitool prints them (lib/ipmi_dcmi.c, ipmi_dcmi_pwr_rd and chk_rsp; open.c's device
error)."""

from __future__ import annotations

import logging
import subprocess
import threading

import pytest

from fleet.agent.bmc import (
    Answer,
    BmcReader,
    Reading,
    device_refusal,
    failed_reading,
    parse_reading,
)
from fleet.agent.client import AgentSettings, bmc_reader
from fleet.agent.credentials import Credentials
from fleet.agent.discovery import Machine, simulated_gpus
from fleet.agent.main import build_parser
from fleet.agent.sensors import SensorSampler
from fleet.protocol import Load

from .helpers import put


def dcmi(watts: int, state: str = "activated") -> str:
    """``ipmitool dcmi power reading``'s standard output, as its printf calls write it."""
    return (
        "\n"
        f"    Instantaneous power reading:              {watts:8d} Watts\n"
        f"    Minimum during sampling period:           {64:8d} Watts\n"
        f"    Maximum during sampling period:           {658:8d} Watts\n"
        f"    Average power reading over sample period: {302:8d} Watts\n"
        "    IPMI timestamp:                           Mon Dec  7 18:40:00 2026\n"
        f"    Sampling period:                          {1:08d} Seconds.\n"
        f"    Power reading state is:                   {state}\n\n\n"
    )


OPEN_FAILED = (
    "Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0: "
    "No such file or directory\n"
)
NOT_SUPPORTED = "\n    DCMI request failed because: Invalid command (c1)\n"


class Ipmitool:
    """A fake ipmitool: counts its runs, answers as told or raises."""

    def __init__(self, answer: Answer | None = None, error: Exception | None = None):
        self.answer = answer or Answer(0, dcmi(310), "")
        self.error = error
        self.runs = 0

    def __call__(self) -> Answer:
        self.runs += 1
        if self.error is not None:
            raise self.error
        return self.answer


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def dev(tmp_path):
    """A /dev with the BMC's device, as the ipmi_devintf module makes it."""
    put(tmp_path, "ipmi0", "")
    return tmp_path


def reader(dev_root, ipmi=None, *, which=lambda name: f"/usr/bin/{name}", clock=None, **kw):
    """A reader whose readings for `latest` run at once, unless the test gives a `spawn`."""
    kw.setdefault("spawn", lambda read: read())
    return BmcReader(
        ipmi=ipmi or Ipmitool(), which=which, dev_root=dev_root, clock=clock or Clock(), **kw
    )


@pytest.mark.parametrize(
    ("out", "watts", "why"),
    [
        (dcmi(310), 310.0, ""),
        (dcmi(4127), 4127.0, ""),
        (dcmi(310, "deactivated"), None, "the BMC's power reading is deactivated"),
        (dcmi(0), None, "the BMC reads 0 W, which is no reading"),
        ("", None, "ipmitool's answer has no instantaneous power reading"),
        (
            "\n    A valid DCMI command was not returned! (0)",
            None,
            "ipmitool's answer has no instantaneous power reading",
        ),
    ],
)
def test_the_instantaneous_reading_is_the_nodes_draw_only_while_measurement_is_active(
    out, watts, why
):
    got = parse_reading(out)
    assert (got.watts, got.why, got.lasting) == (watts, why, False)


@pytest.mark.parametrize(
    ("answer", "why", "lasting"),
    [
        (
            Answer(1, "", NOT_SUPPORTED),
            "the BMC refuses DCMI's power reading: Invalid command (c1)",
            False,
        ),
        (
            Answer(1, "", "\n    DCMI request failed because: Parameter not supported (80)\n"),
            "the BMC refuses DCMI's power reading: Parameter not supported (80)",
            False,
        ),
        (
            Answer(1, "", OPEN_FAILED),
            "ipmitool cannot open the BMC: " + OPEN_FAILED.strip(),
            True,
        ),
        (
            Answer(1, "", "\n    Unable to get DCMI information\n"),
            "ipmitool exited with status 1 and said 'Unable to get DCMI information'",
            False,
        ),
    ],
)
def test_an_error_from_ipmitool_is_said_in_its_own_words(answer, why, lasting):
    got = failed_reading(answer)
    assert (got.watts, got.why, got.lasting) == (None, why, lasting)


def test_a_machine_without_a_bmc_device_or_leave_to_open_it_is_said_so(tmp_path, dev):
    assert "there is no BMC device" in device_refusal(tmp_path / "empty")
    assert "ipmi_si and ipmi_devintf" in device_refusal(tmp_path / "empty")
    assert device_refusal(dev) == ""
    assert device_refusal(dev, access=lambda path, mode: False) == (
        f"the agent may not open {dev / 'ipmi0'}: ipmitool needs root, or read and write on it"
    )


def test_the_bmc_is_asked_at_most_every_n_seconds(dev):
    ipmi, clock = Ipmitool(), Clock()
    bmc = reader(dev, ipmi, clock=clock, every_s=30)
    assert bmc.read() == 310
    ipmi.answer = Answer(0, dcmi(420), "")
    clock.t += 29
    assert (bmc.read(), ipmi.runs) == (310, 1)
    clock.t += 1
    assert (bmc.read(), ipmi.runs) == (420, 2)


@pytest.mark.parametrize(
    ("which", "ipmi", "said"),
    [
        (lambda name: None, Ipmitool(), "ipmitool is not installed"),
        (None, Ipmitool(error=FileNotFoundError(2, "No such file", "ipmitool")), "cannot be run"),
        (None, Ipmitool(Answer(1, "", OPEN_FAILED)), "cannot open the BMC"),
    ],
)
def test_a_machine_that_cannot_ask_its_bmc_has_no_figure_and_is_not_asked_again(
    dev, caplog, which, ipmi, said
):
    clock = Clock()
    bmc = reader(dev, ipmi, which=which or (lambda name: "/usr/bin/ipmitool"), clock=clock)
    with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
        for _ in range(3):
            assert bmc.read() is None
            clock.t += 60
    assert ipmi.runs <= 1
    assert len(caplog.records) == 1
    assert said in caplog.text and "asks again when it restarts" in caplog.text


def test_a_machine_without_a_bmc_device_never_runs_ipmitool(tmp_path):
    ipmi = Ipmitool()
    assert reader(tmp_path, ipmi).read() is None
    assert ipmi.runs == 0


@pytest.mark.parametrize(
    "fails",
    [
        Ipmitool(Answer(0, dcmi(290, "deactivated"), "")),
        Ipmitool(Answer(1, "", NOT_SUPPORTED)),
        Ipmitool(Answer(0, dcmi(0), "")),
        Ipmitool(error=subprocess.TimeoutExpired("ipmitool", 10)),
    ],
)
def test_a_bmc_without_a_reading_now_is_asked_again_and_its_reason_logged_once(dev, caplog, fails):
    clock = Clock()
    bmc = reader(dev, fails, clock=clock, every_s=30)
    with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
        for _ in range(3):
            assert bmc.read() is None
            clock.t += 30
        assert fails.runs == 3
        assert len(caplog.records) == 1 and "asked again every 30 s" in caplog.text
        fails.error, fails.answer = None, Answer(0, dcmi(305), "")
        assert bmc.read() == 305
    assert len(caplog.records) == 2 and "drawing 305 W" in caplog.records[1].message


def test_the_bmc_reading_rides_the_heartbeat_as_node_power_w(tmp_path, dev):
    sensors = SensorSampler(sys_root=tmp_path / "sys", read_gpus=False, bmc=reader(dev))
    load = sensors.sample().to_load()
    assert load["node_power_w"] == 310
    assert Load.model_validate(load).node_power_w == 310


def test_a_hung_bmc_holds_up_neither_a_heartbeat_nor_a_power_cap(tmp_path, dev):
    asked, answer = threading.Event(), threading.Event()

    def hung() -> Answer:
        """A BMC that answers only when the test lets it (or ipmitool's own timeout)."""
        asked.set()
        answer.wait(10)
        return Answer(0, dcmi(1180), "")

    threads: list[threading.Thread] = []

    def spawn(read) -> None:
        threads.append(threading.Thread(target=read, daemon=True))
        threads[-1].start()

    clock = Clock()
    bmc = reader(dev, hung, clock=clock, spawn=spawn)
    sensors = SensorSampler(
        sys_root=tmp_path / "sys", read_gpus=False, sim_power=tmp_path / "power", clock=clock
    )
    sensors.bmc = bmc
    first = sensors.sample()
    assert asked.wait(10), "the BMC was not asked"
    assert not answer.is_set() and first.node_power_w is None  # no figure yet: absent
    assert sensors.power_cap(0.8)  # while ipmitool still hangs
    clock.t += sensors.every_s
    assert sensors.sample().node_power_w is None  # still no answer; no second ipmitool
    assert len(threads) == 1
    answer.set()
    threads[0].join()
    clock.t += sensors.every_s
    assert sensors.sample().node_power_w == 1180


def test_a_node_without_a_bmc_reading_leaves_node_power_w_out_never_zero(tmp_path, dev):
    for bmc in (None, reader(dev, Ipmitool(Answer(0, dcmi(0), "")))):
        sensors = SensorSampler(sys_root=tmp_path / "sys", read_gpus=False, bmc=bmc)
        assert "node_power_w" not in sensors.sample().to_load()


def test_the_control_plane_refuses_a_node_power_past_what_a_reading_may_be():
    with pytest.raises(ValueError):
        Load.model_validate({"node_power_w": 2_000_000})
    with pytest.raises(ValueError):
        Load.model_validate({"node_power_w": "310 Watts"})


@pytest.mark.parametrize(
    ("argv", "simulate", "reads"),
    [
        ([], {}, True),
        (["--no-bmc"], {}, False),
        ([], {"gpus": simulated_gpus("2xl40s-48g", "n1")}, False),  # one machine, many nodes
        ([], {"memory_gb": 64}, False),
    ],
)
def test_the_bmc_is_read_unless_turned_off_or_the_node_is_simulated(
    tmp_path, argv, simulate, reads
):
    args = build_parser().parse_args(argv)
    settings = AgentSettings(
        ws_url="ws://127.0.0.1:1/agent",
        credentials=Credentials(tmp_path, "t"),
        node_id="n1",
        advertise_addr="127.0.0.1",
        read_bmc=not args.no_bmc,
    )
    machine = Machine(tmp_path, engines={"sim": "1"}, **({"gpus": []} | simulate))
    machine.gpus_simulated = "gpus" in simulate  # given no GPUs: this machine's own, none
    assert isinstance(bmc_reader(settings, machine), BmcReader) is reads


def test_a_source_that_raises_gives_no_figure_said_once_and_is_asked_again(dev, caplog):
    asks: list[int] = []

    def broken() -> Reading:
        asks.append(1)
        raise OverflowError("int too large to convert to float")

    clock = Clock()
    bmc = reader(dev, clock=clock, source=broken)
    with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
        for _ in range(3):
            assert bmc.latest() is None  # the reading's thread does not die
            clock.t += 30
    assert len(asks) == 3
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        "The BMC gave no reading of the node's draw: reading it failed (OverflowError: int too "
        "large to convert to float). It is asked again every 30 s."
    ]


def test_a_figure_is_dropped_once_its_next_ask_runs_past_the_timeout(dev, caplog):
    answer = threading.Event()
    figures = iter([Reading(1180.0), Reading(1175.0)])

    def source() -> Reading:
        if not answer.is_set() and threads:
            answer.wait(10)  # the second ask hangs until the test lets it go
        return next(figures)

    threads: list[threading.Thread] = []

    def spawn(read) -> None:
        threads.append(threading.Thread(target=read, daemon=True))
        threads[-1].start()

    clock = Clock()
    bmc = reader(dev, clock=clock, source=source, spawn=spawn, timeout_s=10)
    assert bmc.read() == 1180
    clock.t += 30
    with caplog.at_level(logging.INFO, logger="fleet.agent.bmc"):
        assert bmc.latest() == 1180  # the next ask has just begun: the figure stands
        clock.t += 10
        assert bmc.latest() == 1180
        clock.t += 0.5
        assert bmc.latest() is None  # asked 10.5 s ago and not answered: stale
        assert bmc.latest() is None and len(threads) == 1
    assert [r.getMessage() for r in caplog.records][-1:] == [
        "The BMC gave no reading of the node's draw: the BMC has not answered for more than "
        "10 s. It is asked again every 30 s."
    ]
    answer.set()
    threads[0].join(10)
    assert bmc.latest() == 1175
