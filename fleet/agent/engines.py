"""Engine command lines, and reading each engine's own load figures.

``build_command`` is a pure function from a shard's spec to the argv and
environment its engine runs with. The engine's API key goes in the
environment only: a command line is readable by every user of the node.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.agent.adapters import AdapterError, AdapterRef, format_refusal

DEFAULT_STARTUP_TIMEOUT_S = 600.0
SIM_COMMAND: tuple[str, ...] = (sys.executable, "-m", "llmgw", "sim-engine")

# The program each engine runs, found on PATH unless the agent was given one
# (`llmgw agent --llama-server PATH`); the sim engine runs SIM_COMMAND.
DEFAULT_BINARIES: dict[str, str] = {"llamacpp": "llama-server", "vllm": "vllm"}
_binaries = dict(DEFAULT_BINARIES)

# Where each engine takes its API key from.
KEY_VARIABLES = {"llamacpp": "LLAMA_API_KEY", "vllm": "VLLM_API_KEY", "sim": "LLMGW_ENGINE_API_KEY"}


class EngineError(ValueError):
    """A shard that cannot be started as given; the message is a sentence."""


@dataclass(frozen=True)
class ShardSpec:
    """What ``start_shard`` asks for."""

    shard_id: str
    model: str
    profile: dict[str, Any]
    replica_id: str | None = None
    rank: int = 0
    profile_fp: str | None = None
    source: str | None = None
    gpu_indices: tuple[int, ...] = ()
    http_port: int | None = None
    api_key: str | None = None
    threads: int | None = None
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    # The memory the shard reserved on the node (GB; None: none declared), and how far past
    # it (a fraction) and for how long (seconds) its engine may go before it is stopped
    # (fleet/agent/contain.py).
    memory_gb: float | None = None
    memory_margin: float = 0.25
    memory_grace_s: float = 5.0
    # The LoRA adapters its engine holds from the start, and how many it may hold at once
    # (0: its profile serves none; fleet/agent/adapters.py loads and unloads the rest).
    adapters: tuple[AdapterRef, ...] = ()
    adapter_slots: int = 0

    @property
    def engine(self) -> str:
        """The profile's engine name."""
        return str(self.profile.get("engine") or "")

    @property
    def profile_name(self) -> str | None:
        """The profile's name, as ``register`` reports it."""
        name = self.profile.get("name")
        return str(name) if name is not None else None

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> ShardSpec:
        """Read a ``start_shard`` message; raises EngineError when it is unusable."""
        shard_id = msg.get("shard_id")
        if not isinstance(shard_id, str) or not shard_id:
            raise EngineError("start_shard has no shard_id.")
        profile = msg.get("profile")
        if not isinstance(profile, dict):
            raise EngineError(f"start_shard for {shard_id} has no profile.")
        model = msg.get("model")
        if not isinstance(model, str) or not model:
            raise EngineError(f"start_shard for {shard_id} has no model.")
        try:
            gpu_indices = tuple(int(i) for i in msg.get("gpu_indices") or ())
            http_port = int(msg["http_port"]) if msg.get("http_port") else None
            threads = int(msg["threads"]) if msg.get("threads") else None
            timeout = float(msg.get("startup_timeout_s") or DEFAULT_STARTUP_TIMEOUT_S)
            rank = int(msg.get("rank") or 0)
            memory_gb = msg.get("memory_gb") or profile.get("min_memory_gb")
            memory_gb = float(memory_gb) if memory_gb else None
            watch = msg.get("memory_watch")
            if not isinstance(watch, dict):
                watch = {}
            margin = float(watch.get("margin", 0.25))
            grace = float(watch.get("grace_s", 5.0))
            slots = int(msg.get("adapter_slots") or 0)
            adapters = tuple(AdapterRef.from_message(a) for a in msg.get("adapters") or ())
        except AdapterError as exc:
            raise EngineError(f"start_shard for {shard_id}: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise EngineError(f"start_shard for {shard_id} has a malformed field: {exc}.") from exc
        return cls(
            shard_id=shard_id,
            model=model,
            profile=profile,
            replica_id=_str_or_none(msg.get("replica_id")),
            rank=rank,
            profile_fp=_str_or_none(msg.get("profile_fp")),
            source=_str_or_none(msg.get("source")),
            gpu_indices=gpu_indices,
            http_port=http_port,
            api_key=_str_or_none(msg.get("api_key")),
            threads=threads,
            startup_timeout_s=timeout,
            memory_gb=memory_gb,
            memory_margin=margin,
            memory_grace_s=grace,
            adapters=adapters,
            adapter_slots=slots,
        )


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


@dataclass(frozen=True)
class EngineCommand:
    """An engine's argv and the variables to set on top of the agent's env."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def use_binary(engine: str, program: str) -> None:
    """Run ``engine`` with ``program`` (a path, or a name on PATH) from now on, in this process.

    The agent sets it once at start, from its command line; every shard's
    command and the engine probe read it.
    """
    if engine not in DEFAULT_BINARIES:
        raise ValueError(f"{engine!r} is not an engine with a program of its own")
    _binaries[engine] = program


def engine_binaries() -> dict[str, str]:
    """Each engine's program: the one given to the agent, else its name on PATH."""
    return dict(_binaries)


@dataclass(frozen=True)
class NodeContext:
    """What the node adds to a shard's spec to make its command line."""

    port: int
    cpu_count: int | None
    bind_host: str = "0.0.0.0"
    sim_command: Sequence[str] = SIM_COMMAND
    binaries: Mapping[str, str] = field(default_factory=engine_binaries)
    # Where simulated GPUs keep the power limit they are held to (sensors.sim_power_cap):
    # a sim engine runs as slow as it says. None: the GPUs are real, or not capped.
    sim_power_file: str | None = None

    def binary(self, engine: str) -> str:
        """The program that runs ``engine`` here."""
        return self.binaries.get(engine) or DEFAULT_BINARIES[engine]


def build_command(spec: ShardSpec, node: NodeContext) -> EngineCommand:
    """The argv and env that run ``spec`` on this node.

    Raises EngineError for an engine the agent does not know.
    """
    builder = _BUILDERS.get(spec.engine)
    if builder is None:
        known = ", ".join(sorted(_BUILDERS))
        raise EngineError(
            f"The engine {spec.engine or '(none)'!r} of profile "
            f"{spec.profile_name or '(unnamed)'} is not one this agent runs ({known})."
        )
    _check_adapters(spec)
    argv = builder(spec, node)
    return EngineCommand(argv=argv, env=_engine_env(spec))


def _check_adapters(spec: ShardSpec) -> None:
    """Raise EngineError when the shard's adapters do not fit its slots or its engine."""
    count, slots = len(spec.adapters), spec.adapter_slots
    if slots < 0:
        raise EngineError(f"Shard {spec.shard_id} asks for {slots} adapter slots.")
    if count > slots:
        raise EngineError(
            f"Shard {spec.shard_id} is to start with {count} adapters and its profile "
            f"{spec.profile_name or '(unnamed)'} has {slots} adapter slots."
        )
    for ref in spec.adapters:
        refusal = format_refusal(spec.engine, ref)
        if refusal:
            raise EngineError(refusal)
        if spec.engine == "llamacpp" and ("," in ref.path or ":" in ref.path):
            # llama-server splits --lora-scaled at commas and colons.
            raise EngineError(
                f"llama-server cannot be given the adapter {ref.name}'s path {ref.path}: "
                "it holds a comma or a colon."
            )


def _profile_args(spec: ShardSpec) -> list[str]:
    return [str(a) for a in spec.profile.get("args") or []]


def has_flag(args: Sequence[str], *names: str) -> bool:
    """Whether ``args`` sets any of ``names``, as ``--x v``, ``--x=v`` or ``-xV``."""
    for arg in args:
        for name in names:
            if arg == name or arg.startswith(name + "="):
                return True
            # Short options take their value attached: -t8.
            if len(name) == 2 and arg.startswith(name) and arg[2:].isdigit():
                return True
    return False


# Per engine, the flags that set how many requests it runs at once (its slots).
SLOT_FLAGS: dict[str, tuple[str, ...]] = {
    "llamacpp": ("--parallel", "-np"),
    "vllm": ("--max-num-seqs",),
    "sim": ("--slots",),
}


def engine_slots(engine: str, argv: Sequence[str]) -> int | None:
    """How many requests the engine runs at once, as its command line sets it; None where
    the command leaves it to the engine's default (unknown here: it changes by version and
    device), or says it in a form not read here."""
    flags = SLOT_FLAGS.get(engine, ())
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name not in flags:
            continue
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        return int(value) if value.isdigit() and int(value) > 0 else None
    return None


def cpu_threads(spec: ShardSpec, cpu_count: int | None) -> int:
    """Threads for a CPU engine: what placement reserved, else half the CPUs.

    Placement's figure wins because the node's other replicas were placed
    around it; half the machine leaves room for another replica.
    """
    if spec.threads and spec.threads > 0:
        return spec.threads
    return max((cpu_count or 0) // 2, 1)


def _llamacpp(spec: ShardSpec, node: NodeContext) -> list[str]:
    args = _profile_args(spec)
    argv = [node.binary("llamacpp"), "--host", node.bind_host, "--port", str(node.port)]
    argv += ["-m", spec.source or spec.model, "--metrics"]
    if not has_flag(args, "--alias", "-a"):
        # Else llama-server names the GGUF's path on the node as every answer's model.
        argv += ["--alias", spec.model]
    if spec.gpu_indices:
        argv += ["--n-gpu-layers", "999"]
    elif not has_flag(args, "--threads", "-t"):
        argv += ["--threads", str(cpu_threads(spec, node.cpu_count))]
    return argv + _llamacpp_adapters(spec) + args


def _llamacpp_adapters(spec: ShardSpec) -> list[str]:
    """llama-server's adapters, in the spec's order (a request names each by its index).

    Each at scale 0: llama-server applies its adapters' start scales to every request that
    names none (even with --lora-init-without-apply, which only spares the first), so at
    `--lora PATH`'s 1.0 the base's own answers would carry them all.
    """
    if not spec.adapters:
        return []
    argv = ["--lora-init-without-apply"]
    for ref in spec.adapters:
        argv += ["--lora-scaled", f"{ref.path}:0"]
    return argv


def _vllm(spec: ShardSpec, node: NodeContext) -> list[str]:
    tp = int(spec.profile.get("tp") or 1)
    pp = int(spec.profile.get("pp") or 1)
    argv = [node.binary("vllm"), "serve", spec.source or spec.model, "--host", node.bind_host]
    argv += ["--port", str(node.port)]
    argv += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp)]
    args = _profile_args(spec)
    if not has_flag(args, "--served-model-name"):
        # The gateway sends requests under the model's catalog name.
        argv += ["--served-model-name", spec.model]
    if _on_cpu(spec) and not has_flag(args, "--enforce-eager", "--no-enforce-eager"):
        # Compiling the model takes 3-4 minutes on a CPU, and its cache did not survive a
        # restart in vLLM 0.32; eager mode is ready in about 30 s, at some speed.
        argv.append("--enforce-eager")
    return argv + _vllm_adapters(spec, args) + args


