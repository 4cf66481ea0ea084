"""The agent's side of LoRA adapters: the engines' flags for a shard's adapter slots and
start adapters, the load_adapter / unload_adapter commands answered with adapter_status,
and the adapters each engine_load entry says its engine holds. Engines are the fakes of
fake_adapter_engines.py, shaped like vLLM's and llama-server's APIs."""

import asyncio

import pytest

from fleet.agent.adapters import AdapterRef
from fleet.agent.engines import EngineError, NodeContext, ShardSpec, build_command
from fleet.agent.ledger import Entry
from fleet.agent.supervisor import READY, STARTING, Shard, Supervisor

from .fake_adapter_engines import llama_app, serve, vllm_app
from .helpers import PATIENCE_S, free_port
from .test_client import TOKEN, FakeControlPlane, make_agent

KEY = "engine-key"
SQL = AdapterRef("sql", "/cache/adapters/sql", "peft")
POEMS = AdapterRef("poems", "/cache/adapters/poems", "peft")
SQL_GGUF = AdapterRef("sql", "/cache/adapters/sql.gguf", "gguf")
POEMS_GGUF = AdapterRef("poems", "/cache/adapters/poems.gguf", "gguf")


def spec(engine="vllm", *, slots=2, adapters=(), args=(), shard_id="s1"):
    return ShardSpec(
        shard_id=shard_id,
        model="base",
        source="/weights/base",
        profile={"name": "lora-cpu", "engine": engine, "args": list(args)},
        api_key=KEY,
        threads=2,
        adapters=tuple(adapters),
        adapter_slots=slots,
    )


def command(s):
    return build_command(s, NodeContext(port=20001, cpu_count=4))


def test_vllm_gets_lora_enabled_with_the_profiles_slots_and_its_start_adapters():
    cmd = command(spec(slots=4, adapters=[SQL, POEMS]))
    tail = cmd.argv[cmd.argv.index("--enable-lora") :]
    assert tail == [
        "--enable-lora",
        "--max-loras",
        "4",
        "--max-lora-rank",
        "16",
        "--lora-modules",
        "sql=/cache/adapters/sql",
        "poems=/cache/adapters/poems",
    ]
    # Without it vLLM answers 404 to /v1/load_lora_adapter.
    assert cmd.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_a_profiles_own_lora_flags_are_not_given_twice():
    cmd = command(spec(slots=2, args=["--max-lora-rank", "64", "--enable-lora"]))
    assert cmd.argv.count("--enable-lora") == 1
    assert cmd.argv.count("--max-lora-rank") == 1
    assert cmd.argv[cmd.argv.index("--max-lora-rank") + 1] == "64"
    assert "--lora-modules" not in cmd.argv


def test_the_sim_engine_gets_its_slots_and_start_adapters():
    cmd = command(spec("sim", slots=3, adapters=[SQL]))
    tail = cmd.argv[cmd.argv.index("--max-loras") :]
    assert tail[:4] == ["--max-loras", "3", "--lora", "sql=/cache/adapters/sql"]


def test_a_profile_without_adapter_slots_gets_no_lora_flags():
    for engine in ("vllm", "llamacpp", "sim"):
        cmd = command(spec(engine, slots=0))
        assert not [a for a in cmd.argv if a.startswith("--") and "lora" in a], engine
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in cmd.env


def test_llama_server_gets_its_adapters_in_order_at_scale_zero():
    """At --lora's scale 1.0 llama-server would apply every adapter to requests that name
    none (the base's own); a request names one by its index to apply it."""
    cmd = command(spec("llamacpp", adapters=[SQL_GGUF, POEMS_GGUF]))
    tail = cmd.argv[cmd.argv.index("--lora-init-without-apply") :]
    assert tail == [
        "--lora-init-without-apply",
        "--lora-scaled",
        "/cache/adapters/sql.gguf:0",
        "--lora-scaled",
        "/cache/adapters/poems.gguf:0",
    ]
    assert "--lora" not in cmd.argv


@pytest.mark.parametrize(
    ("s", "said"),
    [
        (
            spec(slots=1, adapters=[SQL, POEMS]),
            "start with 2 adapters.*lora-cpu has 1 adapter slots",
        ),
        (spec(slots=0, adapters=[SQL]), "1 adapters.*has 0 adapter slots"),
        (spec("llamacpp", adapters=[SQL]), "sql is a peft adapter.*llamacpp engine takes gguf"),
        (spec("vllm", adapters=[SQL_GGUF]), "sql is a gguf adapter.*vllm engine takes peft"),
        (
            spec("llamacpp", adapters=[AdapterRef("sql", "/a,b/sql.gguf", "gguf")]),
            "path /a,b/sql.gguf: it holds a comma or a colon",
        ),
        (spec(slots=-1), "asks for -1 adapter slots"),
    ],
)
def test_a_shard_whose_adapters_do_not_fit_is_refused_with_why(s, said):
    with pytest.raises(EngineError, match=said):
        command(s)


def start_msg(**extra):
    return {
        "type": "start_shard",
        "shard_id": "s1",
        "model": "base",
        "profile": {"name": "lora-cpu", "engine": "vllm"},
        **extra,
    }


