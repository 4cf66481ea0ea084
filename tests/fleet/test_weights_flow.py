"""Mirror weights through the fleet's shell: a model waits for its weights, start_shard
carries them once ready, a fetching shard's progress is kept and shown, and what a node's
cache holds is recorded from register and heartbeats."""

from __future__ import annotations

from datetime import timedelta

import pytest

from catalog.services import model_add
from fleet.models import ModelState, Node, Replica
from fleet.nodes.reports import node_weights_record, shard_status_record
from fleet.protocol import Heartbeat, ShardStatus
from fleet.reconciler import run as reconciler
from fleet.reconciler.run import reconcile_once
from fleet.selectors.listings import replicas_list
from mirror.models import WeightFile
from mirror.worker import work_until_idle
from tests.fleet.builders import T0, node_add
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

DIGEST = "ab" * 32


@pytest.fixture
def sent(monkeypatch):
    commands = []
    monkeypatch.setattr(reconciler, "dispatch", commands.extend)
    return commands


@pytest.fixture
def weights(api, mirror_dir):  # noqa: F811
    path = mirror_dir / "allowed" / "tiny.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 1000)
    return api.call("POST", "/weights", {"source": str(path)}).json()


def _model(source: str) -> None:
    model_add(
        data={
            "name": "tiny",
            "source": source,
            "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}],
        },
        actor="test",
    )


def test_a_model_waits_for_its_weights_then_start_shard_carries_them(
    no_settle, sent, weights, django_capture_on_commit_callbacks
):
    _model(weights["source"])
    node_add("gpu-a", now=T0)

    reconcile_once(now=T0)

    assert not Replica.objects.exists()
    reasons = ModelState.objects.get(pk="tiny").explanation[0]["reasons"]
    assert reasons == [f"waiting for weights {weights['id']} (tiny.gguf): queued, 0% of 0.00 GB"]

    work_until_idle()
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0 + timedelta(seconds=5))

    (start,) = [c.payload for c in sent if c.payload["type"] == "start_shard"]
    digest = WeightFile.objects.get().sha256
    assert start["weights"] == {
        "sha256": digest,
        "size": 1004,
        "url": f"/api/v1/mirror/files/{digest}",
        "file": "tiny.gguf",
    }
    assert start["source"] == weights["source"]


def test_a_folder_model_waits_while_any_file_is_not_ready_then_gets_every_file(
    api,
    no_settle,
    sent,
    mirror_dir,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    folder = mirror_dir / "allowed" / "tiny-hf"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00" * 2000)
    weights = api.call("POST", "/weights", {"source": str(folder)}).json()
    _model(weights["source"])
    node_add("gpu-a", now=T0)
    work_until_idle()
    files = {f.path: f.sha256 for f in WeightFile.objects.all()}
    WeightFile.objects.filter(path="model.safetensors").update(
        state="downloading", sha256="", bytes_done=500
    )

    reconcile_once(now=T0)

    assert not Replica.objects.exists()
    reasons = ModelState.objects.get(pk="tiny").explanation[0]["reasons"]
    assert reasons == [
        f"waiting for weights {weights['id']} (model.safetensors): downloading, 25% of 0.00 GB"
    ]

    WeightFile.objects.filter(path="model.safetensors").update(
        state="ready", sha256=files["model.safetensors"], bytes_done=2000
    )
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0 + timedelta(seconds=5))

    (start,) = [c.payload for c in sent if c.payload["type"] == "start_shard"]
    assert start["weights"] == {
        "files": [
            {
                "sha256": files[path],
                "size": size,
                "url": f"/api/v1/mirror/files/{files[path]}",
                "path": path,
            }
            for path, size in (
                ("config.json", 23),
                ("model.safetensors", 2000),
                ("tokenizer/tokenizer.json", 2),
            )
        ],
        "name": weights["source"],
    }


def test_a_model_whose_weights_failed_says_so_and_how_to_retry(no_settle, sent, weights):
    WeightFile.objects.update(state="failed", detail="it broke.")
    _model(weights["source"])
    node_add("gpu-a", now=T0)

    reconcile_once(now=T0)

    reasons = ModelState.objects.get(pk="tiny").explanation[0]["reasons"]
    assert reasons == [
        f"waiting for weights {weights['id']} (tiny.gguf): failed: it broke.; "
        f"llmgw ctl weights retry {weights['id']}"
    ]


def test_a_source_that_is_no_mirror_weights_is_sent_as_it_is(no_settle, sent, mirror_dir):  # noqa: F811
    _model("/models/tiny.gguf")
    node_add("gpu-a", now=T0)

    reconcile_once(now=T0)

    assert Replica.objects.count() == 1


def test_a_fetching_shards_progress_is_kept_and_shown(no_settle, sent, mirror_dir):  # noqa: F811
    _model("/models/tiny.gguf")
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    shard = Replica.objects.get().shards.get()

    shard_status_record(
        node_id="gpu-a",
        msg=ShardStatus(
            type="shard_status",
            shard_id=shard.id,
            state="fetching",
            progress={"done": 100_000_000, "total": 250_000_000},
        ),
        now=T0,
    )

    (row,) = replicas_list()
    assert row["fetching"] == {"done": 100_000_000, "total": 250_000_000}
    assert row["state"] == "pending"
    # Past the startup timeout while fetching: not given up on.
    reconcile_once(now=T0 + timedelta(hours=2))
    assert Replica.objects.get().state == "pending"


def test_what_a_nodes_cache_holds_is_recorded_from_register_and_heartbeats(mirror_dir):  # noqa: F811
    node_add("gpu-a", now=T0)
    frame = {
        "type": "heartbeat",
        "seq": 1,
        "weights": [{"sha256": DIGEST, "size": 5, "source": "hf://a/b"}],
    }
    hb = Heartbeat.model_validate(frame)

    node_weights_record(node_id="gpu-a", weights=hb.weights, disk=None)

    node = Node.objects.get()
    assert node.weights == [
        {"sha256": DIGEST, "source": "hf://a/b", "digest": "", "size": 5, "used_at": None}
    ]
    assert node.disk_free_gb == 500.0  # as registered: a heartbeat without it changes nothing


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "heartbeat", "seq": 1, "weights": [{"sha256": "nothex", "size": 5}]},
        {"type": "heartbeat", "seq": 1, "weights": [{"sha256": DIGEST, "size": -1}]},
        {
            "type": "shard_status",
            "shard_id": "tiny-1-0",
            "state": "fetching",
            "progress": {"done": -1},
        },
        {"type": "shard_status", "shard_id": "tiny-1-0", "state": "fetching", "progress": "half"},
    ],
)
def test_weights_and_progress_that_make_no_sense_are_refused(frame):
    import json

    from fleet.protocol import BadMessage, parse

    with pytest.raises(BadMessage):
        parse(json.dumps(frame))
