"""``llmgw ctl adapter add|list|show|rm`` against the real REST API."""

from __future__ import annotations

import pytest

from catalog.models import Adapter
from catalog.services import model_add
from tests.catalog.test_adapters import hub  # noqa: F401 - a fixture: acme/support-lora
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
    assert "  mirror:  0% of " in out  # its repository added to the mirror, not fetched yet

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


def test_ctl_replicas_says_which_adapters_each_engine_holds(capsys, server, acme):  # noqa: F811
    from fleet.models import Node
    from llmgw.core import clock
    from tests.catalog.test_pages import ready_replica
    from tests.fleet.builders import node_add

    model_add(data=gpu_model("llama"), actor="t")
    _, out, _ = ctl_run(capsys, server, "replicas")
    assert "ADAPTERS" not in out  # none holds any: the table as before
    node_add("n1", now=clock.now())
    ready_replica("llama-1", "llama", node="n1", gpus=[0])
    ready_replica("llama-2", "llama", node="n1", gpus=[1])
    Node.objects.filter(pk="n1").update(
        state=Node.READY,
        load={
            "engines": {
                "llama-1-0": {"running": 1, "adapters": [{"name": "a"}, {"name": "b"}]},
                "llama-2-0": {"running": 0},
            }
        },
    )

    code, out, _ = ctl_run(capsys, server, "replicas")
    assert code == 0
    rows = table(out)
    assert rows[0][-1] == "ADAPTERS"
    assert rows[1][0] == "llama-1" and out.splitlines()[1].endswith("a, b")
    assert rows[2][-1] == "-"
