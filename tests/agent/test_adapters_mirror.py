"""An adapter whose source the mirror holds (``hf://org/repo``): the agent fetches its files
from the control plane's mirror into its weight cache, then has the engine load the cached
folder; the files are kept from reclaim while the engine holds them, and a fetch that fails
is a failed load with the cache's sentence, the engine never asked. The mirror is the test
hub's plain file server; the adapter a PEFT folder written by tests/lora_files.py; the
engine the fake vLLM of fake_adapter_engines.py."""

from __future__ import annotations

import asyncio
import hashlib
import threading

import pytest

from fleet.agent.cache import WeightCache
from fleet.agent.supervisor import READY, Shard, Supervisor
from mirror.domain.refs import FolderRef, WeightsRef
from tests.lora_files import PEFT_CONFIG, PEFT_WEIGHTS, BaseDims, peft_adapter
from tests.mirror.hub import Hub

from .fake_adapter_engines import serve, vllm_app
from .helpers import free_port
from .test_adapters_agent import KEY, spec

SOURCE = "hf://acme/sql-lora"
DIMS = BaseDims(architecture="llama", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16)


@pytest.fixture
def adapter_files(tmp_path) -> dict[str, bytes]:
    """A PEFT adapter's two files, as the mirror holds them."""
    folder = peft_adapter(tmp_path / "written", dims=DIMS, seed=7, rank=4)
    return {name: (folder / name).read_bytes() for name in (PEFT_CONFIG, PEFT_WEIGHTS)}


@pytest.fixture
def mirror(adapter_files):
    hub = Hub(plain={hashlib.sha256(d).hexdigest(): d for d in adapter_files.values()}).start()
    yield hub
    hub.stop()


def weights(mirror, files: dict[str, bytes]) -> dict:
    """The ``weights`` a load_adapter carries for a folder of the mirror."""
    refs = [
        WeightsRef(
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            url=f"{mirror.url}/files/{hashlib.sha256(data).hexdigest()}",
            file=path,
        )
        for path, data in sorted(files.items())
    ]
    return FolderRef(files=tuple(refs), name=SOURCE).message()


def load_msg(weights_msg: dict) -> dict:
    adapter = {"name": "sql", "path": SOURCE, "format": "peft"}
    return {"type": "load_adapter", "shard_id": "s1", "adapter": adapter, "weights": weights_msg}


@pytest.fixture
async def node(tmp_path, mirror):
    """A supervisor with a weight cache whose shard s1 is ready on a fake vLLM."""
    fake, port = vllm_app(api_key=KEY), free_port()
    runner = await serve(fake, port)
    cache = WeightCache(tmp_path / "cache", server=mirror.url, bearer=lambda: "llmgw_node_x")
    sup = Supervisor(tmp_path / "state", advertise_addr="127.0.0.1", cache=cache)
    said: list[dict] = []
    sup.on_change = said.append
    sup._shards["s1"] = Shard(spec=spec("vllm", slots=2), state=READY, port=port)
    yield sup, fake, said
    await sup.close()
    await runner.cleanup()


async def test_the_mirrors_files_are_fetched_and_the_engine_loads_the_cached_folder(
    node, mirror, adapter_files
):
    sup, fake, said = node
    await sup.load_adapter(load_msg(weights(mirror, adapter_files)))

    assert said == [{"type": "adapter_status", "shard_id": "s1", "name": "sql", "state": "loaded"}]
    folder = sup.cache.folder_path(FolderRef.from_message(weights(mirror, adapter_files)))
    assert fake.loaded == {"sql": str(folder)}  # the cached copy, not the hf:// source
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == adapter_files
    digests = {hashlib.sha256(d).hexdigest() for d in adapter_files.values()}
    assert sup.weights_in_use() == digests  # held: reclaim leaves them alone
    assert {w["source"] for w in sup.cache.held()} == {SOURCE}

    # Loaded again (another replica of the node, or asked twice): nothing fetched again.
    await sup.unload_adapter({"type": "unload_adapter", "shard_id": "s1", "name": "sql"})
    assert said[-1]["state"] == "unloaded"
    assert sup.weights_in_use() == set()  # unloaded: reclaim may take them
    await sup.load_adapter(load_msg(weights(mirror, adapter_files)))
    assert said[-1]["state"] == "loaded"
    assert sum(mirror.gets.values()) == 2


