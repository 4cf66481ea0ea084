"""The channel layer of embedded mode: Channels' in-memory one, cleaned at most once a second."""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer


class PacedInMemoryChannelLayer(InMemoryChannelLayer):
    """Channels' in-memory layer, looking for expired messages and memberships at most once
    every CLEAN_EVERY_S rather than on every receive and group send.

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

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at < self.CLEAN_EVERY_S:
            return
        self._cleaned_at = now
        super()._clean_expired()
