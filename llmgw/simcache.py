"""The sim engine's model of prefill: a prefix (KV) cache and the time to fill what it misses.

Real engines with automatic prefix caching (vLLM's, llama.cpp's slots) keep
the KV blocks of what they have seen, so a prompt that begins as an earlier
one did is prefilled only from where it differs. The sim has no KV, only its
words, so a block here is `block_tokens` words identified by a chained hash,
as vLLM identifies its blocks. Pure: no clock, no I/O, bounded memory.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
from collections.abc import Iterable, Iterator


def _chained_hashes(tokens: Iterable[str], block_tokens: int) -> Iterator[bytes]:
    """The hash of each whole block, each one over the one before it and its own tokens.

    Chained so that a block matches only when everything before it matches
    too: the same sixteen words after a different beginning are another block.
    """
    previous = b""
    words = iter(tokens)
    while len(block := list(itertools.islice(words, block_tokens))) == block_tokens:
        # The sim's tokens come from str.split(), so none holds a space and
        # joining with one is unambiguous; surrogatepass because JSON may
        # carry lone surrogates.
        text = " ".join(block).encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + text, digest_size=16).digest()
        yield previous


class PrefixCache:
    """A least-recently-used store of prefix blocks holding at most `capacity_tokens` tokens.

    Only whole blocks are kept, so a capacity under one block holds nothing,
    and 0 turns the cache off.
    """

    def __init__(self, capacity_tokens: int, block_tokens: int = 16) -> None:
        if block_tokens < 1:
            raise ValueError(f"a prefix block must hold at least 1 token, not {block_tokens}")
        if capacity_tokens < 0:
            raise ValueError(f"the prefix cache's capacity cannot be negative ({capacity_tokens})")
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        # Oldest first; the values are unused, an OrderedDict is the LRU.
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    @property
    def held_tokens(self) -> int:
        """How many tokens the cached blocks hold."""
        return len(self._blocks) * self.block_tokens

    def lookup(self, tokens: Iterable[str]) -> int:
        """How many leading tokens are cached: the longest run of leading blocks held.

        Always a whole number of blocks, never more than len(tokens). A lookup
        does not refresh the blocks; the insert at the end of the request does.
        """
        hits = 0
        for digest in _chained_hashes(tokens, self.block_tokens):
            if digest not in self._blocks:
                break
            hits += 1
        return hits * self.block_tokens

    def insert(self, tokens: Iterable[str]) -> None:
        """Add or refresh the whole blocks of `tokens`, evicting the least recently used.

        Only the first `capacity_blocks` blocks are read, so a sequence of any
        length costs bounded time and memory. They are refreshed last to
        first, as vLLM frees a finished request's blocks, so a sequence's tail
        is evicted before its head: a later request can only use a head.
        """
        if not self.capacity_blocks:
            return
        digests = list(
            itertools.islice(_chained_hashes(tokens, self.block_tokens), self.capacity_blocks)
        )
        for digest in reversed(digests):
            self._blocks[digest] = None
            self._blocks.move_to_end(digest)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)


def first_token_seconds(
    *, ttft_ms: float, uncached_tokens: int, prefill_tokens_per_sec: float
) -> float:
    """Seconds from taking a slot to the first token: `ttft_ms`, plus the prefill of what
    the cache missed at `prefill_tokens_per_sec`; a rate of 0 makes prefill free."""
    base = ttft_ms / 1000.0
    if prefill_tokens_per_sec <= 0:
        return base
    return base + max(uncached_tokens, 0) / prefill_tokens_per_sec
