"""``llmgw ctl weights`` and ``ctl model serve`` against the real REST API."""

from __future__ import annotations

import pytest

from catalog.models import Model
from llmgw.cli import ctl
from mirror.worker import work_until_idle
from tests.mirror.ggufs import write_gguf
from tests.mirror.test_serve import _cpu_node
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def _ctl(capsys, server, *argv):
    code = ctl.main(list(argv), transport=server)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def gguf(mirror_dir):  # noqa: F811
    return write_gguf(mirror_dir / "allowed" / "tiny.gguf", name="Tiny", context_length=8192)


def _id() -> str:
    # By its row, not 1: PostgreSQL's sequences are not rolled back between tests.
    from mirror.models import Weights

    return str(Weights.objects.get().pk)


def test_weights_are_added_listed_and_shown(capsys, server, gguf):
    code, out, _ = _ctl(capsys, server, "weights", "add", str(gguf))
    assert code == 0 and f"weights {_id()}: {gguf}" in out and "state:     queued" in out

    work_until_idle()
    code, out, _ = _ctl(capsys, server, "weights", "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["ID", "STATE", "PROGRESS", "SOURCE", "MODELS", "ADDED"]
    assert "ready" in out and str(gguf) in out

    code, out, _ = _ctl(capsys, server, "weights", "show", _id())
    assert code == 0 and "tiny.gguf  ready" in out


def test_a_source_refused_is_the_servers_sentence(capsys, server, mirror_dir):  # noqa: F811
    code, _, err = _ctl(capsys, server, "weights", "add", "ftp://x/y.gguf")

    assert code != 0
    assert "which the mirror does not fetch" in err


def test_model_serve_shows_the_plan_then_adds_the_model_with_apply(capsys, server, gguf):
    _cpu_node("big", memory_gb=64, cpus=16)
    _ctl(capsys, server, "weights", "add", str(gguf))
    work_until_idle()

    code, out, _ = _ctl(capsys, server, "model", "serve", _id(), "--name", "tiny", "--ctx", "4096")
    assert code == 0
    assert "needs 2 GB and 8 cores at a context pool of 4,096" in out
    assert "fits on: big" in out
    assert not Model.objects.exists()

    code, out, _ = _ctl(
        capsys, server, "model", "serve", _id(), "--name", "tiny", "--ctx", "4096", "--apply"
    )
    assert code == 0 and "model tiny added" in out
    assert Model.objects.get().source == str(gguf)


def test_weights_a_model_uses_cannot_be_removed(capsys, server, gguf):
    _cpu_node("big", memory_gb=64, cpus=16)
    _ctl(capsys, server, "weights", "add", str(gguf))
    work_until_idle()
    _ctl(capsys, server, "model", "serve", _id(), "--name", "tiny", "--apply")

    code, _, err = _ctl(capsys, server, "weights", "rm", _id())

    assert code != 0 and "used by tiny" in err


def test_replicas_show_how_far_a_fetch_got(capsys):
    from tests.cli.helpers import FakeServer, run, table

    fetching = {
        "id": "tiny-1", "model": "tiny", "profile": "cpu", "state": "pending", "shards": [],
        "endpoint": "", "created_at": None, "outdated": False,
        "fetching": {"done": 100_000_000, "total": 250_000_000},
    }  # fmt: skip
    server = FakeServer({("GET", "/api/v1/replicas"): (200, [fetching])})

    code, out, _ = run(capsys, server, "replicas")

    assert code == 0
    assert table(out)[1][3] == "fetching 40% of 250 MB"


def test_a_safetensors_repository_is_planned_and_served_as_vllm_from_ctl(
    capsys,
    server,
    api,
    tmp_path,
    monkeypatch,
    mirror_dir,  # noqa: F811
):
    from huggingface_hub import constants

    from fleet.models import Replica
    from fleet.reconciler.run import reconcile_once
    from tests.fleet.builders import L4, node_add
    from tests.mirror.hub import Hub
    from tests.mirror.test_serve_safetensors import T0, llama_repo

    hub = Hub(repos={"meta-llama/Llama-3.1-8B-Instruct": llama_repo(tmp_path)}).start()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    try:
        node_add("l4-node", now=T0, gpus=(L4, L4))
        code, _, err = _ctl(
            capsys, server, "weights", "add", "hf://meta-llama/Llama-3.1-8B-Instruct"
        )
        assert code == 0, err
        work_until_idle()

        code, out, err = _ctl(capsys, server, "weights", "plan", _id(), "--ctx", "131072")
        assert code == 0, err
        assert "LlamaForCausalLM, 8,030,261,248 parameters, BF16, trained on 131,072" in out
        assert "l4-24g: tp 2, 1 sequence of 131,072; fits on: l4-node." in out

        code, out, err = _ctl(
            capsys, server, "model", "serve", _id(), "--name", "llama", "--ctx", "131072",
            "--selector", "zone=a", "--cores", "4", "--apply",
        )  # fmt: skip
        # Placed nowhere yet: no node has the label, which placement says.
        assert code == 0, err
        assert "model llama added" in out
        profile = Model.objects.get(name="llama").profiles.get()
        assert (profile.engine, profile.tp, profile.node_selector) == ("vllm", 2, {"zone": "a"})
        reconcile_once(now=T0)
        assert not Replica.objects.filter(model="llama").exists()
    finally:
        hub.stop()


def test_a_bad_selector_is_said_before_asking(capsys, server):
    code, _, err = _ctl(capsys, server, "model", "serve", "1", "--name", "x", "--selector", "zone")

    assert code != 0 and "--selector takes KEY=VALUE, not 'zone'" in err
