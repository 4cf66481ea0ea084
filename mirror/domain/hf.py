"""What a Hugging Face model (config.json and safetensors headers) needs on a GPU, from its
metadata alone (issue 36, item 2).

Pure: the parsed `config.json` and each tensor's name, dtype and shape in, an `HfModel`
out. The reader of the files is mirror.safetensors.

- Weights are the tensors as stored: bytes by dtype, so FP8 and AWQ/GPTQ int4 (packed
  eight to an I32) are sized by what they hold. Parameters count a packed int4 tensor
  (`*.qweight`) as the eight weights each I32 holds; the quantiser's scales, zeros and
  indices are bytes, not parameters. A mixture of experts counts every expert: all of them
  are loaded.
- The KV cache per token and layer is KV heads × head size × 2 (a key and a value) × the
  cache's bytes per value (2: vLLM's default cache dtype is the model's 16-bit one). Heads
  are `num_key_value_heads` (GQA), else `num_attention_heads`; the head size is `head_dim`,
  else hidden_size / num_attention_heads. MLA (DeepSeek V2/V3, `kv_lora_rank`) keeps one
  latent of kv_lora_rank + qk_rope_head_dim per layer and token, for keys and values both.
- A sliding-window layer keeps at most its window (Gemma 2: every other layer; Gemma 3: five
  of each six, or as `layer_types` says; Mistral: every layer when `sliding_window` is set;
  Qwen2 only when `use_sliding_window` is true), so the cache for a context is not linear:
  `kv_cache_bytes(ctx)`.
- The trained context is `max_position_embeddings`, stretched by YaRN (the original × the
  factor, as vLLM derives it) or dynamic scaling (× the factor); Llama 3's, LongRoPE's and
  linear scaling are already in `max_position_embeddings`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

# Bytes per value of each safetensors dtype (the format's own list).
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
KV_BYTES = 2
# What transformers' config classes default to where a real config.json leaves it out
# (Gemma 3's multimodal configs omit the text model's max_position_embeddings).
_DEFAULTS = {"gemma3_text": {"max_position_embeddings": 131072, "sliding_window_pattern": 6}}
# Tensors a quantiser adds beside the packed weights: bytes, not parameters.
_QUANT_AUX = (".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_scale_inv", ".input_scale")


class HfError(ValueError):
    """Metadata sizing cannot use; the message is a sentence for an operator."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class HfModel:
    """What sizing needs of a safetensors model. `windows` is each layer's window in tokens,
    None for a layer that attends to the whole context; `kv_per_layer` the bytes a token
    takes in one layer's cache; `kv_heads` 1 for MLA (one latent, not split by tp)."""

    architecture: str
    model_type: str
    parameters: int
    bytes_by_dtype: Mapping[str, int]
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    mla: bool
    kv_per_layer: int
    windows: tuple[int | None, ...]
    context_length: int
    quantization: str = ""
    said: tuple[str, ...] = field(default=())
    # Bytes a cached value takes: 2 in the model's 16-bit dtype (vLLM's "auto"), 1 in FP8.
    kv_bytes: int = KV_BYTES

    @property
    def weights_bytes(self) -> int:
        return sum(self.bytes_by_dtype.values())

    @property
    def kv_per_token(self) -> int:
        """Bytes one token takes in every layer's cache (before any window is full)."""
        return self.kv_per_layer * self.layers

    def kv_cache_bytes(self, ctx: int) -> int:
        """The cache one sequence of `ctx` tokens takes: a windowed layer holds its window."""
        return sum(self.kv_per_layer * (ctx if w is None else min(ctx, w)) for w in self.windows)

    def kv_share(self, tp: int) -> float:
        """The share of the cache each of `tp` GPUs holds: KV heads are split between them
        (a GPU holds one at least, so heads fewer than tp are copied); MLA's latent is whole
        on each."""
        if self.mla:
            return 1.0
        return max(1, self.kv_heads // tp) / self.kv_heads


# vLLM's --kv-cache-dtype values and the bytes a value takes in each.
CACHE_DTYPES = {"auto": KV_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def cached_in(model: HfModel, dtype: str | None) -> HfModel:
    """The model with its KV cache in `dtype` (vLLM's `--kv-cache-dtype`; None is "auto");
    HfError with a sentence for a dtype vLLM does not take."""
    if dtype is None:
        return model
    size = CACHE_DTYPES.get(dtype)
    if size is None:
        known = ", ".join(CACHE_DTYPES)
        raise HfError(f"kv_cache_dtype must be one of {known}, not {dtype!r}.")
    per_layer = model.kv_per_layer // model.kv_bytes * size
    return replace(model, kv_bytes=size, kv_per_layer=per_layer)


def hf_model(config: Mapping[str, Any], tensors: Iterable[Tensor]) -> HfModel:
    """Size the model `config` describes, whose tensors are `tensors`; HfError with a
    sentence when the config lacks what sizing needs or there are no tensors."""
    if not isinstance(config, Mapping):
        raise HfError("config.json is not a JSON object.")
    text = config.get("text_config")
    # Multimodal configs (Gemma 3, Llama 4, Mistral 3) keep the language model's figures apart.
    c = {**config, **text} if isinstance(text, Mapping) else dict(config)
    model_type = str(c.get("model_type") or config.get("model_type") or "")
    c = {**_DEFAULTS.get(model_type, {}), **c}
    archs = config.get("architectures") or [model_type or "unknown"]
    arch = str(archs[0]) if isinstance(archs, list) and archs else str(archs)
    layers = _positive(c, "num_hidden_layers")
    heads = _positive(c, "num_attention_heads")
    kv_heads = _positive(c, "num_key_value_heads", default=heads)
    hidden = _positive(c, "hidden_size")
    head_dim = _positive(c, "head_dim", default=hidden // heads)
    said: list[str] = []
    mla = c.get("kv_lora_rank") is not None
    if mla:
        latent = _positive(c, "kv_lora_rank") + _positive(c, "qk_rope_head_dim")
        kv_per_layer = latent * KV_BYTES
        kv_heads = 1
        said.append(f"MLA: one latent of {latent} values a layer")
    else:
        kv_per_layer = kv_heads * head_dim * 2 * KV_BYTES
    windows = _windows(c, model_type, layers, said)
    tensors = list(tensors)
    if not tensors:
        raise HfError("The safetensors headers list no tensors.")
    by_dtype: Counter[str] = Counter()
    params = 0
    quant = config.get("quantization_config")
    quant = quant if isinstance(quant, Mapping) else {}
    bits = quant.get("bits") if isinstance(quant.get("bits"), int) else None
    for t in tensors:
        size = DTYPE_BYTES.get(t.dtype)
        if size is None:
            raise HfError(f"Tensor {t.name} has dtype {t.dtype}, which sizing does not know.")
        by_dtype[t.dtype] += t.count * size
        if t.name.endswith(_QUANT_AUX):
            continue
        packed = 32 // bits if bits and t.name.endswith(".qweight") and t.dtype == "I32" else 1
        params += t.count * packed
    return HfModel(
        architecture=arch,
        model_type=model_type,
        parameters=params,
        bytes_by_dtype=dict(sorted(by_dtype.items())),
        layers=layers,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        mla=mla,
        kv_per_layer=kv_per_layer,
        windows=windows,
        context_length=trained_context(c),
        quantization=str(quant.get("quant_method") or ""),
        said=tuple(said),
    )


def trained_context(c: Mapping[str, Any]) -> int:
    """The context the model can use: max_position_embeddings as rope scaling stretches it."""
    base = _positive(c, "max_position_embeddings")
    rope = c.get("rope_scaling")
    if not isinstance(rope, Mapping):
        return base
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    factor = rope.get("factor")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 1:
        return base
    if kind == "yarn":
        original = rope.get("original_max_position_embeddings")
        start = original if isinstance(original, int) and original > 0 else base
        return int(start * factor)
    if kind == "dynamic":
        return int(base * factor)
    return base


def _windows(
    c: Mapping[str, Any], model_type: str, layers: int, said: list[str]
) -> tuple[int | None, ...]:
    window = c.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return (None,) * layers
    if model_type.startswith("qwen") and not c.get("use_sliding_window"):
        return (None,) * layers
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        sliding = [t == "sliding_attention" for t in types]
    elif model_type == "gemma2":
        sliding = [i % 2 == 0 for i in range(layers)]
    elif model_type.startswith("gemma3"):
        pattern = c.get("sliding_window_pattern")
        pattern = pattern if isinstance(pattern, int) and pattern > 0 else 6
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    else:
        sliding = [True] * layers
    n = sum(sliding)
    if n:
        said.append(f"{n} of {layers} layers keep a window of {window:,} tokens")
    return tuple(window if s else None for s in sliding)


def _positive(c: Mapping[str, Any], key: str, *, default: int | None = None) -> int:
    value = c.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise HfError(f"config.json has no positive {key} (it says {value!r}); sizing needs it.")
    return value
