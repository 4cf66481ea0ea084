"""What an adapter's GGUF and its base's GGUF say of their architecture, read on the control
plane at POST /adapters (catalog.adapter_files): from the header alone, through the mirror's
reader, not the gguf package's stock one, which took 8 s over SmolLM2's tokenizer strings
on a loaded machine and ran past a client's 10 s timeout."""

from __future__ import annotations

import gguf
import pytest

import mirror.gguf  # noqa: F401 - its reader bound before the stock one is taken away
from catalog.adapter_files import adapter_facts, weights_architecture
from tests.mirror.ggufs import write_gguf


class _Stock:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the stock GGUFReader read a whole header")


@pytest.fixture
def no_stock_reader(monkeypatch):
    monkeypatch.setattr(gguf, "GGUFReader", _Stock)


def test_a_gguf_base_with_a_large_vocabulary_says_its_architecture(no_stock_reader, tmp_path):
    base = write_gguf(tmp_path / "base.gguf", arch="qwen2", tokens=50_000)
    assert weights_architecture(str(base)) == "qwen2"


def test_a_lora_gguf_says_the_architecture_it_was_made_for(no_stock_reader, tmp_path):
    lora = write_gguf(tmp_path / "lora.gguf", arch="llama", block_count=None)
    facts = adapter_facts(str(lora), "gguf")
    assert facts is not None and facts.architecture == "llama"


def test_a_file_that_is_no_gguf_or_cut_short_says_nothing(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    assert weights_architecture(str(text)) is None
    whole = write_gguf(tmp_path / "whole.gguf", tokens=1_000).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])
    assert weights_architecture(str(cut)) is None
    assert adapter_facts(str(cut), "gguf") is None
