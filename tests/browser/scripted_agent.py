"""An agent whose GPU readings are scripted: it registers over the real websocket with the
agent token, as `llmgw agent` does, and heartbeats every second with GPU 0's utilisation,
temperature, power and memory stepping through SCRIPT, and nothing from GPU 1 (a card
whose driver says nothing), so a chart's line and its "no data" are both known. It also
says it holds llama.cpp, installed from the mirror, and a file in its weight cache."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

from websockets.asyncio.client import connect

NODE = "gpu-scripted"
# GPU 0's utilisation, beat by beat, over and over.
SCRIPT = (20.0, 40.0, 60.0, 80.0)
MEMORY_MB = 81559
# What its weight cache holds: a file of 241.4 MiB, which the mirror calls 253 MB.
CACHED = {
    "sha256": "ab" * 32,
    "source": "/srv/llmgw/var/demo/weights/gemma-3-270m-it-Q4_K_M.gguf",
    "size": 253_134_592,
}
# llama.cpp, installed from the mirror: the node reports it as one of its engines too.
LLAMACPP = "b6000"


class ScriptedAgent:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.replace("http://", "ws://") + "/ws/agent/"
        self.token = token
        self.beats = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._run(), self._loop)

    def stop(self) -> None:
        """Close the connection as an agent that stops does, then end the thread."""

        async def ended() -> None:
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        asyncio.run_coroutine_threadsafe(ended(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def _register(self) -> dict:
        return {
            "type": "register",
            "node_id": NODE,
            "hostname": NODE,
            "mgmt_addr": "127.0.0.1",
            "memory_total_mb": 65536,
            "cpu_count": 16,
            "gpus": [
                {"index": i, "uuid": f"GPU-scripted-{i}", "name": "NVIDIA H100 80GB HBM3",
                 "memory_total_mb": MEMORY_MB}
                for i in range(2)
            ],
            "engines": {"sim": "scripted", "llamacpp": LLAMACPP},
            "engines_probed": True,
            "platform": "linux-x86_64",
            "engine_installs": [{"engine": "llamacpp", "version": LLAMACPP, "state": "installed"}],
            "weights": [CACHED],
        }  # fmt: skip

    def _heartbeat(self, seq: int) -> dict:
        util = SCRIPT[seq % len(SCRIPT)]
        gpu0 = {
            "index": 0,
            "utilization": util,
            "temp_c": 50 + util / 4,
            "power_w": 100 + util * 5,
            "power_limit_w": 700,
            "memory_used_mb": int(MEMORY_MB * util / 100),
        }
        return {
            "type": "heartbeat",
            "seq": seq,
            "load": {
                "cpu_percent": util / 2,
                "memory_used_bytes": 16 << 30,
                "gpus": [gpu0, {"index": 1}],
            },
        }

    async def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        token = None
        while True:
            try:
                async with connect(self.url, additional_headers=headers) as ws:
                    await ws.send(json.dumps(self._register()))
                    answer = json.loads(await ws.recv())
                    token = answer.get("node_token") or token
                    if token:
                        headers = {"Authorization": f"Bearer {token}"}
                    while True:
                        await ws.send(json.dumps(self._heartbeat(self.beats)))
                        self.beats += 1
                        await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)
