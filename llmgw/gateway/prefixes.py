"""Prefix-aware routing's rules: which part of a prompt names its prefix, the order in
which a model's replicas are asked to hold it, and the replica a request goes to.

Engines keep the KV cache of what they served (llama.cpp a prompt cache per slot, vLLM
automatic prefix caching), so a request sharing a long prefix with an earlier one (a
system prompt, the earlier turns of a conversation) starts much sooner on the replica
that served it. Every gateway process and server must send the same prefix to the same
replica, with no table to share and no lookup across the network: a prompt's opening
(the whole leading blocks of its first turn) is hashed with a hash that is the same in
every process, and each ready replica is ranked by rendezvous hashing of it (highest
random weight): the same opening and the same replicas give the same order anywhere, and
a replica that comes or goes moves only the openings ranked first on it. A request goes to
the first in its order whose load is within a bound of the mean (consistent hashing with
bounded loads), so a hot prefix spills to the next replica in its order, not anywhere.
Pure: no clock, no I/O; `State.pick` calls it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

BLOCK_CHARS = 256  # about 64 tokens of English
MAX_BLOCKS = 256  # the first 64 KiB of a prompt name its prefix; the rest is not looked at
# A replica whose load passes the mean's by more than this share (and the least loaded's by
# more than the imbalance allowed) spills the request to the next in its prefix's order.
SPILL = 0.25
# The roles a conversation opens with before its first turn: part of every turn's prompt.
OPENING_ROLES = frozenset({"system", "developer"})


def prompt_text(endpoint: str, body: Mapping, most: int = BLOCK_CHARS * MAX_BLOCKS) -> str | None:
    """The text an engine would see first, in the order it sees it, read as far as the
    first message that takes it past `most` characters; None for a request with no
    prompt to cache (embeddings, or a body that names none)."""
    found = _opening(endpoint, body, most)
    return None if found is None else found[0]


def prefix_for(endpoint: str, body: Mapping) -> Prefix | None:
    """What names the prefix of a request's prompt (`prefix_of`): its opening is, for
    chat, the tools, the system prompt and the first message after it (the first
    question: what tells one conversation from another sharing the system prompt); for a
    completion, its first block. None for a request with no prompt to cache."""
    found = _opening(endpoint, body, BLOCK_CHARS * MAX_BLOCKS)
    return None if found is None else prefix_of(*found)


def _opening(endpoint: str, body: Mapping, most: int) -> tuple[str, int] | None:
    """The prompt's text (`prompt_text`) and how many of its leading characters every
    later turn of the same conversation repeats (`prefix_for`)."""
    if endpoint == "chat":
        return _chat_text(body, most)
    if endpoint == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            prompt = ",".join(map(str, prompt))
        if isinstance(prompt, str):
            return prompt, min(len(prompt), BLOCK_CHARS)
    return None


def _chat_text(body: Mapping, most: int) -> tuple[str, int] | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    parts = []
    length = 0
    opening = None
    tools = body.get("tools")
    if tools:  # chat templates put the tools before the system prompt
        parts.append(json.dumps(tools, sort_keys=True, default=str))
        length = len(parts[0])
    for m in messages:
        if length >= most:
            break
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(
                p["text"]
                if isinstance(p, dict) and isinstance(p.get("text"), str)
                else json.dumps(p, sort_keys=True, default=str)
                for p in content
            )
        elif not isinstance(content, str):
            content = "" if content is None else json.dumps(content, default=str)
        parts.append(f"{m.get('role')}\x1f{content}\x1e")
        length += len(parts[-1])
        if opening is None and m.get("role") not in OPENING_ROLES:
            opening = length
    return "".join(parts), length if opening is None else opening


@dataclass(frozen=True, slots=True)
class Prefix:
    """What names a prompt's prefix: the hash of its opening's whole leading blocks (at
    least the first; `blocks` of them), the same in every process; and how many whole
    blocks the prompt has (`of`)."""

    key: bytes
    blocks: int
    of: int


def prefix_of(text: str, opening: int) -> Prefix | None:
    """The prefix of a prompt `text` whose first `opening` characters every turn repeats;
    None for a prompt shorter than a block (nothing worth keeping a replica for).

    A conversation's first turn ends within a block that its later turns continue with
    the answer: only the blocks whole in the opening are hashed, so every turn names the
    same ones. An opening shorter than a block is named by the prompt's first block."""
    of = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    if of == 0:
        return None
    blocks = min(max(opening // BLOCK_CHARS, 1), of)
    lead = text[: blocks * BLOCK_CHARS].encode("utf-8", "surrogatepass")
    return Prefix(hashlib.blake2b(lead, digest_size=16).digest(), blocks, of)


def rank(key: bytes, replica: str, weight: int = 1) -> float:
    """How high `replica` stands for a prefix (rendezvous hashing, weighted: a replica of
    weight 2 is first for twice the prefixes); the same in every process."""
    digest = hashlib.blake2b(replica.encode(), digest_size=8, key=key[:64]).digest()
    u = (int.from_bytes(digest, "big") + 1) / (2**64 + 1)  # in (0, 1)
    return -max(weight, 1) / math.log(u)


def order(key: bytes, replicas: Sequence[tuple[str, int]]) -> list[int]:
    """The indices of `replicas` (id, weight) in the order they are asked to hold the
    prefix `key`: the highest ranked first, ties (of ids alike) by index."""
    ranks = [rank(key, r, w) for r, w in replicas]
    return sorted(range(len(replicas)), key=lambda i: (-ranks[i], i))


@dataclass(frozen=True, slots=True)
class Choice:
    """The replica chosen, how (`prefix`: the first in its prefix's order; `imbalance`:
    a later one, those before it over the bound; `least_loaded`) and its place in the
    prefix's order (0 for the first)."""

    index: int
    how: str
    place: int = 0


def bound(loads: Sequence[float], imbalance: float, spill: float = SPILL) -> float:
    """The most load a replica may have and still take a request for its prefix: the mean
    load times 1 + `spill`, and never less than the least loaded's plus `imbalance` (with
    few requests in flight a cached prefix is worth one or two more of them)."""
    return max((1 + spill) * sum(loads) / len(loads), min(loads) + imbalance)


def choose(
    loads: Sequence[float], ordered: Sequence[int], imbalance: float, spill: float = SPILL
) -> Choice:
    """Among candidates with these loads (requests in flight per unit of weight, this one
    included), the first of `ordered` (the prefix's order of those routed by prefix;
    empty for none) within the `bound`; when none is, or there is no order, the least
    loaded (ties to the first)."""
    least = min(range(len(loads)), key=loads.__getitem__)
    if not ordered:
        return Choice(least, "least_loaded")
    most = bound(loads, imbalance, spill)
    for place, i in enumerate(ordered):
        if loads[i] <= most:
            return Choice(i, "prefix" if place == 0 else "imbalance", place)
    return Choice(least, "imbalance", len(ordered))
