"""LoRA adapters on real engines, started by the agent's own command builder
(fleet/agent/engines.py) and driven through its adapters module (fleet/agent/adapters.py):

- llama-server with SmolLM2-135M-Instruct and two LoRA GGUFs the tests write for it: at
  temperature 0 each adapter's answer differs from the base's and from the other's, and the
  base's own answer on that server is the one a server without adapters gives (llama-server
  applies an adapter's start scale to every request that names none: the agent starts each
  at 0); started by a supervisor from a start_shard, its engine_load names both adapters
  by index, and load_adapter is answered for each as llama-server can;
- vLLM's CPU build with SmolLM2 as a Hugging Face folder and a PEFT adapter the tests write,
  loaded while it runs: it answers otherwise than the base, is listed with the base as its
  parent, and is gone once unloaded.

The llama-server is the one `llmgw engines build llamacpp` made and vLLM the one `llmgw
engines build vllm` made (real_engines.py, real_vllm.py). Without one its tests skip, saying
how to make it; in CI (CI=true) they fail instead. Answers are kept to a few tokens: the
machine may have two cores.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from fleet.agent.adapters import AdapterError, AdapterRef, EngineAdapters, Held
from fleet.agent.engines import (
    DEFAULT_BINARIES,
    NodeContext,
    ShardSpec,
    build_command,
    use_binary,
)
from fleet.agent.supervisor import Supervisor
from tests.agent.helpers import free_port
from tests.lora_files import hf_dims, lora_gguf, peft_adapter

from .real_engines import in_ci, llama_server, smollm2_gguf
from .real_vllm import memory_short_of, smollm2_hf_folder, vllm_program

MODEL = "smollm2-135m"
KEY = "sk-engine-adapters"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK = [SYSTEM, {"role": "user", "content": "Tell me about the sea."}]
TOKENS = 24
LLAMA_READY_S = 180.0
# Starting eager on a loaded 2-core machine: minutes.
VLLM_READY_S = 600.0
# SmolLM2 with vLLM's three processes (about 3.9 GB), and a margin.
VLLM_NEED_GB = 5.0


def _skip_or_fail(why: str) -> None:
    if in_ci():
        pytest.fail(f"CI must test real engines with adapters, and cannot: {why}.")
    pytest.skip(why)


class Engine:
    """An engine process started from the agent's command for ``spec``, on a loopback port."""

    def __init__(self, spec: ShardSpec, binaries: dict[str, str], log: Path) -> None:
        self.port = free_port()
        node = NodeContext(port=self.port, cpu_count=2, bind_host="127.0.0.1", binaries=binaries)
        self.command = build_command(spec, node)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                self.command.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.command.env},
                start_new_session=True,
            )
        self.headers = {"Authorization": f"Bearer {KEY}"}

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the engine exited {self.process.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", headers=self.headers, timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(
            f"the engine was not ready in {timeout:g} s: {self.log.read_text()[-2000:]}"
        )

    def chat(self, model: str, **extra) -> str:
        body = {"model": model, "messages": ASK, "temperature": 0, "max_tokens": TOKENS, **extra}
        r = httpx.post(
            f"{self.url}/v1/chat/completions", json=body, headers=self.headers, timeout=300
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    def adapters(self, client: httpx.AsyncClient, spec: ShardSpec) -> EngineAdapters:
        return EngineAdapters(
            client, engine=spec.engine, base_url=self.url, api_key=KEY, started_with=spec.adapters
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()


def shard(engine: str, source: Path, *, adapters=(), slots=0, args=(), memory_gb=None) -> ShardSpec:
    return ShardSpec(
        shard_id=f"{engine}-adapters",
        model=MODEL,
        source=str(source),
        profile={"name": f"{engine}-lora", "engine": engine, "args": list(args)},
        api_key=KEY,
        threads=1,
        adapters=tuple(adapters),
        adapter_slots=slots,
        memory_gb=memory_gb,
    )


async def _with_client(work):
    async with httpx.AsyncClient(trust_env=False) as client:
        return await work(client)


@pytest.fixture(scope="module")
def llama_binary() -> Path:
    path, why = llama_server()
    if path is None:
        _skip_or_fail(why)
    return path


@pytest.fixture(scope="module")
def gguf_adapters(tmp_path_factory) -> tuple[AdapterRef, AdapterRef]:
    """Two LoRA GGUFs for SmolLM2, of different seeds: SQL's team's and the poets'."""
    folder = tmp_path_factory.mktemp("gguf-adapters")
    base = smollm2_gguf()
    return tuple(
        AdapterRef(name, str(lora_gguf(base, folder / f"{name}.gguf", seed=seed)), "gguf")
        for name, seed in (("sql", 1), ("poems", 2))
    )


@pytest.fixture(scope="module")
def llama_engines(llama_binary, gguf_adapters, tmp_path_factory):
    """Two llama-servers of SmolLM2: one holding both adapters, one with none."""
    logs = tmp_path_factory.mktemp("llama-logs")
    binaries = {"llamacpp": str(llama_binary)}
    base = smollm2_gguf()
    args = ["--ctx-size", "1024"]
    with_adapters = shard("llamacpp", base, adapters=gguf_adapters, slots=2, args=args)
    engines = [
        Engine(with_adapters, binaries, logs / "adapters.log"),
        Engine(shard("llamacpp", base, args=args), binaries, logs / "plain.log"),
    ]
    try:
        for engine in engines:
            engine.wait_ready(LLAMA_READY_S)
        yield with_adapters, engines[0], engines[1]
    finally:
        for engine in engines:
            engine.stop()


def test_each_llama_adapter_answers_otherwise_than_the_base_and_the_other(llama_engines):
    spec, engine, plain = llama_engines
    base = engine.chat(MODEL)
    sql = engine.chat(MODEL, lora=[{"id": 0, "scale": 1.0}])
    poems = engine.chat(MODEL, lora=[{"id": 1, "scale": 1.0}])
    assert base and sql and poems
    assert sql != base, sql
    assert poems != base, poems
    assert sql != poems
    # Naming no adapter is the base, as on a server that holds none.
    assert base == plain.chat(MODEL)
    # Asked again, the same: an adapter's scale is per request, not left behind. After an
    # adapter's request the base is asked with every adapter at 0 said outright: a request
    # naming none reuses the slot's prompt cache the adapter computed (llama.cpp 0.3.36's
    # server clears it only when a request names adapters), as the gateway asks it.
    assert engine.chat(MODEL, lora=[{"id": 0, "scale": 0.0}]) == base
    assert engine.chat(MODEL, lora=[{"id": 0, "scale": 1.0}]) == sql
    assert engine.chat(MODEL, lora=[{"id": 1, "scale": 0.0}]) == base


def test_the_agent_reads_and_loads_the_adapters_llama_server_started_with(llama_engines):
    spec, engine, _ = llama_engines
    sql, poems = spec.adapters

    async def work(client):
        adapters = engine.adapters(client, spec)
        held = await adapters.held()
        loaded = await adapters.load(poems)
        with pytest.raises(AdapterError, match="only when it starts") as refused:
            await adapters.load(AdapterRef("legal", "/nowhere/legal.gguf", "gguf"))
        return held, loaded, str(refused.value)

    held, loaded, refused = asyncio.run(_with_client(work))
    assert held == [Held("sql", 0), Held("poems", 1)]
    assert loaded == Held("poems", 1)
    assert "without legal" in refused


async def test_an_agent_starts_llama_server_with_adapters_and_reports_them(
    llama_binary, gguf_adapters, tmp_path
):
    """Through the supervisor, as a start_shard gives it: the engine holds both adapters by
    index, engine_load says so, and load_adapter answers for each as llama-server can."""
    sup = Supervisor(tmp_path, advertise_addr="127.0.0.1", port_range=(34100, 34199), cpu_count=2)
    said: list[dict] = []
    sup.on_change = said.append
    use_binary("llamacpp", str(llama_binary))
    start = {
        "type": "start_shard",
        "shard_id": "lora-1",
        "model": MODEL,
        "source": str(smollm2_gguf()),
        "profile": {"name": "cpu-lora", "engine": "llamacpp", "args": ["--ctx-size", "512"]},
        "api_key": KEY,
        "threads": 1,
        "adapter_slots": 2,
        "adapters": [ref.to_message() for ref in gguf_adapters],
        "startup_timeout_s": LLAMA_READY_S,
    }
    try:
        await sup.start(start)
        async with asyncio.timeout(LLAMA_READY_S):
            while not any(m.get("state") in ("ready", "failed") for m in said):
                await asyncio.sleep(0.2)
        assert said[-1]["state"] == "ready", said[-1]
        [load] = await sup.engine_loads()
        assert load["adapters"] == [
            {"name": "sql", "engine_id": 0},
            {"name": "poems", "engine_id": 1},
        ]
        await sup.load_adapter(
            {"type": "load_adapter", "shard_id": "lora-1", "adapter": gguf_adapters[1].to_message()}
        )
        legal = {"name": "legal", "path": "/nowhere/legal.gguf", "format": "gguf"}
        await sup.load_adapter({"type": "load_adapter", "shard_id": "lora-1", "adapter": legal})
        answers = [m for m in said if m["type"] == "adapter_status"]
        assert [(m["name"], m["state"]) for m in answers] == [
            ("poems", "loaded"),
            ("legal", "failed"),
        ]
        assert "only when it starts" in answers[1]["detail"]
    finally:
        await sup.stop_all(grace_s=5)
        await sup.close()
        use_binary("llamacpp", DEFAULT_BINARIES["llamacpp"])


@pytest.fixture(scope="module")
def vllm_site(tmp_path_factory):
    """vLLM's CPU build serving SmolLM2 (a Hugging Face folder) with 2 adapter slots, one
    PEFT adapter held from its start (poems) and one to load while it runs (sql):
    (spec, engine, sql)."""
    program, why = vllm_program()
    why = why or memory_short_of(VLLM_NEED_GB)
    if why:
        _skip_or_fail(why)
    folder = smollm2_hf_folder(program)
    made = tmp_path_factory.mktemp("peft")
    sql, poems = (
        AdapterRef(name, str(peft_adapter(made / name, dims=hf_dims(folder), seed=seed)), "peft")
        for name, seed in (("sql", 1), ("poems", 2))
    )
    # 5 GB reserved: a KV cache of 1 GiB (engines.vllm_cpu_kv_space_gib).
    spec = shard(
        "vllm",
        folder,
        adapters=[poems],
        slots=2,
        args=["--max-model-len", "1024"],
        memory_gb=VLLM_NEED_GB,
    )
    engine = Engine(spec, {"vllm": str(program)}, tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        engine.wait_ready(VLLM_READY_S)
        yield spec, engine, sql
    finally:
        engine.stop()


def test_a_peft_adapter_loaded_into_vllm_answers_otherwise_than_the_base(vllm_site):
    """The adapter given at start (--lora-modules) is held and answers as itself; one loaded
    while vLLM runs answers otherwise than the base and than the other, and is gone, asked
    for by name, once unloaded."""
    spec, engine, sql = vllm_site
    base = engine.chat(MODEL)
    poems = engine.chat("poems")

    async def load(client):
        adapters = engine.adapters(client, spec)
        before = await adapters.held()
        started = time.monotonic()
        held = await adapters.load(sql)
        return before, held, time.monotonic() - started, await adapters.held()

    before, held, load_s, listed = asyncio.run(_with_client(load))
    assert before == [Held("poems", None)]
    assert held == Held("sql", None)
    assert sorted(h.name for h in listed) == ["poems", "sql"]
    started = time.monotonic()
    answer = engine.chat("sql")
    first_s = time.monotonic() - started
    print(f"vLLM CPU: loading the adapter took {load_s:.2f} s, its first answer {first_s:.2f} s")
    assert answer and answer != base, answer
    assert poems and poems != base, poems
    assert answer != poems
    assert engine.chat(MODEL) == base  # the base is still itself

    async def unload(client):
        adapters = engine.adapters(client, spec)
        await adapters.unload("sql")
        return await adapters.held()

    assert asyncio.run(_with_client(unload)) == [Held("poems", None)]
    r = httpx.post(
        f"{engine.url}/v1/chat/completions",
        json={"model": "sql", "messages": ASK, "max_tokens": 4},
        headers=engine.headers,
        timeout=60,
    )
    assert r.status_code == 404, r.text
