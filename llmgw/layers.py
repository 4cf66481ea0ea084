"""The channel layer of embedded mode: Channels' in-memory one, an Inbox a channel, cleaned
at most once a second."""

from __future__ import annotations

import time
from copy import deepcopy

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

from llmgw.core.inbox import Inbox


class PacedInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' in-memory layer, with an Inbox of (expiry, message) for each channel where
    Channels keeps an asyncio.Queue (3.3 KB for every agent's connection, each always
    waiting on its own channel), and looking for expired messages and memberships at most
    once every CLEAN_EVERY_S rather than on every receive and group send.

    Channels' own walks every channel and every group membership each time: with thousands
    of agents connected, each new connection and each registration paid for the whole fleet
    (44 % of the serving loop while 3,700 agents reconnected, benchmarks/fleet.py). A
    message expires after a minute and a membership after ten years here (settings.py): a
    second later is as expired.
    """

    CLEAN_EVERY_S = 1.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cleaned_at = float("-inf")

    def _inbox(self, channel: str) -> Inbox:
        inbox = self.channels.get(channel)
        if inbox is None:
            inbox = self.channels[channel] = Inbox()
        return inbox

    async def send(self, channel, message):
        """Put a message on a channel; ChannelFull when it holds its capacity already."""
        assert isinstance(message, dict), "message is not a dict"
        self.require_valid_channel_name(channel)
        assert "__asgi_channel__" not in message
        inbox = self._inbox(channel)
        if len(inbox.items) >= self.get_capacity(channel):
            raise ChannelFull(channel)
        inbox.put_nowait((time.time() + self.expiry, deepcopy(message)))

    async def receive(self, channel):
        """The first message on the channel, waiting for one; of receivers waiting on one
        channel, the first to wait gets it."""
        self.require_valid_channel_name(channel)
        self._clean_expired()
        inbox = self._inbox(channel)
        try:
            return (await inbox.get())[1]
        finally:
            if not inbox.items and not inbox.waited_on and self.channels.get(channel) is inbox:
                del self.channels[channel]

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at < self.CLEAN_EVERY_S:
            return
        self._cleaned_at = now
        self._walk_expired()

    def _walk_expired(self) -> None:
        """Channels' own walk, over inboxes: expired messages dropped and their channels
        taken out of every group (their receiver is gone), memberships past expiry ended."""
        wall = time.time()
        for channel, inbox in list(self.channels.items()):
            if inbox.items and inbox.items[0][0] < wall:
                inbox.items[:] = [item for item in inbox.items if item[0] >= wall]
                self._remove_from_groups(channel)
                if not inbox.items and not inbox.waited_on:
                    del self.channels[channel]
        timeout = int(wall) - self.group_expiry
        for members in self.groups.values():
            for name, joined in list(members.items()):
                if joined and joined < timeout:
                    del members[name]
