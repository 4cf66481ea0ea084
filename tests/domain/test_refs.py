"""start_shard's weights as the control plane says them and an agent reads them: one file
as it always was, or every file of a folder; anything else a sentence, never a crash."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from mirror.domain.refs import FolderRef, RefError, WeightsRef, safe_path, weights_from_message

A, B, C = "a" * 64, "b" * 64, "c" * 64


def entry(path, sha256=A, size=10):
    return {"sha256": sha256, "size": size, "url": f"/api/v1/mirror/files/{sha256}", "path": path}


def test_a_single_file_reads_as_it_always_did():
    raw = {"sha256": A, "size": 5, "url": "/f", "file": "tiny.gguf"}

    ref = weights_from_message(raw)

    assert ref == WeightsRef(A, 5, "/f", "tiny.gguf")
    assert ref.message() == raw and ref.digests == (A,)


def test_a_folder_round_trips_sorted_by_path_with_each_digest_once():
    raw = {
        "files": [entry("tokenizer/vocab.json", B), entry("config.json"), entry("extra.json")],
        "name": "hf://acme/tiny",
    }

    ref = weights_from_message(raw)

    assert isinstance(ref, FolderRef)
    assert [f.file for f in ref.files] == ["config.json", "extra.json", "tokenizer/vocab.json"]
    assert ref.digests == (A, B) and ref.size == 30
    assert FolderRef.from_message(ref.message()) == ref
    # One folder, one key; any file changed, another.
    assert ref.key == FolderRef.from_message(ref.message()).key
    files = [entry("tokenizer/vocab.json", B), entry("config.json", C), entry("extra.json")]
    changed = {**raw, "files": files}
    assert FolderRef.from_message(changed).key != ref.key


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ([], "list 0 files"),
        (["x"], "is not an object"),
        ([entry("../x")], "The path '../x' of a weights file leaves its folder"),
        ([entry("/etc/passwd")], "The path '/etc/passwd' of a weights file is absolute"),
        ([entry("a\\b")], "is absolute"),
        ([entry("a/./b")], "leaves its folder or is not plain"),
        ([entry("")], "has no path"),
        ([{"size": 1, "url": "/f", "path": "x"}], "no sha256"),
        ([entry("a"), entry("a", B)], "Two files of the weights are at one path, 'a'"),
        ([entry("a"), entry("a/b", B)], "a file 'a' and a file inside it, 'a/b'"),
    ],
)
def test_a_folder_an_agent_cannot_assemble_is_a_sentence(files, said):
    with pytest.raises(RefError, match=re.escape(said)):
        weights_from_message({"files": files, "name": "hf://acme/x"})


def test_an_agent_of_an_earlier_release_fails_a_folder_rather_than_run_one_of_its_files():
    raw = FolderRef((WeightsRef(A, 1, "/f", "config.json"),), "hf://acme/x").message()

    with pytest.raises(RefError, match="no sha256"):
        WeightsRef.from_message(raw)  # what such an agent calls


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)
_files = st.lists(
    st.fixed_dictionaries(
        {
            "sha256": st.sampled_from([A, B, "x", 3]),
            "size": st.integers(-2, 5) | st.booleans(),
            "url": st.sampled_from(["/f", "", None]),
            "path": st.text(alphabet="ab./\\\0", max_size=6),
        }
    ),
    max_size=4,
)


@given(st.one_of(_json, st.fixed_dictionaries({"files": _files, "name": _json})))
def test_any_message_is_read_or_refused_with_a_sentence(raw):
    try:
        ref = weights_from_message(raw)
    except RefError as exc:
        assert str(exc).endswith(".") and len(str(exc).split()) >= 4
        return
    for f in getattr(ref, "files", ()):
        # What was read names a file inside its folder.
        assert safe_path(f.file) == f.file
        assert not f.file.startswith("/") and ".." not in f.file.split("/")
