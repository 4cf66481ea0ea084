"""Reading GGUF headers: Gemma 3 270M's real file, small files written with chosen
figures, and files that are not GGUF or not whole, each refused in a sentence."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from mirror.gguf import GgufError, GgufInfo, read_gguf

from .ggufs import write_gguf


def test_gemma_3_270m_header_says_what_the_model_is(gemma_gguf):
    info = read_gguf(gemma_gguf)
    assert info == GgufInfo(
        filename="gemma-3-270m-q4_k_m.gguf",
        architecture="gemma3",
        name="Gemma 3 270m",
        # The sum of its 236 tensors' elements: 169,246,720 in Q8_0 (the embeddings),
        # 63,406,080 Q5_0, 23,592,960 Q4_K, 11,796,480 Q6_K and 55,936 F32.
        parameters=268_098_176,
        # general.file_type 15, although most of its weights are Q8_0.
        quantization="Q4_K_M",
        block_count=18,
        context_length=32768,
        embedding_length=640,
        head_count=4,
        head_count_kv=1,
        # gemma3.attention.key_length and value_length; 640 / 4 would say 160.
        key_length=256,
        value_length=256,
        size_bytes=253_113_024,
    )


def test_a_written_files_figures_are_read_back(tmp_path):
    path = write_gguf(tmp_path / "small.gguf", name="Small", embedding_length=4096, head_count=32)
    info = read_gguf(path)
    assert (info.name, info.block_count, info.context_length) == ("Small", 32, 8192)
    # No key_length or value_length: the head size is 4096 / 32 = 128.
    assert (info.key_length, info.value_length) == (128, 128)
    # 64 × 64 f16 + 64 f32; no general.file_type, so the type most elements are in.
    assert (info.parameters, info.quantization) == (4160, "F16")
    assert info.size_bytes == path.stat().st_size


def test_per_layer_kv_heads_are_kept_and_the_largest_taken(tmp_path):
    info = read_gguf(write_gguf(tmp_path / "hybrid.gguf", head_count_kv=[8, 0, 2, 8]))
    assert (info.head_count_kv, info.head_count_kv_per_layer) == (8, (8, 0, 2, 8))


def test_no_kv_head_count_means_as_many_as_query_heads(tmp_path):
    info = read_gguf(write_gguf(tmp_path / "mha.gguf", head_count=12, head_count_kv=None))
    assert info.head_count_kv == 12


@pytest.mark.parametrize(
    ("file_type", "expected"),
    [
        (gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q4_K_M"),
        (gguf.LlamaFileType.MOSTLY_Q8_0, "Q8_0"),
        (gguf.LlamaFileType.ALL_F32, "F32"),
        (gguf.LlamaFileType.GUESSED, "F16"),  # says nothing: the tensors are asked
    ],
)
def test_quantization_is_named_by_the_file_type(tmp_path, file_type, expected):
    info = read_gguf(write_gguf(tmp_path / "q.gguf", file_type=file_type))
    assert info.quantization == expected


def test_a_tokenizer_of_many_strings_is_stepped_over_and_what_follows_read(tmp_path):
    # The model's figures are written after 50,000 tokens and their types, so a wrong
    # step over either array would misread every one of them.
    path = write_gguf(tmp_path / "vocab.gguf", tokens=50_000, block_count=7, context_length=2048)
    info = read_gguf(path)
    assert (info.block_count, info.context_length, info.head_count_kv) == (7, 2048, 8)


def test_the_stock_reader_agrees_on_the_figures(tmp_path):
    path = write_gguf(tmp_path / "same.gguf", tokens=300, head_count_kv=[4, 8])
    stock = gguf.GGUFReader(path)
    info = read_gguf(path)
    assert stock.get_field("llama.attention.head_count_kv").contents() == [4, 8]
    assert info.head_count_kv_per_layer == (4, 8)
    assert info.parameters == sum(int(t.n_elements) for t in stock.tensors)


def test_a_zip_is_not_a_gguf(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GgufError) as e:
        read_gguf(path)
    assert (
        str(e.value) == "model.bin is not a GGUF file: it starts with 'PK\\x03\\x04', not 'GGUF'."
    )


def test_an_empty_file_is_not_a_gguf(tmp_path):
    path = tmp_path / "empty.gguf"
    path.touch()
    with pytest.raises(GgufError, match=r"^empty.gguf is empty: a GGUF file starts with 'GGUF'\.$"):
        read_gguf(path)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(GgufError, match=r"^gone.gguf cannot be read: No such file or directory\.$"):
        read_gguf(tmp_path / "gone.gguf")


def test_a_file_cut_inside_its_tensors_says_how_much_is_missing(tmp_path):
    path = write_gguf(tmp_path / "cut.gguf")
    whole = path.read_bytes()
    path.write_bytes(whole[:-100])
    with pytest.raises(GgufError) as e:
        read_gguf(path)
    # The last tensor (64 f32, 256 bytes) ends the file, with no padding after it.
    assert str(e.value) == (
        f"cut.gguf is truncated: it is {len(whole) - 100:,} bytes and its tensors end at "
        f"byte {len(whole):,}, so 100 bytes are missing (a download cut short?)."
    )


def test_a_real_file_cut_short_says_so(gemma_gguf, tmp_path):
    path = tmp_path / "partial.gguf"
    with gemma_gguf.open("rb") as f:
        path.write_bytes(f.read(10 * 2**20))  # the first 10 MiB of a download
    with pytest.raises(GgufError, match=r"^partial.gguf is truncated: it is 10,485,760 bytes"):
        read_gguf(path)


def test_a_file_cut_inside_its_header_says_so(tmp_path):
    path = write_gguf(tmp_path / "head.gguf", tokens=100)
    path.write_bytes(path.read_bytes()[:600])
    with pytest.raises(GgufError, match=r"^head.gguf is truncated or damaged: its GGUF header"):
        read_gguf(path)


def test_a_file_of_four_bytes_is_too_short(tmp_path):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(GgufError, match=r"^magic.gguf is truncated: it is 4 bytes"):
        read_gguf(path)


def test_an_unknown_version_is_named(tmp_path):
    path = write_gguf(tmp_path / "v9.gguf")
    data = bytearray(path.read_bytes())
    data[4:8] = (9).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(
        GgufError, match=r"^v9.gguf is GGUF version 9; this reader knows versions 2 and 3\.$"
    ):
        read_gguf(path)


def test_a_header_without_a_figure_sizing_needs_names_it(tmp_path):
    path = write_gguf(tmp_path / "nolayers.gguf", block_count=None)
    with pytest.raises(GgufError) as e:
        read_gguf(path)
    assert str(e.value) == (
        "nolayers.gguf (llama) has no llama.block_count in its header, which sizing needs."
    )


def test_a_file_with_no_tensors_has_nothing_to_serve(tmp_path):
    path = write_gguf(tmp_path / "vocab-only.gguf", tensors={})
    with pytest.raises(GgufError, match=r"holds no tensors .*there is no model to serve\.$"):
        read_gguf(path)


def test_a_figure_of_the_wrong_type_is_refused(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "odd.gguf", "llama")
    w.add_string("llama.block_count", "thirty-two")
    w.add_tensor("x", np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GgufError, match=r"^odd.gguf has llama.block_count = 'thirty-two', not a"):
        read_gguf(tmp_path / "odd.gguf")


def test_a_string_array_longer_than_the_file_is_refused_with_a_sentence(tmp_path):
    import struct

    # The header of a GGUF v3 with one key: an array of 2**40 strings, and nothing after.
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    field = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 1 << 40)
    path = tmp_path / "crafted.gguf"
    path.write_bytes(head + field + b"\x00" * 4096)

    with pytest.raises(GgufError, match=r"^crafted.gguf is truncated or damaged"):
        read_gguf(path)
