"""What the agent finds on the machine, what it simulates, and its CLI."""

import sys
import types

import pytest

from fleet.agent import discovery
from fleet.agent.discovery import (
    LoadSampler,
    Machine,
    advertise_address,
    nvml_gpus,
    parse_version_output,
    simulated_gpus,
)
from fleet.agent.main import (
    build_parser,
    labels_file,
    location_labels,
    main,
    node_id_for,
    parse_labels,
    parse_port_range,
    ws_url,
)


def test_simulated_h100s_carry_the_real_cards_name_and_memory():
    gpus = simulated_gpus("8xh100-80g", "node-a")
    assert len(gpus) == 8
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[5].uuid == "SIM-node-a-5"
    assert {(g.name, g.memory_total_mb) for g in gpus} == {("NVIDIA H100 80GB HBM3", 81559)}


def test_mixed_simulated_gpus_are_numbered_across_the_spec():
    gpus = simulated_gpus("2xa100-80g,rtx4090-24g, 1xt4-16g", "n")
    assert [(g.index, g.name, g.memory_total_mb) for g in gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 81920),
        (1, "NVIDIA A100-SXM4-80GB", 81920),
        (2, "NVIDIA GeForce RTX 4090", 24564),
        # Not in the table: named so the server derives t4-16g back.
        (3, "NVIDIA T4", 16384),
    ]


@pytest.mark.parametrize("bad", ["8x", "h100", "0xh100-80g", "8xh100-80"])
def test_a_malformed_gpu_spec_is_refused(bad):
    with pytest.raises(ValueError):
        simulated_gpus(bad, "n")


def test_a_malformed_gpu_spec_stops_the_cli_with_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--token", "t", "--simulate-gpus", "lots"])
    assert exc.value.code == 2
    assert "'lots' is not a GPU spec" in capsys.readouterr().err


def _fake_nvml(init_error=None, devices=()):
    class NVMLError(Exception):
        pass

    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError

    def init():
        if init_error:
            raise NVMLError(init_error)

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: len(devices)
    mod.nvmlDeviceGetHandleByIndex = lambda i: devices[i]
    mod.nvmlDeviceGetUUID = lambda d: d["uuid"]
    mod.nvmlDeviceGetName = lambda d: d["name"]
    mod.nvmlDeviceGetMemoryInfo = lambda d: types.SimpleNamespace(total=d["bytes"])
    return mod


def test_no_driver_means_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(init_error="Driver Not Loaded"))
    assert nvml_gpus() == []


def test_no_nvml_package_means_no_gpus(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert nvml_gpus() == []


def test_nvml_gpus_are_listed_with_memory_in_mib(monkeypatch):
    devices = [
        {"uuid": b"GPU-aaaa", "name": b"NVIDIA H100 80GB HBM3", "bytes": 81559 * 1024 * 1024},
        {"uuid": "GPU-bbbb", "name": "NVIDIA H100 80GB HBM3", "bytes": 81559 * 1024 * 1024},
    ]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(devices=devices))
    gpus = nvml_gpus()
    assert [(g.index, g.uuid, g.memory_total_mb) for g in gpus] == [
        (0, "GPU-aaaa", 81559),
        (1, "GPU-bbbb", 81559),
    ]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_an_nvml_error_while_listing_means_no_gpus(monkeypatch):
    mod = _fake_nvml(devices=[{}])

    def broken(_):
        raise mod.NVMLError("GPU is lost")

    mod.nvmlDeviceGetHandleByIndex = broken
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    assert nvml_gpus() == []


MEMINFO = "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   16384000 kB\n"


