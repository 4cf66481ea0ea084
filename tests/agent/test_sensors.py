"""Heat and power from fake /sys trees, a fake NVML and a fake nvidia-smi.

The first six tests are the seed's (``discovery/sensors_test.go``), ported.
"""

import os
import stat
import subprocess
import sys

import pytest

from fleet.agent.discovery import LoadSampler
from fleet.agent.sensors import Sensors, SensorSampler, parse_smi, run_smi
from fleet.protocol import Load

from .helpers import FakeNVML, put


class Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


class SMI:
    """A fake nvidia-smi: records what it was asked, answers or fails."""

    def __init__(self, answer="", fails_on=None, error=None):
        self.answer = answer
        self.fails_on = fails_on
        self.error = error
        self.asked = []

    def __call__(self, fields):
        self.asked.append(fields)
        if self.error is not None:
            raise self.error
        if self.fails_on and self.fails_on in fields:
            raise subprocess.CalledProcessError(
                2, "nvidia-smi", output=f'Field "{self.fails_on}" is not a valid field to query.'
            )
        return self.answer


def no_smi(fields):
    raise FileNotFoundError("nvidia-smi")


def no_nvml():
    return FakeNVML(init_error="NVML Shared Library Not Found")


def sampler(sys_root, *, clock=None, nvml=None, smi=no_smi, read_gpus=True):
    return SensorSampler(
        sys_root=sys_root,
        nvml=nvml or no_nvml(),
        smi=smi,
        clock=clock or Clock(),
        read_gpus=read_gpus,
    )


def dell_host(root):
    """The layout of the Proxmox host the seed's tests were written against.

    Dell's SMM with a CPU and SODIMM sensor, coretemp with a package and
    cores, and RAPL with a package and its dram subdomain.
    """
    put(root, "class/hwmon/hwmon0/name", "dell_smm")
    put(root, "class/hwmon/hwmon0/temp1_input", "55000")
    put(root, "class/hwmon/hwmon0/temp1_label", "CPU")
    put(root, "class/hwmon/hwmon0/temp2_input", "47000")
    put(root, "class/hwmon/hwmon0/temp2_label", "SODIMM")
    put(root, "class/hwmon/hwmon1/name", "coretemp")
    put(root, "class/hwmon/hwmon1/temp1_input", "58000")
    put(root, "class/hwmon/hwmon1/temp1_label", "Package id 0")
    put(root, "class/hwmon/hwmon1/temp10_input", "61000")
    put(root, "class/hwmon/hwmon1/temp10_label", "Core 8")
    put(root, "class/powercap/intel-rapl:0/energy_uj", "1000000000")
    put(root, "class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850")
    put(root, "class/powercap/intel-rapl:0:0/energy_uj", "5000000")
    return root


def test_a_hosts_cpu_heat_and_power_are_read_as_lm_sensors_would(tmp_path):
    root = dell_host(tmp_path)
    clock = Clock()
    s = sampler(root, clock=clock)
    first = s.sample()
    # The package reading, not the hotter core: the package is what the chip
    # itself reports as its temperature.
    assert first.cpu_temp_c == 58
    assert first.cpu_power_w is None, "power from one reading of a counter is invented"
    assert first.inlet_temp_c is None and first.gpus == ()
    assert first.to_load() == {"cpu_temp_c": 58.0}

    # 10 s later the package has used 650 J, and its dram subdomain some of
    # that: counted once.
    put(root, "class/powercap/intel-rapl:0/energy_uj", "1650000000")
    put(root, "class/powercap/intel-rapl:0:0/energy_uj", "99000000")
    clock.t += 10
    assert s.sample().cpu_power_w == pytest.approx(65, abs=0.1)


def test_a_counter_that_wraps_is_not_a_negative_draw(tmp_path):
    root = dell_host(tmp_path)
    put(root, "class/powercap/intel-rapl:0/energy_uj", "262143000000")
    clock = Clock()
    s = sampler(root, clock=clock)
    s.sample()
    # 328,850 µJ to the wrap, then 499,671,150 past it: 500 J in 10 s.
    put(root, "class/powercap/intel-rapl:0/energy_uj", "499671150")
    clock.t += 10
    assert s.sample().cpu_power_w == pytest.approx(50, abs=0.1)


