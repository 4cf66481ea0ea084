"""Whether an endpoint a node reports is its own: on its address, and which address that is."""

from __future__ import annotations

import ipaddress
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
    if not mgmt_addr.strip():
        return f"endpoint {endpoint!r} cannot be checked: the node registered no address"
    if not same_address(host, mgmt_addr):
        return f"endpoint {endpoint!r} is not on the node's own address {mgmt_addr}"
    return None


def same_address(a: str, b: str) -> bool:
    """Whether two addresses name the same host: IP addresses compared as addresses (an
    IPv4 address mapped into IPv6 is the IPv4 one), anything else as text without case."""
    return bool(a) and _canonical(a) == _canonical(b)


def _canonical(address: str) -> str:
    text = address.strip().strip("[]").lower()
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def address_refusal(
    *, node_id: str, declared: str, seen: str, approved: str, trust_declared: bool
) -> str | None:
    """Why node `node_id`'s engines may not be reached at the address it `declared`, in a
    sentence; None when they may. A declared address is believed when it is the one the
    node's connection came from (`seen`, empty when unknown), when an operator approved it
    for this node (`approved`), or when the operator trusts what nodes declare."""
    if trust_declared or same_address(declared, seen) or same_address(declared, approved):
        return None
    approve = f"llmgw ctl node approve {node_id} --address {declared}"
    where = f"node {node_id} says its engines are at {declared or 'no address'}"
    if approved:
        why = f"{where}, not at {approved} as an operator approved"
    elif seen:
        why = f"{where} but connects from {seen}"
    else:
        why = f"{where} and the address it connects from is not known"
    return (
        f"{why}: nothing is placed on it and none of its engines is used until an operator "
        f"approves that address ({approve})"
    )
