"""The sim engine's LoRA adapters, as vLLM serves them: loaded at start or at run time, up to
--max-loras, listed with their parent, each answering in words of its own."""

from __future__ import annotations

import pytest

from llmgw import simengine
from tests.simengine.test_sim_engine import CHAT, chat_body, engine


async def answer(client, model: str) -> str:
    async with client.post(CHAT, json=chat_body("tell me a story", model=model)) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["choices"][0]["message"]["content"]


async def test_adapters_load_answer_differently_and_unload(tmp_path) -> None:
    lora = tmp_path / "support"
    lora.mkdir()
    async with engine(max_loras=2, loras=(("held", "/x"),)) as client:
        base = await answer(client, "sim")
        held = await answer(client, "held")
        async with client.post(
            "/v1/load_lora_adapter", json={"lora_name": "support", "lora_path": str(lora)}
        ) as resp:
            assert resp.status == 200
            assert "added successfully" in await resp.text()
        support = await answer(client, "support")
        assert len({base, held, support}) == 3
        assert await answer(client, "support") == support  # the same prompt, the same words

        async with client.get("/v1/models") as resp:
            listed = (await resp.json())["data"]
        assert [(m["id"], m.get("parent")) for m in listed] == [
            ("sim", None),
            ("held", "sim"),
            ("support", "sim"),
        ]
        async with client.post(
            "/v1/load_lora_adapter", json={"lora_name": "third", "lora_path": str(lora)}
        ) as resp:
            assert resp.status == 400
            assert "No free LoRA slot: 2 of 2 held" in await resp.text()
        async with client.post("/v1/unload_lora_adapter", json={"lora_name": "held"}) as resp:
            assert resp.status == 200
        async with client.post(CHAT, json=chat_body(model="held")) as resp:
            assert resp.status == 404
            assert "The model `held` does not exist." in await resp.text()


async def test_an_engine_without_slots_refuses_to_load(tmp_path) -> None:
    async with engine() as client:
        async with client.post(
            "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)}
        ) as resp:
            assert resp.status == 400
            assert "start the engine with --max-loras" in await resp.text()
        # Without adapters, any model name is answered as before.
        async with client.post(CHAT, json=chat_body(model="whatever")) as resp:
            assert resp.status == 200


async def test_a_path_that_is_not_there_is_404(tmp_path) -> None:
    async with (
        engine(max_loras=1) as client,
        client.post(
            "/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path / "no")}
        ) as resp,
    ):
        assert resp.status == 404


def test_more_loras_than_slots_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit):
        simengine.main(["--port", "0", "--lora", "a=/x", "--lora", "b=/y", "--max-loras", "1"])
    assert "2 --lora given, more than --max-loras 1" in capsys.readouterr().err
