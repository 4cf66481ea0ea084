"""A rolling upgrade with real agent processes, from one built wheel of llmgw to another
(its version bumped here): engines keep running with the same pids and are adopted by the
new agent, and the roll stops at a node whose upgrade fails (issue 14, item 2): pip
failing, or a release that installs but does not start, tried beside the running one
first (issue 35, item 4)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from tests.mirror.wheels import wheel

from .conftest import MODES
from .harness import REPO, SMALL, Cluster, listener_pid, staff_cookie, wait_for

CURRENT = "0.11.0.dev0"
# What makes a release that installs but does not start: a module it needs that no node has.
NEEDS = "\nimport llmgw_missing_dependency  # noqa: F401\n"


def _source_copy(dest: Path, version: str) -> Path:
    """The repository's files (tracked and new, as git lists them), `version` written in."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    for name in listed:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    for name in ("pyproject.toml", "llmgw/__init__.py"):
        path = dest / name
        path.write_text(path.read_text().replace(CURRENT, version))
    return dest


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
         "-w", str(out), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = out.glob("llmgw-*.whl")
    return wheel


# What pip says on a full disk: an environment whose pip fails the way a real one does.
NO_SPACE = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"


def _agent_env(folder: Path, wheel: Path, *, pip_works: bool) -> Path:
    """A Python environment of the agent's own with `wheel` installed; its dependencies
    are found in this test's environment (a .pth line), so nothing is fetched. Where pip
    does not work, it answers as on a full disk."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120
    )
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "llmgw-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", site, str(wheel)],
        check=True, timeout=120,
    )  # fmt: skip
    if not pip_works:
        broken = Path(site, "pip")
        broken.mkdir()
        (broken / "__init__.py").write_text("")
        (broken / "__main__.py").write_text(f"import sys\nprint({NO_SPACE!r})\nsys.exit(1)\n")
    return python


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Three wheels: the release the control plane runs, the next one, and one that does
    not start (its llmgw imports a module no node has)."""
    root = tmp_path_factory.mktemp("releases")
    built = {}
    for version in (CURRENT, f"{CURRENT}+next", f"{CURRENT}+broken"):
        src = _source_copy(root / f"src-{version}", version)
        if version.endswith("+broken"):
            with open(src / "llmgw" / "__init__.py", "a") as init:
                init.write(NEEDS)
        built[version] = _wheel(src, root / f"wheel-{version}")
    return built


@pytest.mark.parametrize("mode", MODES)
def test_a_rolling_upgrade_keeps_engines_and_stops_at_a_node_that_fails(tmp_path, releases, mode):
    current, nxt, broken = list(releases)
    cluster = Cluster(tmp_path / "cluster", production=mode == "production")
    agents: dict[str, subprocess.Popen] = {}
    try:
        cluster.start_server()
        environments = {
            "n1": _agent_env(tmp_path / "env-n1", releases[current], pip_works=False),
            "n2": _agent_env(tmp_path / "env-n2", releases[current], pip_works=True),
        }
        for i, (node, python) in enumerate(environments.items()):
            log = open(tmp_path / f"agent-{node}.log", "ab")  # noqa: SIM115 - the agent's for its life
            agents[node] = subprocess.Popen(
                [str(python), "-m", "llmgw", "agent", "--server", cluster.url, "--node-id", node,
                 "--state-dir", str(tmp_path / node), "--heartbeat-interval", "0.5",
                 "--memory-gb", "4", "--cpus", "1", "--port-range", f"{32400 + 100 * i}-{32499 + 100 * i}"],
                env={**cluster.env, "LLMGW_TOKEN": cluster.agent_token},
                cwd=tmp_path,  # not the repository: the agent runs the wheel it was given
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_for(
            "both nodes on the current release",
            lambda: sorted(n["agent_version"] for n in cluster.get("/nodes")) == [current] * 2,
        )
        cluster.post("/models", {**SMALL, "scaling": {"min": 2}})
        replicas = wait_for(
            "a ready replica on each node",
            lambda: r if len(r := cluster.ready_replicas("small")) == 2 else None,
            timeout=90,
        )
        engines = {r["id"]: listener_pid(int(r["endpoint"].rsplit(":", 1)[1])) for r in replicas}
        assert all(engines.values())

        def ctl(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "llmgw", "ctl", "--server", cluster.url,
                 "--token", cluster.admin_token, *argv],
                cwd=REPO, capture_output=True, text=True, timeout=300,
            )  # fmt: skip

        # The next release goes into the mirror; the control plane's own is built on asking.
        added = ctl(
            "engines", "add", "--engine", "llmgw", "--version", nxt, "--file", str(releases[nxt])
        )
        assert added.returncode == 0, added.stderr
        own = ctl("upgrade", "--nodes", "n2")
        assert own.returncode == 0, own.stderr
        assert f"0 node(s) upgraded to {current}, 1 already on it" in own.stdout

        # n1 cannot install (its disk is full): the roll stops there, n2 untried.
        stopped = ctl("upgrade", nxt, "--nodes", "n1,n2", "--wait", "60")
        assert stopped.returncode == 1, stopped.stdout + stopped.stderr
        assert (
            f"the roll stopped at n1: node n1 could not upgrade to llmgw {nxt}: installing"
            in stopped.stderr
        )
        assert NO_SPACE in stopped.stderr
        versions = {n["id"]: n["agent_version"] for n in cluster.get("/nodes")}
        assert versions == {"n1": current, "n2": current}
        assert agents["n1"].poll() is None  # it goes on as it was

        # A wheel without the llmgw package is no release: refused, nothing kept.
        empty = wheel(tmp_path / "empty", "9.9.9", files={"evil/__init__.py": ""})
        refused = ctl(
            "engines", "add", "--engine", "llmgw", "--version", "9.9.9", "--file", str(empty)
        )
        assert refused.returncode != 0
        assert "does not hold the llmgw package" in refused.stderr
        assert "9.9.9" not in ctl("engines", "list").stdout

        # One that installs but does not start: n2 tries it beside its own release, says
        # why, and goes on running that one, the same process.
        added = ctl(
            "engines",
            "add",
            "--engine",
            "llmgw",
            "--version",
            broken,
            "--file",
            str(releases[broken]),
        )
        assert added.returncode == 0, added.stderr
        tried = ctl("upgrade", broken, "--nodes", "n2", "--wait", "60")
        assert tried.returncode == 1, tried.stdout + tried.stderr
        assert (
            f"the roll stopped at n2: node n2 could not upgrade to llmgw {broken}: llmgw {broken} "
            "does not start, tried beside this one: `llmgw version` with it exited with code 1"
        ) in tried.stderr
        assert "No module named 'llmgw_missing_dependency'" in tried.stderr
        assert "nothing was switched and this agent goes on running its release" in tried.stderr
        assert agents["n2"].poll() is None
        assert cluster.get("/nodes/n2")["agent_version"] == current
        page = httpx.get(
            f"{cluster.url}/nodes/n2", cookies={"sessionid": staff_cookie(cluster)}, timeout=10
        )
        assert "No module named &#x27;llmgw_missing_dependency&#x27;" in page.text

        # n2 upgrades: the same agent process (re-executed), the same engine, still ready.
        rolled = ctl("upgrade", nxt, "--nodes", "n2")
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        assert f"n2: on {nxt}, ready, its engines kept running" in rolled.stdout
        assert f"1 node(s) upgraded to {nxt}, 0 already on it" in rolled.stdout
        assert f"sudo llmgw upgrade {nxt} --service UNIT" in rolled.stdout
        assert agents["n2"].poll() is None
        node = cluster.get("/nodes/n2")
        assert (node["agent_version"], node["state"]) == (nxt, "ready")
        after = {r["id"]: r for r in cluster.ready_replicas("small")}
        assert set(after) == set(engines)
        for replica_id, pid in engines.items():
            assert listener_pid(int(after[replica_id]["endpoint"].rsplit(":", 1)[1])) == pid
        log = (tmp_path / "agent-n2.log").read_text()
        assert "restarting into it, engines left running" in log
        assert "adopted 1 engines from an earlier run" in log
        events = cluster.get("/events", node="n2")["events"]
        assert any(e["kind"] == "upgrade" and "restarting into" in e["message"] for e in events)
    finally:
        for proc in agents.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
        cluster.close()


