"""Issue 35's attacks, as its report made them: a real `llmgw serve`, a real agent running a
replica, and a hostile node as a process of its own (tests/e2e/hostile_agent.py) holding
nothing but the join token and the credential it was given. It claims the other node's
replica under two ids, a replica it was never given and 300 made up in the same frame, a
mirror file through a claimed shard and an address it does not connect from; fails the other's shard and goes silent. None of
it changes anything of anyone else's, and no tenant's request reaches it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from catalog.domain import parse_model

from .conftest import MODES
from .harness import REPO, SMALL, Cluster, free_port, gateway_key, gateway_project, wait_for

HOSTILE = REPO / "tests" / "e2e" / "hostile_agent.py"


def _hostile(cluster: Cluster, tmp: Path, node_id: str, addr: str, claims, then=(), fetch=""):
    """The hostile node's process and the file it writes what it saw to."""
    out, port = tmp / f"{node_id}.json", free_port()
    (tmp / f"{node_id}-claims.json").write_text(json.dumps(claims(port)))
    (tmp / f"{node_id}-then.json").write_text(json.dumps(list(then)))
    cmd = [
        sys.executable, str(HOSTILE), "--server", cluster.url, "--node-id", node_id,
        "--addr", addr, "--listen", str(port), "--out", str(out),
        "--claims", str(tmp / f"{node_id}-claims.json"), "--then", str(tmp / f"{node_id}-then.json"),
    ] + (["--fetch", fetch] if fetch else [])  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env={**cluster.env, "LLMGW_TOKEN": cluster.agent_token},
        cwd=REPO,
        stdout=open(tmp / f"{node_id}.log", "ab"),  # noqa: SIM115 - the child writes it
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    cluster.procs[f"hostile-{node_id}"] = proc
    seen = wait_for(
        f"{node_id} to register and hear back",
        lambda: out.exists() and (s := json.loads(out.read_text()))["registered"] and s,
        timeout=30,
    )
    return proc, out, seen


def _placed(cluster: Cluster) -> list[tuple]:
    """Every replica with its state, endpoint and shards (not its last use: requests move it)."""
    return [
        (r["id"], r["state"], r["endpoint"], [(s["id"], s["node"], s["rank"]) for s in r["shards"]])
        for r in cluster.get("/replicas")
    ]


def _fields(text: str) -> dict[str, str]:
    """`ctl node show`'s `key: value` lines."""
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _claim(replica_id: str, shard_id: str, model: str, profile: str, fp: str, endpoint: str):
    return {
        "shard_id": shard_id,
        "replica_id": replica_id,
        "model": model,
        "profile": profile,
        "profile_fp": fp,
        "gpu_indices": [],
        "endpoint": endpoint,
        "state": "ready",
    }


@pytest.mark.parametrize("mode", MODES)
def test_a_hostile_node_changes_nothing_of_anyone_elses(tmp_path, mode):
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "tiny.gguf").write_bytes(b"GGUF" + b"\x00" * 4096)
    cluster = Cluster(tmp_path / "cluster", production=mode == "production", mirror_sources=sources)
    # The control plane takes back what it did not place for a second after it starts.
    cluster.env["LLMGW_ADOPT_WINDOW_SECONDS"] = "1"
    try:
        cluster.start_server()
        cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="32400-32499")
        cluster.post("/models", SMALL)
        [victim] = wait_for("a ready replica", lambda: cluster.ready_replicas("small") or None)
        weights = cluster.post("/weights", {"source": str(sources / "tiny.gguf")})
        wait_for(
            "the weights", lambda: cluster.get(f"/weights/{weights['id']}")["state"] == "ready"
        )
        digest = cluster.get(f"/weights/{weights['id']}")["files"][0]["sha256"]
        tiny = SMALL | {
            "name": "tiny",
            "source": weights["source"],
            "scaling": {"min": 0, "max": 1},
        }
        cluster.post("/models", tiny)
        fp = {
            m: parse_model(s).profile("cpu").fingerprint()
            for m, s in (("small", SMALL), ("tiny", tiny))
        }
        before = _placed(cluster)
        time.sleep(2)  # past the window: this control plane has run all along

        rid = victim["id"]
        proc, out, seen = _hostile(
            cluster,
            tmp_path,
            "evil",
            "127.0.0.1",
            lambda port: [
                _claim(rid, f"{rid}-0", "small", "cpu", fp["small"], f"http://127.0.0.1:{port}"),
                _claim(rid, f"{rid}-00", "small", "cpu", fp["small"], f"http://127.0.0.1:{port}"),
                _claim("small-ffffff", "small-ffffff-0", "small", "cpu", fp["small"], f"http://127.0.0.1:{port}"),
                _claim("tiny-eeeeee", "tiny-eeeeee-0", "tiny", "cpu", fp["tiny"], f"http://127.0.0.1:{port}"),
                *(_claim(f"small-{i:06x}", f"small-{i:06x}-0", "small", "cpu", fp["small"], f"http://127.0.0.1:{port}") for i in range(300)),
            ],
            then=[{"type": "shard_status", "shard_id": f"{rid}-0", "state": "failed", "detail": "gone"}],
            fetch=digest,
        )  # fmt: skip

        stopped = sorted(a["shard_id"] for a in seen["answers"] if a["type"] == "stop_shard")
        made_up = [f"small-{i:06x}-0" for i in range(300)]
        assert stopped == sorted(
            [f"{rid}-0", f"{rid}-00", "small-ffffff-0", "tiny-eeeeee-0", *made_up]
        )
        assert seen["fetch"] == {
            "status": 403,
            "detail": f"Node evil was given no shard that needs the file {digest} now.",
        }
        assert _placed(cluster) == before
        assert cluster.get("/replicas", model="tiny") == []

        # Every tenant's request goes to the replica gpu-a's agent runs, none to evil.
        key = gateway_key(cluster, gateway_project(cluster, "acme"), "k")
        client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=key["secret"], max_retries=0)
        for _ in range(20):
            answer = client.chat.completions.create(
                model="small", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert answer.usage.completion_tokens == 3
        assert json.loads(out.read_text())["requests"] == 0

        # Gone silent (killed), it takes nothing with it.
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for("evil to be unreachable", lambda: cluster.get("/nodes/evil")["state"] != "ready")
        assert _placed(cluster) == before

        # Counted, and said where an operator looks.
        metrics = httpx.get(f"{cluster.url}/metrics").text
        assert 'llmgw_agent_refused_total{reason="shard_elsewhere"} 1.0' in metrics
        events = cluster.ctl("events", "--node", "evil").stdout
        assert "node evil reported 304 shard(s) the control plane did not give it" in events

        # A node naming an address it does not connect from: stopped there, held out.
        _, _, seen = _hostile(
            cluster,
            tmp_path,
            "evil2",
            "203.0.113.7",
            lambda port: [_claim("small-dddddd", "small-dddddd-0", "small", "cpu", fp["small"], "http://203.0.113.7:1")],
        )  # fmt: skip
        assert [a["shard_id"] for a in seen["answers"] if a["type"] == "stop_shard"] == [
            "small-dddddd-0"
        ]
        shown = wait_for(
            "evil2 held for its address",
            lambda: (
                (f := _fields(cluster.ctl("node", "show", "evil2").stdout))["state"] == "unapproved"
                and f
            ),
        )
        assert shown["connects from"] == "127.0.0.1"
        assert shown["address refused"].startswith(
            "node evil2 says its engines are at 203.0.113.7 but connects from 127.0.0.1"
        )
        assert _placed(cluster) == before
    finally:
        cluster.close()
