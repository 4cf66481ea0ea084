"""The agent's own credential: kept when issued, used from then on, forgotten when refused."""

import asyncio
import json
import stat
from http import HTTPStatus

import pytest

from fleet.agent.credentials import Credentials

from .helpers import PATIENCE_S
from .test_client import TOKEN, FakeControlPlane, make_agent


class IssuingControlPlane(FakeControlPlane):
    """Lets in the join token and the credentials it issued, and issues one at the first
    register made with the join token, as the real control plane does."""

    def __init__(self):
        super().__init__(token=TOKEN)
        self.valid = {TOKEN}
        self.bearers: list[str] = []
        self.issued = 0

    def _check_token(self, connection, request):
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.bearers.append(bearer)
        if bearer not in self.valid:
            self.refused += 1
            return connection.respond(HTTPStatus.FORBIDDEN, "no\n")
        return None

    async def _serve(self, ws):
        self.connections.append(ws)
        n = len(self.connections) - 1
        bearer = self.bearers[-1]
        async for raw in ws:
            msg = json.loads(raw)
            self.messages.append((n, msg))
            if msg["type"] == "register":
                reply = {"type": "registered", "node_id": msg["node_id"]}
                if bearer == TOKEN:
                    self.issued += 1
                    reply["node_token"] = f"llmgw_node_{self.issued}"
                    self.valid.add(reply["node_token"])
                await ws.send(json.dumps(reply))

    async def drop_all(self):
        for ws in self.connections:
            await ws.close()


async def until(check):
    async with asyncio.timeout(PATIENCE_S):
        while not check():
            await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_the_agent_keeps_its_credential_uses_it_and_joins_again_when_it_is_refused(
    tmp_path,
):
    cp = IssuingControlPlane()
    await cp.start()
    agent = make_agent(tmp_path, cp.url)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    kept = tmp_path / "node-token"
    try:
        await until(lambda: kept.exists())
        assert kept.read_text().strip() == "llmgw_node_1"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600

        # Reconnecting, it sends its own credential, not the join token.
        await cp.drop_all()
        await until(lambda: len(cp.of("register")) >= 2)
        assert cp.bearers[-1] == "llmgw_node_1"

        # Forgotten: its credential is refused, so it joins again with the join token.
        cp.valid.discard("llmgw_node_1")
        await cp.drop_all()
        await until(lambda: cp.issued == 2)
        assert cp.bearers[-2:] == ["llmgw_node_1", TOKEN]
        await until(lambda: kept.exists() and kept.read_text().strip() == "llmgw_node_2")
    finally:
        stop.set()
        await running
        await cp.close()


def test_a_credential_file_is_read_back_and_a_broken_one_is_ignored(tmp_path):
    first = Credentials(tmp_path, "join")
    assert (first(), first.joined) == ("join", False)
    first.keep("llmgw_node_abc")

    again = Credentials(tmp_path, None)
    assert (again(), again.joined) == ("llmgw_node_abc", True)
    # Refused with no join token to fall back on, it keeps what it has and says so.
    assert again.refused() is False and again() == "llmgw_node_abc"

    (tmp_path / "node-token").write_text("\x00garbage\n")
    assert Credentials(tmp_path, "join")() == "join"
