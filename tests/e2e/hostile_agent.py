"""A hostile node, as a process: what issue 35's report did with nothing but the join token.

It joins as a new node with the join token (LLMGW_TOKEN), keeps the credential it is given,
connects again with it, and registers claiming whatever shards `--claims` (a JSON file)
lists, with `--addr` as its address; then sends the frames `--then` lists (shard_status
for others' shards), and asks the mirror for `--fetch` (a file's sha256) with its own
credential. Meanwhile it serves HTTP on `--listen`, where its claimed endpoints point,
counting every request that reaches it (the tenants' prompts a forged replica would get).

What it saw goes to `--out` as JSON, rewritten as it learns more. It heartbeats from its
register until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

ANSWER_S = 2.0


class Seen:
    """What the hostile node saw, written out whole after each change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = {"answers": [], "requests": 0, "fetch": None, "registered": False}

    def note(self, **changes) -> None:
        self.data.update(changes)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)


async def _listen(port: int, seen: Seen) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        seen.note(requests=seen.data["requests"] + 1)
        body = b'{"forged": true}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    await asyncio.start_server(answer, "127.0.0.1", port)


async def _join(ws_url: str, join_token: str, node_id: str, addr: str) -> str:
    """Its own credential, from a first register with the join token."""
    headers = {"Authorization": f"Bearer {join_token}"}
    async with connect(ws_url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "register", "node_id": node_id, "mgmt_addr": addr}))
        return json.loads(await ws.recv())["node_token"]


async def _answers(ws, seen: Seen) -> None:
    while True:
        frame = json.loads(await ws.recv())
        seen.note(answers=[*seen.data["answers"], frame])


async def main(args: argparse.Namespace) -> None:
    seen = Seen(args.out)
    await _listen(args.listen, seen)
    ws_url = args.server.replace("http://", "ws://") + "/ws/agent/"
    token = await _join(ws_url, os.environ["LLMGW_TOKEN"], args.node_id, args.addr)
    claims = json.loads(args.claims.read_text()) if args.claims else []
    then = json.loads(args.then.read_text()) if args.then else []
    headers = {"Authorization": f"Bearer {token}"}
    async with connect(ws_url, additional_headers=headers) as ws:
        register = {
            "type": "register",
            "node_id": args.node_id,
            "mgmt_addr": args.addr,
            "memory_total_mb": 64 * 1024,
            "cpu_count": 16,
            "shards": claims,
        }
        await ws.send(json.dumps(register))
        loop = asyncio.get_running_loop()
        listening = loop.create_task(_answers(ws, seen))
        # Heard from all along, as an agent is: never taken as silent meanwhile.
        beating = loop.create_task(_heartbeats(ws))
        await asyncio.sleep(ANSWER_S)
        for frame in then:
            await ws.send(json.dumps(frame))
        if args.fetch:
            async with httpx.AsyncClient(base_url=args.server, headers=headers) as http:
                r = await http.get(f"/api/v1/mirror/files/{args.fetch}")
                seen.note(fetch={"status": r.status_code, "detail": r.json().get("detail")})
        seen.note(registered=True)
        await asyncio.wait([listening, beating], return_when=asyncio.FIRST_COMPLETED)


async def _heartbeats(ws) -> None:
    seq = 0
    while True:
        seq += 1
        await ws.send(json.dumps({"type": "heartbeat", "seq": seq}))
        await asyncio.sleep(0.5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--claims", type=Path)
    parser.add_argument("--then", type=Path)
    parser.add_argument("--fetch")
    parser.add_argument("--out", type=Path, required=True)
    asyncio.run(main(parser.parse_args()))
