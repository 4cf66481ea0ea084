"""The agent's fabric discovery (fleet/agent/fabric.py) against a fake NVML shaped like
pynvml and a fake sysfs tree (tests/agent/fake_nvml.py): an NVL72 rack, tray by tray."""

from __future__ import annotations

import json
import subprocess

import pynvml
import pytest

from fleet.agent.fabric import (
    FABRIC_BYTES,
    FabricReader,
    SimulatedFabric,
    fit,
    ib_ports,
    imex_state,
    parse_fabric_spec,
)
from fleet.protocol import MAX_FRAME_BYTES, XIDS_KEPT, Fabric, Register

from .fake_nvml import (
    GPUS_PER_TRAY,
    LINKS,
    RACK_CLUSTER,
    TRAYS,
    FakeGpu,
    FakeLink,
    FakeNvml,
    ib_port,
    ib_tree,
    nvl72_tray,
)

IMEX_UP = json.dumps({"status": "UP", "nodes": {"0": {"status": "READY"}}})
IMEX_DOWN = json.dumps({"status": "DOWN"})


def no_imex(args):
    raise FileNotFoundError("nvidia-imex-ctl is not installed")


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def reader(nvml, tmp_path, *, imex=no_imex, clock=None, **kw):
    return FabricReader(
        nvml=nvml,
        sys_root=tmp_path / "sys",
        etc_root=tmp_path / "etc",
        imex=imex,
        clock=clock or Clock(),
        **kw,
    )


# The rack: trays 0-8 in clique 1, 9-17 in clique 2; IMEX up on trays 0-13, down on 14
# and 15, not installed on 16 and 17; tray 4's GPU 1 has uncorrected ECC errors; tray
# 11's GPU 2 has link 5 down.
def imex_of(tray):
    if tray >= 16:
        return no_imex
    return lambda args: IMEX_UP if tray < 14 else IMEX_DOWN


def tray_fabric(tray, tmp_path):
    nvml = nvl72_tray(
        tray,
        uncorrected_ecc_gpu=1 if tray == 4 else None,
        link_down=(2, 5) if tray == 11 else None,
    )
    return reader(nvml, tmp_path, imex=imex_of(tray)).read()


@pytest.mark.parametrize("tray", range(TRAYS))
def test_each_tray_of_an_nvl72_rack_reports_its_clique_links_memory_and_imex(tray, tmp_path):
    fabric = tray_fabric(tray, tmp_path)

    gpus = fabric["gpus"]
    assert [g["index"] for g in gpus] == list(range(GPUS_PER_TRAY))
    for g in gpus:
        assert g["fabric"] == {
            "cluster_uuid": str(RACK_CLUSTER),
            "clique_id": 1 if tray < 9 else 2,
            "state": "completed",
            "status": 0,
            "health_degraded": False,
        }
        assert [link["link"] for link in g["nvlinks"]] == list(range(LINKS))
        # Every link goes to an NVSwitch tray: no GPU of this node at its other end.
        assert not any("peer_index" in link for link in g["nvlinks"])
    down = [(g["index"], ln["link"]) for g in gpus for ln in g["nvlinks"] if not ln["up"]]
    assert down == ([(2, 5)] if tray == 11 else [])
    uncorrected = {g["index"]: g["ecc"]["uncorrected_volatile"] for g in gpus}
    assert uncorrected == {i: 2 if (tray, i) == (4, 1) else 0 for i in range(GPUS_PER_TRAY)}
    assert fabric.get("imex") == (
        {"state": "up"} if tray < 14 else {"state": "down"} if tray < 16 else None
    )
    # What the control plane takes, and within the frame with room to spare.
    Fabric.model_validate(fabric)
    assert len(json.dumps(fabric)) <= FABRIC_BYTES


