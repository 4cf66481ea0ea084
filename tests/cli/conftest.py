"""Every ctl test has a token and no server in its environment unless it sets one."""

from __future__ import annotations

import pytest

from tests.cli.helpers import TOKEN


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    monkeypatch.setenv("LLMGW_TOKEN", TOKEN)
    monkeypatch.delenv("LLMGW_SERVER", raising=False)
