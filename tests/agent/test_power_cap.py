"""GPU power capping on the agent (docs/facility.md, "Power capping"): each GPU held to a
share of its default power limit through NVML's nvmlDeviceSetPowerManagementLimit, within
what the card allows, and back; what NVML refuses said per GPU."""

from __future__ import annotations

import asyncio
import logging

from fleet.agent.sensors import SensorSampler

from .fake_nvml import FakeGpu, FakeNvml


def sampler(nvml, tmp_path, **kw) -> SensorSampler:
    return SensorSampler(sys_root=tmp_path, nvml=nvml, smi=lambda fields: "", **kw)


def test_each_gpu_is_held_to_a_share_of_its_default_limit_and_back(tmp_path):
    nvml = FakeNvml([FakeGpu("0000:01:00.0"), FakeGpu("0000:02:00.0")])
    s = sampler(nvml, tmp_path)

    said = s.power_cap(0.8)

    assert [g.power_limit_mw for g in nvml.gpus] == [560_000, 560_000]
    assert said[0] == "GPU 0: power limit set to 560 W, 80% of its default 700 W"
    assert s.power_cap(None)[1] == "GPU 1: power limit back to its default, 700 W"
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000]


def test_a_share_below_what_the_card_allows_is_held_at_its_least(tmp_path):
    nvml = FakeNvml([FakeGpu("0000:01:00.0", power_limits_mw=(400_000, 700_000))])

    (said,) = sampler(nvml, tmp_path).power_cap(0.3)

    assert nvml.gpus[0].power_limit_mw == 400_000
    assert (
        said
        == "GPU 0: power limit set to 400 W, 30% of its default 700 W (the card's least is 400 W)"
    )


def test_what_nvml_refuses_is_said_per_gpu_and_the_others_are_set(tmp_path):
    nvml = FakeNvml(
        [
            FakeGpu("0000:01:00.0", may_set_power=False),
            FakeGpu("0000:02:00.0", power_default_mw=None),
            FakeGpu("0000:03:00.0"),
        ]
    )

    said = sampler(nvml, tmp_path).power_cap(0.5)

    assert said[0].startswith("GPU 0: its power limit was not set to 350 W: ")
    assert "Permission" in said[0] or "permission" in said[0]
    assert said[1].startswith("GPU 1: its power limit cannot be read: ")
    assert said[2] == "GPU 2: power limit set to 350 W, 50% of its default 700 W"
    assert [g.power_limit_mw for g in nvml.gpus] == [700_000, 700_000, 350_000]


def test_simulated_gpus_are_not_touched(tmp_path):
    nvml = FakeNvml([FakeGpu("0000:01:00.0")])

    assert sampler(nvml, tmp_path, read_gpus=False).power_cap(0.5) == []
    assert (nvml.inits, nvml.gpus[0].power_limit_mw) == (0, 700_000)


def test_simulated_gpus_keep_their_cap_where_their_sim_engines_read_it(tmp_path):
    from llmgw.simengine import PowerFile

    path = tmp_path / "sim-power"
    s = sampler(FakeNvml([]), tmp_path, read_gpus=False, sim_power=path)

    assert s.power_cap(0.8) == ["simulated GPUs: power limit set to 80% of their default"]
    assert PowerFile(str(path)).share(0.0) == 0.8
    assert s.power_cap(None) == ["simulated GPUs: power limit back to their default"]
    assert not path.exists() and PowerFile(str(path)).share(0.0) == 1.0
    assert s.power_cap(None) == ["simulated GPUs: power limit back to their default"]


def test_without_nvml_nothing_is_set_and_it_is_said(tmp_path):
    import pynvml

    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    assert sampler(nvml, tmp_path).power_cap(0.5) == [
        "no GPU's power limit was set: NVML could not be loaded"
    ]


def test_the_agent_caps_on_the_control_planes_command_and_refuses_a_bad_share(tmp_path, caplog):
    from fleet.agent.client import Agent

    nvml = FakeNvml([FakeGpu("0000:01:00.0")])
    agent = Agent.__new__(Agent)  # only what _power_cap reads
    agent.load_sampler = type("L", (), {"sensors": sampler(nvml, tmp_path)})()
    caplog.set_level(logging.INFO)

    asyncio.run(agent._power_cap({"type": "power_cap", "share": 0.75}))
    asyncio.run(agent._power_cap({"type": "power_cap", "share": 5}))

    assert nvml.gpus[0].power_limit_mw == 525_000
    assert "power cap: GPU 0: power limit set to 525 W, 75% of its default 700 W" in caplog.text
    assert "power_cap with a share that is not from 0.1 to 1: 5" in caplog.text


def test_an_agent_on_simulated_gpus_keeps_their_cap_in_its_state_folder(tmp_path, caplog):
    from fleet.agent.client import Agent, AgentSettings
    from fleet.agent.credentials import Credentials
    from fleet.agent.discovery import Machine, simulated_gpus
    from fleet.agent.supervisor import Supervisor
    from llmgw.simengine import PowerFile

    machine = Machine(
        tmp_path, gpus=simulated_gpus("2xh100-80g", "n1"), engines={"sim": "1"}, cpus=8
    )
    settings = AgentSettings(
        ws_url="ws://127.0.0.1:1/",
        credentials=Credentials(tmp_path, "t"),
        node_id="n1",
        advertise_addr="127.0.0.1",
    )
    agent = Agent(settings, machine, Supervisor(tmp_path, advertise_addr="127.0.0.1"))
    caplog.set_level(logging.INFO)

    asyncio.run(agent._power_cap({"type": "power_cap", "share": 0.6}))

    assert PowerFile(str(tmp_path / "sim-power")).share(0.0) == 0.6
    assert "power cap: simulated GPUs: power limit set to 60% of their default" in caplog.text
