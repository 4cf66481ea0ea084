"""What a GGUF file's header says about the model in it, read without reading the model.

`read_gguf` gives a `GgufInfo`: architecture, parameters, quantization and the
figures the memory estimate needs (mirror.domain.sizing). It reads with the
`gguf` package's `GGUFReader`, which memory-maps the whole file and builds
its fields and tensor infos from views into that map: tensor data is never
read, so a 100 GB file costs its header's pages. What is not cheap is the
stock reader's arrays: it makes two numpy views per element, and a Gemma
header's 262,144 tokenizer strings took 23 s and 700 MB. `_HeaderReader`
reads arrays of numbers as one view and steps over arrays of strings, which
nothing here needs.
"""

from __future__ import annotations

import math
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFEndian,
    GGUFReader,
    GGUFValueType,
    Keys,
    LlamaFileType,
)

MAGIC = b"GGUF"
# What gguf's reader takes (gguf_reader.READER_SUPPORTED_VERSIONS); version 1 is pre-2023.
VERSIONS = (2, 3)
# What a damaged header can raise out of GGUFReader: reads past the end of the map come
# back short (IndexError on [0], ValueError from view or reshape), bad type codes are
# ValueError, a key twice is KeyError.
_READ_ERRORS = (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError, struct.error)


class GgufError(ValueError):
    """A file that is not a GGUF header sizing can use; the message is a sentence for an operator."""


@dataclass(frozen=True)
class GgufInfo:
    """What sizing needs from a GGUF header (issue 11, GGUF sizing).

    Head counts are the most any layer has when the file stores one per layer
    (`head_count_kv_per_layer` keeps the list, empty when the file stores one
    number); key and value lengths are the head size, from
    `{arch}.attention.key_length`/`value_length` or else embedding_length /
    head_count, as llama.cpp does. `size_bytes` is the file's size.
    """

    filename: str
    architecture: str
    name: str
    parameters: int
    quantization: str
    block_count: int
    context_length: int
    embedding_length: int
    head_count: int
    head_count_kv: int
    key_length: int
    value_length: int
    size_bytes: int
    head_count_kv_per_layer: tuple[int, ...] = ()


def read_gguf(path: str | os.PathLike[str]) -> GgufInfo:
    """Read the header of the GGUF file at `path`; raise GgufError with a sentence when it
    is missing, empty, not GGUF, truncated or damaged, or lacks what sizing needs."""
    path = Path(path)
    label = path.name
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
    except OSError as e:
        raise GgufError(f"{label} cannot be read: {e.strerror or e}.") from e
    if size == 0:
        raise GgufError(f"{label} is empty: a GGUF file starts with 'GGUF'.")
    if head[:4] != MAGIC:
        # repr of the bytes without its b: 'PK\x03\x04' reads as a zip, '<htm' as a web page.
        raise GgufError(
            f"{label} is not a GGUF file: it starts with {repr(head[:4])[1:]}, not 'GGUF'."
        )
    if len(head) < 8:
        raise GgufError(f"{label} is truncated: it is {size} bytes, shorter than a GGUF header.")
    little, big = int.from_bytes(head[4:], "little"), int.from_bytes(head[4:], "big")
    if little not in VERSIONS and big not in VERSIONS:
        raise GgufError(
            f"{label} is GGUF version {little}; this reader knows versions "
            f"{' and '.join(map(str, VERSIONS))}."
        )
    try:
        reader = _HeaderReader(path, label)
    except GgufError:
        raise
    except _READ_ERRORS as e:
        raise GgufError(
            f"{label} is truncated or damaged: its GGUF header could not be read to the end "
            f"({size:,} bytes; the reader said: {e})."
        ) from e
    try:
        return _info(reader, label, size)
    finally:
        del reader  # drop the map now rather than when a cycle collector gets round to it