def test_the_rack_as_the_control_plane_hears_it(tmp_path):
    trays = [tray_fabric(t, tmp_path / str(t)) for t in range(TRAYS)]

    cliques = {}
    for t, fabric in enumerate(trays):
        for g in fabric["gpus"]:
            cliques.setdefault(g["fabric"]["clique_id"], []).append((t, g["index"]))
    assert {c: len(gpus) for c, gpus in cliques.items()} == {1: 36, 2: 36}
    assert sum(1 for f in trays if f.get("imex", {}).get("state") == "up") == 14
    bad = [
        (t, g["index"])
        for t, f in enumerate(trays)
        for g in f["gpus"]
        if g["ecc"].get("uncorrected_volatile")
    ]
    assert bad == [(4, 1)]


def test_what_nvml_does_not_support_is_absent_never_zero(tmp_path):
    bare = FakeGpu(
        bus_id="00000000:17:00.0",
        fabric_state=None,
        links=None,
        ecc_enabled=None,
        ecc=None,
        remapped=None,
        xid_events=False,
    )
    # A PCIe card on no fabric says NOT_SUPPORTED in the state: nothing to say either.
    pcie = FakeGpu(
        bus_id="00000000:18:00.0", fabric_state=pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    )

    fabric = reader(FakeNvml([bare, pcie]), tmp_path).read()

    assert fabric == {
        "gpus": [
            {"index": 0},
            {
                "index": 1,
                "ecc": {
                    "enabled": True,
                    "corrected_volatile": 0,
                    "uncorrected_volatile": 0,
                    "corrected_aggregate": 0,
                    "uncorrected_aggregate": 0,
                    "remap_pending": False,
                    "remap_failure": False,
                },
            },
        ]
    }


@pytest.mark.parametrize(
    ("mask", "state", "degraded", "clique"),
    [
        ((2 << 0) | (2 << 4), pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, False, 3),
        ((1 << 0) | (2 << 4), pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, True, 3),
        ((2 << 0) | (1 << 4), pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, True, 3),
        (0, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, None, 3),
        (0, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, None, None),
        (0, pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED, None, None),
    ],
)
def test_the_fabric_state_and_health_mask(tmp_path, mask, state, degraded, clique):
    gpu = FakeGpu(
        bus_id="00000000:17:00.0",
        cluster=RACK_CLUSTER,
        clique=3,
        fabric_state=state,
        health_mask=mask,
    )

    [report] = reader(FakeNvml([gpu]), tmp_path).read()["gpus"]

    fabric = report["fabric"]
    assert fabric["state"] == ("not_supported", "not_started", "in_progress", "completed")[state]
    assert fabric.get("health_degraded") == degraded
    assert fabric.get("clique_id") == clique  # a clique only once registered


def test_links_between_gpus_of_one_board_name_their_peer(tmp_path):
    bus = [f"00000000:{0x18 + i:02x}:00.0" for i in range(4)]
    counters = {pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 7, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 1}
    gpus = [
        FakeGpu(
            bus_id=bus[i],
            fabric_state=None,
            links=[
                FakeLink(remote_bus=bus[i ^ 1].upper(), counters=counters),
                FakeLink(up=False, remote_bus=bus[i ^ 2]),
            ],
        )
        for i in range(4)
    ]

    fabric = reader(FakeNvml(gpus), tmp_path).read()

    assert fabric["gpus"][2]["nvlinks"] == [
        {"link": 0, "up": True, "peer_index": 3, "replay_errors": 7, "crc_flit_errors": 1},
        {"link": 1, "up": False},  # a link down names no peer
    ]


def test_xids_are_taken_from_nvml_events_at_each_read(tmp_path):
    nvml = nvl72_tray(0)
    nvml.gpus[3].xid_events = False
    clock = Clock()
    r = reader(nvml, tmp_path, clock=clock)
    assert all("xids" not in g for g in r.read()["gpus"])  # registers for events

    nvml.xid(2, 79)
    nvml.xid(2, 48)
    nvml.xid(3, 79)  # its GPU takes no events
    assert all("xids" not in g for g in r.read()["gpus"]), "read again only every every_s"
    clock.t += r.every_s
    gpus = r.read()["gpus"]

    assert {g["index"]: g.get("xids") for g in gpus} == {0: None, 1: None, 2: [79, 48], 3: None}
    for code in range(100):
        nvml.xid(0, code)
    clock.t += r.every_s
    assert r.read()["gpus"][0]["xids"] == list(range(100 - XIDS_KEPT, 100))


