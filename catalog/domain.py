"""The catalog's rules: what a model and its profiles are, and what makes them valid.

Pure: no Django, no clock. Services turn rows into these and back.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from llmgw.core.text import surrogate_refusal
from mirror.domain.sources import SourceError, parse_source
from tenancy.scopes import KEY_RE

ENGINES = ("llamacpp", "vllm", "sim")
CLASSES = ("critical", "standard", "opportunistic")
CLASS_RANK = {"critical": 3, "standard": 2, "opportunistic": 1}
ROUTING_PROFILES = ("chat", "completion", "embedding")
# How the gateway chooses among a model's ready replicas (docs/gateway.md, Routing).
ROUTINGS = ("prefix", "least_loaded", "round_robin")
# Engines that keep the KV cache of what they served, and so gain from prefix affinity.
PREFIX_CACHING_ENGINES = frozenset({"llamacpp", "vllm"})
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# Paths under /models/ that are actions, not models.
RESERVED_NAMES = frozenset({"serve"})
PROFILE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,126}$")
# Far above any real deployment, and low enough that a typo (min: 100000) is caught
# here rather than by placement trying to find room for it.
MAX_REPLICAS = 10_000
MAX_IDLE_TIMEOUT_S = 30 * 86400
# The adapter format each engine loads (docs/adapters.md): vLLM a PEFT folder, llama.cpp a
# LoRA GGUF; the simulated engine as vLLM (it serves vLLM's adapter API, and the agent
# starts it so: fleet/agent/engines.py).
ADAPTER_FORMATS: Mapping[str, tuple[str, ...]] = {
    "vllm": ("peft",),
    "llamacpp": ("gguf",),
    "sim": ("peft",),
}
FORMATS = ("peft", "gguf")
# vLLM's own default for --max-lora-rank, taken where a profile does not say.
DEFAULT_MAX_LORA_RANK = 16
# vLLM refuses a rank above 512; far more slots than any GPU holds is a typo.
MAX_LORA_RANK = 512
MAX_ADAPTER_SLOTS = 256


class CatalogError(ValueError):
    """A model or catalog that cannot be accepted; the message says why, in a sentence."""


@dataclass(frozen=True)
class Profile:
    """One way a model may run (domain.md, Catalog: Profile)."""

    name: str
    engine: str
    gpu_class: str = ""
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    gpus_per_node: int | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    min_memory_gb: float | None = None
    cpu_cores: int | None = None
    min_disk_gb: float | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    weight: int = 1
    priority: int = 0
    startup_timeout_s: int = 600
    routing: str = ""  # empty: the engine's default (`routes_by`)
    # What a replica draws, in watts, as the operator declares it: wins over the estimate
    # placement makes against a rack's or PDU's power budget (docs/facility.md).
    power_watts: float | None = None
    # LoRA adapters one replica holds at once (0: it serves none; docs/adapters.md).
    adapter_slots: int = 0

    @property
    def routes_by(self) -> str:
        """How the gateway chooses among this profile's replicas: as given, else by prefix
        for the engines that cache prefixes and by load for the rest."""
        if self.routing:
            return self.routing
        return "prefix" if self.engine in PREFIX_CACHING_ENGINES else "least_loaded"

    @property
    def cpu_only(self) -> bool:
        return not self.gpu_class

    @property
    def gpus_on_each_node(self) -> int:
        """GPUs a shard takes on each node: given, else tp × pp spread over the nodes."""
        if self.cpu_only:
            return 0
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        return max(1, (self.tp * self.pp) // self.nodes)

    @property
    def shard_power_w(self) -> float | None:
        """The declared draw of one shard: `power_watts` shared over the nodes; None if none."""
        return self.power_watts / self.nodes if self.power_watts else None

    @property
    def reserved_cores(self) -> int | None:
        """Cores reserved per shard: only CPU-only profiles reserve cores."""
        return self.cpu_cores if self.cpu_only else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["args"] = list(self.args)
        d["env"] = dict(self.env)
        d["node_selector"] = dict(self.node_selector)
        return d

    def fingerprint(self) -> str:
        """A hash of the profile's canonical JSON: a replica started with another is outdated.
        Routing is the gateway's, not the engine's, and `power_watts` placement's: changing
        either restarts nothing."""
        fields = self.to_dict()
        del fields["routing"]
        # What a replica is declared to draw is placement's figure, not the engine's.
        del fields["power_watts"]
        # Left out at 0, so replicas started before adapters existed are not outdated.
        if not fields["adapter_slots"]:
            del fields["adapter_slots"]
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Slo:
    """What a model promises its callers, at the 95th percentile (domain.md, Catalog: Model).

    A figure left out is no promise; `ctl bench` measures against those given.
    """

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)


@dataclass(frozen=True)
class ModelSpec:
    """A model as the rules see it (domain.md, Catalog: Model and Scaling)."""

    name: str
    profiles: tuple[Profile, ...]
    min_replicas: int = 1
    max_replicas: int = 1
    idle_timeout_s: int = 600
    capacity_class: str = ""
    owner: str = ""
    source: str = ""
    aliases: tuple[str, ...] = ()
    fallbacks: tuple[str, ...] = ()
    description: str = ""
    routing_profile: str = "chat"
    declared: bool = False
    slo: Slo = Slo()
    context_length: int | None = None
    max_output: int | None = None
    # Scaling up: requests waiting per ready replica that count as busy (None: 1), and the
    # share of the KV cache in use, on average over the replicas, above which they are busy
    # too (None: KV use is not looked at).
    target_waiting: float | None = None
    kv_ceiling: float | None = None

    @property
    def on_demand(self) -> bool:
        """Nothing runs until asked for, and it stops after idle_timeout unused."""
        return self.min_replicas == 0 and self.max_replicas > 0

    @property
    def effective_class(self) -> str:
        """Empty is opportunistic for an on-demand model and standard otherwise."""
        if self.capacity_class:
            return self.capacity_class
        return "opportunistic" if self.on_demand else "standard"

    @property
    def class_rank(self) -> int:
        return CLASS_RANK[self.effective_class]

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)


# A default of a number gives a number back; a default of None may give None.
_D = TypeVar("_D", bound=int | None)


def _int(data: Mapping, key: str, default: _D, *, where: str, minimum: int = 0) -> int | _D:
    # A key given with no value (YAML's `tp:`) is left out, not a crash further on.
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise CatalogError(f"{where}: {key} must be a whole number, not {value!r}.")
    if value < minimum:
        raise CatalogError(f"{where}: {key} must be at least {minimum}, not {value}.")
    return value


def _float(data: Mapping, key: str, *, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise CatalogError(f"{where}: {key} must be a number, not {value!r}.")
    if value <= 0:
        raise CatalogError(f"{where}: {key} must be more than 0, not {value}.")
    try:
        return float(value)
    except OverflowError:  # a whole number of hundreds of digits, which no float holds
        raise CatalogError(f"{where}: {key} is too large.") from None


def _strings(data: Mapping, key: str, *, where: str) -> tuple[str, ...]:
    value = data.get(key) or []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise CatalogError(f"{where}: {key} must be a list of strings.")
    return tuple(value)


def _string_map(data: Mapping, key: str, *, where: str) -> dict[str, str]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise CatalogError(f"{where}: {key} must map strings to strings.")
    return dict(value)


_PROFILE_FIELDS = {f for f in Profile.__dataclass_fields__} | {"startup_timeout"}
_SLO_FIELDS = set(Slo.__dataclass_fields__)
_MODEL_FIELDS = {
    "name",
    "aliases",
    "description",
    "source",
    "profiles",
    "scaling",
    "class",
    "owner",
    "fallbacks",
    "routing_profile",
    "slo",
    "context_length",
    "max_output",
}


def parse_profile(data: Mapping, *, model: str) -> Profile:
    """Check one profile's fields and return it; raise CatalogError naming the field."""
    if not isinstance(data, Mapping):
        raise CatalogError(f"model {model}: each profile must be an object.")
    name = data.get("name")
    where = f"model {model}, profile {name}"
    if not isinstance(name, str) or not PROFILE_NAME_RE.match(name):
        raise CatalogError(
            f"model {model}: a profile needs a name of letters, digits, '.', '_' or '-', not {name!r}."
        )
    unknown = sorted(set(data) - _PROFILE_FIELDS)
    if unknown:
        raise CatalogError(f"{where}: unknown field {unknown[0]!r}.")
    # Half a character in an argument or the environment reached the agent, which could
    # not start the engine with it and lost its session; nothing stores one either.
    refused = surrogate_refusal(dict(data), where=where)
    if refused:
        raise CatalogError(refused)
    engine = data.get("engine")
    if engine not in ENGINES:
        raise CatalogError(f"{where}: engine must be one of {', '.join(ENGINES)}, not {engine!r}.")
    gpu_class = data.get("gpu_class") or ""
    if not isinstance(gpu_class, str) or (
        gpu_class and not re.match(r"^[a-z0-9][a-z0-9.-]*$", gpu_class)
    ):
        raise CatalogError(f"{where}: gpu_class must look like h100-80g, not {gpu_class!r}.")
    tp = _int(data, "tp", 1, where=where, minimum=1)
    pp = _int(data, "pp", 1, where=where, minimum=1)
    nodes = _int(data, "nodes", 1, where=where, minimum=1)
    gpus_per_node = _int(data, "gpus_per_node", None, where=where, minimum=1)
    if not gpu_class and (tp > 1 or pp > 1 or gpus_per_node):
        raise CatalogError(
            f"{where}: tp, pp and gpus_per_node need a gpu_class; a CPU profile has none."
        )
    if gpu_class and gpus_per_node is None and (tp * pp) % nodes:
        raise CatalogError(f"{where}: tp × pp ({tp * pp}) does not divide over {nodes} nodes.")
    cpu_cores = _int(data, "cpu_cores", None, where=where, minimum=1)
    # The spec's name is startup_timeout; startup_timeout_s is the dataclass's, also accepted.
    timeout_key = "startup_timeout_s" if "startup_timeout_s" in data else "startup_timeout"
    routing = data.get("routing") or ""
    if routing not in ("", *ROUTINGS):
        raise CatalogError(
            f"{where}: routing must be one of {', '.join(ROUTINGS)}, not {routing!r}."
        )
    selector = _string_map(data, "node_selector", where=where)
    for k in selector:
        if not LABEL_RE.match(k):
            raise CatalogError(f"{where}: node_selector label {k!r} is not a valid label name.")
    return Profile(
        name=name,
        engine=engine,
        gpu_class=gpu_class,
        tp=tp,
        pp=pp,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        args=_strings(data, "args", where=where),
        env=_string_map(data, "env", where=where),
        min_memory_gb=_float(data, "min_memory_gb", where=where),
        cpu_cores=cpu_cores,
        min_disk_gb=_float(data, "min_disk_gb", where=where),
        node_selector=selector,
        weight=_int(data, "weight", 1, where=where, minimum=0),
        priority=_int(data, "priority", 0, where=where, minimum=-1000),
        startup_timeout_s=_int(data, timeout_key, 600, where=where, minimum=1),
        routing=routing,
        power_watts=_float(data, "power_watts", where=where),
        adapter_slots=_adapter_slots(data, engine, where=where),
    )