def test_a_vm_has_no_sensors_and_says_nothing(tmp_path):
    put(tmp_path, "class/thermal/cooling_device0/type", "Processor")
    clock = Clock()
    s = sampler(tmp_path, clock=clock)
    assert s.sample() == Sensors()
    clock.t += 10
    got = s.sample()
    assert got == Sensors()
    # Nothing, not zeros: the heartbeat carries no sensor field at all.
    assert got.to_load() == {}


def test_a_boards_inlet_sensor_is_the_room_not_the_cpu(tmp_path):
    put(tmp_path, "class/hwmon/hwmon2/name", "nct6798")
    put(tmp_path, "class/hwmon/hwmon2/temp1_input", "24500")
    put(tmp_path, "class/hwmon/hwmon2/temp1_label", "SYSTIN")
    put(tmp_path, "class/hwmon/hwmon3/name", "k10temp")
    put(tmp_path, "class/hwmon/hwmon3/temp1_input", "71250")
    put(tmp_path, "class/hwmon/hwmon3/temp1_label", "Tctl")
    got = sampler(tmp_path).sample()
    assert (got.inlet_temp_c, got.cpu_temp_c) == (24.5, 71.25)


# The seed's three cards: free, held back by its power cap and by heat, and
# one whose driver gives neither its power nor its memory temperature.
SEED_SMI = (
    "0, 71, 612.45, 700.00, 0x0000000000000000, 93, 61234, 84\n"
    "1, 88, 698.10, 700.00, 0x0000000000000024, 100, 80000, 95\n"  # sw_power_cap + sw_thermal
    "2, 45, [N/A], 700.00, 0x0000000000000001, 0, 0, [N/A]\n"  # idle only
)
SEED_CARDS = [
    {
        "temp": 71,
        "mem_temp": 84,
        "power_mw": 612450,
        "limit_mw": 700000,
        "reasons": 0,
        "util": 93,
        "used": 61234 << 20,
    },
    {
        "temp": 88,
        "mem_temp": 95,
        "power_mw": 698100,
        "limit_mw": 700000,
        "reasons": 0x24,
        "util": 100,
        "used": 80000 << 20,
    },
    {"temp": 45, "limit_mw": 700000, "reasons": 0x1, "util": 0, "used": 0},
]


@pytest.mark.parametrize("via", ["nvml", "nvidia-smi"])
def test_each_gpu_says_how_hot_how_hungry_and_what_holds_it_back(tmp_path, via):
    smi = SMI(SEED_SMI)
    nvml = FakeNVML(SEED_CARDS) if via == "nvml" else no_nvml()
    clock = Clock()
    s = sampler(tmp_path, clock=clock, nvml=nvml, smi=smi)
    g0, g1, g2 = s.sample().gpus
    assert (g0.index, g0.temp_c, g0.power_w, g0.power_limit_w, g0.memory_temp_c) == (
        0,
        71,
        612.45,
        700,
        84,
    )
    assert (g0.utilization, g0.memory_used_mb, g0.throttle) == (93, 61234, ())
    assert g1.throttle == ("sw_power_cap", "sw_thermal")
    # N/A is not a reading, and idle is not being held back.
    assert (g2.power_w, g2.memory_temp_c, g2.throttle) == (None, None, ())
    assert g2.to_message() == {
        "index": 2,
        "temp_c": 45.0,
        "power_limit_w": 700.0,
        "utilization": 0.0,
        "memory_used_mb": 0,
        "throttle": [],
    }
    # Within ten seconds the last reading is reused rather than asking the
    # driver on every heartbeat; after, it is asked again.
    nvml.cards = nvml.cards[:1]
    smi.answer = SEED_SMI.splitlines()[0]
    clock.t += 5
    assert len(s.sample().gpus) == 3
    clock.t += 6
    assert len(s.sample().gpus) == 1
    if via == "nvidia-smi":
        assert len(smi.asked) == 2
    else:
        assert smi.asked == [] and nvml.inits == 1, "NVML is loaded once and kept"


def test_a_driver_that_does_not_know_memory_temperature_still_reports_the_rest(tmp_path):
    smi = SMI("0, 66, 250.0, 300.0, 0x0000000000000040, 12, 2048\n", fails_on="temperature.memory")
    clock = Clock()
    s = sampler(tmp_path, clock=clock, smi=smi)
    [g] = s.sample().gpus
    assert (g.temp_c, g.power_w, g.throttle, g.memory_temp_c) == (66, 250, ("hw_thermal",), None)
    # Once seen not to know it, the driver is not asked for it again.
    clock.t += 10
    s.sample()
    assert ["temperature.memory" in f for f in smi.asked] == [True, False, False]


