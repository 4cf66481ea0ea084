"""Sizing on real GGUF headers: Gemma 3 270M's file and small files written with chosen
figures, against estimates worked out by hand (the arithmetic beside each)."""

from __future__ import annotations

from catalog.domain import new_model_warnings_as_errors, parse_model
from mirror.domain.sizing import GIB, plan, serve_model
from mirror.gguf import read_gguf
from tests.domain.builders import cpu_node, gpu_node, rooms

from .ggufs import write_gguf


def test_gemma_3_270m_needs_2_gb_at_the_default_context(gemma_gguf):
    p = plan(read_gguf(gemma_gguf), nodes=rooms(cpu_node("cpu-1", cpus=8, memory_gb=16)))
    # Trained on 32768, capped at the seed's pool of 16384.
    assert p.ctx == 16384
    # KV: 18 layers × 16384 tokens × 1 KV head × (256 + 256) × 2 bytes = 301,989,888 (288 MiB)
    assert p.kv_cache_bytes == 18 * 16384 * 1 * 512 * 2 == 301_989_888
    # 1 GiB + 253,113,024 // 20 = 1,073,741,824 + 12,655,651 = 1,086,397,475
    assert p.overhead_bytes == 1_086_397_475
    # 253,113,024 + 301,989,888 + 1,086,397,475 = 1,641,500,387 bytes = 1.53 GiB → 2
    assert p.weights_bytes + p.kv_cache_bytes + p.overhead_bytes == 1_641_500_387
    assert p.memory_gb == 2
    assert p.cpu_cores == 4  # half of the one node's 8
    assert p.fits == ("cpu-1",)
    assert p.basis == (
        "Gemma 3 270m (gemma3, Q4_K_M, 268M parameters): 242 MiB of weights + 288 MiB of "
        "f16 KV cache (18 layers × 16,384 tokens × 1 KV head × (256 key + 256 value) × 2 "
        "bytes) + 1 GiB + 13 MiB (weights/20) = 1.53 GiB, rounded up to 2 GB."
    )


def test_gemma_3_270m_at_its_whole_trained_context(gemma_gguf):
    p = plan(read_gguf(gemma_gguf), ctx=32768, nodes=())
    # KV doubles: 18 × 32768 × 1 × 512 × 2 = 603,979,776; the total 1,943,490,275 is
    # 1.81 GiB, still 2 GB.
    assert p.kv_cache_bytes == 603_979_776
    assert p.memory_gb == 2


def test_gemma_3_270m_becomes_a_model_the_catalog_accepts(gemma_gguf):
    p = plan(read_gguf(gemma_gguf), nodes=rooms(cpu_node("cpu-1", cpus=8, memory_gb=16)))
    data = serve_model(p, name="gemma3-270m", source="mirror:1")
    spec = parse_model(data)
    new_model_warnings_as_errors(spec)
    (profile,) = spec.profiles
    assert profile.engine == "llamacpp" and profile.cpu_only
    assert profile.args == ("--ctx-size", "16384")
    assert (profile.min_memory_gb, profile.cpu_cores) == (2, 4)
    assert spec.description == "Gemma 3 270m, Q4_K_M, 268M parameters"


def test_a_written_file_is_sized_from_its_figures(tmp_path):
    path = write_gguf(
        tmp_path / "small.gguf",
        name="Small",
        block_count=32,
        context_length=8192,
        embedding_length=4096,
        head_count=32,
        head_count_kv=8,
    )
    info = read_gguf(path)
    # No key_length or value_length: the head size is 4096 / 32 = 128.
    assert (info.key_length, info.value_length) == (128, 128)
    # 64 × 64 f16 + 64 f32; no general.file_type, so the type most elements are in.
    assert (info.parameters, info.quantization) == (4160, "F16")
    assert info.size_bytes == path.stat().st_size
    p = plan(info, nodes=())
    assert p.ctx == 8192  # its trained context, under the default cap
    # KV: 32 layers × 8192 tokens × 8 KV heads × (128 + 128) × 2 bytes = 2^30, 1 GiB exactly.
    assert p.kv_cache_bytes == GIB
    # 1 GiB of KV + 1 GiB + a few KB of weights and a twentieth of them: just over 2 GiB → 3.
    assert p.memory_gb == 3


def test_keys_and_values_of_different_sizes_are_each_counted(tmp_path):
    path = write_gguf(
        tmp_path / "mla.gguf",
        block_count=10,
        context_length=4096,
        head_count=16,
        head_count_kv=16,
        key_length=192,
        value_length=128,
    )
    p = plan(read_gguf(path), ctx=1000, nodes=())
    # 10 layers × 1000 tokens × 16 KV heads × (192 + 128) × 2 bytes = 102,400,000
    assert p.kv_cache_bytes == 102_400_000
    assert "(192 key + 128 value)" in p.basis


def test_per_layer_kv_heads_take_the_largest_and_say_so(tmp_path):
    path = write_gguf(
        tmp_path / "hybrid.gguf", block_count=4, head_count=8, head_count_kv=[8, 0, 2, 8]
    )
    info = read_gguf(path)
    assert info.head_count_kv == 8
    assert info.head_count_kv_per_layer == (8, 0, 2, 8)
    p = plan(info, ctx=1024, nodes=())
    # 4 layers × 1024 tokens × 8 (the largest) × (512 + 512) × 2 bytes = 67,108,864;
    # head size 4096 / 8 = 512.
    assert p.kv_cache_bytes == 67_108_864
    assert p.basis.endswith(
        "its layers have 0 to 8 KV heads, and the largest is counted for every layer."
    )


def test_a_gguf_on_gpus_is_planned_for_llamacpp_with_every_layer_offloaded(gemma_gguf):
    node = gpu_node("g", gpus=1, gpu_class="l4-24g", engines=["llamacpp"])

    p = plan(read_gguf(gemma_gguf), nodes=rooms(node, cpu_node("cpu-1")))

    (option,) = p.gpus
    # 0.9 × 24 GiB = 21.6 GiB, less 242 MiB of weights: 21.36 GiB, which holds 75 pools of
    # 16,384 tokens at 288 MiB each.
    assert (option.gpu_class, option.tp, option.chosen.sequences) == ("l4-24g", 1, 75)
    assert option.fits == ("g",)
    assert option.said == (
        "Gemma 3 270m needs 241 MiB of weights; on l4-24g (24.0 GiB a GPU) at 0.9 utilisation, "
        "tp 1 leaves about 21.4 GiB a GPU, 75 sequences of 16,384."
    )
    data = serve_model(p, name="g", source="x", gpu_class="l4-24g")
    assert data["profiles"] == [
        {
            "name": "l4-24g",
            "engine": "llamacpp",
            "gpu_class": "l4-24g",
            "tp": 1,
            "args": ["--ctx-size", "16384"],
        }
    ]