def test_start_shard_carries_the_adapters_and_slots():
    got = ShardSpec.from_message(
        start_msg(adapters=[SQL.to_message(), POEMS.to_message()], adapter_slots=4)
    )
    assert got.adapters == (SQL, POEMS)
    assert got.adapter_slots == 4
    plain = ShardSpec.from_message(start_msg())
    assert (plain.adapters, plain.adapter_slots) == ((), 0)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"adapters": [{"name": "sql", "path": "/a", "format": "onnx"}]}, "format 'onnx'"),
        ({"adapters": ["sql"]}, "is an object"),
        ({"adapter_slots": "many"}, "malformed field"),
    ],
)
def test_a_start_shard_with_a_malformed_adapter_is_refused(extra, said):
    with pytest.raises(EngineError, match=said):
        ShardSpec.from_message(start_msg(**extra))


def test_an_adopted_engine_keeps_its_adapters():
    """The ledger gives an agent started again what its engine was started with: the names
    llama-server's adapters are reported under."""
    entry = Entry(
        spec=spec("llamacpp", adapters=[SQL_GGUF, POEMS_GGUF]),
        pid=4242,
        start_time=1,
        boot="b",
        port=20001,
        log_path="",
        state="ready",
        started_at=1.0,
    )
    again = Entry.from_json(entry.to_json())
    assert again.spec.adapters == (SQL_GGUF, POEMS_GGUF)
    assert again.spec.adapter_slots == 2


class Node:
    """A supervisor whose shard s1 is ready on a fake engine, with its messages kept."""

    def __init__(self, tmp_path, fake, port, s):
        self.fake = fake
        self.sup = Supervisor(tmp_path, advertise_addr="127.0.0.1")
        self.messages = []
        self.sup.on_change = self.messages.append
        self.sup._shards[s.shard_id] = Shard(spec=s, state=READY, port=port)

    def statuses(self):
        return [m for m in self.messages if m["type"] == "adapter_status"]


@pytest.fixture
async def vllm_node(tmp_path):
    fake, port = vllm_app(api_key=KEY), free_port()
    runner = await serve(fake, port)
    node = Node(tmp_path, fake, port, spec("vllm", slots=2))
    yield node
    await node.sup.close()
    await runner.cleanup()


def peft_folder(tmp_path, name):
    folder = tmp_path / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    return {"name": name, "path": str(folder), "format": "peft"}


async def test_load_adapter_is_answered_loaded_and_engine_load_says_it_is_held(vllm_node, tmp_path):
    sql = peft_folder(tmp_path, "sql")
    await vllm_node.sup.load_adapter({"type": "load_adapter", "shard_id": "s1", "adapter": sql})
    assert vllm_node.statuses() == [
        {"type": "adapter_status", "shard_id": "s1", "name": "sql", "state": "loaded"}
    ]
    assert vllm_node.fake.loaded == {"sql": sql["path"]}
    [load] = await vllm_node.sup.engine_loads()
    assert load["shard_id"] == "s1"
    assert load["adapters"] == [{"name": "sql", "engine_id": None}]

    await vllm_node.sup.unload_adapter({"type": "unload_adapter", "shard_id": "s1", "name": "sql"})
    assert vllm_node.statuses()[-1]["state"] == "unloaded"
    [load] = await vllm_node.sup.engine_loads()
    assert load["adapters"] == []  # holds none, which is known


async def test_a_load_the_engine_refuses_is_failed_with_its_words(vllm_node, tmp_path):
    missing = {"name": "sql", "path": str(tmp_path / "nowhere"), "format": "peft"}
    await vllm_node.sup.load_adapter({"type": "load_adapter", "shard_id": "s1", "adapter": missing})
    [status] = vllm_node.statuses()
    assert status["state"] == "failed" and status["name"] == "sql"
    assert "HTTP 404" in status["detail"]
    assert f"No adapter found for {tmp_path / 'nowhere'}" in status["detail"]


@pytest.mark.parametrize(
    ("msg", "said"),
    [
        (
            {"shard_id": "s9", "adapter": {"name": "sql", "path": "/a", "format": "peft"}},
            "Shard s9 does not run on this node.",
        ),
        (
            {"shard_id": "s1", "adapter": {"name": "sql", "path": "/a", "format": "gguf"}},
            "sql is a gguf adapter",
        ),
        ({"shard_id": "s1", "adapter": {"name": "sql", "path": ""}}, "sql has no path"),
    ],
)
async def test_a_load_that_cannot_be_tried_is_failed_with_why(vllm_node, msg, said):
    await vllm_node.sup.load_adapter({"type": "load_adapter", **msg})
    [status] = vllm_node.statuses()
    assert status["state"] == "failed" and status["name"] == "sql"
    assert said in status["detail"]
    assert vllm_node.fake.calls == []


async def test_a_command_without_its_ids_is_not_answered(vllm_node):
    await vllm_node.sup.load_adapter({"type": "load_adapter", "adapter": "sql"})
    await vllm_node.sup.unload_adapter({"type": "unload_adapter", "shard_id": "s1"})
    assert vllm_node.messages == []


