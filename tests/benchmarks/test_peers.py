"""benchmarks/peers.py's Rust routers: where each is installed, how it is started, and when
it is left out with a sentence rather than measured."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks import peers
from benchmarks.peers import (
    ROUTERS,
    SGLANG_ROUTER,
    VLLM_ROUTER,
    Procs,
    cores_by_role,
    free_port,
    machine_cpu,
    router_binary,
    router_command,
    router_venv,
    start_router,
    wait,
)


@pytest.fixture
def peers_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BENCH_PEERS_DIR", str(tmp_path / "peers"))
    for router in ROUTERS:
        monkeypatch.delenv(router.switch, raising=False)
    return tmp_path / "peers"


def _no_process(*args, **kwargs):
    raise AssertionError(f"nothing should be run: {args}")


def test_each_router_has_a_venv_of_its_own_per_version(peers_dir):
    assert router_venv(VLLM_ROUTER) == peers_dir / "vllm-router-0.1.17"
    assert router_venv(SGLANG_ROUTER) == peers_dir / "sglang-router-0.3.2"


def test_the_version_installed_is_pinned_and_can_be_moved(monkeypatch):
    monkeypatch.setenv("BENCH_VLLM_ROUTER_VERSION", "0.1.18")
    moved = peers._router("vllm-router", "0.1.17", ("vllm-router",), "warning")
    assert (moved.version, moved.switch) == ("0.1.18", "BENCH_VLLM_ROUTER")


def test_a_router_listens_on_loopback_only_and_is_given_the_engines_and_policy():
    workers = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    binary = Path("/venv/bin/smg")
    cmd = router_command(SGLANG_ROUTER, binary, 9000, 9001, workers, "cache_aware")
    assert cmd[:2] == ["/venv/bin/smg", "launch"]
    flags = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert flags["--host"] == flags["--prometheus-host"] == "127.0.0.1"
    assert (flags["--port"], flags["--prometheus-port"]) == ("9000", "9001")
    assert flags["--policy"] == "cache_aware" and flags["--log-level"] == "warn"
    start = cmd.index("--worker-urls") + 1
    assert cmd[start : start + 2] == workers
    vllm = router_command(
        VLLM_ROUTER, Path("/v/bin/vllm-router"), 9000, 9001, workers, "round_robin"
    )
    assert vllm[0] == "/v/bin/vllm-router" and vllm[1] == "--host"
    assert "warning" in vllm and "round_robin" in vllm


def test_a_router_left_out_by_its_switch_installs_and_starts_nothing(
    peers_dir, monkeypatch, tmp_path
):
    monkeypatch.setenv("BENCH_SGLANG_ROUTER", "0")
    monkeypatch.setattr(peers.subprocess, "run", _no_process)
    peer, why = start_router(_no_process, tmp_path, SGLANG_ROUTER, ["http://x"], "k", "m")
    assert peer is None
    assert why == "BENCH_SGLANG_ROUTER=0 leaves sglang-router out"
    assert not peers_dir.exists()


def test_an_installed_router_is_reused_not_installed_again(peers_dir, monkeypatch):
    binary = router_venv(VLLM_ROUTER) / "bin" / "vllm-router"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setattr(peers.subprocess, "run", _no_process)
    assert router_binary(VLLM_ROUTER) == (binary, None)


def test_a_router_that_cannot_be_installed_is_left_out_with_why(peers_dir, monkeypatch, tmp_path):
    # An interpreter that cannot make a venv, as where PyPI or the wheel is missing pip fails.
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho no venv here >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(peers, "_venv_python", lambda: str(broken))
    spawned = []
    peer, why = start_router(lambda *a: spawned.append(a), tmp_path, SGLANG_ROUTER, ["u"], "k", "m")
    assert peer is None and spawned == []
    log = peers_dir / "sglang-router-0.3.2.install.log"
    assert (
        why
        == f"sglang-router==0.3.2 could not be installed from PyPI (python -m venv exited 3); see {log}"
    )
    assert "no venv here" in log.read_text()
    assert not router_venv(SGLANG_ROUTER).exists()


@pytest.mark.e2e
@pytest.mark.parametrize("router", ROUTERS, ids=lambda r: r.name)
def test_an_installed_router_passes_the_engines_answers_on(router, tmp_path):
    """A real router (where a benchmark run installed it) before a real sim engine that
    takes one key: its answer is the engine's, and the CPU counted is its own process's."""
    if not (router_venv(router) / "bin" / router.command[0]).exists():
        pytest.skip(f"{router.name} {router.version} is not installed in {router_venv(router)}")
    procs = Procs(tmp_path)
    try:
        port, key = free_port(), "sk-one-key"
        env = {**os.environ, "LLMGW_ENGINE_API_KEY": key}
        engine = f"http://127.0.0.1:{port}"
        procs.spawn("engine", [sys.executable, "-m", "llmgw", "sim-engine", "--port", str(port),
                               "--model", "bench", "--ttft-ms", "0"], env)  # fmt: skip
        wait("the engine", lambda: httpx.get(f"{engine}/health").status_code == 200)
        peer, why = start_router(procs.spawn, tmp_path, router, [engine], key, "bench")
        assert why is None and peer is not None and peer.version == router.version
        chat = {
            "model": "bench",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
        }
        auth = {"Authorization": f"Bearer {key}"}
        through = httpx.post(
            f"http://127.0.0.1:{peer.port}/v1/chat/completions", json=chat, headers=auth
        )
        direct = httpx.post(f"{engine}/v1/chat/completions", json=chat, headers=auth)
        said = [json.loads(r.text)["choices"][0]["message"]["content"] for r in (through, direct)]
        assert said[0] == said[1]
        wrong = httpx.post(f"http://127.0.0.1:{peer.port}/v1/chat/completions", json=chat,
                           headers={"Authorization": "Bearer not-the-key"})  # fmt: skip
        assert wrong.status_code == 401  # the engine's answer, passed on
        assert peers.cpu_seconds(peer.pids()) > 0
    finally:
        procs.stop()


def test_the_cores_are_split_by_role_with_the_rest_of_the_machine_as_everything_else():
    before = {"pids": {1: ("python", 10.0), 2: ("python", 5.0), 3: ("postgres", 1.0)},
              "busy": 100.0, "steal": 2.0}  # fmt: skip
    after = {"pids": {1: ("python", 14.0), 2: ("python", 6.0), 3: ("postgres", 1.5),
                      4: ("redis-server", 0.5), 9: ("python", 1.0)},
             "busy": 108.0, "steal": 3.0}  # fmt: skip
    # 2 is in both roles and counts in the first; 9 started meanwhile and counts whole.
    roles = {"load generator": [1, 2], "llmgw serve": [2, 9], "gone": [7]}
    split = cores_by_role(before, after, roles, seconds=2.0)
    assert split == {"load generator": 2.5, "llmgw serve": 0.5, "gone": 0.0, "postgres": 0.25,
                     "redis": 0.25, "everything else": 0.5, "steal": 0.5}  # fmt: skip


def test_the_machine_reading_has_this_process_and_the_machine_busy():
    first = machine_cpu()
    sum(i * i for i in range(300_000))
    second = machine_cpu()
    assert second["pids"][os.getpid()][0].startswith(("python", "pytest"))
    assert second["pids"][os.getpid()][1] >= first["pids"][os.getpid()][1]
    assert second["busy"] > first["busy"] > 0


@pytest.mark.parametrize(
    ("pip_exit", "failed"),
    [(1, "pip install exited 1"), (0, "it has no vllm-router command")],
)
def test_a_router_pip_cannot_install_leaves_no_venv_behind(peers_dir, monkeypatch, tmp_path,
                                                          pip_exit, failed):  # fmt: skip
    # A venv whose pip fails, as with no PyPI or no wheel for the machine; or "succeeds"
    # and installs no command.
    python = tmp_path / "python"
    python.write_text(
        '#!/bin/sh\nmkdir -p "$3/bin"\n'
        f"printf '#!/bin/sh\\necho no matching distribution >&2\\nexit {pip_exit}\\n' > \"$3/bin/pip\"\n"
        'chmod +x "$3/bin/pip"\n'
    )
    python.chmod(0o755)
    monkeypatch.setattr(peers, "_venv_python", lambda: str(python))
    binary, why = router_binary(VLLM_ROUTER)
    log = peers_dir / "vllm-router-0.1.17.install.log"
    assert binary is None
    assert why == f"vllm-router==0.1.17 could not be installed from PyPI ({failed}); see {log}"
    assert not router_venv(VLLM_ROUTER).exists()
    if pip_exit:
        assert "no matching distribution" in log.read_text()