def _adapter_slots(data: Mapping, engine: str, *, where: str) -> int:
    slots = _int(data, "adapter_slots", 0, where=where)
    if slots > MAX_ADAPTER_SLOTS:
        raise CatalogError(
            f"{where}: adapter_slots must be at most {MAX_ADAPTER_SLOTS}, not {slots}."
        )
    if slots and not ADAPTER_FORMATS.get(engine):
        raise CatalogError(f"{where}: engine {engine} serves no LoRA adapters; adapter_slots 0.")
    return slots


def parse_model(data: Mapping, *, declared: bool = False) -> ModelSpec:
    """Check a model's fields (domain.md, Catalog) and return it, or raise CatalogError."""
    if not isinstance(data, Mapping):
        raise CatalogError("A model must be an object.")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CatalogError(
            "A model's name must be lowercase letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit, at most 64 long, not {name!r}."
        )
    if name in RESERVED_NAMES:
        raise CatalogError(
            f"{name!r} names an action of the API (POST /models/{name}); choose another name."
        )
    where = f"model {name}"
    _fields_known(data, _MODEL_FIELDS, where)
    raw_profiles = data.get("profiles")
    if not isinstance(raw_profiles, list) or not raw_profiles:
        raise CatalogError(f"{where}: at least one profile is needed.")
    profiles = tuple(parse_profile(p, model=name) for p in raw_profiles)
    seen: set[str] = set()
    for p in profiles:
        if p.name in seen:
            raise CatalogError(f"{where}: two profiles are named {p.name}.")
        seen.add(p.name)
    scaling = data.get("scaling") or {}
    if not isinstance(scaling, Mapping):
        raise CatalogError(f"{where}: scaling must be an object with min, max and idle_timeout.")
    lo, hi, idle = parse_scaling(scaling, where=where, current=(1, None, 600))
    target_waiting, kv_ceiling = parse_pressure(scaling, where=where)
    klass = data.get("class") or ""
    if klass not in ("", *CLASSES):
        raise CatalogError(f"{where}: class must be one of {', '.join(CLASSES)}, not {klass!r}.")
    owner = data.get("owner") or ""
    if not isinstance(owner, str) or (owner and not KEY_RE.match(owner)):
        raise CatalogError(f"{where}: owner must be org:ID, team:ID or project:ID, not {owner!r}.")
    routing = data.get("routing_profile") or "chat"
    if routing not in ROUTING_PROFILES:
        raise CatalogError(
            f"{where}: routing_profile must be one of {', '.join(ROUTING_PROFILES)}."
        )
    source = data.get("source") or ""
    if not isinstance(source, str):
        raise CatalogError(f"{where}: source must be a string.")
    aliases, description = _aliases_described(data, where)
    context_length = _int(data, "context_length", None, where=where, minimum=1)
    max_output = _int(data, "max_output", None, where=where, minimum=1)
    if context_length is not None and max_output is not None and max_output > context_length:
        raise CatalogError(
            f"{where}: max_output ({max_output}) is more than context_length ({context_length})."
        )
    return ModelSpec(
        name=name,
        profiles=profiles,
        min_replicas=lo,
        max_replicas=hi,
        idle_timeout_s=idle,
        capacity_class=klass,
        owner=owner,
        source=source,
        aliases=aliases,
        fallbacks=_strings(data, "fallbacks", where=where),
        description=description,
        routing_profile=routing,
        declared=declared,
        slo=parse_slo(data.get("slo"), where=where),
        context_length=context_length,
        max_output=max_output,
        target_waiting=target_waiting,
        kv_ceiling=kv_ceiling,
    )