def test_without_nvml_the_node_still_reports_its_ports_and_imex(tmp_path):
    ib_tree(tmp_path / "sys", {("mlx5_0", 1): ib_port()})
    failing = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    fabric = reader(failing, tmp_path, imex=lambda args: IMEX_UP).read()

    assert "gpus" not in fabric
    assert fabric["imex"] == {"state": "up"}
    assert [p["device"] for p in fabric["ib_ports"]] == ["mlx5_0"]
    assert reader(None, tmp_path / "empty").read() == {}


def test_infiniband_ports_from_sysfs(tmp_path):
    ib_tree(
        tmp_path,
        {
            ("mlx5_0", 1): ib_port(link_downed=3, symbol_error=12),
            ("mlx5_1", 1): ib_port(state="1: DOWN", rate="10 Gb/sec (4X SDR)"),
            ("mlx5_2", 1): {"state": "4: ACTIVE"},  # no rate, no counters readable
        },
    )

    ports = ib_ports(tmp_path)

    assert ports == [
        {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0,
         "link_downed": 3, "symbol_errors": 12, "port_rcv_errors": 0},
        {"device": "mlx5_1", "port": 1, "state": "DOWN", "rate_gbps": 10.0,
         "link_downed": 0, "symbol_errors": 0, "port_rcv_errors": 0},
        {"device": "mlx5_2", "port": 1, "state": "ACTIVE"},
    ]  # fmt: skip
    assert ib_ports(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (IMEX_UP, {"state": "up"}),
        (json.dumps({"state": "READY"}), {"state": "up"}),
        (IMEX_DOWN, {"state": "down"}),
        ("not json", {"state": "down"}),
        (subprocess.CalledProcessError(1, "nvidia-imex-ctl"), {"state": "down"}),
        (subprocess.TimeoutExpired("nvidia-imex-ctl", 5), {"state": "down"}),
        (FileNotFoundError(), None),
    ],
)
def test_imex_as_nvidia_imex_ctl_says(tmp_path, answer, said):
    asked = []

    def run(args):
        asked.append(args)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert imex_state(run, tmp_path) == said
    assert asked == [["-N", "-j"]]


def test_the_imex_domain_is_its_nodes_config(tmp_path):
    def config(where, text):
        (where / "nvidia-imex").mkdir(parents=True)
        (where / "nvidia-imex" / "nodes_config.cfg").write_text(text)
        return imex_state(lambda args: IMEX_UP, where)["domain"]

    a = config(tmp_path / "a", "10.0.0.1\n10.0.0.2\n")
    b = config(tmp_path / "b", "# rack a\n10.0.0.2\n10.0.0.1\n\n")
    c = config(tmp_path / "c", "10.0.1.1\n10.0.1.2\n")

    assert a == b != c and a.startswith("imex-") and len(a) == 17


def test_a_fabric_too_large_for_the_frame_leaves_out_link_details_first():
    link = {"link": 0, "up": True, "peer_index": 1, **dict.fromkeys(
        ("replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors"), 123456789)}  # fmt: skip
    gpus = [
        {"index": i, "fabric": {"state": "completed"}, "nvlinks": [{**link, "link": n} for n in range(64)]}
        for i in range(16)
    ]  # fmt: skip
    fabric = {"gpus": gpus}

    assert fit(fabric, 10**7) is fabric
    trimmed = fit(fabric, FABRIC_BYTES)
    assert len(json.dumps(trimmed, separators=(",", ":"))) <= FABRIC_BYTES
    assert trimmed["gpus"][5]["nvlinks"][3] == {"link": 3, "up": True, "peer_index": 1}
    bare = fit(fabric, 5000)
    assert bare["gpus"][5] == {"index": 5, "fabric": {"state": "completed"}}


