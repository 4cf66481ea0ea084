"""A TCP balancer on loopback for end-to-end tests: round robin over backends, skipping one
that refuses, websockets included (they are TCP too); and, cut, an outage of whatever it
fronts (a database) that the test can end."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from .harness import free_port


class Balancer:
    """Round-robin TCP on loopback, skipping a backend that refuses: what a load balancer in
    front of several `llmgw serve` does, websockets included (they are TCP too)."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = free_port()
        self.turn = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def _client(self, reader, writer) -> None:
        upstream = None
        for i in range(len(self.backends)):
            port = self.backends[(self.turn + i) % len(self.backends)]
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection("127.0.0.1", port)
                break
        self.turn += 1
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def cut(self) -> None:
        """An outage: stop listening and drop every connection through it."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)

    def restore(self) -> None:
        """The outage ends: listen again on the same port."""
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)


async def _pipe(reader, writer) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
