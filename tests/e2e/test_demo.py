"""`llmgw demo` as a new user runs it, and the README's operating commands against it
(issue 14, item 4): each command in README.md's ``Operating it`` blocks, as written."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from .harness import REPO, free_port, wait_for

# A runtime model for `ctl model add --file model.yaml`.
MODEL_YAML = """\
name: notes-1b
source: org/notes-1b
scaling: {min: 1}
profiles:
  - {name: cpu, engine: sim, min_memory_gb: 2, cpu_cores: 1}
"""


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
        (tmp_path / "model.yaml").write_text(MODEL_YAML)

        def ctl(line: str) -> subprocess.CompletedProcess:
            argv = shlex.split(line)[1:]
            return subprocess.run(
                [sys.executable, "-m", "llmgw", *argv],
                env=ctl_env,
                cwd=tmp_path,
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
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        try:
            demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
        log.close()
    assert "stopping the demo" in Path(tmp_path / "demo.log").read_text()