def parse_slo(data: object, *, where: str) -> Slo:
    """`{"ttft_p95_ms", "tpot_p95_ms"}`, each a positive number or left out; nothing else."""
    if data is None:
        return Slo()
    if not isinstance(data, Mapping):
        raise CatalogError(f"{where}: slo must be an object with ttft_p95_ms and tpot_p95_ms.")
    unknown = sorted(set(data) - _SLO_FIELDS, key=str)
    if unknown:
        raise CatalogError(f"{where}: slo has an unknown field {unknown[0]!r}.")
    figures = {}
    for key in sorted(_SLO_FIELDS):
        value = _float(data, key, where=f"{where}, slo")
        # JSON cannot carry an infinite figure, nor can the database store one.
        if value is not None and not math.isfinite(value):
            raise CatalogError(f"{where}, slo: {key} must be a finite number, not {value}.")
        figures[key] = value
    return Slo(**figures)


def parse_scaling(
    data: Mapping, *, where: str, current: tuple[int, int | None, int]
) -> tuple[int, int, int]:
    """Min, max and idle timeout: max left out follows min; max < min is refused.

    The one place their bounds are checked: adding a model, scaling it and the
    catalog file all come through here.
    """
    lo = _int(data, "min", current[0], where=where)
    hi = _int(data, "max", None, where=where)
    for key, value in (("min", lo), ("max", hi)):
        if value is not None and value > MAX_REPLICAS:
            raise CatalogError(
                f"{where}: {key} must be at most {MAX_REPLICAS} replicas, not {value}."
            )
    if hi is None:
        hi = lo if current[1] is None or "min" in data else max(current[1], lo)
    idle = _int(data, "idle_timeout", current[2], where=where, minimum=1)
    if idle > MAX_IDLE_TIMEOUT_S:
        raise CatalogError(
            f"{where}: idle_timeout must be at most {MAX_IDLE_TIMEOUT_S} seconds (30 days), "
            f"not {idle}."
        )
    if hi < lo:
        raise CatalogError(f"{where}: max ({hi}) is below min ({lo}).")
    return lo, hi, idle


