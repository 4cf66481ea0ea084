"""``llmgw ctl adapter add|list|show|rm`` against the real REST API."""

from __future__ import annotations

import pytest

from catalog.models import Adapter
from catalog.services import model_add
from tests.cli.helpers import table
from tests.cli.test_ctl_against_the_api import acme, ctl_run  # noqa: F401 - a fixture
from tests.fleet.builders import gpu_model

pytestmark = pytest.mark.django_db


def test_an_adapter_is_added_listed_shown_and_removed_with_ctl(capsys, server, acme):  # noqa: F811
    data = gpu_model("llama")
    data["profiles"][0]["adapter_slots"] = 2
    model_add(data=data, actor="t")

    code, out, err = ctl_run(
        capsys, server, "adapter", "add", "support", "--base", "llama", "--source",
        "hf://acme/support-lora", "--format", "peft", "--rank", "8", "--owner", "team:Acme/ml",
        "--alias", "help",
    )  # fmt: skip
    assert (code, err) == (0, ""), err
    assert out.splitlines()[0] == "adapter support on llama"
    assert "  aliases: help" in out

    _, out, _ = ctl_run(capsys, server, "adapter", "list")
    assert table(out) == [
        ["NAME", "BASE", "FORMAT", "RANK", "OWNER", "HELD BY"],
        ["support", "llama", "peft", "8", f"team:{acme['ml']}", "-"],
    ]
    _, out, _ = ctl_run(capsys, server, "adapter", "show", "support")
    assert "held by: no replica now" in out

    code, _, err = ctl_run(
        capsys, server, "adapter", "add", "big", "--base", "llama", "--source", "hf://a/b",
        "--format", "peft", "--rank", "64", "--owner", "team:Acme/ml",
    )  # fmt: skip
    assert code == 1
    assert err == (
        "error: adapter big: rank 64 is above base llama's max LoRA rank 16 "
        "(its profile's --max-lora-rank).\n"
    )

    code, out, _ = ctl_run(capsys, server, "adapter", "rm", "support")
    assert code == 0 and "adapter support removed" in out
    assert not Adapter.objects.exists()
