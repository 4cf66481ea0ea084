"""Engine ports: the one the control plane asked for when this machine can give it, else
a free one in the agent's range."""

from __future__ import annotations

import errno
import random
import socket


def can_bind(port: int) -> bool:
    """Whether a listener on ``port`` (all addresses) could start now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the engines do, so a port with only TIME_WAIT connections left
        # counts as free while one with a listener (on any address) does not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def choose_port(requested: int | None, port_range: tuple[int, int], taken: set[int]) -> int:
    """``requested`` when it is in ``port_range`` and can be bound now, else a free port there.

    Several agents may share a machine (simulated nodes), so the control
    plane's choice is checked by binding. The scan starts at a random place
    so agents on one machine rarely race for the same port. Raises OSError
    when the range is full.
    """
    low, high = port_range
    # Only inside the range: agents sharing a machine are given disjoint ranges,
    # and the control plane's choice does not know about the other agents here.
    if requested and low <= requested <= high and requested not in taken and can_bind(requested):
        return requested
    size = high - low + 1
    start = random.randrange(size)
    for i in range(size):
        port = low + (start + i) % size
        if port not in taken and can_bind(port):
            return port
    raise OSError(errno.EADDRINUSE, f"no free port in {low}-{high}")


def host_for_url(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
