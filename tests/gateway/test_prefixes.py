"""Prefix-aware routing's rules (llmgw/gateway/prefixes.py): the prompt's blocks, the
table of who served them, and the choice between the prefix's replica and load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from llmgw.gateway.prefixes import (
    BLOCK_CHARS,
    HOLDERS,
    MAX_BLOCKS,
    PrefixTable,
    block_hashes,
    choose,
    prompt_text,
)

SYSTEM = "You are a careful assistant. " * 40  # about 1,160 characters: 4 whole blocks


def chat(*contents: str, **extra) -> dict:
    roles = ["system", "user", "assistant"]
    messages = [
        {"role": roles[min(i, 1) if i < 2 else 1 + i % 2], "content": c}
        for i, c in enumerate(contents)
    ]
    return {"model": "m", "messages": messages, **extra}


# -- the prompt and its blocks


def test_a_chat_prompt_is_its_messages_roles_and_contents_in_order():
    text = prompt_text("chat", chat("be brief", "hello"))
    assert text == "system\x1fbe brief\x1euser\x1fhello\x1e"


def test_tools_come_first_and_parts_of_a_message_are_joined():
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            }
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    text = prompt_text("chat", body)
    assert text.startswith('[{"function": {"name": "f"}')
    assert text.endswith('user\x1fa{"image_url": {"url": "x"}, "type": "image_url"}\x1e')


@pytest.mark.parametrize(
    ("endpoint", "body", "text"),
    [
        ("completion", {"prompt": "once upon"}, "once upon"),
        ("completion", {"prompt": ["once upon"]}, "once upon"),
        ("completion", {"prompt": [1, 2, 3]}, "1,2,3"),
        ("embedding", {"input": "x"}, None),
        ("chat", {"messages": "not a list"}, None),
        ("chat", {"messages": ["not an object"]}, None),
    ],
)
def test_other_prompts(endpoint, body, text):
    assert prompt_text(endpoint, body) == text


def test_only_whole_blocks_count_and_each_names_everything_before_it():
    text = "a" * (BLOCK_CHARS * 3 + 10)
    hashes = block_hashes(text)
    assert len(hashes) == 3
    # The same block after a different one is a different block.
    other = block_hashes("b" * BLOCK_CHARS + "a" * (BLOCK_CHARS * 2))
    assert other[1] != hashes[1] and other[2] != hashes[2]
    # A longer prompt with the same start shares its blocks.
    assert block_hashes(text + "more" * 100)[:3] == hashes


def test_a_huge_prompt_names_its_prefix_by_its_first_blocks_only():
    assert len(block_hashes("x" * BLOCK_CHARS * (MAX_BLOCKS + 50))) == MAX_BLOCKS
    assert block_hashes("short") == []


# -- the table


def test_the_deepest_block_a_replica_served_is_its_depth():
    t = PrefixTable(100)
    turn1 = block_hashes(SYSTEM + "user: what is a GPU? " * 20)
    turn2 = block_hashes(SYSTEM + "user: what is a GPU? " * 20 + "assistant: a card. " * 30)
    other = block_hashes(SYSTEM + "user: hello " * 40)
    t.served(turn1, "r1")
    t.served(other, "r2")
    assert t.depths(turn2, ["r1", "r2", "r3"]) == {"r1": len(turn1), "r2": 4}
    assert t.depths(turn2, ["r3"]) == {}


def test_the_deepest_blocks_of_what_was_served_least_lately_go_first():
    t = PrefixTable(4)
    a, b = block_hashes("a" * BLOCK_CHARS * 3), block_hashes("b" * BLOCK_CHARS * 3)
    t.served(a, "r1")
    t.served(b, "r2")
    assert len(t) == 4
    # What is left of a is still a prefix of it: its first block.
    assert t.depths(a, ["r1"]) == {"r1": 1}
    assert t.depths(b, ["r2"]) == {"r2": 3}
    t.served(a, "r1")
    assert t.depths(a, ["r1"]) == {"r1": 3}
    assert t.depths(b, ["r2"]) == {"r2": 1}


def test_each_block_remembers_its_latest_holders_only():
    t = PrefixTable(10)
    h = block_hashes("s" * BLOCK_CHARS)
    for i in range(HOLDERS + 3):
        t.served(h, f"r{i}")
    t.served(h, "r5")  # again: it moves to the end, not in twice
    held = t.depths(h, [f"r{i}" for i in range(HOLDERS + 3)])
    assert set(held) == {f"r{i}" for i in range(HOLDERS + 3 - HOLDERS, HOLDERS + 3)}


# -- the choice


@pytest.mark.parametrize(
    ("loads", "depths", "imbalance", "index", "how"),
    [
        ([1, 1, 1], [0, 0, 0], 4, 0, "least_loaded"),  # ties go to the first
        ([3, 1, 2], [0, 0, 0], 4, 1, "least_loaded"),
        ([3, 1, 2], [5, 0, 2], 4, 0, "prefix"),  # the longest prefix wins while it can
        ([5, 1, 2], [5, 0, 2], 4, 0, "prefix"),  # 4 more than the least: still allowed
        ([6, 1, 2], [5, 0, 2], 4, 1, "imbalance"),  # past it: the least loaded
        ([3, 1, 2], [5, 0, 5], 4, 2, "prefix"),  # of two holding it, the less loaded
        ([2, 2, 2], [1, 3, 0], 0, 1, "prefix"),  # no imbalance allowed, none there
        ([2.5, 1, 2], [4, 0, 0], 1, 1, "imbalance"),  # loads per unit of weight
    ],
)
def test_choose(loads, depths, imbalance, index, how):
    choice = choose(loads, depths, imbalance)
    assert (choice.index, choice.how) == (index, how)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8)), min_size=1, max_size=12),
    st.floats(0, 10),
)
def test_the_choice_is_never_busier_than_the_imbalance_allows(candidates, imbalance):
    loads = [float(load) for load, _ in candidates]
    depths = [d for _, d in candidates]
    choice = choose(loads, depths, imbalance)
    assert loads[choice.index] - min(loads) <= imbalance
    if choice.how == "prefix":
        # The holder of the longest prefix, and the least loaded of such holders.
        assert depths[choice.index] == max(depths) > 0
        assert loads[choice.index] == min(
            x for x, d in zip(loads, depths, strict=True) if d == max(depths)
        )
    else:
        assert loads[choice.index] == min(loads)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 50),
    st.lists(
        st.tuples(st.integers(0, 20), st.integers(1, 12), st.sampled_from("abcdefgh")),
        max_size=60,
    ),
)
def test_nothing_grows_without_bound(capacity, served):
    t = PrefixTable(capacity)
    prompts = []
    for start, length, replica in served:
        hashes = block_hashes("".join(f"{i:0{BLOCK_CHARS}d}" for i in range(start, start + length)))
        t.served(hashes, replica)
        assert len(t) <= capacity
        assert all(len(held) <= HOLDERS for held in t._blocks.values())
        depths = t.depths(hashes, "abcdefgh")
        assert all(0 < d <= len(hashes) for d in depths.values())
        # What was served last is held whole by whoever served it, if it fits.
        if len(hashes) <= capacity:
            assert depths[replica] == len(hashes)
        # What is held of any prompt served is a prefix of it.
        prompts.append(hashes)
        for p in prompts:
            kept = [h in t._blocks for h in p]
            assert kept == sorted(kept, reverse=True)


def test_a_prompt_is_read_only_as_far_as_its_prefix_can_reach():
    body = chat("x" * (BLOCK_CHARS * MAX_BLOCKS), "never read", "nor this")
    text = prompt_text("chat", body)
    assert "never read" not in text
    assert block_hashes(text) == block_hashes(
        prompt_text("chat", chat("x" * (BLOCK_CHARS * MAX_BLOCKS)))
    )