def gguf_architecture(path: str | os.PathLike[str]) -> str | None:
    """The general.architecture of the GGUF file at `path`, read as `read_gguf` reads (the
    stock reader takes seconds over a tokenizer's strings); None when the file is not a
    GGUF this reader can read or says none."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != MAGIC:
                return None
        reader = _HeaderReader(path, path.name)
    except (OSError, GgufError, *_READ_ERRORS):
        return None
    try:
        arch = _value(reader, Keys.General.ARCHITECTURE)
    finally:
        del reader
    return arch if isinstance(arch, str) and arch else None


def _info(reader: GGUFReader, label: str, size: int) -> GgufInfo:
    arch = _value(reader, Keys.General.ARCHITECTURE)
    if not isinstance(arch, str) or not arch:
        raise GgufError(
            f"{label} has no general.architecture in its header, so it cannot be sized."
        )
    name = _value(reader, Keys.General.NAME)

    def number(template: str, *, required: bool = True) -> tuple[int, tuple[int, ...]] | None:
        key = template.format(arch=arch)
        value = _value(reader, key)
        if value is None:
            if required:
                raise GgufError(f"{label} ({arch}) has no {key} in its header, which sizing needs.")
            return None
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise GgufError(f"{label} has {key} = {value!r}, not a whole number.")
        if min(values) < 0:
            raise GgufError(f"{label} has {key} = {value!r}, which cannot be negative.")
        return max(values), tuple(values) if isinstance(value, list) else ()

    block_count = number(Keys.LLM.BLOCK_COUNT)[0]
    context_length = number(Keys.LLM.CONTEXT_LENGTH)[0]
    embedding_length = number(Keys.LLM.EMBEDDING_LENGTH)[0]
    head_count = number(Keys.Attention.HEAD_COUNT)[0]
    if not (block_count and context_length and embedding_length and head_count):
        raise GgufError(
            f"{label} ({arch}) says it has {block_count} layers, {context_length} tokens of "
            f"context, embeddings of {embedding_length} and {head_count} attention heads; "
            "sizing needs all of them above zero."
        )
    # Absent, llama.cpp takes as many KV heads as query heads (no grouped-query attention).
    kv = number(Keys.Attention.HEAD_COUNT_KV, required=False) or (head_count, ())
    key = number(Keys.Attention.KEY_LENGTH, required=False)
    value = number(Keys.Attention.VALUE_LENGTH, required=False)
    head_size = embedding_length // head_count
    if not reader.tensors:
        raise GgufError(
            f"{label} holds no tensors (a vocabulary-only GGUF?): there is no model to serve."
        )
    return GgufInfo(
        filename=label,
        architecture=arch,
        name=name if isinstance(name, str) else "",
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        quantization=_quantization(reader),
        block_count=block_count,
        context_length=context_length,
        embedding_length=embedding_length,
        head_count=head_count,
        head_count_kv=kv[0],
        key_length=key[0] if key else head_size,
        value_length=value[0] if value else head_size,
        size_bytes=size,
        head_count_kv_per_layer=kv[1],
    )


def _value(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    if field is None:
        return None
    return field.contents()


def _quantization(reader: GGUFReader) -> str:
    """general.file_type's name (MOSTLY_Q4_K_M is Q4_K_M), else the tensor type most
    weights are stored in: Q8_0 for Gemma 3 270M, whose embeddings outweigh the rest."""
    file_type = _value(reader, Keys.General.FILE_TYPE)
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            named = LlamaFileType(file_type).name
        except ValueError:
            named = ""  # newer than this gguf package
        if named and named != LlamaFileType.GUESSED.name:
            return named.removeprefix("MOSTLY_").removeprefix("ALL_")
    counts: Counter[str] = Counter()
    for t in reader.tensors:
        counts[t.tensor_type.name] += int(t.n_elements)
    return counts.most_common(1)[0][0]


class _HeaderReader(GGUFReader):
    """GGUFReader that reads arrays of numbers as one view, steps over arrays of strings
    (their contents read as []), and says in a sentence when tensor data is cut short."""

    def __init__(self, path: Path, label: str):
        self._label = label
        self._buffer: memoryview | None = None
        super().__init__(path, "r")

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list, list]:
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs
        raw_itype = self._get(offs, np.uint32)
        offs += int(raw_itype.nbytes)
        alen = self._get(offs, np.uint64)
        offs += int(alen.nbytes)
        itype = GGUFValueType(int(raw_itype[0]))
        count = int(alen[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            values = self._get(offs, nptype, count)
            if len(values) != count:
                raise IndexError(f"an array of {count} numbers runs past the end of the file")
            # One part holding every value: ReaderField.contents() flattens parts in order.
            size = offs + int(values.nbytes) - orig_offs
            return size, [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
        if itype == GGUFValueType.STRING:
            if self._buffer is None:
                self._buffer = memoryview(self.data)
            fmt = "<Q" if self.endianess == GGUFEndian.LITTLE else ">Q"
            # Each string takes its 8-byte length at least: a count the rest of the file
            # cannot hold is refused before a loop over it (a crafted header would have it
            # step through a 100 GB file eight bytes at a time).
            if count > (len(self.data) - offs) // 8:
                raise IndexError(f"an array of {count} strings runs past the end of the file")
            for _ in range(count):
                (length,) = struct.unpack_from(fmt, self._buffer, offs)
                offs += 8 + length
            if offs > len(self.data):
                raise IndexError(f"an array of {count} strings runs past the end of the file")
            return offs - orig_offs, [raw_itype, alen], [], [GGUFValueType.ARRAY, itype]
        return super()._get_field_parts(orig_offs, raw_type)  # arrays of arrays: rare, small

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        size = len(self.data)
        end = start_offs
        for field in fields:
            dims, raw_dtype, offset = field.parts[3], field.parts[4], field.parts[5]
            try:
                kind = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise GgufError(
                    f"{self._label} has a tensor of type {int(raw_dtype[0])}, which this gguf "
                    "package does not know: the file is damaged or newer than the package."
                ) from None
            block, type_size = GGML_QUANT_SIZES[kind]
            n_bytes = math.prod(int(d) for d in dims) * type_size // block
            end = max(end, start_offs + int(offset[0]) + n_bytes)
        if end > size:
            raise GgufError(
                f"{self._label} is truncated: it is {size:,} bytes and its tensors end at "
                f"byte {end:,}, so {end - size:,} bytes are missing (a download cut short?)."
            )
        super()._build_tensors(start_offs, fields)
