"""`llmgw agent` takes its join token from the environment or a file, never needing it on
its command line, where every user of the machine can read it (ps, /proc/PID/cmdline)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleet.agent.main import main

from .test_client import TOKEN, FakeControlPlane


def _agent(tmp_path, flags: list[str], env: dict[str, str]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_TOKEN")}
    return subprocess.Popen(
        [sys.executable, "-m", "llmgw", "agent", *flags, "--state-dir", str(tmp_path / "state"),
         "--node-id", "n1", "--simulate-gpus", "1xh100-80g", "--memory-gb", "8", "--cpus", "2"],
        env={**base, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["--token-file", "LLMGW_TOKEN_FILE"])
async def test_the_agent_joins_with_a_token_read_from_a_file(tmp_path, how):
    secret = tmp_path / "join-token"
    secret.write_text(f"{TOKEN}\n")
    cp = FakeControlPlane(token=TOKEN)
    await cp.start()
    server = ["--server", f"http://127.0.0.1:{cp.port}"]
    if how == "--token-file":
        agent = _agent(tmp_path, [*server, "--token-file", str(secret)], {})
    else:
        agent = _agent(tmp_path, server, {"LLMGW_TOKEN_FILE": str(secret)})
    try:
        await cp.until("register")
        assert cp.refused == 0
        with open(f"/proc/{agent.pid}/cmdline", "rb") as f:
            assert TOKEN.encode() not in f.read()
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        await cp.close()


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_token_file_that_is_missing_or_empty_stops_the_agent_naming_it(
    tmp_path, capsys, monkeypatch, content
):
    monkeypatch.delenv("LLMGW_TOKEN", raising=False)
    path = tmp_path / "join-token"
    if content is not None:
        path.write_text(content)

    code = main(["--token-file", str(path), "--state-dir", str(tmp_path / "state")])

    assert code == 2
    assert str(path) in capsys.readouterr().err
