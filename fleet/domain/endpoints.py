"""Whether an endpoint a node reports is its own: on the address it registered with."""

from __future__ import annotations

from urllib.parse import urlsplit


def endpoint_refusal(endpoint: str, mgmt_addr: str) -> str | None:
    """Why a node whose address is `mgmt_addr` may not report `endpoint`, in a sentence; None
    when it may. An empty endpoint (not known yet) is always allowed; anything else must be
    an http(s) URL whose host is the node's address, so a node cannot send the gateway's
    requests (with their engine keys) to a machine that is not itself."""
    if not endpoint:
        return None
    try:
        parts = urlsplit(endpoint)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return f"endpoint {endpoint!r} is not a URL"
    if parts.scheme not in ("http", "https") or not host:
        return f"endpoint {endpoint!r} is not an http:// URL with a host"
    own = mgmt_addr.strip().strip("[]").lower()
    if not own:
        return f"endpoint {endpoint!r} cannot be checked: the node registered no address"
    if host.lower() != own:
        return f"endpoint {endpoint!r} is not on the node's own address {mgmt_addr}"
    return None