async def test_weights_the_mirror_cannot_serve_fail_the_load_with_the_caches_sentence(
    node, mirror, adapter_files
):
    sup, fake, said = node
    missing = {**adapter_files, PEFT_WEIGHTS: b"not what the mirror holds"}

    await sup.load_adapter(load_msg(weights(mirror, missing)))

    [status] = said
    assert status["state"] == "failed" and status["name"] == "sql"
    assert status["detail"].startswith(
        "The adapter sql's weights could not be put in this node's cache: "
        f"The weights {PEFT_WEIGHTS} could not be fetched from the mirror:"
    )
    assert fake.calls == []  # the engine is never asked to load what is not there
    assert sup.weights_in_use() == set()


async def test_an_engine_refusing_the_fetched_adapter_leaves_its_files_unused(
    node, mirror, adapter_files
):
    sup, fake, said = node
    # A folder without adapter_config.json: vLLM answers 404 "No adapter found".
    only_weights = {PEFT_WEIGHTS: adapter_files[PEFT_WEIGHTS]}

    await sup.load_adapter(load_msg(weights(mirror, only_weights)))

    [status] = said
    assert status["state"] == "failed" and "No adapter found" in status["detail"]
    assert [call for call, _ in fake.calls] == ["load"]
    assert sup.weights_in_use() == set()


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"files": [{"sha256": "x", "size": 1, "url": "/f", "path": "a"}]}, "are not usable"),
        (None, ""),  # no weights: the path as given, as before
    ],
)
async def test_weights_that_are_not_a_mirror_reference_are_refused_before_any_fetch(
    node, mirror, raw, said
):
    sup, fake, statuses = node
    msg = load_msg(raw)
    if raw is None:
        del msg["weights"]
    await sup.load_adapter(msg)
    [status] = statuses
    if said:
        assert status["state"] == "failed" and said in status["detail"]
        assert fake.calls == []
    else:  # the fake engine finds no adapter at hf://…: the engine's words, as before
        assert [call for call, _ in fake.calls] == ["load"]
        assert fake.calls[0][1]["lora_path"] == SOURCE
    assert sum(mirror.gets.values()) == 0


async def test_an_agent_without_a_cache_says_it_cannot_fetch_an_adapter(tmp_path, mirror):
    sup = Supervisor(tmp_path, advertise_addr="127.0.0.1")
    said: list[dict] = []
    sup.on_change = said.append
    sup._shards["s1"] = Shard(spec=spec("vllm", slots=2), state=READY, port=free_port())
    await sup.load_adapter(load_msg(weights(mirror, {"a.json": b"{}"})))
    [status] = said
    assert status["detail"] == (
        "This agent keeps no weight cache (--cache-dir): the adapter sql's weights cannot be "
        "fetched from the mirror."
    )
    await sup.close()


async def test_engine_load_says_how_far_an_adapters_fetch_got_while_it_runs(
    node, mirror, adapter_files
):
    """The gateway's 503 for a request waiting on the load says it (docs/adapters.md)."""
    sup, fake, said = node
    mirror.hold = threading.Event()
    total = sum(len(d) for d in adapter_files.values())
    loading = asyncio.ensure_future(sup.load_adapter(load_msg(weights(mirror, adapter_files))))
    try:
        async with asyncio.timeout(10):
            while not mirror.gets:  # the first file asked for, and held back
                await asyncio.sleep(0.02)
        [entry] = await sup.engine_loads()
        assert entry["adapters_fetching"] == [{"name": "sql", "done": 0, "total": total}]
    finally:
        mirror.hold.set()
    await loading

    assert said[-1]["state"] == "loaded"
    [entry] = await sup.engine_loads()
    assert "adapters_fetching" not in entry
    assert sup._shards["s1"].adapter_fetches == {}