# vLLM's own default for --max-lora-rank, which the adapters' catalog checks ranks against
# when a profile sets none.
DEFAULT_MAX_LORA_RANK = 16


def _vllm_adapters(spec: ShardSpec, args: Sequence[str]) -> list[str]:
    """vLLM's LoRA flags: enabled with the profile's slots, and the adapters held from the
    start; the rest are loaded while it runs (VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
    if spec.adapter_slots <= 0:
        return []
    argv = [] if has_flag(args, "--enable-lora") else ["--enable-lora"]
    if not has_flag(args, "--max-loras"):
        argv += ["--max-loras", str(spec.adapter_slots)]
    if not has_flag(args, "--max-lora-rank"):
        argv += ["--max-lora-rank", str(DEFAULT_MAX_LORA_RANK)]
    if spec.adapters:
        argv += ["--lora-modules", *(f"{ref.name}={ref.path}" for ref in spec.adapters)]
    return argv


# What vLLM's CPU build takes for itself beside the weights and its KV cache: the API
# server, the engine core and the worker, each with torch (about 3.5 GB measured).
VLLM_CPU_RUNTIME_GB = 3.0


def _on_cpu(spec: ShardSpec) -> bool:
    return not spec.gpu_indices and not spec.profile.get("gpu_class")


def vllm_cpu_kv_space_gib(memory_gb: float | None) -> int | None:
    """``VLLM_CPU_KVCACHE_SPACE`` for a CPU profile with ``memory_gb`` reserved: half of
    what vLLM's own runtime leaves (the other half holds the weights and activations), in
    whole GiB, at least 1; None when the profile declares no memory (vLLM's default)."""
    if memory_gb is None or memory_gb <= 0:
        return None
    return max(1, int((memory_gb - VLLM_CPU_RUNTIME_GB) / 2))


def _vllm_env(spec: ShardSpec) -> dict[str, str]:
    """What vLLM runs with before the profile's own env (which may change any of it)."""
    env: dict[str, str] = {}
    if spec.adapter_slots > 0:
        # Else /v1/load_lora_adapter and /v1/unload_lora_adapter answer 404.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if (spec.source or "").startswith("/"):
        # Weights from the mirror's copy on this node: nothing is to be asked of the hub,
        # which a node may not reach (vLLM otherwise waits on it for each file's metadata).
        env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    if _on_cpu(spec):
        # The shard's reservation, as the memory watch and cgroup hold it to.
        space = vllm_cpu_kv_space_gib(spec.memory_gb)
        if space is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(space)
    return env


def _sim(spec: ShardSpec, node: NodeContext) -> list[str]:
    args = _profile_args(spec)
    argv = [*node.sim_command, "--host", node.bind_host, "--port", str(node.port)]
    argv += ["--model", spec.model]
    if (spec.source or "").startswith("/") and not has_flag(args, "--weights"):
        # The weights the agent put in its cache, or a path on the node: checked as vLLM would.
        argv += ["--weights", spec.source or ""]
    if not has_flag(args, "--threads"):
        argv += ["--threads", str(cpu_threads(spec, node.cpu_count))]
    if node.sim_power_file and not has_flag(args, "--power-file"):
        argv += ["--power-file", node.sim_power_file]
    return argv + _sim_adapters(spec, args) + args


def _sim_adapters(spec: ShardSpec, args: Sequence[str]) -> list[str]:
    """The sim engine's adapter slots and start adapters (it answers vLLM's adapter API)."""
    if spec.adapter_slots <= 0:
        return []
    argv = [] if has_flag(args, "--max-loras") else ["--max-loras", str(spec.adapter_slots)]
    for ref in spec.adapters:
        argv += ["--lora", f"{ref.name}={ref.path}"]
    return argv


_BUILDERS: dict[str, Callable[[ShardSpec, NodeContext], list[str]]] = {
    "llamacpp": _llamacpp,
    "vllm": _vllm,
    "sim": _sim,
}


def _engine_env(spec: ShardSpec) -> dict[str, str]:
    env = _vllm_env(spec) if spec.engine == "vllm" else {}
    env.update({str(k): str(v) for k, v in (spec.profile.get("env") or {}).items()})
    # Set after the profile's env so a profile cannot move a shard onto GPUs
    # placement did not give it, nor replace the key the gateway uses.
    # NVML numbers GPUs in PCI bus order, CUDA by default fastest first:
    # without PCI_BUS_ID the indices placement chose are not the cards used.
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
    if spec.api_key:
        env[KEY_VARIABLES[spec.engine]] = spec.api_key
    return env


# Per engine, each load figure and the metric names that carry it, in order of preference.
# Checked against the engines' sources: vLLM 0.32's v1/metrics/loggers.py (gpu_cache_usage_perc
# is the name before v1), llama.cpp's tools/server/server-task.cpp (kv_cache_usage_ratio was
# dropped in 2025: a recent llama-server reports no KV use, which stays absent).
LOAD_METRICS: dict[str, dict[str, tuple[str, ...]]] = {
    "llamacpp": {
        "running": ("llamacpp:requests_processing",),
        "waiting": ("llamacpp:requests_deferred",),
        "kv_cache": ("llamacpp:kv_cache_usage_ratio",),
    },
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv_cache": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    "sim": {  # vLLM's names; the sim's own before it published them
        "running": ("vllm:num_requests_running", "llmgw_sim:requests_running"),
        "waiting": ("vllm:num_requests_waiting", "llmgw_sim:requests_waiting"),
        "kv_cache": ("vllm:kv_cache_usage_perc", "llmgw_sim:kv_cache_usage_perc"),
    },
}

