"""benchmarks/routing.py's figures with the Rust routers beside llmgw's routings."""

from __future__ import annotations

import json

from benchmarks.routing import _figures


def _turns(ttft_ms: list[float], replica: str = "") -> list[dict]:
    return [{"ttft": t / 1000, "prompt": 100, "cached": 50, "replica": replica} for t in ttft_ms]


def test_prefix_is_set_against_each_router_and_their_replicas_come_from_the_engines(capsys):
    results = {
        "prefix": _turns([30, 30, 30, 30], "r1"),
        "least_loaded": _turns([60, 60, 60, 60], "r2"),
        "round_robin": _turns([60, 60, 60, 60], "r3"),
        "sglang-router_cache_aware": _turns([120, 120, 120, 120]),
    }
    served = {"sglang-router_cache_aware": {"http://a": 4, "http://b": 0}}
    _figures("sim", results, {"replicas": 2}, served)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    lower = {x["figure"]: x["value"] for x in lines if x["figure"].startswith("prefix_ttft")}
    assert lower == {
        "prefix_ttft_p50_lower_than_least_loaded": 0.5,
        "prefix_ttft_p50_lower_than_round_robin": 0.5,
        "prefix_ttft_p50_lower_than_sglang-router_cache_aware": 0.75,
    }
    busiest = {x["routing"]: x for x in lines if x["figure"] == "busiest_replica_over_mean"}
    assert busiest["sglang-router_cache_aware"]["value"] == 2.0  # all 4 on one of 2
    assert busiest["sglang-router_cache_aware"]["served"] == {"http://a": 4, "http://b": 0}
    assert busiest["prefix"]["served"] == {"r1": 4}