def test_the_machine_reads_memory_cpus_and_disk(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    m = Machine(tmp_path / "state", gpus=[], engines={}, meminfo_path=str(meminfo))
    assert m.memory_total_mb() == 64000
    assert m.cpu_count() and m.cpu_count() >= 1
    disk = m.disk()
    assert disk and 0 < disk["free_gb"] <= disk["total_gb"]


def test_simulation_flags_replace_what_they_name(tmp_path):
    m = Machine(tmp_path, gpus=[], engines={}, memory_gb=512, cpus=96, disk_gb=2000)
    assert (m.memory_total_mb(), m.cpu_count()) == (512 * 1024, 96)
    assert m.disk() == {"free_gb": 2000.0, "total_gb": 2000.0}


def test_unreadable_memory_is_unknown_not_zero(tmp_path):
    m = Machine(tmp_path, gpus=[], engines={}, meminfo_path=str(tmp_path / "missing"))
    assert m.memory_total_mb() is None


def test_the_sim_engine_is_always_installed(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert list(discovery.probe_engines()) == ["sim"]


def _fake_llama_server(path, version_line="version: 7001 (9f0e1d2)"):
    # llama-server writes its version, among the backends it loaded, to stderr.
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "#!/bin/sh",
        "echo 'load_backend: loaded CPU backend' >&2",
        f"echo '{version_line}' >&2",
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def test_a_given_llama_server_is_probed_where_it_is_and_reports_its_version(tmp_path, monkeypatch):
    binary = _fake_llama_server(tmp_path / "llama-server")
    monkeypatch.setenv("PATH", "/nonexistent")
    engines = discovery.probe_engines(binaries={"llamacpp": str(binary), "vllm": "vllm"})
    assert engines == {"llamacpp": "7001 (9f0e1d2)", "sim": discovery.AGENT_VERSION}


def test_a_given_llama_server_that_is_gone_is_no_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    missing = str(tmp_path / "gone" / "llama-server")
    assert list(discovery.probe_engines(binaries={"llamacpp": missing})) == ["sim"]


def _agents_started(monkeypatch) -> list:
    """The agents `main` would run, kept instead of run."""
    from fleet.agent import main as agent_main

    started: list = []

    def run(coro):
        started.append(coro.cr_frame.f_locals["agent"])
        coro.close()

    monkeypatch.setattr(agent_main.asyncio, "run", run)
    return started


def test_the_agent_runs_and_reports_the_llama_server_it_is_given(tmp_path, monkeypatch):
    from fleet.agent import engines

    binary = _fake_llama_server(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))
    started = _agents_started(monkeypatch)
    flags = ["--token", "t", "--node-id", "n", "--state-dir", str(tmp_path / "state")]
    assert main([*flags, "--llama-server", str(binary), "--simulate-gpus", "1xh100-80g"]) == 0
    assert started[0].machine.engines["llamacpp"] == "7001 (9f0e1d2)"
    assert engines.engine_binaries()["llamacpp"] == str(binary)


def test_a_llama_server_that_is_not_an_executable_file_stops_the_cli(tmp_path, capsys):
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    for given in (plain, tmp_path / "missing", tmp_path):
        with pytest.raises(SystemExit) as exc:
            main(["--token", "t", "--llama-server", str(given)])
        assert exc.value.code == 2
        assert f"{given} is not an executable file" in capsys.readouterr().err


def test_engine_versions_are_read_from_their_output():
    out = "ggml_cuda_init: found 1 CUDA devices\nversion: 4589 (a1b2c3d)\nbuilt with cc\n"
    assert parse_version_output(out) == "4589 (a1b2c3d)"
    assert parse_version_output("0.6.3.post1\n") == "0.6.3.post1"
    assert parse_version_output("") is None


def _stat(busy, idle):
    return f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n"


def test_cpu_percent_needs_two_samples(tmp_path):
    stat, meminfo = tmp_path / "stat", tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    stat.write_text(_stat(100, 900))
    sampler = LoadSampler(stat_path=str(stat), meminfo_path=str(meminfo))
    first = sampler.sample_load()
    assert "cpu_percent" not in first
    assert first["memory_available_bytes"] == 16384000 * 1024
    assert first["memory_used_bytes"] == (65536000 - 16384000) * 1024
    assert {"load1", "load5", "load15"} <= first.keys()
    stat.write_text(_stat(130, 990))
    assert sampler.sample_load()["cpu_percent"] == 25.0


def test_simulated_memory_leaves_the_real_machines_figures_out(tmp_path):
    sampler = LoadSampler(include_memory=False)
    assert not {"memory_used_bytes", "memory_available_bytes"} & sampler.sample_load().keys()


def test_labels_are_repeatable_and_comma_separated():
    assert parse_labels(["rack=r1,row=a", "llmgw.io/fabric=nvl-1"]) == {
        "rack": "r1",
        "row": "a",
        "llmgw.io/fabric": "nvl-1",
    }
    with pytest.raises(ValueError, match="not key=value"):
        parse_labels(["rack"])


def test_zone_rack_and_pdu_flags_set_the_well_known_labels():
    args = build_parser().parse_args(["--zone", "z1", "--rack", "r12-07", "--pdu", "p-a, p-b"])
    assert location_labels(zone=args.zone, rack=args.rack, pdu=args.pdu) == {
        "llmgw.io/zone": "z1",
        "llmgw.io/rack": "r12-07",
        "llmgw.io/pdu": "p-a,p-b",
    }
    assert location_labels(zone=None, rack=None, pdu=None) == {}
    with pytest.raises(ValueError, match="--rack: 'r 1' is not a rack's name"):
        location_labels(zone=None, rack="r 1", pdu=None)
    with pytest.raises(ValueError, match="--pdu: a PDU needs a name"):
        location_labels(zone=None, rack=None, pdu="p-a,")


def test_row_room_and_site_flags_set_the_location_trees_labels():
    args = build_parser().parse_args(["--row", " 12 ", "--room", "hall-b", "--site", "sto1"])
    said = dict(row=args.row, room=args.room, site=args.site)
    assert location_labels(zone=None, rack=None, pdu=None, **said) == {
        "llmgw.io/row": "12",
        "llmgw.io/room": "hall-b",
        "llmgw.io/site": "sto1",
    }
    with pytest.raises(ValueError, match="--room: 'hall b' is not a room's name"):
        location_labels(zone=None, rack=None, pdu=None, room="hall b")
    with pytest.raises(ValueError, match="--site: a site's name is at most 63 characters"):
        location_labels(zone=None, rack=None, pdu=None, site="s" * 64)


def test_labels_come_from_a_file_one_key_value_a_line(tmp_path):
    path = tmp_path / "labels"
    path.write_text("# where it is\nllmgw.io/rack = r12-07\n\nteam=ml\n")
    assert labels_file(path) == {"llmgw.io/rack": "r12-07", "team": "ml"}
    path.write_text("rack\n")
    with pytest.raises(ValueError, match="line 1 of the labels file .* is not key=value"):
        labels_file(path)
    with pytest.raises(ValueError, match="cannot be read"):
        labels_file(tmp_path / "missing")


def test_a_bad_rack_flag_stops_the_agent_before_it_connects(tmp_path, capsys):
    code = main(["--token", "t", "--state-dir", str(tmp_path), "--rack", "r/1"])
    assert code == 2
    assert "--rack: 'r/1' is not a rack's name" in capsys.readouterr().err


def test_the_pdu_phase_flag_sets_one_phase_per_pdu_in_their_order():
    args = build_parser().parse_args(["--pdu", "p-a, p-b", "--pdu-phase", " L2 , L1"])
    assert location_labels(zone=None, rack=None, pdu=args.pdu, pdu_phase=args.pdu_phase) == {
        "llmgw.io/pdu": "p-a,p-b",
        "llmgw.io/pdu-phase": "L2,L1",
    }
    with pytest.raises(ValueError, match="--pdu-phase: 'L 2' is not a phase: L1, L2 or L3"):
        location_labels(zone=None, rack=None, pdu="p-a", pdu_phase="L 2")
    with pytest.raises(ValueError, match="--pdu-phase: '' is not a phase"):
        location_labels(zone=None, rack=None, pdu="p-a,p-b", pdu_phase="L2,")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--pdu", "p-a,p-b", "--pdu-phase", "L2"],
            "llmgw.io/pdu-phase names 1 phase for 2 PDUs (p-a, p-b): it gives one phase per "
            "PDU of llmgw.io/pdu, in the same order (L2,L2 for a node on L2 of two).\n",
        ),
        (["--pdu-phase", "L2"], "llmgw.io/pdu-phase names 1 phase for 0 PDUs: "),
        (["--pdu", "p-a", "--pdu-phase", "phase-one"], "--pdu-phase: 'phase-one' is not a phase"),
        # Given as a plain label, and from the labels file, it is checked the same.
        (
            ["--pdu", "p-a", "--labels", "llmgw.io/pdu-phase=L 2"],
            "llmgw.io/pdu-phase: 'L 2' is not a phase: L1, L2 or L3",
        ),
        (
            ["--labels-file", "{tmp}/labels"],
            "llmgw.io/pdu-phase names 2 phases for 1 PDU (p-a)",
        ),
    ],
)
def test_a_pdu_phase_label_that_cannot_be_read_stops_the_agent_before_it_connects(
    tmp_path, capsys, argv, said
):
    (tmp_path / "labels").write_text("llmgw.io/pdu=p-a\nllmgw.io/pdu-phase=L1,L2\n")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code = main(["--token", "t", "--state-dir", str(tmp_path / "state"), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("llmgw agent: ") and said in err
    assert ".." not in err


def test_the_agent_sends_the_phases_it_is_given(tmp_path, monkeypatch):
    started = _agents_started(monkeypatch)
    flags = ["--token", "t", "--node-id", "n", "--state-dir", str(tmp_path / "state")]
    # The flag wins over --labels, as --pdu does; an empty label is no phase, not refused.
    given = ["--pdu", "p-a,p-b", "--labels", "llmgw.io/pdu-phase=", "--pdu-phase", "L2,L2"]
    assert main([*flags, "--simulate-gpus", "1xh100-80g", *given]) == 0
    labels = started[0].settings.labels
    assert (labels["llmgw.io/pdu"], labels["llmgw.io/pdu-phase"]) == ("p-a,p-b", "L2,L2")
    assert main([*flags, "--simulate-gpus", "1xh100-80g", "--labels", "llmgw.io/pdu-phase="]) == 0


def test_the_websocket_url_follows_the_servers_scheme():
    assert ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/ws/agent/"
    assert ws_url("https://llmgw.example.com/") == "wss://llmgw.example.com/ws/agent/"
    assert ws_url("https://example.com/llmgw") == "wss://example.com/llmgw/ws/agent/"
    with pytest.raises(ValueError):
        ws_url("ftp://example.com")


def test_port_ranges():
    assert parse_port_range("20000-29999") == (20000, 29999)
    with pytest.raises(ValueError):
        parse_port_range("30000-20000")


def test_the_node_id_is_made_once_and_kept(tmp_path):
    first = node_id_for(tmp_path, None)
    assert first == (tmp_path / "node-id").read_text().strip()
    assert node_id_for(tmp_path, None) == first
    assert node_id_for(tmp_path, "given") == "given"


def test_a_server_on_loopback_is_reached_on_loopback():
    assert advertise_address("127.0.0.1", 8000) == "127.0.0.1"
    assert advertise_address("localhost", 8000) == "127.0.0.1"
    assert advertise_address("::1", 8000) == "127.0.0.1"


def test_without_a_token_the_agent_says_so_and_exits_2(monkeypatch, capsys):
    monkeypatch.delenv("LLMGW_TOKEN", raising=False)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "set LLMGW_TOKEN, or LLMGW_TOKEN_FILE to a file holding it" in err
