"""An outage said twice, not once per attempt: when the first attempt fails, and when one
succeeds again, with how long it lasted and how many attempts failed meanwhile."""

from __future__ import annotations

import logging
import time

from .errors import cause


class Outage:
    """What a loop retrying something (a database, Redis) tells the log about it."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self.log = log
        self.since: float | None = None
        self.failures = 0

    def failed(self, exc: BaseException) -> None:
        """An attempt failed: logged with its traceback if it is the first since it worked."""
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.log.error(
                "%s failed: %s; retrying, and saying so again only once it works",
                self.what,
                cause(exc),
                exc_info=exc,
            )

    def worked(self) -> None:
        """An attempt worked: said if it ends an outage."""
        if self.since is None:
            return
        self.log.warning(
            "%s works again after %.0f s; %d attempts failed meanwhile",
            self.what,
            time.monotonic() - self.since,
            self.failures,
        )
        self.since, self.failures = None, 0
