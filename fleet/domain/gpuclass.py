"""A GPU's class from its product name and memory: `<model>-<memory>g`, lower case."""

import re

# Sizes GPUs are sold with, in GiB: a card reports a little less than its label.
_SOLD_GIB = (8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 120, 141, 144, 180, 192, 288)
# Vendor, family and form-factor words that say nothing about what a GPU can run.
_NOISE = {
    "nvidia",
    "geforce",
    "tesla",
    "quadro",
    "amd",
    "radeon",
    "instinct",
    "sxm",
    "sxm2",
    "sxm3",
    "sxm4",
    "sxm5",
    "pcie",
    "hbm",
    "hbm2",
    "hbm2e",
    "hbm3",
    "hbm3e",
    "nvl",
    "mig",
}
CLASS_LABEL = "llmgw.io/gpu-class"


def _nearest_sold(gib: float) -> int:
    return min(_SOLD_GIB, key=lambda size: (abs(size - gib), size))


def gpu_class(name: str, memory_mb: int | None) -> str:
    """`NVIDIA H100 80GB HBM3` with 81559 MiB is `h100-80g`; memory unknown leaves the model alone."""
    words = []
    for word in re.split(r"[\s_-]+", name.lower()):
        if not word or word in _NOISE or re.fullmatch(r"\d+gb", word):
            continue
        words.append(word)
    model = "".join(words) or "gpu"
    if not memory_mb:
        return model
    return f"{model}-{_nearest_sold(memory_mb / 1024)}g"
