"""A waitable list: what daphne puts for an application, and what the embedded channel layer
keeps for a channel, each held for as long as an agent's socket is open."""

from __future__ import annotations

import asyncio
from typing import Any


class Inbox:
    """Items put and taken in order, the first receiver waiting served first: the part of
    asyncio.Queue that daphne and the channel layer use (`put_nowait`, `get`), in a
    few hundred bytes where the Queue is 3.3 KB (four deques and an Event). As in the
    Queue, an item stays in the inbox until a receiver takes it: a receive cancelled as it
    was woken loses nothing, the next receiver is woken instead. And as the Queue it has no
    length: daphne asks `if self.application_queue:` before it tells an application its
    caller hung up, and an empty inbox must still be told (count `items`)."""

    __slots__ = ("items", "_waiters")

    def __init__(self) -> None:
        self.items: list = []
        self._waiters: list[asyncio.Future] = []

    @property
    def waited_on(self) -> bool:
        return bool(self._waiters)

    def put_nowait(self, item: Any) -> None:
        self.items.append(item)
        self._wake()

    async def get(self) -> Any:
        while not self.items:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif self.items:
                    self._wake()  # woken, but leaving: the next receiver takes it
                raise
        return self.items.pop(0)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