def test_a_card_without_memory_temperature_through_nvml_still_reports_the_rest(tmp_path):
    card = {"temp": 66, "power_mw": 250000, "limit_mw": 300000, "reasons": 0x40}
    [g] = sampler(tmp_path, nvml=FakeNVML([card])).sample().gpus
    assert g.to_message() == {
        "index": 0,
        "temp_c": 66.0,
        "power_w": 250.0,
        "power_limit_w": 300.0,
        "throttle": ["hw_thermal"],
    }


def test_nvml_says_each_cards_default_power_limit_and_its_least(tmp_path):
    # What the control plane keeps a power cap against; a card that does not say is absent.
    capped = {"limit_mw": 560000, "default_mw": 700000, "limits_mw": (200000, 700000)}
    g0, g1 = sampler(tmp_path, nvml=FakeNVML([capped, {"limit_mw": 300000}])).sample().gpus
    assert g0.to_message() == {
        "index": 0,
        "power_limit_w": 560.0,
        "power_default_w": 700.0,
        "power_min_w": 200.0,
    }
    assert g1.to_message() == {"index": 1, "power_limit_w": 300.0}


def test_nvidia_smi_cells_it_cannot_give_are_absent(tmp_path):
    fields = [
        "index",
        "temperature.gpu",
        "power.draw",
        "enforced.power.limit",
        "clocks_throttle_reasons.active",
        "utilization.gpu",
        "memory.used",
        "temperature.memory",
    ]
    text = (
        "0, [Not Supported], [N/A], , [N/A], [N/A], [Not Supported], 0\n"
        "Unable to determine the device handle for GPU 0000:41:00.0: Unknown Error\n"
        "3, 0, 0.00, 450.00, 0x0000000000000080, 7, 10, -1\n"
    )
    g0, g3 = parse_smi(text, fields)
    assert g0.to_message() == {"index": 0}
    # A temperature or power of 0 is a sensor that is not there; a use of 0 is a use.
    assert g3.to_message() == {
        "index": 3,
        "power_limit_w": 450.0,
        "utilization": 7.0,
        "memory_used_mb": 10,
        "throttle": ["power_brake"],
    }


def test_without_nvml_or_nvidia_smi_there_are_no_gpus(tmp_path):
    assert sampler(tmp_path).sample().gpus == ()


