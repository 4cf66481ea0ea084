"""LoRA adapters on a running engine (fleet/agent/adapters.py), against fake engines that
answer as vLLM's and llama-server's APIs do: loaded, unloaded, listed, and refused with the
engine's own words."""

import string

import httpx
import pytest
from hypothesis import given, strategies as st

from fleet.agent.adapters import (
    AdapterError,
    AdapterRef,
    EngineAdapters,
    Held,
    engine_words,
    format_refusal,
)

from .fake_adapter_engines import llama_app, serve, vllm_app
from .helpers import free_port

KEY = "engine-key"


def peft_folder(tmp_path, name="sql"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    return folder


@pytest.fixture
async def client():
    async with httpx.AsyncClient(trust_env=False) as c:
        yield c


@pytest.fixture
async def vllm():
    fake = vllm_app(served="base", api_key=KEY)
    runner = await serve(fake, free_port())
    yield fake
    await runner.cleanup()


def on_vllm(client, vllm, key=KEY):
    return EngineAdapters(client, engine="vllm", base_url=vllm.url, api_key=key)


async def test_vllm_loads_an_adapter_lists_it_and_unloads_it(client, vllm, tmp_path):
    ref = AdapterRef("sql", str(peft_folder(tmp_path)), "peft")
    engine = on_vllm(client, vllm)

    assert await engine.held() == []
    assert await engine.load(ref) == Held("sql", None)
    assert vllm.loaded == {"sql": ref.path}
    assert await engine.held() == [Held("sql", None)]

    await engine.unload("sql")
    assert vllm.loaded == {}
    assert await engine.held() == []


async def test_loading_an_adapter_held_already_is_a_success(client, vllm, tmp_path):
    """The control plane may send a command again when it heard nothing back."""
    ref = AdapterRef("sql", str(peft_folder(tmp_path)), "peft")
    engine = on_vllm(client, vllm)
    await engine.load(ref)
    assert await engine.load(ref) == Held("sql", None)
    assert [c[0] for c in vllm.calls] == ["load", "load"]


async def test_a_failed_load_keeps_the_engines_words_and_its_status(client, vllm, tmp_path):
    ref = AdapterRef("sql", str(tmp_path / "missing"), "peft")
    with pytest.raises(AdapterError) as caught:
        await on_vllm(client, vllm).load(ref)
    said = str(caught.value)
    assert "sql" in said and "HTTP 404" in said
    assert f"No adapter found for {tmp_path / 'missing'}" in said
    assert vllm.loaded == {}


async def test_unloading_an_adapter_the_engine_does_not_hold_is_a_success(client, vllm):
    await on_vllm(client, vllm).unload("never-loaded")
    assert vllm.calls == [("unload", {"lora_name": "never-loaded"})]


async def test_the_engines_key_goes_with_every_call(client, vllm, tmp_path):
    wrong = on_vllm(client, vllm, key="not-the-key")
    with pytest.raises(AdapterError, match="HTTP 401"):
        await wrong.held()
    with pytest.raises(AdapterError, match="HTTP 401.*Unauthorized"):
        await wrong.load(AdapterRef("sql", str(peft_folder(tmp_path)), "peft"))
    assert vllm.loaded == {}


async def test_an_engine_that_does_not_answer_is_said_so(client, tmp_path):
    engine = EngineAdapters(client, engine="vllm", base_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(AdapterError, match="did not answer the request to load the adapter sql"):
        await engine.load(AdapterRef("sql", str(peft_folder(tmp_path)), "peft"))
    with pytest.raises(AdapterError, match="did not answer /v1/models"):
        await engine.held()


async def test_a_gguf_adapter_is_refused_by_vllm_before_asking_it(client, vllm):
    with pytest.raises(AdapterError, match="sql is a gguf adapter.*vllm engine takes peft"):
        await on_vllm(client, vllm).load(AdapterRef("sql", "/a/sql.gguf", "gguf"))
    assert vllm.calls == []


@pytest.fixture
async def llama():
    paths = ["/cache/sql.gguf", "/cache/poems.gguf", "/cache/unnamed.gguf"]
    fake = llama_app(paths, api_key=KEY)
    runner = await serve(fake, free_port())
    yield fake
    await runner.cleanup()


def on_llama(client, llama):
    started = (
        AdapterRef("sql", "/cache/sql.gguf", "gguf"),
        AdapterRef("poems", "/cache/poems.gguf", "gguf"),
    )
    return EngineAdapters(
        client, engine="llamacpp", base_url=llama.url, api_key=KEY, started_with=started
    )


async def test_llama_server_lists_the_adapters_it_started_with_by_index(client, llama):
    """An adapter file the agent did not name (not in the spec) has no name to report."""
    assert await on_llama(client, llama).held() == [Held("sql", 0), Held("poems", 1)]


async def test_llama_server_loads_an_adapter_it_started_with_as_its_index(client, llama):
    held = await on_llama(client, llama).load(AdapterRef("poems", "/cache/poems.gguf", "gguf"))
    assert held == Held("poems", 1)


async def test_llama_server_cannot_load_another_adapter_while_it_runs(client, llama):
    with pytest.raises(AdapterError, match="only when it starts.*without legal"):
        await on_llama(client, llama).load(AdapterRef("legal", "/cache/legal.gguf", "gguf"))


async def test_llama_server_cannot_unload_an_adapter_it_holds(client, llama):
    engine = on_llama(client, llama)
    with pytest.raises(AdapterError, match="cannot unload an adapter while it runs: sql"):
        await engine.unload("sql")
    await engine.unload("legal")  # not held: dropped already


async def test_a_peft_adapter_is_refused_by_llama_server(client, llama):
    with pytest.raises(AdapterError, match="llamacpp engine takes gguf"):
        await on_llama(client, llama).load(AdapterRef("sql", "/cache/sql", "peft"))


def test_engines_that_serve_no_adapters_say_so():
    ref = AdapterRef("sql", "/cache/sql", "peft")
    assert format_refusal("tgi", ref) == "The tgi engine serves no LoRA adapters."
    assert format_refusal("sim", ref) == ""


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("sql", "is an object"),
        ({"name": "SQL", "path": "/a", "format": "peft"}, "'SQL' is not 1 to 64"),
        ({"name": "-sql", "path": "/a", "format": "peft"}, "starting with a letter or digit"),
        ({"name": "a" * 65, "path": "/a", "format": "peft"}, "is not 1 to 64"),
        ({"name": "sql", "format": "peft"}, "sql has no path"),
        ({"name": "sql", "path": "/a", "format": "onnx"}, "format 'onnx' is not peft or gguf"),
        ({"name": "sql", "path": "/a"}, "format None is not"),
    ],
)
def test_an_adapter_that_is_not_one_is_refused_with_why(raw, said):
    with pytest.raises(AdapterError, match=said):
        AdapterRef.from_message(raw)


