"""The mirror with real processes: a download from a hub on loopback survives the process
doing it being killed and resumes where it was cut; a model on those weights is placed
once they are ready, and its node's agent fetches them from the mirror into its cache; a
model that is a folder (a Hugging Face repository) reaches its engine as that folder."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.mirror.hub import Hub, HubFile

from .conftest import MODES
from .harness import Cluster, wait_for

DATA = os.urandom(12 * (1 << 20))
DIGEST = hashlib.sha256(DATA).hexdigest()
SOURCE = "hf://acme/tiny/tiny.gguf"
FOLDER = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}',
    "tokenizer/tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "model.safetensors": os.urandom(1 << 20),
}


@pytest.fixture
def hub():
    # Slow enough to be caught mid-way: 12 MiB at 2 MiB/s.
    folder = {
        path: HubFile(data, lfs=path.endswith(".safetensors")) for path, data in FOLDER.items()
    }
    repos = {"acme/tiny": {"tiny.gguf": HubFile(DATA)}, "acme/folder": folder}
    h = Hub(repos=repos, rate=2 * (1 << 20)).start()
    yield h
    h.stop()


@pytest.fixture(params=MODES)
def site(request, tmp_path, hub):
    cluster = Cluster(tmp_path, production=request.param == "production")
    cluster.env["HF_ENDPOINT"] = hub.url
    try:
        cluster.start_server()
        yield cluster
    finally:
        cluster.close()


def _weights(cluster: Cluster, weights_id: int) -> dict:
    return cluster.get(f"/weights/{weights_id}")


def _restart_the_downloader(cluster: Cluster) -> None:
    """Kill what runs the download (serve embedded, the mirror's Celery worker in
    production) without a chance to tidy up, and start it again."""
    if cluster.production:
        cluster.stop("mirror", signal.SIGKILL)
        celery = [sys.executable, "-m", "celery", "-A", "llmgw", "worker", "--pool", "solo"]
        cluster._spawn("mirror", [*celery, "-Q", "mirror", "-n", "mirror2@%h"])
    else:
        cluster.stop("serve", signal.SIGKILL)
        cluster.start_server()


def test_a_download_killed_mid_way_resumes_and_the_agent_fetches_it_from_the_mirror(site, hub):
    cluster = site
    added = cluster.post("/weights", {"source": SOURCE})
    # Answered at once; the worker may have claimed the file by the time it is answered.
    assert added["state"] in ("queued", "downloading") and added["bytes_total"] == len(DATA)

    wait_for(
        "the download to be under way",
        lambda: _weights(cluster, added["id"])["bytes_done"] >= 2 * (1 << 20),
        timeout=30,
    )
    _restart_the_downloader(cluster)
    hub.rate = None  # the rest at once

    ready = wait_for(
        "the weights to be ready",
        lambda: (w := _weights(cluster, added["id"]))["state"] == "ready" and w,
        timeout=90,
    )
    assert ready["files"][0]["sha256"] == DIGEST
    resumed = [r for r in hub.ranges if r]
    assert resumed and int(resumed[-1].split("=")[1].rstrip("-")) >= 2 * (1 << 20), hub.ranges

    cluster.start_agent("cpu-1", "--memory-gb", "8", "--cpus", "4", port_range="34000-34099")
    cluster.post(
        "/models",
        {
            "name": "tiny",
            "source": SOURCE,
            "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}],
        },
    )
    wait_for("the replica to be ready", lambda: cluster.ready_replicas("tiny"), timeout=60)

    cached = cluster.home / "cpu-1" / "weights" / "sha256" / DIGEST
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == DIGEST
    node = wait_for(
        "the node to report its cache",
        lambda: next((n for n in cluster.get("/nodes") if n.get("weights")), None),
        timeout=20,
    )
    assert [w["sha256"] for w in node["weights"]] == [DIGEST]
    assert _weights(cluster, added["id"])["last_used_at"] is not None


def test_a_folder_model_reaches_its_engine_as_the_folder_fetched_from_the_mirror(site):
    cluster = site
    added = cluster.post("/weights", {"source": "hf://acme/folder"})
    ready = wait_for(
        "the folder's weights to be ready",
        lambda: (w := _weights(cluster, added["id"]))["state"] == "ready" and w,
        timeout=60,
    )
    digests = sorted(f["sha256"] for f in ready["files"])
    assert len(digests) == 3

    cluster.start_agent("cpu-1", "--memory-gb", "8", "--cpus", "4", port_range="34100-34199")
    cluster.post(
        "/models",
        {
            "name": "folder",
            "source": "hf://acme/folder",
            "profiles": [{"name": "cpu", "engine": "sim", "cpu_cores": 1, "min_memory_gb": 1}],
        },
    )
    # The sim engine is given the folder as --weights and exits when no such path exists.
    wait_for("the replica to be ready", lambda: cluster.ready_replicas("folder"), timeout=60)

    cache = cluster.home / "cpu-1" / "weights"
    (assembled,) = (cache / "folders").glob("[0-9a-f]*[0-9a-f]")
    got = {str(p.relative_to(assembled)): p.read_bytes() for p in assembled.rglob("*.*")}
    assert got == FOLDER
    (argv,) = [a for a in _command_lines() if "sim-engine" in a and "folder" in a]
    assert argv[argv.index("--weights") + 1] == str(assembled)
    assert sorted(p.name for p in (cache / "sha256").glob("*") if p.suffix == "") == digests
    node = wait_for(
        "the node to report its cache",
        lambda: next((n for n in cluster.get("/nodes") if len(n.get("weights") or ()) == 3), None),
        timeout=20,
    )
    assert sorted(w["sha256"] for w in node["weights"]) == digests
    assert {w["source"] for w in node["weights"]} == {"hf://acme/folder"}


def _command_lines() -> list[list[str]]:
    """Every process's argv here, as /proc has it."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(cmdline.read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue
    return out