def test_nvml_is_imported_as_pynvml_and_released_on_close(tmp_path, monkeypatch):
    nvml = FakeNVML([{"temp": 50}])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    s = SensorSampler(sys_root=tmp_path, smi=no_smi, clock=Clock())
    assert [g.temp_c for g in s.sample().gpus] == [50]
    s.close()
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_without_the_nvml_package_nvidia_smi_is_asked(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    smi = SMI("0, 40, 60.5, 300.0, 0x0, 1, 100, [N/A]\n")
    s = SensorSampler(sys_root=tmp_path, smi=smi, clock=Clock())
    assert [(g.index, g.temp_c, g.power_w) for g in s.sample().gpus] == [(0, 40, 60.5)]


def test_the_real_nvidia_smi_command_line_is_parsed(tmp_path, monkeypatch):
    # A stand-in nvidia-smi on PATH that echoes what it was asked for.
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$1 $2" >&2\necho "0, 55, 100.5, 300.00, 0x4, 3, 512, 60"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    [g] = sampler(tmp_path / "sys", smi=run_smi).sample().gpus
    assert (g.temp_c, g.power_w, g.throttle, g.memory_temp_c) == (55, 100.5, ("sw_power_cap",), 60)


def test_a_node_with_simulated_gpus_reads_no_real_cards(tmp_path):
    nvml = FakeNVML([{"temp": 50}])
    assert sampler(tmp_path, nvml=nvml, read_gpus=False).sample().gpus == ()
    assert nvml.inits == 0


def test_readings_are_reused_for_ten_seconds(tmp_path):
    put(tmp_path, "class/hwmon/hwmon0/name", "coretemp")
    put(tmp_path, "class/hwmon/hwmon0/temp1_input", "50000")
    put(tmp_path, "class/hwmon/hwmon0/temp1_label", "Package id 0")
    clock = Clock()
    s = sampler(tmp_path, clock=clock)
    assert s.sample().cpu_temp_c == 50
    put(tmp_path, "class/hwmon/hwmon0/temp1_input", "70000")
    clock.t += 9.9
    assert s.sample().cpu_temp_c == 50
    clock.t += 0.1
    assert s.sample().cpu_temp_c == 70


def test_the_first_rapl_sample_is_nothing_and_a_new_domain_waits_a_sample(tmp_path):
    put(tmp_path, "class/powercap/intel-rapl:0/energy_uj", "1000000")
    clock = Clock()
    s = sampler(tmp_path, clock=clock)
    assert s.sample().cpu_power_w is None
    # A second socket appears: no fair difference for it yet.
    put(tmp_path, "class/powercap/intel-rapl:0/energy_uj", "101000000")
    put(tmp_path, "class/powercap/intel-rapl:1/energy_uj", "7000000")
    clock.t += 10
    assert s.sample().cpu_power_w is None
    put(tmp_path, "class/powercap/intel-rapl:0/energy_uj", "201000000")
    put(tmp_path, "class/powercap/intel-rapl:1/energy_uj", "207000000")
    clock.t += 10
    # Two packages, 100 J and 200 J in 10 s.
    assert s.sample().cpu_power_w == pytest.approx(30)


def test_an_unreadable_energy_counter_is_no_power(tmp_path):
    # Kernels since 5.10 make energy_uj readable by root only.
    put(tmp_path, "class/powercap/intel-rapl:0/max_energy_range_uj", "262143328850")
    clock = Clock()
    s = sampler(tmp_path, clock=clock)
    s.sample()
    clock.t += 10
    assert s.sample().cpu_power_w is None


def test_without_a_package_sensor_the_hottest_core_is_the_cpu(tmp_path):
    put(tmp_path, "class/hwmon/hwmon0/name", "coretemp")
    for i, milli in enumerate(["52000", "67000", "0", "not a number"], start=2):
        put(tmp_path, f"class/hwmon/hwmon0/temp{i}_input", milli)
        put(tmp_path, f"class/hwmon/hwmon0/temp{i}_label", f"Core {i}")
    put(tmp_path, "class/hwmon/hwmon1/name", "acpitz")
    put(tmp_path, "class/hwmon/hwmon1/temp1_input", "99000")
    got = sampler(tmp_path).sample()
    # acpitz is neither the CPU nor the room, however hot it reads.
    assert (got.cpu_temp_c, got.inlet_temp_c) == (67, None)


@pytest.mark.parametrize(
    ("driver", "label"),
    [("it8728", "SYSTIN"), ("dell_smm", "Ambient"), ("ipmi", "Inlet Temp"), ("x", "Intake")],
)
def test_an_inlet_is_found_by_what_the_board_calls_it(tmp_path, driver, label):
    put(tmp_path, "class/hwmon/hwmon0/name", driver)
    put(tmp_path, "class/hwmon/hwmon0/temp1_input", "21000")
    put(tmp_path, "class/hwmon/hwmon0/temp1_label", label)
    got = sampler(tmp_path).sample()
    assert (got.inlet_temp_c, got.cpu_temp_c) == (21, None)


def test_what_the_sensors_say_is_what_the_protocol_takes(tmp_path):
    root = dell_host(tmp_path)
    put(root, "class/hwmon/hwmon2/name", "nct6775")
    put(root, "class/hwmon/hwmon2/temp1_input", "23000")
    put(root, "class/hwmon/hwmon2/temp1_label", "SYSTIN")
    clock = Clock()
    s = sampler(root, clock=clock, nvml=FakeNVML(SEED_CARDS))
    s.sample()
    put(root, "class/powercap/intel-rapl:0/energy_uj", "1650000000")
    clock.t += 10
    load = s.sample().to_load()
    assert set(load) == {"cpu_temp_c", "cpu_power_w", "inlet_temp_c", "gpus"}
    parsed = Load.model_validate(load)
    assert parsed.gpus[1].throttle == ["sw_power_cap", "sw_thermal"]
    assert parsed.gpus[2].power_w is None


def test_a_sensor_that_breaks_costs_its_figures_not_the_heartbeat(tmp_path, caplog):
    class Broken:
        def sample(self):
            raise RuntimeError("a driver bug")

    sampler_ = LoadSampler(include_memory=False, sensors=Broken())
    for _ in range(2):
        load = sampler_.sample_load()
        assert "load1" in load and "cpu_temp_c" not in load
    assert caplog.text.count("cannot read the sensors") == 1
