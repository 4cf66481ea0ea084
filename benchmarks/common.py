"""What every benchmark does first: a database of its own, Django set up, tables made."""

from __future__ import annotations

import json
import os
import tempfile
import time


def host_loop_ms() -> float:
    """How fast this machine runs plain Python now: a fixed loop of a million dict writes,
    best of three (about 75 ms on the 2-core VM when its host is quiet). Shared hosts move
    by half again within an hour; figures from runs with different readings differ by it."""
    best = float("inf")
    for _ in range(3):
        start, d = time.perf_counter(), {}
        for i in range(1_000_000):
            d[i & 1023] = i
        best = min(best, time.perf_counter() - start)
    return round(best * 1000, 1)


def django_ready() -> None:
    """Set Django up on DATABASE_URL's server when set, else SQLite in a fresh temporary
    LLMGW_HOME (or BENCH_HOME), and migrate it. Benchmarks empty the tables they fill:
    give them a database of their own."""
    if not os.environ.get("DATABASE_URL"):
        os.environ["LLMGW_HOME"] = os.environ.get("BENCH_HOME") or tempfile.mkdtemp(
            prefix="llmgw-bench-"
        )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    # Django's test client calls itself "testserver", which LLMGW_ALLOWED_HOSTS' default
    # does not let in (Django's own test runner adds it the same way).
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]

    call_command("migrate", interactive=False, verbosity=0)


def gpu_nodes(count: int, now) -> None:
    """`count` ready nodes n00000… of 8 × h100-80g, 1 TB and 96 CPUs, heard from at `now`."""
    from fleet.models import Gpu, Node

    Node.objects.bulk_create(
        (Node(id=f"n{i:05d}", state="ready", state_since=now, registered_at=now, last_seen=now,
              memory_total_mb=1024 * 1024, cpu_count=96, engines={"sim": "1"}, engines_probed=True)
         for i in range(count)),
        batch_size=1000,
    )  # fmt: skip
    Gpu.objects.bulk_create(
        (Gpu(node_id=f"n{i:05d}", index=g, name="NVIDIA H100 80GB HBM3", memory_mb=81559, gpu_class="h100-80g")
         for i in range(count) for g in range(8)),
        batch_size=5000,
    )  # fmt: skip


def vacuumed(*models) -> None:
    """On PostgreSQL, the tables of `models` as a fresh database's would be: what earlier
    runs emptied is still on disk, and this machine's server runs no autovacuum (a
    production server's does), so a scan would walk every dead row."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for model in models:
                cursor.execute(f"VACUUM FULL ANALYZE {model._meta.db_table}")


def stream_chat(
    url: str, key: str, model: str, messages: list[dict], max_tokens: int
) -> tuple[float, int, float]:
    """One streamed chat of ``max_tokens`` (``ignore_eos``) to an OpenAI-compatible ``url``:
    (seconds to the first content, completion tokens as the usage says, whole seconds)."""
    import httpx

    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, tokens = time.monotonic(), None, 0
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.monotonic() - started
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return first or float("nan"), tokens, time.monotonic() - started