def test_a_register_with_a_whole_tray_fits_the_frame(tmp_path):
    fabric = tray_fabric(4, tmp_path)
    msg = {"type": "register", "node_id": "tray-4", "fabric": fabric}

    text = json.dumps(msg)

    assert len(text) < MAX_FRAME_BYTES // 8
    assert Register.model_validate_json(text).fabric.gpus[1].ecc.uncorrected_volatile == 2


def test_nodes_simulated_with_the_same_fabric_share_a_clique():
    a, b = SimulatedFabric("nvl72-a:1", 4).read(), SimulatedFabric("nvl72-a:1", 4).read()
    other = SimulatedFabric("nvl72-b:1", 4).read()

    assert a == b
    assert a["gpus"][0]["fabric"]["cluster_uuid"] != other["gpus"][0]["fabric"]["cluster_uuid"]
    assert [g["nvlinks"][0]["peer_index"] for g in a["gpus"]] == [1, 0, 3, 2]
    assert a["imex"] == {"state": "up", "domain": "nvl72-a"}
    Fabric.model_validate(a)
    with pytest.raises(ValueError, match="DOMAIN:CLIQUE"):
        parse_fabric_spec("nvl72-a")


class Reads:
    """A fabric reader answering what a test sets."""

    def __init__(self, fabric):
        self.fabric, self.closed = fabric, False

    def read(self):
        if isinstance(self.fabric, Exception):
            raise self.fabric
        return self.fabric

    def close(self):
        self.closed = True


def test_the_fabric_goes_in_the_register_and_in_a_heartbeat_only_when_it_changed(tmp_path):
    from .test_client import make_agent

    agent = make_agent(tmp_path, "ws://127.0.0.1:1/ws/agent/")
    agent.fabric = Reads(tray_fabric(4, tmp_path))

    register = agent.register_message()
    first = agent.heartbeat_message(1, load={})
    nvml_said = json.loads(json.dumps(agent.fabric.fabric))
    nvml_said["gpus"][0]["nvlinks"][7]["up"] = False
    agent.fabric.fabric = nvml_said
    second = agent.heartbeat_message(2, load={})
    third = agent.heartbeat_message(3, load={})

    assert Register.model_validate(register).fabric.gpus[1].ecc.uncorrected_volatile == 2
    assert "fabric" not in first and "fabric" not in third
    assert second["fabric"]["gpus"][0]["nvlinks"][7]["up"] is False


def test_a_node_without_a_fabric_says_none_and_a_failing_read_costs_only_the_fabric(
    tmp_path, caplog
):
    from .test_client import make_agent

    agent = make_agent(tmp_path, "ws://127.0.0.1:1/ws/agent/")
    assert "fabric" not in agent.register_message()  # no reader: simulated GPUs

    agent.fabric = Reads(RuntimeError("a bug"))
    assert "fabric" not in agent.register_message()
    beats = [agent.heartbeat_message(n, load={}) for n in (1, 2)]

    assert all("fabric" not in b and b["type"] == "heartbeat" for b in beats)
    assert caplog.text.count("cannot read the GPU fabric") == 1


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["--simulate-gpus", "4xh100-80g", "--simulate-fabric", "nvl72-a:1"], SimulatedFabric),
        (["--simulate-gpus", "4xh100-80g"], type(None)),  # one machine plays many nodes
        ([], FabricReader),
    ],
)
def test_the_agent_reads_the_fabric_asked_for(tmp_path, argv, kind):
    from fleet.agent.discovery import Machine, simulated_gpus
    from fleet.agent.main import build_parser, fabric_reader

    args = build_parser().parse_args(argv)
    gpus = simulated_gpus(args.simulate_gpus, "n1") if args.simulate_gpus else []
    machine = Machine(tmp_path, gpus=gpus, engines={"sim": "1"})
    machine.gpus_simulated = bool(args.simulate_gpus)

    assert isinstance(fabric_reader(args, machine), kind)


def test_a_fabric_that_is_not_domain_and_clique_is_refused_at_the_command_line(capsys):
    from fleet.agent.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--simulate-fabric", "nvl72"])
    assert "DOMAIN:CLIQUE" in capsys.readouterr().err
