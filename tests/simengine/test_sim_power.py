"""The sim engine held to a power limit (`--power-file`): its tokens come at share **
exponent of its speed, the file read at most once a second, anything unreadable the
default. Nothing here is timed: the engine's sleeps are recorded, not waited."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from llmgw import simengine
from llmgw.simengine import PowerFile, SimConfig, power_speed, start_server


@pytest.mark.parametrize(
    ("share", "exponent", "expected"),
    [
        (1.0, 0.6, 1.0),
        (0.8, 0.6, 0.8**0.6),  # ~0.875: 20 % less power, 12.5 % fewer tokens
        (0.5, 1.0, 0.5),  # linear
        (0.5, 0.0, 1.0),  # power does not change speed
        (0.01, 1.0, 0.1),  # no share below the least any card allows in the model
        (3.0, 0.6, 1.0),  # never above its default
    ],
)
def test_speed_follows_the_power_share(share, exponent, expected):
    assert power_speed(share, exponent) == pytest.approx(expected)


def test_the_power_file_is_read_at_most_once_a_second(tmp_path):
    path = tmp_path / "power"
    power = PowerFile(str(path))
    assert power.share(0.0) == 1.0  # absent: the default
    path.write_text("0.8\n")
    assert power.share(0.5) == 1.0  # read at 0: not again within the second
    assert power.share(1.0) == 0.8
    path.write_text("not a number")
    assert power.share(2.0) == 1.0
    path.write_text("0.05")
    assert power.share(3.0) == 0.1
    path.write_text("nan")
    assert power.share(4.0) == 1.0
    assert PowerFile(None).share(0.0) == 1.0


async def test_a_capped_engine_makes_each_token_wait_longer(tmp_path, monkeypatch):
    waits: list[float] = []

    async def record(deadline: float) -> None:
        # Called straight after the slot is taken: what is left is the answer's time.
        waits.append(deadline - asyncio.get_running_loop().time())

    monkeypatch.setattr(simengine, "_sleep_until", record)
    (tmp_path / "power").write_text("0.5")
    config: dict[str, Any] = {"ttft_ms": 100.0, "tokens_per_sec": 10.0, "power_exponent": 1.0}
    answers = []
    for power_file in (None, str(tmp_path / "power")):
        runner, port = await start_server(SimConfig(power_file=power_file, **config))
        try:
            async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
                waits.clear()
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
                await client.post("/v1/chat/completions", json=body)
                answers.append(list(waits))
        finally:
            await runner.cleanup()
    (full,), (capped,) = answers
    # One sleep to the whole answer's end: 0.1 s + 4 tokens of 0.1 s; twice as long at half.
    assert (full, capped) == (pytest.approx(0.5, abs=0.02), pytest.approx(1.0, abs=0.02))
