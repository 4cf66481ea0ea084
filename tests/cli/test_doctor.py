"""`llmgw doctor` (issue 37, item 7): each check's judgement from the figures read, NVML
through a fake shaped like pynvml, the server through answers shaped like the mirror's."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import httpx
import pytest

from llmgw.cli import doctor
from llmgw.cli.doctor import (
    FAIL,
    OK,
    WARN,
    clock_finding,
    disk_finding,
    nvml_findings,
    ports_finding,
    probe_server,
    render,
    state_finding,
)
from tests.agent.helpers import FakeNVML

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
GB = 10**9


@pytest.mark.parametrize(
    ("skew", "status", "words"),
    [
        (0.0, OK, "within 2 s"),
        (-1.9, OK, "within 2 s"),
        (-10.0, WARN, "10 s behind the server's"),
        (45.0, FAIL, "45 s ahead of the server's"),
        (None, WARN, "no Date"),
    ],
)
def test_the_clock_is_judged_against_the_servers(skew, status, words):
    found = clock_finding(skew)
    assert (found.status, words in found.said) == (status, True)
    assert bool(found.fix) == (status == FAIL or (status == WARN and skew is not None))


@pytest.mark.parametrize(
    ("free_gb", "status"), [(500, OK), (19.9, WARN), (4.9, FAIL), (None, WARN)]
)
def test_the_caches_free_disk_is_said_with_its_figures(free_gb, status):
    free = None if free_gb is None else int(free_gb * GB)
    found = disk_finding(Path("/var/lib/llmgw/weights"), free, None if free is None else 1000 * GB)
    assert found.status == status
    if free_gb == 19.9:
        assert found.said.startswith("/var/lib/llmgw/weights: 19.9 GB free of 1,000.0 GB")


def test_the_state_folder_is_its_owners_and_its_credential_its_alone():
    folder = Path("/var/lib/llmgw/agent")
    fine = state_finding(folder, 0o40755, 1000, 1000, 0o100600)
    assert fine.status == OK
    assert fine.said == f"{folder} is this user's (mode 755), its credential its alone (mode 600)"
    opened = state_finding(folder, 0o40755, 1000, 1000, 0o100644)
    assert opened.status == FAIL and "node-token, the node's credential, is open" in opened.said
    assert opened.fix == f"chmod 600 {folder / 'node-token'}"
    other = state_finding(folder, 0o40700, 0, 1000, None)
    assert other.status == FAIL and "belongs to uid 0, not to uid 1000" in other.said
    assert state_finding(folder, None, None, 1000, None).status == WARN
    # Not joined yet: nothing to protect.
    assert state_finding(folder, 0o40700, 1000, 1000, None).status == OK


def test_ports_say_how_many_are_free():
    assert ports_finding(20000, 29999, 10000).said == (
        "10,000 of the 10,000 engine ports 20000-29999 are free"
    )
    assert ports_finding(20000, 20099, 0).status == FAIL
    assert ports_finding(20000, 20099, 3).status == WARN


def test_no_driver_is_a_cpu_node():
    for nvml in (None, FakeNVML(init_error="NVML Shared Library Not Found")):
        [found] = nvml_findings(nvml)
        assert (found.status, found.said) == (OK, "no NVIDIA driver: a CPU node")


def test_a_driver_nvml_cannot_read_fails_with_its_fix():
    [found] = nvml_findings(FakeNVML(init_error="Driver/library version mismatch"))
    assert found.status == FAIL
    assert "Driver/library version mismatch" in found.said and "reboot" in found.fix


def test_each_gpu_is_said_with_its_health():
    cards = [
        {"temp": 41, "used": 3 << 30, "reasons": 0},
        {"temp": 88, "used": 70 << 30, "reasons": 0x40},
        {},  # a card that reports none of these
    ]
    nvml = FakeNVML(cards)
    found = nvml_findings(nvml)
    assert [f.check for f in found] == ["nvml", "gpu 0", "gpu 1", "gpu 2"]
    assert found[0].said == "NVML reads 3 GPUs"
    assert (found[1].status, found[1].said) == (OK, "GPU 0, 41 °C, 3.0 of 80 GiB used")
    assert found[2].status == WARN
    assert found[2].said.endswith("held back by hardware thermal slowdown")
    assert (found[3].status, found[3].said) == (OK, "GPU 2")
    assert nvml.shutdowns == 1


def _client(status: int, *, date: datetime | None = NOW, fail: Exception | None = None):
    def answer(request: httpx.Request) -> httpx.Response:
        if fail is not None:
            raise fail
        assert request.url.path == f"/api/v1/mirror/files/{'0' * 64}"
        headers = {"date": format_datetime(date, usegmt=True)} if date else {}
        return httpx.Response(status, headers=headers)

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_a_credential_the_mirror_accepts_and_a_clock_in_time():
    found = probe_server("http://cp:8000", _client(404), "llmgw_node_x", NOW)
    assert [(f.check, f.status) for f in found] == [
        ("server", OK), ("tls", OK), ("clock", OK), ("credential", OK),
    ]  # fmt: skip


def test_a_refused_credential_and_a_clock_ahead_fail_with_their_fixes():
    late = NOW - timedelta(seconds=120)  # the server's clock is two minutes behind this one
    found = {f.check: f for f in probe_server("http://cp:8000", _client(401, date=late), "x", NOW)}
    assert found["credential"].status == FAIL and "join token" in found["credential"].fix
    assert found["clock"].status == FAIL
    assert found["clock"].said == "this clock is 120 s ahead of the server's"


def test_a_server_not_reached_is_one_line_with_its_fix():
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    [found] = probe_server("http://cp:8000", _client(0, fail=refused), None, NOW)
    assert (found.check, found.status) == ("server", FAIL)
    assert "Connection refused" in found.said and "LLMGW_SERVER" in found.fix


def test_a_node_with_no_credential_yet_is_told_how_to_join():
    found = {f.check: f for f in probe_server("http://cp:8000", _client(401), None, NOW)}
    assert found["credential"].status == WARN and "join token" in found["credential"].fix


def test_doctor_prints_a_line_a_check_and_json_on_asking(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(doctor, "real_nvml", lambda: FakeNVML([{"temp": 50}]))
    monkeypatch.setattr(doctor, "_engines", lambda: {"llamacpp": ("/bin/llama-server", "b4589")})
    state = tmp_path / "agent"
    state.mkdir(mode=0o700)
    argv = ["--server", "http://127.0.0.1:9", "--state-dir", str(state), "--port-range", "1-1"]

    assert doctor.main(argv) == 1  # nothing answers on port 9
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("FAIL  server: http://127.0.0.1:9 cannot be reached")
    assert "ok    engine llamacpp: /bin/llama-server: b4589" in text
    assert f"ok    state folder: {state} is this user's (mode 700)" in text

    assert doctor.main([*argv, "--json"]) == 1
    found = json.loads(capsys.readouterr().out)
    assert {f["check"] for f in found} >= {"server", "nvml", "gpu 0", "disk", "ports"}
    assert all(set(f) == {"check", "status", "said", "fix"} for f in found)


def test_render_puts_the_fix_under_what_is_not_ok():
    text = render([clock_finding(45.0), clock_finding(0.0)])
    assert text.splitlines() == [
        "FAIL  clock: this clock is 45 s ahead of the server's",
        "      fix: run NTP on both (timedatectl set-ntp true; chronyc tracking)",
        "ok    clock: within 2 s of the server's",
    ]