def parse_pressure(data: Mapping, *, where: str) -> tuple[float | None, float | None]:
    """Scaling's `target_waiting` (requests waiting per ready replica that count as busy,
    above 0) and `kv_ceiling` (the share of the KV cache in use above which replicas are
    busy, above 0 and at most 1); each left out is None."""
    waiting = _float(data, "target_waiting", where=f"{where}, scaling")
    if waiting is not None and not (0 < waiting <= MAX_REPLICAS * 1000):
        raise CatalogError(
            f"{where}, scaling: target_waiting must be above 0 (requests waiting per replica), "
            f"not {waiting}."
        )
    ceiling = _float(data, "kv_ceiling", where=f"{where}, scaling")
    if ceiling is not None and not (0 < ceiling <= 1):
        raise CatalogError(
            f"{where}, scaling: kv_ceiling must be a share of the KV cache above 0 and at most 1 "
            f"(0.9 is 90 %), not {ceiling}."
        )
    return waiting, ceiling


def new_model_warnings_as_errors(model: ModelSpec) -> None:
    """Refuse what a stored model may carry but a new one may not: a CPU profile without memory."""
    for p in model.profiles:
        if p.cpu_only and p.min_memory_gb is None:
            raise CatalogError(
                f"model {model.name}, profile {p.name}: a CPU profile must declare min_memory_gb, "
                "or placement cannot tell when a node is full."
            )


