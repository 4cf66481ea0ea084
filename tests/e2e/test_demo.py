"""`llmgw demo` as a new user runs it, and the README's operating commands against it
(issue 14, item 4; issue 37, item 3): each command in README.md's ``Operating it`` blocks,
as written, from the clone's root (docs/examples/model.yaml included)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from llmgw.cli.demo import REAL_ALIAS, REAL_MODEL, REAL_NODE

from .harness import REPO, free_port, wait_for
from .real_engines import in_ci, llama_server


def readme_commands() -> list[str]:
    """The `llmgw ctl …` lines of README.md's code blocks from ``## Operating it`` to the
    next section, without their comments or the variables set before them."""
    text = (REPO / "README.md").read_text()
    part = text.split("## Operating it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", part, flags=re.S)
    lines = [ln.split("  #", 1)[0].strip() for b in blocks for ln in b.splitlines()]
    # `LLMGW_API_KEY=… llmgw ctl bench`: the test's environment gives the key.
    lines = [re.sub(r"^([A-Z_]+=\S+\s+)+", "", ln) for ln in lines]
    return [ln for ln in lines if ln.startswith("llmgw ctl ")]


def test_the_readmes_operating_commands_work_against_the_demo(tmp_path):
    commands = readme_commands()
    assert len(commands) >= 20, commands
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PYTHONUNBUFFERED="1", LLMGW_SETTLE_SECONDS="1")
    log = open(tmp_path / "demo.log", "wb")  # noqa: SIM115 - the demo writes it for its life
    demo = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "demo", "--port", str(port), "--home", str(tmp_path / "d")],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        said = wait_for(
            "the demo to say it is running",
            lambda: "Ctrl-C stops" in (t := (tmp_path / "demo.log").read_text()) and t,
            timeout=120,
        )
        token = re.search(r"LLMGW_TOKEN=(llmgw_adm_\S+)", said)[1]
        key = re.search(r"API key (llmgw_key_\S+)", said)[1]
        ctl_env = {**env, "LLMGW_SERVER": f"http://127.0.0.1:{port}", "LLMGW_TOKEN": token}
        ctl_env["LLMGW_API_KEY"] = key
        assert "a control plane and three simulated nodes" in said
        assert f"Its state is new, in {tmp_path / 'd'}." in said
        assert f"added to the mirror from {tmp_path / 'd' / 'weights'}" in said

        def ctl(line: str) -> subprocess.CompletedProcess:
            argv = shlex.split(line)[1:]
            return subprocess.run(
                [sys.executable, "-m", "llmgw", *argv],
                env=ctl_env,
                cwd=REPO,  # as the README's lines are run: docs/examples/model.yaml
                capture_output=True,
                text=True,
                timeout=120,
            )

        # The demo's replicas are ready before a model is scaled, drained or measured.
        wait_for(
            "chat-70b's two replicas",
            lambda: ctl("llmgw ctl models").stdout.count("2/2") >= 1,
            timeout=120,
        )
        for line in commands:
            if "bench" in line:  # measured for a few seconds, at one level, not the defaults'
                line += " --levels 1 --seconds 2"
            done = ctl(line)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr, done.stderr
            if "model add --file" in line:
                assert done.stdout.strip() == "model notes-1b added"
        # llmgw doctor on a node of the demo, against the real server: its credential
        # accepted (the mirror's own answer), the clock in time, its folder fit.
        doctor = subprocess.run(
            [sys.executable, "-m", "llmgw", "doctor", "--json",
             "--server", f"http://127.0.0.1:{port}",
             "--state-dir", str(tmp_path / "d" / "agents" / "cpu-1")],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        found = {f["check"]: f for f in json.loads(doctor.stdout)}
        for check in ("server", "tls", "clock", "credential", "nvml", "state folder"):
            assert found[check]["status"] == "ok", found[check]
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
        log.close()
    said = Path(tmp_path / "demo.log").read_text()
    assert "stopping the demo" in said
    # Every alias the README uses was found without a 404 in the server's log.
    served = (tmp_path / "d" / "logs" / "serve.log").read_text()
    assert "Not Found: /api/v1/models/" not in served


def _start_demo(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen, dict, int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PYTHONUNBUFFERED="1", LLMGW_SETTLE_SECONDS="1")
    log = open(tmp_path / "demo.log", "wb")  # noqa: SIM115 - the demo writes it for its life
    demo = subprocess.Popen(
        [sys.executable, "-m", "llmgw", "demo", "--port", str(port),
         "--home", str(tmp_path / "d"), *argv],
        env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return demo, env, port


def _stop_demo(demo: subprocess.Popen) -> None:
    os.killpg(demo.pid, signal.SIGTERM)
    try:
        demo.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(demo.pid, signal.SIGKILL)


def test_the_real_demo_answers_what_the_capital_of_france_is_on_its_real_node(tmp_path):
    """`make demo-real` as the README says it answers (issue 36, item 1): SmolLM2 with its
    chat template, on this machine's own node, through the gateway."""
    _, why = llama_server()
    if why:
        if in_ci():
            pytest.fail(f"CI must run the real demo, and cannot: {why}.")
        pytest.skip(why)
    demo, _, port = _start_demo(tmp_path, "--real")
    try:
        said = wait_for(
            "the real demo to say it is running",
            lambda: "A real model:" in (t := (tmp_path / "demo.log").read_text()) and t,
            timeout=300,
        )
        assert f"{REAL_MODEL} is served from weights" in said, said
        assert "four nodes: three simulated" in said
        key = re.search(r"API key (llmgw_key_\S+)", said)[1]
        token = re.search(r"LLMGW_TOKEN=(llmgw_adm_\S+)", said)[1]
        base = f"http://127.0.0.1:{port}"

        def ask(question: str, system: bool = True) -> str | None:
            # As the README asks it (a 135M model answers best told what it is), and as a
            # new user types it, with no system message (the demo's ChatML template).
            told = [{"role": "system", "content": "You are a helpful assistant."}] if system else []
            answer = httpx.post(
                f"{base}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": REAL_ALIAS,
                    "messages": [*told, {"role": "user", "content": question}],
                    "max_tokens": 32,
                    "temperature": 0,
                },
                timeout=120,
            )
            if answer.status_code == 503:  # its replica is still being installed or started
                return None
            answer.raise_for_status()
            return answer.json()["choices"][0]["message"]["content"]

        try:
            paris = wait_for(
                "SmolLM2 to answer", lambda: ask("What is the capital of France?"), 240
            )
        except AssertionError:
            why = httpx.get(
                f"{base}/api/v1/models/{REAL_MODEL}/explain",
                headers={"Authorization": f"Bearer {token}"},
            ).json()
            raise AssertionError(f"SmolLM2 did not answer: {why}") from None
        assert "Paris" in paris, paris
        assert "<|im_" not in paris and "<|" not in paris, paris
        untold = ask("What is the capital of France?", system=False)
        assert "Paris" in untold and "<|" not in untold, untold
        hello = ask("Say hello.")
        assert hello.split()[0].strip("!,.").lower() in ("hello", "hi"), hello
        assert "<|" not in hello and "Say hello" not in hello, hello
        replicas = httpx.get(
            f"{base}/api/v1/replicas",
            params={"model": REAL_MODEL},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        nodes = [s["node"] for r in replicas if r["state"] == "ready" for s in r["shards"]]
        assert nodes == [REAL_NODE], replicas
    finally:
        _stop_demo(demo)


def test_a_second_run_says_it_reuses_the_first_runs_state(tmp_path):
    def banner() -> str:
        demo, _, _ = _start_demo(tmp_path)
        try:
            return wait_for(
                "the demo to say it is running",
                lambda: "Ctrl-C stops" in (t := (tmp_path / "demo.log").read_text()) and t,
                timeout=120,
            )
        finally:
            _stop_demo(demo)

    first = banner()
    assert f"Its state is new, in {tmp_path / 'd'}." in first
    (tmp_path / "demo.log").unlink()
    second = banner()
    assert f"It reuses the state an earlier run left in {tmp_path / 'd'}" in second
    password = re.search(r"login admin / (\S+)", first)[1]
    assert f"login admin / {password}" in second, "the same password, as it says"
