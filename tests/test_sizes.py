"""One formatter for sizes on every page (llmgw/core/sizes.py): the mirror's card and a
node's weight cache say the same file's size the same way."""

from __future__ import annotations

import pytest
from django.template import engines
from hypothesis import given, strategies as st

from llmgw.core.sizes import size_text
from mirror import views as mirror_views


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (253_134_592, "253 MB"),  # 241.4 MiB, which must never be called MB
        (4 << 30, "4.3 GB"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (141_000_000_000, "141 GB"),
        (3 * 10**15, "3000 TB"),
    ],
)
def test_a_size_in_decimal_units(n, said):
    assert size_text(n) == said


@pytest.mark.parametrize("unknown", [None, 0, -5, "12", True])
def test_an_unknown_size_is_a_dash_never_zero_bytes(unknown):
    assert size_text(unknown) == "–"


@given(st.integers(min_value=1, max_value=10**15))
def test_the_mirror_and_the_pages_filter_say_every_size_alike(n):
    page = engines["django"].from_string("{{ n|bytes }}").render({"n": n})
    assert page == mirror_views._bytes(n) == size_text(n)
