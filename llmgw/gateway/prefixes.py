"""Prefix-aware routing's rules: what a prompt's leading blocks are, which replicas served
them lately, and the replica a request goes to.

Engines keep the KV cache of what they served (llama.cpp a prompt cache per slot, vLLM
automatic prefix caching), so a request sharing a long prefix with an earlier one (a
system prompt, the earlier turns of a conversation) starts much sooner on the replica
that served it. The gateway cannot tokenize, so a prompt is cut into blocks of
characters, each named by a hash chained from the blocks before it: a block matches only
when everything before it matched too. Pure: no clock, no I/O; `State.pick` calls it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

BLOCK_CHARS = 256  # about 64 tokens of English
MAX_BLOCKS = 256  # the first 64 KiB of a prompt name its prefix; the rest is not looked at
HOLDERS = 4  # replicas remembered per block, the most recent last


def prompt_text(endpoint: str, body: Mapping, most: int = BLOCK_CHARS * MAX_BLOCKS) -> str | None:
    """The text an engine would see first, in the order it sees it, read as far as the
    first message that takes it past `most` characters; None for a request with no
    prompt to cache (embeddings, or a body that names none)."""
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        length = 0
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
        return "".join(parts)
    if endpoint == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list):
            return ",".join(map(str, prompt))
    return None


def block_hashes(text: str, block: int = BLOCK_CHARS, most: int = MAX_BLOCKS) -> list[int]:
    """The chained hash of each whole leading block of `text`, at most `most` of them.

    Python's own hash: the same within one process, which is as far as a table is kept.
    """
    out: list[int] = []
    h = 0
    for start in range(0, min(len(text) // block, most) * block, block):
        h = hash((h, text[start : start + block]))
        out.append(h)
    return out


class PrefixTable:
    """One model's blocks and the replicas that served them lately: at most `capacity`
    blocks, the least recently served dropped first, `HOLDERS` replicas each."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def served(self, hashes: Sequence[int], replica: str) -> None:
        """`replica` served a prompt of these blocks: each is now held by it, most lately.
        The deepest are refreshed first, so they are dropped first: what is kept of a
        prompt is always a prefix of it."""
        blocks = self._blocks
        for h in reversed(hashes):
            held = blocks.get(h)
            if held is None:
                blocks[h] = (replica,)
            else:
                if held[-1] != replica:
                    kept = tuple(r for r in held if r != replica)[-(HOLDERS - 1) :]
                    blocks[h] = (*kept, replica)
                blocks.move_to_end(h)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def depths(self, hashes: Sequence[int], replicas: Iterable[str]) -> dict[str, int]:
        """For each of `replicas`, how many leading blocks of these it served lately: the
        deepest it holds (`served` keeps what is held of a prompt a prefix of it)."""
        wanted = set(replicas)
        found: dict[str, int] = {}
        blocks = self._blocks
        for depth in range(len(hashes), 0, -1):
            held = blocks.get(hashes[depth - 1])
            if held is None:
                continue
            for r in held:
                if r in wanted and r not in found:
                    found[r] = depth
            if len(found) == len(wanted):
                break
        return found


@dataclass(frozen=True, slots=True)
class Choice:
    """The replica chosen, how (`prefix`, `imbalance`, `least_loaded`) and how many
    leading blocks its choice held."""

    index: int
    how: str
    depth: int = 0


def choose(loads: Sequence[float], depths: Sequence[int], imbalance: float) -> Choice:
    """Among candidates with these loads (requests in flight per unit of weight) and
    prefix depths (blocks of this prompt each served lately), in the order ties go:

    the least loaded of those holding the longest prefix, unless its load passes the
    least loaded candidate's by more than `imbalance`; then, or when none holds any of
    it, the least loaded."""
    least = min(range(len(loads)), key=loads.__getitem__)
    deepest = max(depths, default=0)
    if deepest == 0:
        return Choice(least, "least_loaded")
    holders = [i for i, d in enumerate(depths) if d == deepest]
    holder = min(holders, key=loads.__getitem__)
    if loads[holder] - loads[least] > imbalance:
        return Choice(least, "imbalance", depths[least])
    return Choice(holder, "prefix", deepest)
