"""A GPU's class is `<model>-<memory>g` from its product name and memory (domain.md, GPU class)."""

import pytest

from fleet.domain.gpuclass import gpu_class


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80g"),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g"),
        ("NVIDIA H200", 143771, "h200-141g"),
    ],
)
def test_the_examples_in_the_spec_derive_their_class(name, memory_mib, expected):
    assert gpu_class(name, memory_mib) == expected


def test_vendor_family_and_form_factor_words_are_dropped():
    assert gpu_class("Tesla V100-SXM2-32GB", 32510) == "v100-32g"
    assert gpu_class("NVIDIA A100-PCIE-40GB", 40536) == "a100-40g"


def test_memory_rounds_to_the_nearest_size_sold_not_down():
    # 47.5 GiB reported is a 48 GB card, not 47 or 40.
    assert gpu_class("NVIDIA L40S", 46068) == "l40s-48g"
    # 93.6 GiB is the H100 NVL's 94.
    assert gpu_class("NVIDIA H100 NVL", 95830) == "h100-94g"


def test_the_class_is_lower_case_whatever_the_driver_says():
    assert gpu_class("NVIDIA RTX A6000", 49140) == "rtxa6000-48g"


def test_unknown_memory_leaves_the_model_name_alone():
    assert gpu_class("NVIDIA H100 80GB HBM3", None) == "h100"
    assert gpu_class("NVIDIA H100 80GB HBM3", 0) == "h100"
