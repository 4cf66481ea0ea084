"""benchmarks/capping.py at a small scale: it runs, says each figure with its model's, and
the shed move fails no request. No figure is asserted: they are the benchmark's to say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_capping_benchmark_says_each_figure_and_sheds_without_a_failure():
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_PHASE_S": "0.5", "BENCH_REPLICAS": "2"}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "capping.py")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    scale, *lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert (scale["replicas"], scale["clients"], scale["power_exponent"]) == (2, 8, 0.6)
    assert [line["figure"] for line in lines] == [
        "uncapped",
        "capped to 80%, no restart",
        "capped to 60%, no restart",
        "shed one replica, make-before-break (after the move)",
    ]
    assert [line.get("model_kept") for line in lines[1:3]] == [0.875, 0.736]
    shed = lines[-1]
    assert shed["failed_during_move"] == 0 and shed["replacement_ready_s"] > 0
