"""Adapters' rules: their fields, whether their base can serve them, names across the catalog
(docs/adapters.md)."""

import hashlib
import json

import pytest
from hypothesis import given, strategies as st

from catalog.domain import (
    AdapterFacts,
    CatalogError,
    adapter_as_model,
    adapter_refusal,
    max_lora_rank,
    parse_adapter,
    parse_model,
    parse_profile,
    validate_adapters,
)


def base(*profiles, name="llama"):
    return parse_model({"name": name, "profiles": list(profiles) or [vllm()]})


def vllm(**kw):
    return {"name": "gpu", "engine": "vllm", "gpu_class": "h100-80g", "adapter_slots": 4, **kw}


def llamacpp(**kw):
    return {"name": "cpu", "engine": "llamacpp", "adapter_slots": 2, **kw}


def adapter(**kw):
    data = {
        "name": "acme-support",
        "base": "llama",
        "source": "hf://acme/support-lora",
        "format": "peft",
        "rank": 8,
        "owner": "team:2",
        **kw,
    }
    return parse_adapter(data)


def test_an_adapter_is_read_with_its_fields():
    a = adapter(aliases=["support"], description="Acme's support tone")
    assert (a.name, a.base, a.format, a.rank, a.owner, a.aliases) == (
        "acme-support",
        "llama",
        "peft",
        8,
        "team:2",
        ("support",),
    )


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("name", "Acme!", "name must be lowercase"),
        ("format", "onnx", "format must be peft"),
        ("rank", 0, "rank must be at least 1"),
        ("rank", 1024, "rank must be at most 512"),
        ("rank", None, "rank is needed"),
        ("owner", "org:1", "owner must be a team or a project"),
        ("owner", "", "owner must be a team or a project"),
        ("source", " ", "source must say where"),
        ("base", "", "base must name"),
        ("aliases", ["Bad Alias"], "alias 'Bad Alias'"),
        ("colour", "red", "unknown field 'colour'"),
    ],
)
def test_bad_fields_are_refused_with_a_sentence(field, value, match):
    with pytest.raises(CatalogError, match=match):
        adapter(**{field: value})


def test_a_base_that_is_not_in_the_catalog_is_refused():
    assert "base model llama is not in the catalog" in adapter_refusal(adapter(), None)


def test_an_engine_that_cannot_serve_the_format_is_refused():
    why = adapter_refusal(adapter(format="gguf", source="/lora/support.gguf"), base(vllm()))
    assert why == (
        "adapter acme-support: base llama runs on vllm, which cannot serve a gguf adapter "
        "(that needs llamacpp)."
    )
    assert "cannot serve a peft adapter" in adapter_refusal(adapter(), base(llamacpp()))


def test_a_base_without_adapter_slots_is_refused():
    why = adapter_refusal(adapter(), base(vllm(adapter_slots=0)))
    assert "profile gpu holds no adapters: give it adapter_slots" in why


def test_a_rank_above_the_profiles_max_lora_rank_is_refused():
    assert adapter_refusal(adapter(rank=16), base(vllm())) is None
    why = adapter_refusal(adapter(rank=32), base(vllm()))
    assert why.endswith(
        "rank 32 is above base llama's max LoRA rank 16 (its profile's --max-lora-rank)."
    )
    assert adapter_refusal(adapter(rank=32), base(vllm(args=["--max-lora-rank", "64"]))) is None
    assert adapter_refusal(adapter(rank=64), base(vllm(args=["--max-lora-rank=64"]))) is None


def test_llamacpp_has_no_rank_bound():
    assert (
        adapter_refusal(
            adapter(format="gguf", source="/lora/support.gguf", rank=256), base(llamacpp())
        )
        is None
    )


def test_the_adapters_own_files_are_believed_over_what_was_typed():
    why = adapter_refusal(adapter(rank=8), base(vllm()), facts=AdapterFacts(rank=16))
    assert why == "adapter acme-support: rank is given as 8 but its adapter files say 16."


