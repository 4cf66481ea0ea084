"""Real config.json contents of several architectures (the fields sizing reads, as the
repositories on the hub hold them), the tensors their checkpoints hold, and safetensors
files written from them with a header and nothing (or zeros) behind it."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from mirror.domain.hf import DTYPE_BYTES, Tensor

# meta-llama/Llama-3.1-8B-Instruct
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
# meta-llama/Llama-3.3-70B-Instruct
LLAMA_33_70B = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
# Qwen/Qwen2.5-7B-Instruct: a sliding_window that is not used (use_sliding_window false).
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
# Qwen's model card: "add the following to config.json" for contexts past 32,768.
QWEN25_7B_YARN = {
    **QWEN25_7B,
    "rope_scaling": {
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
        "type": "yarn",
    },
}
# google/gemma-2-9b-it: every other layer (from the first) keeps a window of 4,096.
GEMMA2_9B = {
    "architectures": ["Gemma2ForCausalLM"],
    "head_dim": 256,
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "vocab_size": 256000,
}
# google/gemma-3-27b-it: the language model's figures under text_config; five layers of
# each six keep a window of 1,024; max_position_embeddings left to its default (131,072).
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
}
# mistralai/Mistral-7B-v0.1: every layer keeps a window of 4,096.
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
# mistralai/Mixtral-8x7B-Instruct-v0.1: eight experts a layer, all loaded.
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}
# deepseek-ai/DeepSeek-V3: MLA, FP8 weights with F32 block scales, YaRN from 4,096 × 40.
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "torch_dtype": "bfloat16",
    "v_head_dim": 128,
    "vocab_size": 129280,
}
# hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4: the linear layers packed eight int4
# to an I32, with F16 scales and packed zeros per group of 128.
LLAMA_31_8B_AWQ = {
    **LLAMA_31_8B,
    "quantization_config": {
        "bits": 4,
        "group_size": 128,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    },
    "torch_dtype": "float16",
}


def dense_tensors(c: dict, dtype: str = "BF16") -> list[Tensor]:
    """The tensors of a Llama-shaped checkpoint (Llama, Qwen2, Mistral, Mixtral, Gemma)."""
    c = {**c, **c.get("text_config", {})}
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // heads
    inter, vocab = c["intermediate_size"], c.get("vocab_size", 262208)
    out = [Tensor("model.embed_tokens.weight", dtype, (vocab, h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            Tensor(p + "self_attn.q_proj.weight", dtype, (heads * hd, h)),
            Tensor(p + "self_attn.k_proj.weight", dtype, (kv * hd, h)),
            Tensor(p + "self_attn.v_proj.weight", dtype, (kv * hd, h)),
            Tensor(p + "self_attn.o_proj.weight", dtype, (h, heads * hd)),
            Tensor(p + "input_layernorm.weight", dtype, (h,)),
            Tensor(p + "post_attention_layernorm.weight", dtype, (h,)),
        ]
        if c["model_type"] == "qwen2":
            out += [
                Tensor(p + "self_attn.q_proj.bias", dtype, (heads * hd,)),
                Tensor(p + "self_attn.k_proj.bias", dtype, (kv * hd,)),
                Tensor(p + "self_attn.v_proj.bias", dtype, (kv * hd,)),
            ]
        if c["model_type"].startswith("gemma"):
            out += [
                Tensor(p + "pre_feedforward_layernorm.weight", dtype, (h,)),
                Tensor(p + "post_feedforward_layernorm.weight", dtype, (h,)),
            ]
        experts = c.get("num_local_experts")
        if experts:
            out.append(Tensor(p + "block_sparse_moe.gate.weight", dtype, (experts, h)))
            for e in range(experts):
                q = f"{p}block_sparse_moe.experts.{e}."
                out += [
                    Tensor(q + "w1.weight", dtype, (inter, h)),
                    Tensor(q + "w2.weight", dtype, (h, inter)),
                    Tensor(q + "w3.weight", dtype, (inter, h)),
                ]
        else:
            out += [
                Tensor(p + "mlp.gate_proj.weight", dtype, (inter, h)),
                Tensor(p + "mlp.up_proj.weight", dtype, (inter, h)),
                Tensor(p + "mlp.down_proj.weight", dtype, (h, inter)),
            ]
    out.append(Tensor("model.norm.weight", dtype, (h,)))
    if not c.get("tie_word_embeddings", True) and not c["model_type"].startswith("gemma"):
        out.append(Tensor("lm_head.weight", dtype, (vocab, h)))
    return out


def awq_tensors(c: dict) -> list[Tensor]:
    """A Llama checkpoint with its linear layers as AWQ stores them: qweight (in, out/8)
    I32, qzeros (in/128, out/8) I32, scales (in/128, out) F16; the rest F16."""
    out = []
    for t in dense_tensors(c, "F16"):
        linear = ".layers." in t.name and t.name.endswith("_proj.weight")
        if not linear:
            out.append(t)
            continue
        rows, cols = t.shape  # (out, in) as a torch Linear holds it
        base = t.name.removesuffix(".weight")
        out += [
            Tensor(base + ".qweight", "I32", (cols, rows // 8)),
            Tensor(base + ".qzeros", "I32", (cols // 128, rows // 8)),
            Tensor(base + ".scales", "F16", (cols // 128, rows)),
        ]
    return out


def write_safetensors(path: Path, tensors: list[Tensor], *, data: bool = False) -> Path:
    """A safetensors file of these tensors: the header, then zeros for the data when `data`
    (a file any reader takes), else nothing (sizing never reads past the header)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        size = t.count * DTYPE_BYTES[t.dtype]
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if data:
            f.write(b"\0" * offset)
    return path


# Qwen/Qwen3-14B
QWEN3_14B = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 151936,
}
# Qwen/Qwen3-235B-A22B (its FP8 copy has the same attention)
QWEN3_235B = {
    **QWEN3_14B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 4096,
    "model_type": "qwen3_moe",
    "num_attention_heads": 64,
    "num_hidden_layers": 94,
    "num_key_value_heads": 4,
}
# deepseek-ai/DeepSeek-R1-Distill-Qwen-14B: a Qwen2.5 14B
QWEN25_14B = {
    **QWEN25_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "max_position_embeddings": 131072,
    "num_attention_heads": 40,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
}