def reservation_warnings(model: ModelSpec, measured_memory_gb: float | None = None) -> list[str]:
    """What an operator should fix about a model's reservations (domain.md, Reservation warnings)."""
    warnings = []
    for p in model.profiles:
        if p.cpu_only and p.min_memory_gb is None:
            warnings.append(
                f"profile {p.name} runs on CPU and reserves no memory: "
                f"set it with llmgw ctl model resources {model.name} --memory GB"
            )
    if len(model.profiles) == 1 and measured_memory_gb is not None:
        reserved = model.profiles[0].min_memory_gb
        # Resident memory counts mapped weights the kernel can take back, hence the tenth of slack.
        if reserved and measured_memory_gb > reserved * 1.1:
            warnings.append(
                f"replicas use {measured_memory_gb:.1f} GB but reserve {reserved:g} GB: "
                f"raise it with llmgw ctl model resources {model.name} --memory GB"
            )
    return warnings


def suggested_cores(
    memory_gb: float | None, nodes: Iterable[tuple[float | None, int | None]]
) -> int:
    """Cores to reserve for a CPU model (domain.md, Suggested cores).

    `nodes` is (memory_gb, cpu_count) of each ready node. Half the smallest CPU
    count among the nodes with enough memory (a node that does not say its
    memory counts as having enough), at least 1; 0 when no such node says how
    many CPUs it has. Zero from a node is unknown, never a reading.
    """
    counts = [
        cpus
        for memory, cpus in nodes
        if cpus and (not memory or memory_gb is None or memory >= memory_gb)
    ]
    return max(min(counts) // 2, 1) if counts else 0


def validate_catalog(models: Iterable[ModelSpec]) -> None:
    """Check what spans models: unique names and aliases, fallbacks that exist, no cycles."""
    models = list(models)
    names: dict[str, str] = {}
    for m in models:
        for n in (m.name, *m.aliases):
            if n in names:
                owner = names[n]
                what = "name" if n == owner else f"alias of {owner}"
                raise CatalogError(f"model {m.name}: {n} is already the {what}.")
            names[n] = m.name
    by_name = {m.name: m for m in models}
    for m in models:
        for f in m.fallbacks:
            if f == m.name:
                raise CatalogError(f"model {m.name}: a model cannot fall back to itself.")
            if f not in by_name:
                raise CatalogError(f"model {m.name}: fallback {f} is not a model.")
    for m in models:
        _check_no_cycle(m.name, by_name, ())


def _check_no_cycle(name: str, by_name: Mapping[str, ModelSpec], path: Sequence[str]) -> None:
    if name in path:
        cycle = " → ".join([*path[path.index(name) :], name])
        raise CatalogError(f"fallbacks go round in a circle: {cycle}.")
    for f in by_name[name].fallbacks:
        _check_no_cycle(f, by_name, (*path, name))


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter: a team's fine-tune served on its base model's replicas (docs/adapters.md).

    `source` is fetched through the mirror as a model's weights are (`hf://org/repo` holding
    adapter_config.json and adapter_model.safetensors for `peft`; a LoRA .gguf for `gguf`);
    `owner` is the team or project whose keys reach it and whose quotas it counts against.
    """

    name: str
    base: str
    source: str
    format: str
    rank: int
    owner: str
    aliases: tuple[str, ...] = ()
    description: str = ""
    declared: bool = False  # from the catalog file, which alone changes it


@dataclass(frozen=True)
class AdapterFacts:
    """What an adapter's own files say of it, when they can be read: its rank and the
    architecture it was trained for; None where they do not say."""

    rank: int | None = None
    architecture: str | None = None


_ADAPTER_FIELDS = {"name", "base", "source", "format", "rank", "owner", "aliases", "description"}
OWNER_KINDS = ("team:", "project:")


def _aliases_described(data: Mapping, where: str) -> tuple[tuple[str, ...], str]:
    """A model's or an adapter's aliases, each a valid model name, and its description."""
    aliases = _strings(data, "aliases", where=where)
    for a in aliases:
        if not NAME_RE.match(a):
            raise CatalogError(f"{where}: alias {a!r} is not a valid model name.")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise CatalogError(f"{where}: description must be a string.")
    return aliases, description


def _fields_known(data: Mapping, known: set[str], where: str) -> None:
    """Raise CatalogError for the first field not among `known`, or for text no database
    could store (`surrogate_refusal`)."""
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise CatalogError(f"{where}: unknown field {unknown[0]!r}.")
    refused = surrogate_refusal(dict(data), where=where)
    if refused:
        raise CatalogError(refused)


def parse_adapter(data: Mapping, *, declared: bool = False) -> AdapterSpec:
    """Check an adapter's own fields (not yet against its base: `adapter_refusal`); raise
    CatalogError naming the field."""
    if not isinstance(data, Mapping):
        raise CatalogError("An adapter must be an object.")
    name = data.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CatalogError(
            "An adapter's name must be lowercase letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit, at most 64 long, not {name!r}."
        )
    where = f"adapter {name}"
    _fields_known(data, _ADAPTER_FIELDS, where)
    base = data.get("base")
    if not isinstance(base, str) or not base:
        raise CatalogError(f"{where}: base must name the model it adapts.")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise CatalogError(
            f"{where}: source must say where its weights are (hf://org/repo, or a path)."
        )
    fmt = data.get("format")
    if fmt not in FORMATS:
        raise CatalogError(
            f"{where}: format must be peft (a folder with adapter_config.json and "
            f"adapter_model.safetensors) or gguf (a LoRA GGUF file), not {fmt!r}."
        )
    if fmt == "gguf" and not _llama_path(source.strip()):
        raise CatalogError(
            f"{where}: a gguf adapter's source must be an absolute path on the nodes without "
            f"':' or ',' (llama-server takes it at its start; the mirror does not fetch "
            f"adapters yet), not {source.strip()!r}."
        )
    if fmt == "peft":
        _peft_source(source.strip(), where)
    rank = _int(data, "rank", None, where=where, minimum=1)
    if rank is None:
        raise CatalogError(f"{where}: rank is needed (the LoRA's r, as trained).")
    if rank > MAX_LORA_RANK:
        raise CatalogError(f"{where}: rank must be at most {MAX_LORA_RANK}, not {rank}.")
    owner = data.get("owner")
    if not isinstance(owner, str) or not KEY_RE.match(owner) or not owner.startswith(OWNER_KINDS):
        raise CatalogError(f"{where}: owner must be a team or a project (team:ID, project:ID).")
    aliases, description = _aliases_described(data, where)
    return AdapterSpec(
        name=name,
        base=base,
        source=source.strip(),
        format=fmt,
        rank=rank,
        owner=owner,
        aliases=aliases,
        description=description,
        declared=declared,
    )


def _peft_source(source: str, where: str) -> None:
    """A peft adapter is loaded from a path on the nodes, or from the mirror, which fetches
    only what its sources name (hf://, https://): any other source could never load."""
    try:
        parse_source(source)
    except SourceError as exc:
        raise CatalogError(
            f"{where}: {exc} A peft adapter loads from hf://ORG/REPO[@REVISION][/PATH], "
            "https://… or an absolute path on the nodes, from no other source."
        ) from None


def _llama_path(source: str) -> bool:
    """Whether llama-server's `--lora-scaled PATH:SCALE` can carry `source` as its path."""
    return source.startswith("/") and not any(c in source for c in ":,")


def max_lora_rank(profile: Profile) -> int:
    """The highest rank a profile's replicas load: its `--max-lora-rank`, else vLLM's 16."""
    args = list(profile.args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--max-lora-rank" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-lora-rank="):
            value = arg.partition("=")[2]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return DEFAULT_MAX_LORA_RANK


def serving_profiles(adapter: AdapterSpec, base: ModelSpec) -> tuple[Profile, ...]:
    """The base's profiles whose replicas can hold the adapter: an engine that loads its
    format, adapter slots, and a max LoRA rank (llama.cpp has none) at or above its rank."""
    return tuple(
        p
        for p in base.profiles
        if adapter.format in ADAPTER_FORMATS.get(p.engine, ())
        and p.adapter_slots > 0
        and (p.engine == "llamacpp" or adapter.rank <= max_lora_rank(p))
    )


def adapter_refusal(
    adapter: AdapterSpec,
    base: ModelSpec | None,
    *,
    facts: AdapterFacts | None = None,
    base_architecture: str | None = None,
) -> str | None:
    """Why `adapter` cannot be served on `base`, in a sentence with the figures; None when
    it can. `facts` are what its own files say (when they could be read), `base_architecture`
    what the base's weights say theirs is."""
    where = f"adapter {adapter.name}"
    if base is None:
        return f"{where}: base model {adapter.base} is not in the catalog."
    engines = sorted({p.engine for p in base.profiles})
    able = [p for p in base.profiles if adapter.format in ADAPTER_FORMATS.get(p.engine, ())]
    if not able:
        wanted = " or ".join(e for e, f in ADAPTER_FORMATS.items() if adapter.format in f)
        return (
            f"{where}: base {base.name} runs on {', '.join(engines)}, which cannot serve a "
            f"{adapter.format} adapter (that needs {wanted})."
        )
    slotted = [p for p in able if p.adapter_slots > 0]
    if not slotted:
        names = ", ".join(p.name for p in able)
        return (
            f"{where}: base {base.name}'s profile {names} holds no adapters: give it "
            "adapter_slots (how many one replica holds at once)."
        )
    if facts is not None and facts.rank is not None and facts.rank != adapter.rank:
        return f"{where}: rank is given as {adapter.rank} but its adapter files say {facts.rank}."
    ranked = [p for p in slotted if p.engine == "llamacpp" or adapter.rank <= max_lora_rank(p)]
    if not ranked:
        top = max(max_lora_rank(p) for p in slotted)
        return (
            f"{where}: rank {adapter.rank} is above base {base.name}'s max LoRA rank {top} "
            "(its profile's --max-lora-rank)."
        )
    arch = facts.architecture if facts is not None else None
    if arch and base_architecture and _arch(arch) != _arch(base_architecture):
        return f"{where}: it was trained for {arch}, but base {base.name} is {base_architecture}."
    return None


def _arch(name: str) -> str:
    """An architecture's family, as GGUF (`llama`) and Transformers (`LlamaForCausalLM`,
    model_type `llama`) name it."""
    name = name.lower()
    for tail in ("forcausallm", "forconditionalgeneration", "model"):
        if name.endswith(tail) and len(name) > len(tail):
            return name[: -len(tail)]
    return name


def validate_adapters(models: Mapping[str, ModelSpec], adapters: Iterable[AdapterSpec]) -> None:
    """Names and aliases unique across models and adapters; every base a model."""
    names: dict[str, str] = {}
    for m in models.values():
        for n in (m.name, *m.aliases):
            names[n] = f"model {m.name}"
    for a in adapters:
        if a.base not in models:
            raise CatalogError(f"adapter {a.name}: base model {a.base} is not in the catalog.")
        for n in (a.name, *a.aliases):
            if n in names:
                raise CatalogError(f"adapter {a.name}: {n} is already a name of {names[n]}.")
            names[n] = f"adapter {a.name}"


def adapter_as_model(adapter: AdapterSpec, base: ModelSpec) -> ModelSpec:
    """The adapter as the gateway routes and counts it: its base's spec under its own name,
    aliases and owner, with no fallbacks, on the profiles that can hold it."""
    return replace(
        base,
        name=adapter.name,
        aliases=adapter.aliases,
        owner=adapter.owner,
        fallbacks=(),
        description=adapter.description or base.description,
        profiles=serving_profiles(adapter, base) or base.profiles,
        declared=False,
    )
