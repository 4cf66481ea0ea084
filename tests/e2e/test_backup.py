"""A backup restored into a fresh database: the cluster comes back with its replicas
adopted, their engines never stopped (issue 14, item 5; docs/operations.md)."""

from __future__ import annotations

import secrets
import sqlite3
import subprocess
from urllib.parse import urlparse

import httpx
import pytest

from .conftest import MODES
from .harness import SMALL, Cluster, gateway_key, gateway_project, listener_pid, wait_for


def _restore_postgres(cluster: Cluster, dump) -> None:
    """pg_dump the cluster's database, restore it into a new one and point the cluster
    there; the old one is dropped, as a lost server's would be."""
    old = cluster.env["DATABASE_URL"]
    subprocess.run(["pg_dump", "-Fc", "-d", old, "-f", str(dump)], check=True)
    fresh = f"llmgw_e2e_{secrets.token_hex(4)}"
    cluster._admin_sql(f'CREATE DATABASE "{fresh}"')
    url = urlparse(old)._replace(path=f"/{fresh}").geturl()
    subprocess.run(["pg_restore", "--no-owner", "-d", url, str(dump)], check=True)
    cluster._admin_sql(f'DROP DATABASE "{cluster.database}" WITH (FORCE)')
    cluster.database = fresh
    cluster.env["DATABASE_URL"] = url
    import redis

    redis.Redis.from_url(cluster.env["REDIS_URL"]).flushdb()  # Redis lost with it


def _restore_sqlite(cluster: Cluster, dump) -> None:
    """SQLite's online backup of the embedded database, put back in its place."""
    db = cluster.home / "llmgw.sqlite3"
    with sqlite3.connect(db) as source, sqlite3.connect(dump) as copy:
        source.backup(copy)
    for suffix in ("", "-wal", "-shm"):
        (cluster.home / f"llmgw.sqlite3{suffix}").unlink(missing_ok=True)
    with sqlite3.connect(dump) as copy, sqlite3.connect(db) as back:
        copy.backup(back)


@pytest.mark.parametrize("mode", MODES)
def test_a_restored_backup_brings_the_cluster_back_with_its_replicas_adopted(tmp_path, mode):
    cluster = Cluster(tmp_path / "cluster", production=mode == "production")
    try:
        cluster.start_server()
        cluster.start_agent("cpu-a", "--memory-gb", "8", "--cpus", "4", port_range="32300-32399")
        wait_for("the node", lambda: cluster.client.get("/nodes/cpu-a").status_code == 200)
        cluster.post("/models", SMALL)
        [replica] = wait_for(
            "a ready replica", lambda: cluster.ready_replicas("small") or None, timeout=60
        )
        engine = listener_pid(int(replica["endpoint"].rsplit(":", 1)[1]))
        key = gateway_key(cluster, gateway_project(cluster, "acme"), "k")
        ask = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
        auth = {"Authorization": f"Bearer {key['secret']}"}

        # The control plane goes away; the agent and its engine stay.
        for name in [n for n in list(cluster.procs) if not n.startswith("agent-")]:
            cluster.stop(name)
        (_restore_postgres if cluster.production else _restore_sqlite)(cluster, tmp_path / "dump")
        cluster.start_server()

        def adopted() -> list:
            ready = cluster.ready_replicas("small")
            return ready if [r["id"] for r in ready] == [replica["id"]] else []

        [back] = wait_for("the replica adopted", adopted, timeout=60)
        assert back["endpoint"] == replica["endpoint"]
        assert listener_pid(int(back["endpoint"].rsplit(":", 1)[1])) == engine
        # The restored rows may say the replica is ready before its agent is back (the
        # node unreachable until it reconnects, which a loaded machine can take seconds to).
        wait_for(
            "the node back ready",
            lambda: cluster.get("/nodes/cpu-a")["state"] == "ready",
            timeout=60,
        )
        # The same key answers: keys are in the database, their secret's HMAC under the
        # same LLMGW_SECRET_KEY.
        answer = wait_for(
            "the gateway to answer",
            lambda: (
                r
                if (
                    r := httpx.post(
                        f"{cluster.url}/v1/chat/completions", json=ask, headers=auth, timeout=30
                    )
                ).status_code
                == 200
                else None
            ),
            timeout=30,
        )
        assert answer.json()["model"] == "small"
        assert "unknown_credential" not in cluster.log("serve")
    finally:
        cluster.close()