@pytest.mark.parametrize(
    ("adapter_arch", "base_arch", "ok"),
    [
        ("llama", "llama", True),
        ("LlamaForCausalLM", "llama", True),
        ("qwen2", "llama", False),
        ("Qwen2ForCausalLM", "LlamaForCausalLM", False),
    ],
)
def test_an_architecture_mismatch_is_refused(adapter_arch, base_arch, ok):
    why = adapter_refusal(
        adapter(),
        base(vllm()),
        facts=AdapterFacts(architecture=adapter_arch),
        base_architecture=base_arch,
    )
    assert (why is None) == ok
    if not ok:
        assert f"it was trained for {adapter_arch}, but base llama is {base_arch}" in why


def test_names_are_unique_across_models_and_adapters():
    models = {"llama": base(vllm())}
    validate_adapters(models, [adapter()])
    with pytest.raises(CatalogError, match="llama is already a name of model llama"):
        validate_adapters(models, [adapter(name="llama")])
    with pytest.raises(CatalogError, match="x is already a name of adapter acme-support"):
        validate_adapters(models, [adapter(aliases=["x"]), adapter(name="other", aliases=["x"])])
    with pytest.raises(CatalogError, match="base model gone is not in the catalog"):
        validate_adapters(models, [adapter(base="gone")])


def test_adapter_slots_need_an_engine_that_loads_adapters():
    assert parse_profile(vllm(), model="m").adapter_slots == 4
    assert (
        parse_profile(
            {"name": "p", "engine": "vllm", "gpu_class": "h100-80g"}, model="m"
        ).adapter_slots
        == 0
    )
    with pytest.raises(CatalogError, match="adapter_slots must be at most 256"):
        parse_profile(vllm(adapter_slots=1000), model="m")


def test_a_profile_without_slots_keeps_its_fingerprint():
    """Replicas started before adapters existed are not restarted by the new field."""
    plain = parse_profile({"name": "p", "engine": "vllm", "gpu_class": "h100-80g"}, model="m")
    before = {
        k: v
        for k, v in plain.to_dict().items()
        if k not in ("routing", "power_watts", "adapter_slots")
    }
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":"))
    assert plain.fingerprint() == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    slotted = parse_profile({**vllm(), "name": "p"}, model="m")
    assert slotted.fingerprint() != plain.fingerprint()


def test_the_adapter_is_routed_as_its_base_under_its_own_name():
    b = parse_model({"name": "llama", "profiles": [vllm(), llamacpp()], "fallbacks": []})
    m = adapter_as_model(adapter(aliases=["s"]), b)
    assert (m.name, m.aliases, m.owner, m.fallbacks) == ("acme-support", ("s",), "team:2", ())
    assert [p.name for p in m.profiles] == ["gpu"]  # the llama.cpp one cannot hold peft


@given(st.integers(min_value=1, max_value=512), st.integers(min_value=1, max_value=512))
def test_a_rank_is_accepted_exactly_when_within_the_bound(rank, bound):
    b = base(vllm(args=[f"--max-lora-rank={bound}"]))
    assert max_lora_rank(b.profiles[0]) == bound
    assert (adapter_refusal(adapter(rank=rank), b) is None) == (rank <= bound)


@pytest.mark.parametrize(
    "source", ["hf://acme/sql-lora", "relative/sql.gguf", "/a,b/sql.gguf", "/a:b/sql.gguf"]
)
def test_a_gguf_adapter_is_a_path_llama_server_can_take(source):
    data = {"name": "sql", "base": "llama", "source": source, "format": "gguf", "rank": 8}
    with pytest.raises(CatalogError, match="a gguf adapter's source must be an absolute path"):
        parse_adapter({**data, "owner": "team:1"})
    assert parse_adapter({**data, "source": "/lora/sql.gguf", "owner": "team:1"}).format == "gguf"
