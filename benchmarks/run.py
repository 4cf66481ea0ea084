"""`make bench`: run every benchmark; each prints one JSON line per figure with its scale."""

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = [
    "heartbeats.py",
    "reconcile_pass.py",
    "placement.py",
    # The facility's pass step: the agents' sensors into 125 racks' conditions.
    "conditions.py",
    "metrics.py",
    "pages.py",
    # The console's history at 5,000 nodes: memory, a step's record, the sampler.
    "history.py",
    "gateway.py",
    # Prefix-aware routing against least-loaded and round-robin: a multi-turn trace over 4
    # sim replicas, then 2 real llama.cpp replicas when one is built. About 6 minutes.
    "routing.py",
    # Routing by the engines' queue against in-flight counts, two gateway processes sharing
    # 4 sim replicas, another client on one of them. About 2 minutes.
    "engine_signals.py",
    # A real llama-server when one is built (llmgw engines build llamacpp); else one line saying so.
    "llamacpp.py",
    # A real vLLM (its CPU build) when one is built (llmgw engines build vllm): start to
    # ready, tokens a second direct and through the gateway. About 4 minutes.
    "vllm_cpu.py",
    # The mirror to an agent against curl; with a llama-server, serve to first token too.
    "mirror.py",
    # How fast the cluster heals with the default timings: an engine crash, a worker's death.
    "recovery.py",
    # LoRA adapters on the sim engine: the first request's wait, N adapters on one replica
    # against N replicas. About a minute; a line saying so without the agent's half.
    "adapters.py",
    # Power capping against shedding on 4 sim engines: tokens a second kept capped to 80 %
    # and 60 % (a model of speed under a power limit), and one replica moved. About 40 s.
    "capping.py",
    # 5,000 real agents over websockets (BENCH_FLEET_AGENTS): held, heartbeats, a restart,
    # silence to unreachable, a pass. About 10 minutes.
    "fleet.py",
]

if __name__ == "__main__":
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    failed = 0
    for bench in BENCHES:
        done = subprocess.run([sys.executable, str(HERE / bench)], env=env, cwd=HERE.parent)
        failed += done.returncode != 0
    sys.exit(1 if failed else 0)
