"""Sources read into their parts, and weights' state from their files (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from mirror.domain.progress import (
    ATTEMPTS,
    FileProgress,
    progress,
    retry_delay,
)
from mirror.domain.sources import HF, HTTPS, LOCAL, SourceError, inside, parse_source


@pytest.mark.parametrize(
    ("text", "kind", "repo", "rev", "pattern"),
    [
        ("hf://acme/tiny", HF, "acme/tiny", None, None),
        ("hf://acme/tiny@v1.0", HF, "acme/tiny", "v1.0", None),
        ("hf://acme/tiny@main/model.Q4_K_M.gguf", HF, "acme/tiny", "main", "model.Q4_K_M.gguf"),
        ("hf://acme/tiny/sub/*.gguf", HF, "acme/tiny", None, "sub/*.gguf"),
        ("https://example.org/m/model.gguf", HTTPS, None, None, "model.gguf"),
        ("/srv/models/tiny", LOCAL, None, None, None),
    ],
)
def test_a_source_is_read_into_its_parts(text, kind, repo, rev, pattern):
    s = parse_source(text)
    assert (s.kind, s.repo, s.revision, s.pattern) == (kind, repo, rev, pattern)


def test_a_glob_selects_by_pattern_and_a_path_selects_itself_or_its_folder():
    glob = parse_source("hf://acme/tiny/*.gguf")
    folder = parse_source("hf://acme/tiny/q4")
    assert glob.selects("a.gguf") and not glob.selects("README.md")
    assert folder.selects("q4/a.gguf") and folder.selects("q4") and not folder.selects("q40/a")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "ftp://x/y",
        "http://example.org/x.gguf",
        "hf://a",
        "hf://a/b/../../c",
        "hf://-a/b",
        "https:///x",
        "https://example.org/",
        "relative/path",
        "/a/../b",
        "x" * 600,
        "hf://a/b\tc",
    ],
)
def test_what_is_not_a_source_is_a_sentence(text):
    with pytest.raises(SourceError) as err:
        parse_source(text)
    assert str(err.value).endswith(".")


def test_inside_is_by_folder_not_by_prefix():
    assert inside("/srv/models/a", ("/srv/models",))
    assert inside("/srv/models", ("/srv/models",))
    assert not inside("/srv/models-old/a", ("/srv/models",))


@given(st.text(max_size=80))
def test_any_text_is_read_or_refused_with_a_sentence(text):
    try:
        parse_source(text)
    except SourceError as exc:
        assert str(exc)


def _f(state, done=0, size=10, detail="", path="a"):
    return FileProgress(path=path, state=state, done=done, size=size, detail=detail)


def test_weights_are_ready_when_every_file_is():
    assert progress([_f("ready", 10), _f("ready", 10)]).state == "ready"
    assert progress([_f("ready", 10), _f("queued")]).state == "queued"
    assert progress([_f("ready", 10), _f("queued", 3)]).state == "downloading"


def test_a_failed_file_fails_the_weights_with_its_sentence():
    p = progress(
        [_f("ready", 10), _f("failed", detail="it broke.", path="b"), _f("failed", path="c")]
    )
    assert (p.state, p.detail) == ("failed", "b: it broke. (1 more files failed too)")


def test_a_size_not_known_leaves_the_total_unknown_not_zero():
    assert progress([_f("queued", size=None), _f("queued")]).total is None
    assert progress([_f("queued", size=4), _f("queued", size=6)]).total == 10


def test_retries_back_off_to_ten_minutes():
    delays = [retry_delay(n) for n in range(1, ATTEMPTS + 5)]
    assert delays[:3] == [5.0, 10.0, 20.0]
    assert delays == sorted(delays) and max(delays) == 600.0


def test_how_far_a_fetch_got_is_said_without_a_total_as_the_bytes_so_far():
    from mirror.domain.progress import fetched_said

    assert fetched_said(100_000_000, 250_000_000) == "40% of 250 MB"
    assert fetched_said(3_000_000, None) == "3 MB"
    assert fetched_said(None, 0) == "0 MB"