def test_llmgw_upgrade_installs_by_hand_and_restarts_the_service(tmp_path, releases):
    current, nxt, _ = list(releases)
    python = _agent_env(tmp_path / "env", releases[current], pip_works=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    # systemctl as a host has it: restart, then active.
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = is-active ] && echo active\nexit 0\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def upgrade(*argv: str, root: bool = True) -> subprocess.CompletedProcess:
        # As root, as `sudo llmgw upgrade` runs, or as a user (whoever runs the tests): the
        # only thing not real is the euid it reads.
        euid = 0 if root else 1000
        run = (
            f"import os, sys; os.geteuid = lambda: {euid}; "
            "from llmgw.cli import main; sys.exit(main(sys.argv[1:]))"
        )
        return subprocess.run(
            [str(python), "-c", run, "upgrade", *argv],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    refused = upgrade(nxt, "--wheel", str(releases[nxt]), root=False)
    assert refused.returncode == 1 and "run it with sudo" in refused.stderr
    wrong = upgrade(nxt, "--wheel", str(releases[nxt]), "--sha256", "0" * 64)
    assert wrong.returncode == 1
    assert "has sha256" in wrong.stderr and "nothing was installed" in wrong.stderr
    done = upgrade(nxt, "--wheel", str(releases[nxt]), "--service", "llmgw-mirror")
    assert done.returncode == 0, done.stderr
    assert f"llmgw {current} -> {nxt}: installed into {tmp_path / 'env'}" in done.stdout
    assert f"llmgw {current} is kept in {tmp_path / 'env' / 'llmgw-previous'}" in done.stdout
    assert "llmgw-mirror restarted and running" in done.stdout
    assert calls.read_text().splitlines()[:2] == ["restart llmgw-mirror", "is-active llmgw-mirror"]
    version = subprocess.run(
        [str(python), "-m", "llmgw", "version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert nxt in version.stdout
    again = upgrade(nxt, "--wheel", str(releases[nxt]))
    assert (again.returncode, again.stdout.strip()) == (0, f"this machine already runs llmgw {nxt}")

    # And back, restarted and watched as for an upgrade; the release it replaced kept in turn.
    back = upgrade("--rollback", "--service", "llmgw-mirror")
    assert back.returncode == 0, back.stderr
    assert f"llmgw {nxt} -> {current}: rolled back" in back.stdout
    assert "llmgw-mirror restarted and running" in back.stdout
    assert calls.read_text().splitlines().count("restart llmgw-mirror") == 2
    version = subprocess.run(
        [str(python), "-m", "llmgw", "version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert version.stdout.strip() == current
    kept = list((tmp_path / "env" / "llmgw-previous").glob("*.whl"))
    assert [k.name for k in kept] == [f"llmgw-{nxt}-py3-none-any.whl"]
    forth = upgrade("--rollback")
    assert forth.returncode == 0, forth.stderr
    assert f"llmgw {current} -> {nxt}: rolled back" in forth.stdout
