"""Prefix-aware routing's rules (llmgw/gateway/prefixes.py): the prompt and what names its
prefix, the replicas' order for it (rendezvous hashing, the same in every process), and the
choice along that order within a bound of the mean load."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from llmgw.gateway.prefixes import (
    BLOCK_CHARS,
    MAX_BLOCKS,
    SPILL,
    bound,
    choose,
    order,
    prefix_for,
    prefix_of,
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


def prefix(endpoint: str, body: dict):
    return prefix_for(endpoint, body)


QUESTION = "What does NVLink connect, and how fast is it? " * 8  # about 370 characters


def test_a_conversation_is_named_by_its_opening_whole_blocks_on_every_turn():
    turn1 = chat(SYSTEM, QUESTION)
    turn2 = chat(SYSTEM, QUESTION, "It connects GPUs. " * 30, "And PCIe? " * 20)
    first, later = prefix("chat", turn1), prefix("chat", turn2)
    opening = len(f"system\x1f{SYSTEM}\x1euser\x1f{QUESTION}\x1e")
    assert first.key == later.key and first.blocks == later.blocks == opening // BLOCK_CHARS
    assert later.of > first.of  # the prompt grew; what names it did not
    # Another question under the same system prompt is another conversation.
    assert prefix("chat", chat(SYSTEM, "Tell me about HBM. " * 20)).key != first.key
    # Tools come first: other tools, another prefix.
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert prefix("chat", chat(SYSTEM, QUESTION, tools=tools)).key != first.key


@pytest.mark.parametrize(
    ("endpoint", "body", "blocks"),
    [
        ("chat", chat("short", "hi"), None),  # shorter than a block: routed by load
        ("chat", chat("s" * 100, "q" * 100, "a" * 300), 1),  # a short opening: the first block
        ("chat", chat("q" * (BLOCK_CHARS * (MAX_BLOCKS + 9))), MAX_BLOCKS),
        ("completion", {"prompt": "p" * (BLOCK_CHARS * 5)}, 1),  # a completion: its first block
        ("completion", {"prompt": "p" * 100}, None),
        ("embedding", {"input": "e" * 1000}, None),
    ],
)
def test_what_names_a_prefix(endpoint, body, blocks):
    found = prefix(endpoint, body)
    assert (found.blocks if found else None) == blocks


def test_the_key_and_order_are_the_same_in_any_process():
    # Python's own hash of a string differs from process to process; these must not.
    script = (
        "from llmgw.gateway.prefixes import order, prefix_of;"
        "p = prefix_of('x' * 2000, 600);"
        "print(p.key.hex(), order(p.key, [(f'r{i}', 1 + i % 2) for i in range(7)]))"
    )
    said = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    here = prefix_of("x" * 2000, 600)
    assert said == {
        f"{here.key.hex()} {order(here.key, [(f'r{i}', 1 + i % 2) for i in range(7)])}\n"
    }


# -- the order


keys = st.binary(min_size=16, max_size=16)
ids = st.lists(
    st.text("abcdefgh0123456789-", min_size=1, max_size=12), min_size=1, max_size=10, unique=True
)


@settings(max_examples=300, deadline=None)
@given(keys, ids, st.randoms(use_true_random=False))
def test_the_order_is_the_replicas_not_the_order_they_are_listed_in(key, replicas, rnd):
    shuffled = replicas[:]
    rnd.shuffle(shuffled)
    listed = [replicas[i] for i in order(key, [(r, 1) for r in replicas])]
    again = [shuffled[i] for i in order(key, [(r, 1) for r in shuffled])]
    assert listed == again
    assert sorted(listed) == sorted(replicas)


@settings(max_examples=300, deadline=None)
@given(keys, ids.filter(lambda r: len(r) > 1), st.data())
def test_a_replica_gone_moves_only_what_it_was_first_for(key, replicas, data):
    gone = data.draw(st.sampled_from(replicas))
    left = [r for r in replicas if r != gone]
    before = [replicas[i] for i in order(key, [(r, 1) for r in replicas])]
    after = [left[i] for i in order(key, [(r, 1) for r in left])]
    # The others keep their order: a prefix whose first was another stays there, and one
    # whose first went goes to its second.
    assert after == [r for r in before if r != gone]


def test_about_one_prefix_in_n_moves_when_one_of_n_replicas_goes():
    replicas = [f"llama-{i}" for i in range(8)]
    prefixes = [prefix_of(f"conversation {i} " * 40, 600).key for i in range(4000)]
    firsts = [replicas[order(k, [(r, 1) for r in replicas])[0]] for k in prefixes]
    left = replicas[:3] + replicas[4:]
    moved = sum(
        first != left[order(k, [(r, 1) for r in left])[0]]
        for k, first in zip(prefixes, firsts, strict=True)
    )
    assert moved == firsts.count("llama-3")
    assert 0.10 < moved / len(prefixes) < 0.15  # 1/8, give or take chance
    # Each replica is first for about its share.
    assert max(firsts.count(r) for r in replicas) < 1.2 * len(prefixes) / 8


def test_a_replica_of_twice_the_weight_is_first_for_twice_the_prefixes():
    replicas = [("big", 2), ("small-1", 1), ("small-2", 1)]
    firsts = [order(prefix_of(f"p{i} " * 200, 600).key, replicas)[0] for i in range(4000)]
    assert 0.46 < firsts.count(0) / len(firsts) < 0.54


# -- the choice


@pytest.mark.parametrize(
    ("loads", "ordered", "imbalance", "index", "how"),
    [
        ([1, 1, 1], [], 2, 0, "least_loaded"),  # no prefix: ties go to the first
        ([3, 1, 2], [], 2, 1, "least_loaded"),
        ([3, 1, 2], [0, 2, 1], 2, 0, "prefix"),  # the first in order while it can
        ([4, 1, 1], [0, 2, 1], 2, 2, "imbalance"),  # past the bound: the next in order
        ([4, 1, 3], [0, 2, 1], 2, 2, "imbalance"),  # the next may be busier than the least
        ([4, 1, 4], [0, 2, 1], 2, 1, "imbalance"),
        ([2, 2, 2], [1, 0, 2], 0, 1, "prefix"),  # no imbalance allowed, none there
        ([15, 12, 12], [0, 1, 2], 2, 0, "prefix"),  # 15 <= 1.25 × 13, past 12 + 2
        ([18, 12, 12], [0, 1, 2], 2, 1, "imbalance"),  # 18 > 1.25 × 14
        ([9, 1, 1], [0], 2, 1, "imbalance"),  # only one routed by prefix, and over it
    ],
)
def test_choose(loads, ordered, imbalance, index, how):
    choice = choose(loads, ordered, imbalance)
    assert (choice.index, choice.how) == (index, how)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=12),
    st.floats(0, 10),
    st.randoms(use_true_random=False),
)
def test_the_load_stays_bounded(loads, imbalance, rnd):
    ordered = list(range(len(loads)))
    rnd.shuffle(ordered)
    choice = choose([float(x) for x in loads], ordered, imbalance)
    most = bound(loads, imbalance)
    assert most >= (1 + SPILL) * sum(loads) / len(loads)
    # Never a replica past the bound; the first in order that is within it.
    assert loads[choice.index] <= most
    place = ordered.index(choice.index)
    assert all(loads[i] > most for i in ordered[:place])
    assert choice.how == ("prefix" if place == 0 else "imbalance")


@settings(max_examples=200, deadline=None)
@given(keys, st.lists(st.integers(1, 6), min_size=2, max_size=8), st.integers(0, 5))
def test_requests_for_one_hot_prefix_spread_no_further_than_the_bound(key, weights, imbalance):
    # One prefix, one request after another with none finishing: it fills the first in
    # its order up to the bound, then the next, and no replica's load passes the bound.
    replicas = [(f"r{i}", w) for i, w in enumerate(weights)]
    ordered = order(key, replicas)
    held = [0] * len(replicas)
    for _ in range(40):
        loads = [(h + 1) / w for h, (_, w) in zip(held, replicas, strict=True)]
        choice = choose(loads, ordered, imbalance)
        assert loads[choice.index] <= bound(loads, imbalance)
        held[choice.index] += 1
    # The first in order took the most per unit of weight, within one request.
    per = [h / w for h, (_, w) in zip(held, replicas, strict=True)]
    assert per[ordered[0]] >= max(per) - 1


def test_a_prompt_is_read_only_as_far_as_its_prefix_can_reach():
    body = chat("x" * (BLOCK_CHARS * MAX_BLOCKS), "never read", "nor this")
    text = prompt_text("chat", body)
    assert "never read" not in text
    assert prefix("chat", body) == prefix("chat", chat("x" * (BLOCK_CHARS * MAX_BLOCKS)))
