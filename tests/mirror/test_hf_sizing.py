"""Sizing safetensors models from their metadata (issue 36, item 2): real config.json
contents of several architectures, their tensors as the checkpoints hold them, and the
figures worked out by hand beside each. Pure: no database."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from mirror.domain.gpus import GIB, gpu_options
from mirror.domain.hf import HfError, Tensor, hf_model
from mirror.domain.hf_sizing import hf_plan, serve_hf_model
from mirror.domain.sizing import SizingError
from tests.domain.builders import cpu_node, gpu_node, rooms

from .hf_configs import (
    DEEPSEEK_V3,
    GEMMA2_9B,
    GEMMA3_27B,
    LLAMA_31_8B,
    LLAMA_31_8B_AWQ,
    LLAMA_33_70B,
    MISTRAL_7B,
    MIXTRAL_8X7B,
    QWEN3_14B,
    QWEN3_235B,
    QWEN25_7B,
    QWEN25_7B_YARN,
    QWEN25_14B,
    awq_tensors,
    dense_tensors,
)


@pytest.mark.parametrize(
    ("config", "parameters", "kv_per_token", "context"),
    [
        # 32 layers × 8 KV heads × 128 × 2 × 2 bytes; Llama 3's rope scaling is already in
        # max_position_embeddings.
        (LLAMA_31_8B, 8_030_261_248, 32 * 8 * 128 * 2 * 2, 131_072),
        (LLAMA_33_70B, 70_553_706_496, 80 * 8 * 128 * 2 * 2, 131_072),
        # GQA with 4 KV heads; its sliding_window is off (use_sliding_window false).
        (QWEN25_7B, 7_615_616_512, 28 * 4 * 128 * 2 * 2, 32_768),
        # YaRN: the original 32,768 × 4.
        (QWEN25_7B_YARN, 7_615_616_512, 28 * 4 * 128 * 2 * 2, 131_072),
        # head_dim 256 given (not 3584 / 16).
        (GEMMA2_9B, 9_241_705_984, 42 * 8 * 256 * 2 * 2, 8_192),
        (MISTRAL_7B, 7_241_732_096, 32 * 8 * 128 * 2 * 2, 32_768),
        # Every expert counted: 46.7B, though 12.9B are active a token.
        (MIXTRAL_8X7B, 46_702_792_704, 32 * 8 * 128 * 2 * 2, 32_768),
    ],
)
def test_parameters_cache_and_context_from_real_configs(config, parameters, kv_per_token, context):
    m = hf_model(config, dense_tensors(config))

    assert (m.parameters, m.kv_per_token, m.context_length) == (parameters, kv_per_token, context)
    assert m.weights_bytes == parameters * 2  # BF16


def test_gemma_2_keeps_a_window_in_every_other_layer():
    m = hf_model(GEMMA2_9B, dense_tensors(GEMMA2_9B))
    per_layer = 8 * 256 * 2 * 2

    assert m.windows[:4] == (4096, None, 4096, None)
    # 21 global layers hold all 8,192 tokens, 21 windowed ones 4,096.
    assert m.kv_cache_bytes(8192) == 21 * 8192 * per_layer + 21 * 4096 * per_layer
    assert m.kv_cache_bytes(1000) == 42 * 1000 * per_layer  # below the window: every layer


def test_gemma_3_reads_text_config_and_keeps_windows_in_five_layers_of_six():
    m = hf_model(GEMMA3_27B, dense_tensors(GEMMA3_27B))

    # 62 layers: the 6th, 12th, … 60th attend globally (10), 52 keep 1,024.
    assert m.windows.count(None) == 10 and m.windows.count(1024) == 52
    assert m.windows[5] is None and m.windows[4] == 1024
    assert m.kv_per_layer == 16 * 128 * 2 * 2
    # Linear scaling is already in its (default) 131,072.
    assert m.context_length == 131_072
    assert m.kv_cache_bytes(32768) == (10 * 32768 + 52 * 1024) * 8192
    assert "52 of 62 layers keep a window of 1,024 tokens" in m.said


def test_mistral_keeps_a_window_in_every_layer_and_mixtral_in_none():
    mistral = hf_model(MISTRAL_7B, dense_tensors(MISTRAL_7B))
    mixtral = hf_model(MIXTRAL_8X7B, dense_tensors(MIXTRAL_8X7B))

    assert mistral.kv_cache_bytes(32768) == 32 * 4096 * 8 * 128 * 2 * 2
    assert mixtral.kv_cache_bytes(32768) == 32 * 32768 * 8 * 128 * 2 * 2


def test_deepseek_v3_caches_one_latent_a_layer_whatever_the_tp():
    tensors = [
        Tensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3", (576, 7168)),
        Tensor("model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv", "F32", (5, 56)),
        Tensor("model.embed_tokens.weight", "BF16", (129280, 7168)),
    ]
    m = hf_model(DEEPSEEK_V3, tensors)

    # 61 layers × (512 + 64) × 2 bytes, one "head": not split between GPUs.
    assert m.kv_per_token == 61 * 576 * 2 == 70_272
    assert m.mla and m.kv_share(8) == 1.0
    # YaRN: 4,096 × 40.
    assert m.context_length == 163_840
    assert m.quantization == "fp8"
    assert m.bytes_by_dtype == {"BF16": 129280 * 7168 * 2, "F32": 5 * 56 * 4, "F8_E4M3": 576 * 7168}
    # Scales are bytes, not parameters.
    assert m.parameters == 576 * 7168 + 129280 * 7168


def test_awq_int4_is_sized_as_stored_and_counts_eight_weights_an_i32():
    m = hf_model(LLAMA_31_8B_AWQ, awq_tensors(LLAMA_31_8B_AWQ))

    # The same 8,030,261,248 weights, most of them in 4 bits.
    assert m.parameters == 8_030_261_248
    linear = 8_030_261_248 - 2 * 128256 * 4096 - 65 * 4096  # less embeddings, head, norms
    assert m.bytes_by_dtype["I32"] == linear // 2 + linear // 128 // 2
    assert m.weights_bytes < 6 * GIB  # against 15 GiB in BF16
    assert m.quantization == "awq"


def test_heads_split_between_gpus_but_never_below_one():
    m = hf_model(QWEN25_7B, dense_tensors(QWEN25_7B))  # 4 KV heads

    assert [m.kv_share(tp) for tp in (1, 2, 4, 8)] == [1.0, 0.5, 0.25, 0.25]


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({**LLAMA_31_8B, "num_hidden_layers": 0}, "no positive num_hidden_layers"),
        ({k: v for k, v in LLAMA_31_8B.items() if k != "hidden_size"}, "no positive hidden_size"),
        ([], "not a JSON object"),
    ],
)
def test_a_config_sizing_cannot_use_is_a_sentence(config, said):
    with pytest.raises(HfError, match=said):
        hf_model(config, dense_tensors(LLAMA_31_8B)[:3])


def test_an_unknown_dtype_is_a_sentence():
    with pytest.raises(HfError, match="has dtype F4, which sizing does not know"):
        hf_model(LLAMA_31_8B, [Tensor("x", "F4", (2,))])


def test_llama_70b_on_h100s_takes_the_smallest_tp_that_holds_a_sequence():
    m = hf_model(LLAMA_33_70B, dense_tensors(LLAMA_33_70B))
    # Two nodes of eight H100s that report 81,559 MiB (79.6 GiB); 0.9 of it is 71.7 GiB.
    node = gpu_node("gpu-a", gpus=8)
    node = replace(node, gpus=tuple(replace(g, memory_mb=81559) for g in node.gpus))

    p = hf_plan(m, title="Llama 3.3 70B", ctx=131072, rooms=rooms(node))

    (option,) = p.gpus
    # 131.4 GiB of weights: tp 1 leaves nothing; tp 2 leaves 71.7 - 65.7 = 6.0 GiB a GPU,
    # 5.97 GiB / (80 × 4 heads × 128 × 4 bytes) = 39,154 tokens, below 131,072; tp 4 leaves
    # 71.7 - 32.9 = 38.8 GiB, 38.8 GiB / 81,920 bytes = 508,900 tokens, 3 sequences.
    assert [t.tp for t in option.tries] == [1, 2, 4]
    assert option.tp == 4 and option.chosen.sequences == 3
    assert option.fits == ("gpu-a",)
    assert option.said == (
        "Llama 3.3 70B needs 131 GiB of weights; on h100-80g (79.6 GiB a GPU) at 0.9 utilisation, "
        "tp 1 leaves nothing for the KV cache; tp 2 leaves about 6.0 GiB a GPU, some 39,154 "
        "tokens of KV cache, below the 131,072 asked; tp 4 leaves about 38.8 GiB a GPU, "
        "3 sequences of 131,072."
    )


def test_nothing_fits_said_with_the_figures_and_serve_refuses():
    m = hf_model(LLAMA_33_70B, dense_tensors(LLAMA_33_70B))

    p = hf_plan(
        m, title="Llama 3.3 70B", ctx=32768, rooms=rooms(gpu_node("l4", gpus=2, gpu_class="l4-24g"))
    )

    (option,) = p.gpus
    assert option.chosen is None
    assert option.said.endswith(
        "a node has at most 2 l4-24g GPUs and no fabric (llmgw.io/fabric) joins such nodes for tp 4."
    )
    with pytest.raises(SizingError, match="tp 2 leaves nothing for the KV cache"):
        serve_hf_model(p, name="big", source="meta-llama/Llama-3.3-70B-Instruct")


def test_past_one_node_only_where_a_fabric_joins_nodes():
    m = hf_model(LLAMA_33_70B, dense_tensors(LLAMA_33_70B))
    pairs = [gpu_node(f"n{i}", gpus=2, fabric="ib-1") for i in range(2)]

    p = hf_plan(m, title="Llama 3.3 70B", ctx=65536, rooms=rooms(*pairs))

    (option,) = p.gpus
    # 2 GPUs a node, and tp 2 holds 41,000 tokens, not 65,536: tp 4 over 2 nodes of the fabric.
    assert (option.tp, option.chosen.nodes) == (4, 2)
    assert sorted(option.fits) == ["n0", "n1"]
    data = serve_hf_model(p, name="big", source="meta-llama/Llama-3.3-70B-Instruct")
    assert data["profiles"][0] | {} == {
        "name": "h100-80g",
        "engine": "vllm",
        "gpu_class": "h100-80g",
        "tp": 4,
        "nodes": 2,
        "gpus_per_node": 2,
        "args": [
            "--max-model-len", "65536",
            "--gpu-memory-utilization", "0.9",
        ],
    }  # fmt: skip


def test_llama_cpp_stays_on_one_node_though_a_fabric_joins_nodes():
    m = hf_model(LLAMA_33_70B, dense_tensors(LLAMA_33_70B))
    pairs = [gpu_node(f"n{i}", gpus=2, fabric="ib-1") for i in range(2)]

    (option,) = gpu_options(
        m, ctx=65536, rooms=rooms(*pairs), utilization=0.9, title="x", engine="llamacpp"
    )

    # vLLM takes tp 4 over the two nodes (above); llama.cpp cannot span them.
    assert option.chosen is None
    assert option.said.endswith("a node has at most 2 h100-80g GPUs, and llama.cpp runs on one.")


def test_serve_makes_a_profile_per_class_that_fits_those_free_now_first():
    m = hf_model(LLAMA_31_8B, dense_tensors(LLAMA_31_8B))
    busy = gpu_node("a100", gpus=1, gpu_class="a100-80g", unhealthy=[0])
    free = gpu_node("l40s", gpus=1, gpu_class="l40s-48g")

    p = hf_plan(m, title="Llama 3.1 8B", ctx=None, rooms=rooms(busy, free, cpu_node("cpu-1")))

    # The default: 32,768 a sequence (it was trained on 131,072).
    assert p.ctx == 32768
    assert [o.gpu_class for o in p.gpus] == ["a100-80g", "l40s-48g"]
    assert p.gpus[0].fits == () and "has 0 free a100-80g GPUs of 1" in p.gpus[0].blocked[0]
    data = serve_hf_model(
        p, name="llama", source="x", profile_overrides={"node_selector": {"zone": "a"}}
    )
    assert [pr["gpu_class"] for pr in data["profiles"]] == ["l40s-48g", "a100-80g"]
    assert all(pr["tp"] == 1 and pr["node_selector"] == {"zone": "a"} for pr in data["profiles"])
    assert data["context_length"] == 32768


def test_a_context_past_the_trained_one_or_a_bad_utilisation_is_a_sentence():
    m = hf_model(MISTRAL_7B, dense_tensors(MISTRAL_7B))

    with pytest.raises(SizingError, match="trained on 32,768 tokens"):
        hf_plan(m, title="Mistral 7B", ctx=65536, rooms=[])
    with pytest.raises(SizingError, match="gpu_memory_utilization must be a fraction"):
        hf_plan(m, title="Mistral 7B", ctx=None, rooms=[], utilization=1.5)
    with pytest.raises(SizingError, match="no node of the fleet has any"):
        serve_hf_model(hf_plan(m, title="Mistral 7B", ctx=None, rooms=[]), name="m", source="x")


# What vLLM's own memory profile logged for these models (docs/benchmarks.md, "Sizing
# against vLLM's own figures"): the KV cache memory it had, the tokens that held, and our
# tokens for the same memory from the config alone. Its figures are printed rounded and
# counted in whole blocks of 16 tokens, hence the tolerance.
@pytest.mark.parametrize(
    ("config", "tp", "available_gib", "logged_tokens"),
    [
        # vllm-project/vllm#10517: RTX 3090, 1,952 blocks of 16 in 3.81 GiB.
        (LLAMA_31_8B, 1, 3.81, 1952 * 16),
        # LMCache/LMCache#1739: one GPU, 6.51 GiB, 42,656 tokens.
        (QWEN3_14B, 1, 6.51, 42_656),
        # vllm-project/vllm#21348: 4 × H100, FP8 weights, 8.11 GiB, 178,880 tokens a GPU.
        (QWEN3_235B, 4, 8.11, 178_880),
    ],
)
def test_kv_tokens_agree_with_what_vllm_logged(config, tp, available_gib, logged_tokens):
    m = hf_model(config, [Tensor("x", "BF16", (1,))])

    ours = int(available_gib * GIB // (m.kv_per_token * m.kv_share(tp)))

    assert abs(ours - logged_tokens) / logged_tokens < 0.015, ours


@pytest.mark.parametrize(
    ("config", "tp", "logged_gib"),
    [
        # vllm-project/vllm#10517: "Loading model weights took 14.9888 GB".
        (LLAMA_31_8B, 1, 14.9888),
        # vllm-project/vllm#13061: DeepSeek-R1-Distill-Qwen-14B at tp 2, 13.9476 a GPU.
        (QWEN25_14B, 2, 13.9476),
    ],
)
def test_weights_agree_with_what_vllm_loaded(config, tp, logged_gib):
    m = hf_model(config, dense_tensors(config))

    ours = m.weights_bytes / tp / GIB

    # vLLM's figure is what the GPU's allocator grew by while loading: the weights and the
    # buffers beside them; ours is the weights alone, a little under.
    assert 0.98 < ours / logged_gib <= 1.0, ours


@given(
    layers=st.integers(1, 96),
    kv_heads=st.sampled_from([1, 2, 4, 8, 16]),
    window=st.one_of(st.none(), st.integers(1, 8192)),
    ctx_a=st.integers(1, 200_000),
    ctx_b=st.integers(1, 200_000),
)
@settings(max_examples=200, deadline=None)
def test_a_longer_context_never_needs_less(layers, kv_heads, window, ctx_a, ctx_b):
    config = {
        **MISTRAL_7B,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "sliding_window": window,
        "max_position_embeddings": 200_000,
    }
    m = hf_model(config, [Tensor("x", "BF16", (7 * 10**9,))])
    short, long = sorted((ctx_a, ctx_b))
    node = gpu_node("g", gpus=8)

    a, b = (hf_plan(m, title="m", ctx=c, rooms=rooms(node)).gpus[0] for c in (short, long))

    # The cache grows with the context and never past every layer holding all of it.
    assert m.kv_cache_bytes(short) <= m.kv_cache_bytes(long) <= long * m.kv_per_token
    # So the tp it needs never shrinks, nor do the sequences that fit at one tp grow.
    assert (a.tp or 99) <= (b.tp or 99)
    if a.tp == b.tp and a.tp is not None:
        assert a.chosen.sequences >= b.chosen.sequences


@pytest.mark.parametrize(
    ("owner", "limit", "holds", "said"),
    [
        ("", 8, 0, None),
        ("team:1", 8, 6, None),  # 6 + 1 of 8: room under the limit
        ("team:1", 8, 7, None),  # exactly at the limit is allowed
        ("team:1", 8, 8, "fits on g, but team:Acme/ml is at its capacity limit (9 GPUs of 8)"),
        ("project:2", 8, 8, "fits on g, but team:Acme/ml is at its capacity limit (9 GPUs of 8)"),
    ],
)
def test_the_owners_limit_is_said_where_it_stops_a_replica(owner, limit, holds, said):
    from mirror.domain.owner import with_owner_limit
    from tenancy.quota import Amount, Policy, Quota, Resources

    m = hf_model(LLAMA_31_8B, dense_tensors(LLAMA_31_8B))
    p = hf_plan(m, title="Llama", ctx=8192, rooms=rooms(gpu_node("g", gpus=1)))
    policy = Policy.build(
        [Quota("team:1", limit=Resources(gpus=limit))],
        {"project:2": ["team:1"]},
        {"team:1": "team:Acme/ml"},
    )

    got = with_owner_limit(p, owner, policy, {"team:1": Amount(gpus=holds)})

    assert got.gpus[0].quota == (said or "")


def test_gptq_int4_is_sized_as_stored_too():
    config = {
        **LLAMA_31_8B,
        "quantization_config": {"bits": 4, "group_size": 128, "quant_method": "gptq"},
    }
    # GPTQ packs along the input: qweight (in/8, out) I32, qzeros (in/128, out/8) I32,
    # scales (in/128, out) F16, g_idx (in,) I32.
    tensors = []
    for t in dense_tensors(config, "F16"):
        if ".layers." not in t.name or not t.name.endswith("_proj.weight"):
            tensors.append(t)
            continue
        rows, cols = t.shape
        base = t.name.removesuffix(".weight")
        tensors += [
            Tensor(base + ".qweight", "I32", (cols // 8, rows)),
            Tensor(base + ".qzeros", "I32", (cols // 128, rows // 8)),
            Tensor(base + ".scales", "F16", (cols // 128, rows)),
            Tensor(base + ".g_idx", "I32", (cols,)),
        ]

    m = hf_model(config, tensors)

    assert m.parameters == 8_030_261_248
    assert m.quantization == "gptq"
    assert 5 * GIB < m.weights_bytes < 6 * GIB


def test_an_fp8_cache_halves_the_cache_and_is_passed_to_vllm():
    m = hf_model(LLAMA_33_70B, dense_tensors(LLAMA_33_70B))
    node = rooms(gpu_node("g", gpus=8))

    auto = hf_plan(m, title="Llama", ctx=65536, rooms=node)
    fp8 = hf_plan(m, title="Llama", ctx=65536, rooms=node, kv_cache_dtype="fp8")

    assert fp8.model.kv_per_token == auto.model.kv_per_token // 2 == 163_840
    # tp 2 leaves 72 - 65.7 = 6.3 GiB a GPU (80 GiB by the class's name): a sequence of
    # 65,536 takes 10 GiB there in BF16, 5 GiB in FP8.
    assert (auto.gpus[0].tp, fp8.gpus[0].tp) == (4, 2)
    assert "× 1 byte (FP8 cache)" in fp8.basis
    profile = serve_hf_model(fp8, name="l", source="x")["profiles"][0]
    assert profile["args"][-2:] == ["--kv-cache-dtype", "fp8"]
    with pytest.raises(SizingError, match="kv_cache_dtype must be one of auto, fp8"):
        hf_plan(m, title="Llama", ctx=None, rooms=node, kv_cache_dtype="int4")