# Per engine, the prefix cache's counters, in prompt tokens: those found cached, and those
# looked up (each the sum of the names given). llama-server counts the cached tokens apart
# from those it prefilled, so what it looked up is the two together.
_VLLM_CACHE = (("vllm:prefix_cache_hits_total",), ("vllm:prefix_cache_queries_total",))
CACHE_COUNTERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "llamacpp": (
        ("llamacpp:prompt_tokens_cached_total",),
        ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total"),
    ),
    "vllm": _VLLM_CACHE,
    "sim": _VLLM_CACHE,
}


def parse_prometheus(text: str) -> dict[str, list[float]]:
    """Sample values per metric name in Prometheus text format.

    Labels are dropped (an engine may label by model); values that are not
    finite numbers are skipped.
    """
    samples: dict[str, list[float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, rest = _split_name(line)
        if not name:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        if math.isfinite(value):
            samples.setdefault(name, []).append(value)
    return samples


def _split_name(line: str) -> tuple[str, str]:
    brace = line.find("{")
    space = len(line) if " " not in line else line.index(" ")
    if brace == -1 or brace > space:
        return line[:space], line[space:]
    # Skip the label set, whose quoted values may hold braces and spaces.
    quoted = escaped = False
    for i in range(brace + 1, len(line)):
        ch = line[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "}" and not quoted:
            return line[:brace], line[i + 1 :]
    return "", ""


def engine_load(engine: str, metrics_text: str) -> dict[str, int | float]:
    """``running``, ``waiting`` and ``kv_cache`` from an engine's metrics, and the prefix
    cache's counters so far (``cache_hits``, ``cache_queries``, in prompt tokens).

    A figure the engine does not expose is left out. Request counts and counters are
    summed over label sets; the KV cache use is the fullest one.
    """
    wanted = LOAD_METRICS.get(engine, {})
    samples = parse_prometheus(metrics_text)
    figures: dict[str, int | float] = {}
    for figure, names in wanted.items():
        values = next((samples[n] for n in names if n in samples), None)
        if values is None:
            continue
        if figure == "kv_cache":
            figures[figure] = min(max(values), 1.0)
        else:
            figures[figure] = int(round(sum(values)))
    counters = CACHE_COUNTERS.get(engine)
    if counters is not None and all(n in samples for n in (*counters[0], *counters[1])):
        figures["cache_hits"] = sum(sum(samples[n]) for n in counters[0])
        figures["cache_queries"] = sum(sum(samples[n]) for n in counters[1])
    return figures


CACHE_WINDOW_S = 60.0  # the prefix cache's hit rate is over about this long


class CacheWindow:
    """One engine's prefix-cache counters as read over the last `CACHE_WINDOW_S`, and the
    hit rate they give: tokens found cached over tokens looked up since the oldest read
    kept. None when nothing was looked up in the window (an idle engine has no hit rate,
    not 0) or the counters went back (the engine restarted)."""

    def __init__(self, window_s: float = CACHE_WINDOW_S) -> None:
        self.window_s = window_s
        self._reads: list[tuple[float, float, float]] = []  # (when, hits, queries)

    def add(self, when: float, hits: float, queries: float) -> float | None:
        """Record a read at `when` (a monotonic clock) and answer the rate over the window."""
        reads = self._reads
        if reads and (hits < reads[-1][1] or queries < reads[-1][2]):
            reads.clear()  # counters went back: the engine started again
        reads.append((when, hits, queries))
        # Keep the newest read at or before the window's start, so the window is whole.
        while len(reads) > 2 and reads[1][0] <= when - self.window_s:
            reads.pop(0)
        return hit_rate(reads[0][1:], (hits, queries))


def hit_rate(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Tokens found cached over tokens looked up between two reads of the counters; None
    when nothing was looked up between them, or a counter went back."""
    hits, queries = after[0] - before[0], after[1] - before[1]
    if queries <= 0 or hits < 0:
        return None
    return min(hits / queries, 1.0)
