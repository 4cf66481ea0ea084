"""Sizing a GGUF model (domain.md, Mirror): the memory estimate, the context, the suggested
cores, where it fits and why not, and the model it becomes. Figures worked out by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from catalog.domain import parse_model
from mirror.domain.sizing import (
    DEFAULT_CTX,
    GIB,
    SizingError,
    choose_ctx,
    llamacpp_profile,
    plan,
    serve_model,
)
from mirror.gguf import GgufInfo

from .builders import cpu_node, gpu_node, replica, rooms

# Llama 3.1 8B Instruct Q4_K_M as its header has it.
LLAMA = GgufInfo(
    filename="Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
    architecture="llama",
    name="Llama 3.1 8B Instruct",
    parameters=8_030_261_248,
    quantization="Q4_K_M",
    block_count=32,
    context_length=131072,
    embedding_length=4096,
    head_count=32,
    head_count_kv=8,
    key_length=128,
    value_length=128,
    size_bytes=4_920_734_656,
)


def test_the_estimate_is_weights_kv_cache_a_gib_and_a_twentieth():
    p = plan(LLAMA, ctx=8192, nodes=())
    # KV: 32 layers × 8192 tokens × 8 KV heads × (128 + 128) × 2 bytes = 1,073,741,824
    assert p.kv_cache_bytes == 1_073_741_824
    # 1 GiB + 4,920,734,656 // 20 = 1,073,741,824 + 246,036,732
    assert p.overhead_bytes == 1_319_778_556
    # 4,920,734,656 + 1,073,741,824 + 1,319,778,556 = 7,314,255,036 bytes = 6.81 GiB → 7
    assert p.memory_gb == 7
    assert p.basis == (
        "Llama 3.1 8B Instruct (llama, Q4_K_M, 8.0B parameters): 4,693 MiB of weights + "
        "1,024 MiB of f16 KV cache (32 layers × 8,192 tokens × 8 KV heads × (128 key + 128 "
        "value) × 2 bytes) + 1 GiB + 235 MiB (weights/20) = 6.81 GiB, rounded up to 7 GB."
    )


def test_the_default_context_is_the_seeds_pool_or_less_when_trained_on_less():
    assert DEFAULT_CTX == 16384
    assert plan(LLAMA, nodes=()).ctx == 16384
    assert choose_ctx(replace(LLAMA, context_length=2048)) == 2048
    # At 16384 the KV cache is twice 8192's: 2 GiB, one more than at 8192, so the total
    # is 7,314,255,036 + 1,073,741,824 = 8,387,996,860 bytes = 7.81 GiB → 8.
    assert plan(LLAMA, nodes=()).memory_gb == 8


def test_gb_are_gib_as_nodes_report_memory():
    # 880,000,000 of weights + 2,560,000 of KV (10 × 1000 × 1 × 128 × 2) + 1,073,741,824
    # + 44,000,000 = 2,000,301,824 bytes: over 2 GB of 10^9, under 2 GiB, so 2.
    info = replace(
        LLAMA,
        size_bytes=880_000_000,
        block_count=10,
        head_count_kv=1,
        key_length=64,
        value_length=64,
    )
    p = plan(info, ctx=1000, nodes=())
    assert p.weights_bytes + p.kv_cache_bytes + p.overhead_bytes == 2_000_301_824
    assert p.memory_gb == 2


def test_a_context_beyond_the_trained_one_is_refused():
    with pytest.raises(SizingError) as e:
        plan(LLAMA, ctx=262144, nodes=())
    assert str(e.value) == (
        "Llama 3.1 8B Instruct was trained on 131,072 tokens of context; "
        "a context of 262,144 is more than it can use."
    )


@pytest.mark.parametrize("ctx", [0, -1, True, 4096.0])
def test_a_context_that_is_not_a_positive_whole_number_is_refused(ctx):
    with pytest.raises(SizingError, match=r"^The context must be a positive number of tokens"):
        plan(LLAMA, ctx=ctx, nodes=())


def test_the_trained_context_itself_is_allowed():
    assert plan(LLAMA, ctx=131072, nodes=()).ctx == 131072


def test_cores_are_half_the_smallest_ready_node_with_the_memory():
    p = plan(
        LLAMA,
        ctx=8192,
        nodes=rooms(
            cpu_node("big", cpus=32, memory_gb=256),
            cpu_node("mid", cpus=12, memory_gb=64),
            cpu_node("tiny", cpus=2, memory_gb=4),  # 4 GB: too small for 7, not counted
            cpu_node("shut", cpus=4, memory_gb=64, cordoned=True),  # cordoned: not counted
        ),
    )
    assert p.cpu_cores == 6
    assert p.fits == ("big", "mid")


def test_no_node_saying_its_cpus_suggests_no_cores_and_reserves_none():
    p = plan(LLAMA, ctx=8192, nodes=rooms(cpu_node("n1", cpus=None, memory_gb=64)))
    assert p.cpu_cores == 0
    assert p.fits == ("n1",)
    assert "cpu_cores" not in llamacpp_profile(p)


def test_given_cores_are_kept():
    p = plan(LLAMA, ctx=8192, cores=3, nodes=rooms(cpu_node("n1", cpus=8)))
    assert p.cpu_cores == 3


def test_where_it_does_not_fit_each_node_says_why_with_figures():
    nodes = [
        cpu_node("cpu-1", cpus=16, memory_gb=64),
        cpu_node("cpu-2", cpus=16, memory_gb=64),
        cpu_node("cpu-3", cpus=16, memory_gb=64),
        cpu_node("cpu-4", cpus=16, memory_gb=64, state="lost"),
        cpu_node("cpu-5", cpus=16, memory_gb=64, engines={"vllm"}),
        cpu_node("cpu-6", cpus=16, memory_gb=4),
    ]
    held = [
        # cpu-2: 59 of 64 GB held, 5 free.
        replica("r1", "other", on="cpu-2", gpus=(), memory_gb=59, cores=2),
        # cpu-3: memory free, 14 of 16 CPUs held.
        replica("r2", "other", on="cpu-3", gpus=(), memory_gb=8, cores=14),
    ]
    p = plan(LLAMA, ctx=8192, nodes=rooms(*nodes, replicas=held))
    # Cores: half the smallest node with 7 GB, all 16 CPUs: 8.
    assert p.cpu_cores == 8
    assert p.fits == ("cpu-1",)
    assert p.blocked == (
        "cpu-2 has 5 GB free of 64 GB; Llama 3.1 8B Instruct needs 7 GB.",
        "cpu-3 has 2 of 16 CPUs free; Llama 3.1 8B Instruct needs 8 cores.",
        "node cpu-4 is lost.",
        "node cpu-5 has no llamacpp engine installed.",
        "cpu-6 has 4 GB free of 4 GB; Llama 3.1 8B Instruct needs 7 GB.",
    )


def test_a_node_that_does_not_say_its_memory_is_not_refused_for_it():
    assert plan(LLAMA, ctx=8192, nodes=rooms(cpu_node("n1", memory_gb=None))).fits == ("n1",)


def test_a_gpu_nodes_host_memory_can_run_the_cpu_profile():
    p = plan(LLAMA, ctx=8192, nodes=rooms(gpu_node("g1", memory_gb=512, cpus=64)))
    assert p.fits == ("g1",)
    assert p.cpu_cores == 32


def test_the_plan_answers_the_contract():
    p = plan(LLAMA, ctx=8192, nodes=rooms(cpu_node("cpu-1", cpus=8)))
    assert p.as_dict() == {
        "architecture": "llama",
        "parameters": 8_030_261_248,
        "quantization": "Q4_K_M",
        "context_length": 131072,
        "memory_gb": 7,
        "cpu_cores": 4,
        "basis": p.basis,
        "fits": ["cpu-1"],
        "blocked": [],
        # Issue 36: the GPU figures beside the CPU plan's (no GPU node here: none).
        "format": "gguf",
        "weights_bytes": p.weights_bytes,
        "kv_bytes_per_token": 32 * 8 * (128 + 128) * 2,
        "gpu_memory_utilization": 0.9,
        "gpus": [],
        "quota": None,
    }


def test_the_profile_is_llamacpp_on_cpu_with_the_pool_memory_and_cores():
    p = plan(LLAMA, ctx=8192, nodes=rooms(cpu_node("cpu-1", cpus=8)))
    assert llamacpp_profile(p) == {
        "name": "cpu",
        "engine": "llamacpp",
        "args": ["--ctx-size", "8192"],
        "min_memory_gb": 7,
        "cpu_cores": 4,
    }


def test_the_served_model_is_one_the_catalog_accepts_with_overrides_on_top():
    p = plan(LLAMA, ctx=8192, nodes=rooms(cpu_node("cpu-1", cpus=8)))
    data = serve_model(
        p, name="llama-8b", source="mirror:7", overrides={"scaling": {"min": 0, "max": 2}}
    )
    spec = parse_model(data)
    assert (spec.name, spec.source, spec.context_length) == ("llama-8b", "mirror:7", 8192)
    assert (spec.min_replicas, spec.max_replicas) == (0, 2)
    assert spec.description == "Llama 3.1 8B Instruct, Q4_K_M, 8.0B parameters"
    assert spec.profiles[0].min_memory_gb == 7
    # An override replaces what it names, the profiles too.
    mine = serve_model(p, name="x", source="s", overrides={"profiles": [{"name": "p"}]})
    assert mine["profiles"] == [{"name": "p"}]


def test_per_layer_kv_heads_are_said_in_the_basis():
    info = replace(LLAMA, head_count_kv=8, head_count_kv_per_layer=(8, 0, 8, 0))
    p = plan(info, ctx=8192, nodes=())
    assert p.kv_cache_bytes == GIB  # the largest, 8, on every one of the 32 layers
    assert "its layers have 0 to 8 KV heads, and the largest is counted for every layer" in p.basis