ALNUM = string.ascii_lowercase + string.digits
NAMES = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(ALNUM),
    st.text(ALNUM + "._-", max_size=63),
)


@given(name=NAMES, path=st.text(min_size=1), fmt=st.sampled_from(["peft", "gguf"]))
def test_an_adapter_reads_back_as_written(name, path, fmt):
    ref = AdapterRef(name, path, fmt)
    assert AdapterRef.from_message(ref.to_message()) == ref


def _is_a_name(n):
    return 0 < len(n) <= 64 and n[0] in ALNUM and set(n) <= set(ALNUM + "._-")


@given(name=st.text(max_size=80).filter(lambda n: not _is_a_name(n)))
def test_no_other_name_is_an_adapters(name):
    with pytest.raises(AdapterError):
        AdapterRef.from_message({"name": name, "path": "/a", "format": "peft"})


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"error": {"message": "The lora adapter 'x' cannot be found."}}, "cannot be found"),
        ({"object": "error", "message": "flat  and\nold"}, "flat and old"),
        ({"detail": "Not Found"}, "Not Found"),
    ],
)
def test_the_engines_words_are_its_error_message(body, said):
    assert said in engine_words(httpx.Response(400, json=body))


def test_an_engines_plain_words_are_kept_and_cut():
    assert engine_words(httpx.Response(500, text="x" * 900)) == "x" * 500
    assert engine_words(httpx.Response(500, text="")) == "(no words)"
