"""A server stopped right after answering still writes the usage it had tallied."""

from __future__ import annotations

import httpx

from .harness import gateway_key, gateway_project, wait_for


def test_usage_tallied_just_before_a_stop_is_written_on_the_way_down(cluster):
    cluster.start_agent("gpu-a", "--simulate-gpus", "1xh100-80g", port_range="33000-33099")
    wait_for("a ready node", lambda: [n["state"] for n in cluster.get("/nodes")] == ["ready"])
    cluster.post(
        "/models",
        {
            "name": "chat",
            "source": "hf://acme/chat",
            "profiles": [
                {
                    "name": "gpu",
                    "engine": "sim",
                    "gpu_class": "h100-80g",
                    "args": ["--ttft-ms", "1"],
                }
            ],
        },
    )
    wait_for("a ready replica", lambda: len(cluster.ready_replicas("chat")) == 1)
    key = gateway_key(cluster, gateway_project(cluster, "acme"), "main")
    answer = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key['secret']}"},
        json={"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    ).json()

    # At once: well within the 2 s between the gateway's usage writes.
    cluster.stop("serve")
    # All it held was written: its usage journal is gone with it.
    assert list((cluster.home / "usage").glob("*.journal")) == []
    cluster.start_server()

    rows = cluster.get("/usage", by="key")["rows"]
    assert [(r["model"], r["requests"], r["completion_tokens"]) for r in rows] == [
        ("chat", 1, answer["usage"]["completion_tokens"])
    ]