async def test_adapters_wait_for_a_ready_engine_with_slots(tmp_path):
    sup = Supervisor(tmp_path, advertise_addr="127.0.0.1")
    said = []
    sup.on_change = said.append
    sup._shards["s1"] = Shard(spec=spec(slots=2), state=STARTING, port=free_port())
    sup._shards["s2"] = Shard(spec=spec(slots=0, shard_id="s2"), state=READY, port=free_port())
    for shard_id in ("s1", "s2"):
        await sup.unload_adapter({"type": "unload_adapter", "shard_id": shard_id, "name": "sql"})
    assert [m["detail"] for m in said] == [
        "Shard s1 is starting, not ready.",
        "Shard s2's profile lora-cpu serves no adapters (0 adapter slots).",
    ]
    await sup.close()


async def test_engine_load_names_llama_servers_adapters_by_index(tmp_path):
    fake, port = llama_app(["/cache/adapters/sql.gguf", "/cache/adapters/poems.gguf"]), free_port()
    runner = await serve(fake, port)
    node = Node(tmp_path, fake, port, spec("llamacpp", adapters=[SQL_GGUF, POEMS_GGUF]))
    try:
        [load] = await node.sup.engine_loads()
        assert load["adapters"] == [
            {"name": "sql", "engine_id": 0},
            {"name": "poems", "engine_id": 1},
        ]
    finally:
        await node.sup.close()
        await runner.cleanup()


async def test_engine_load_leaves_adapters_out_where_unknown_or_not_served(tmp_path):
    """An engine whose adapters cannot be read, and one whose profile serves none, report
    no adapters field at all: absent is unknown, where [] says it holds none."""
    sup = Supervisor(tmp_path, advertise_addr="127.0.0.1")
    fake, port = vllm_app(api_key="another-key"), free_port()  # answers 401 to ours
    runner = await serve(fake, port)
    sup._shards["s1"] = Shard(spec=spec(slots=2), state=READY, port=port)
    sup._shards["s2"] = Shard(spec=spec(slots=0, shard_id="s2"), state=READY, port=port)
    try:
        # Nor does the fake serve /metrics: neither has a figure, so neither is an entry.
        assert await sup.engine_loads() == []
    finally:
        await sup.close()
        await runner.cleanup()


async def test_the_agent_answers_adapter_commands_and_reports_what_is_held(tmp_path):
    """Over the websocket: load_adapter is answered adapter_status loaded, and the next
    engine_load says the engine holds it."""
    fake, port = vllm_app(api_key=KEY), free_port()
    runner = await serve(fake, port)
    cp = FakeControlPlane(TOKEN)
    await cp.start()
    agent = make_agent(tmp_path, cp.url)
    agent.supervisor._shards["s1"] = Shard(spec=spec(slots=2), state=READY, port=port)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await cp.until("register")
        sql = peft_folder(tmp_path, "sql")
        await cp.send({"type": "load_adapter", "shard_id": "s1", "adapter": sql})
        [status] = await cp.until("adapter_status")
        assert status == {"type": "adapter_status", "shard_id": "s1", "name": "sql"} | {
            "state": "loaded"
        }
        held = [{"name": "sql", "engine_id": None}]
        async with asyncio.timeout(PATIENCE_S):
            while not any(
                entry.get("adapters") == held
                for load in cp.of("engine_load")
                for entry in load["shards"]
            ):
                await asyncio.sleep(0.05)
        await cp.send({"type": "unload_adapter", "shard_id": "s1", "name": "sql"})
        await cp.until("adapter_status", state="unloaded")
        assert fake.loaded == {}
    finally:
        stop.set()
        await task
        await cp.close()
        await runner.cleanup()


def test_an_adapters_answer_outlives_a_reconnect_only_for_a_shard_that_runs(tmp_path):
    """The register lists the shards that run, not their adapters: a command's answer is
    kept for a listed shard; for one that ended meanwhile only its last status is."""
    agent = make_agent(tmp_path, "ws://127.0.0.1:1/ws/agent/")
    for msg in (
        {"type": "adapter_status", "shard_id": "s1", "name": "sql", "state": "loaded"},
        {"type": "shard_status", "shard_id": "s7", "state": "ready"},
        {"type": "adapter_status", "shard_id": "s7", "name": "sql", "state": "loaded"},
        {"type": "shard_status", "shard_id": "s7", "state": "failed"},
    ):
        agent._queue_status(msg)
    agent._trim_outbox({"s1"})
    assert [(m["type"], m["shard_id"], m["state"]) for m in agent._outbox] == [
        ("shard_status", "s7", "failed"),
        ("adapter_status", "s1", "loaded"),
    ]
    agent.load_sampler.close()


async def test_engine_load_says_the_slots_the_engines_command_set_and_nothing_when_unknown(
    vllm_node,
):
    [load] = await vllm_node.sup.engine_loads()
    assert "slots" not in load  # left to the engine's default: unknown, not 0
    vllm_node.sup._shards["s1"].slots = 8  # as the launch read it from --max-num-seqs 8
    [load] = await vllm_node.sup.engine_loads()
    assert load["slots"] == 8
