"""Engine command lines and the load figures read from engines' metrics."""

from dataclasses import replace

import pytest

from fleet.agent import engines
from fleet.agent.engines import (
    CacheWindow,
    EngineError,
    NodeContext,
    ShardSpec,
    build_command,
    engine_load,
    engine_slots,
    hit_rate,
    parse_prometheus,
    use_binary,
)

KEY = "sk-engine-7f3a9c"


def spec(engine="llamacpp", *, gpus=(), threads=None, args=(), env=None, **profile):
    return ShardSpec(
        shard_id="s1",
        model="qwen-7b",
        source="/weights/qwen-7b.gguf",
        profile={"name": "p", "engine": engine, "args": list(args), "env": env or {}, **profile},
        gpu_indices=tuple(gpus),
        api_key=KEY,
        threads=threads,
        # As start_shard gives it: the shard's reservation, the profile's memory by default.
        memory_gb=profile.get("min_memory_gb"),
    )


def node(port=20001, cpus=16, **kw):
    return NodeContext(port=port, cpu_count=cpus, **kw)


def flag_value(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def test_llama_server_on_cpu_gets_the_model_metrics_and_threads():
    cmd = build_command(spec(args=["--ctx-size", "4096"]), node())
    assert cmd.argv == [
        "llama-server",
        "--host",
        "0.0.0.0",
        "--port",
        "20001",
        "-m",
        "/weights/qwen-7b.gguf",
        "--metrics",
        "--alias",
        "qwen-7b",
        "--threads",
        "8",
        "--ctx-size",
        "4096",
    ]
    assert cmd.env["LLAMA_API_KEY"] == KEY
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == ""


def test_llama_server_answers_under_the_catalog_name_not_the_files_path():
    assert flag_value(build_command(spec(), node()).argv, "--alias") == "qwen-7b"


@pytest.mark.parametrize("args", [["--alias", "mine"], ["--alias=mine"], ["-a", "mine"]])
def test_an_alias_in_the_profile_args_wins(args):
    argv = build_command(spec(args=args), node()).argv
    assert argv[-len(args) :] == args
    assert not {"--alias", "-a"} & set(argv[: -len(args)])


def test_a_llama_server_given_to_the_agent_is_run_as_it_is(monkeypatch):
    given = "/opt/llmgw/engines/llamacpp/0.3.36/bin/llama-server"
    explicit = node(binaries={"llamacpp": given})
    assert build_command(spec(), explicit).argv[0] == given
    # `llmgw agent --llama-server PATH` sets it for the agent's process: every shard after.
    monkeypatch.setattr(engines, "_binaries", dict(engines.DEFAULT_BINARIES))
    use_binary("llamacpp", given)
    assert build_command(spec(), node()).argv[0] == given
    assert build_command(spec("vllm"), node()).argv[0] == "vllm"
    with pytest.raises(ValueError):
        use_binary("sim", "/bin/true")


def test_llama_server_on_gpus_offloads_every_layer_and_sets_no_threads():
    cmd = build_command(spec(gpus=[2, 3], threads=4), node())
    assert flag_value(cmd.argv, "--n-gpu-layers") == "999"
    assert "--threads" not in cmd.argv
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    # NVML's indices are in PCI bus order; CUDA must count the same way.
    assert cmd.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_the_cores_placement_reserved_are_the_threads():
    cmd = build_command(spec(threads=3), node(cpus=16))
    assert flag_value(cmd.argv, "--threads") == "3"


def test_a_cpu_shard_leaves_half_the_machine_for_another():
    assert flag_value(build_command(spec(), node(cpus=16)).argv, "--threads") == "8"
    assert flag_value(build_command(spec(), node(cpus=1)).argv, "--threads") == "1"
    assert flag_value(build_command(spec(), node(cpus=None)).argv, "--threads") == "1"


@pytest.mark.parametrize("args", [["--threads", "6"], ["-t", "6"], ["--threads=6"], ["-t6"]])
def test_threads_in_the_profile_args_win(args):
    cmd = build_command(spec(threads=3, args=args), node())
    assert cmd.argv[-len(args) :] == args
    assert cmd.argv.count("--threads") == args.count("--threads")


def test_a_model_without_source_is_served_by_its_name():
    s = ShardSpec(shard_id="s1", model="/models/m.gguf", profile={"engine": "llamacpp"})
    assert flag_value(build_command(s, node()).argv, "-m") == "/models/m.gguf"


def test_vllm_serves_the_source_under_the_catalog_name_with_the_profiles_parallelism():
    cmd = build_command(
        spec("vllm", gpus=[0, 1, 2, 3], tp=4, pp=1, args=["--max-model-len", "8192"]),
        node(port=20002),
    )
    assert cmd.argv == [
        "vllm",
        "serve",
        "/weights/qwen-7b.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "20002",
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "1",
        "--served-model-name",
        "qwen-7b",
        "--max-model-len",
        "8192",
    ]
    assert cmd.env["VLLM_API_KEY"] == KEY
    assert cmd.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_vllm_keeps_a_served_model_name_the_profile_gives():
    cmd = build_command(spec("vllm", args=["--served-model-name", "other"]), node())
    assert cmd.argv.count("--served-model-name") == 1
    assert flag_value(cmd.argv, "--served-model-name") == "other"


def test_sim_runs_llmgw_sim_engine_or_the_command_given():
    cmd = build_command(
        spec("sim", threads=2, args=["--tokens-per-s", "50"]), node(bind_host="127.0.0.1")
    )
    assert cmd.argv[1:] == [
        "-m",
        "llmgw",
        "sim-engine",
        "--host",
        "127.0.0.1",
        "--port",
        "20001",
        "--model",
        "qwen-7b",
        "--weights",
        "/weights/qwen-7b.gguf",
        "--threads",
        "2",
        "--tokens-per-s",
        "50",
    ]
    assert cmd.env["LLMGW_ENGINE_API_KEY"] == KEY
    other = build_command(spec("sim"), node(sim_command=["/bin/fake-sim"]))
    assert other.argv[:3] == ["/bin/fake-sim", "--host", "0.0.0.0"]
    # A hub id is no path on the node: the sim engine is given no weights to look for.
    hub = build_command(replace(spec("sim"), source="acme/tiny"), node())
    assert "--weights" not in hub.argv


def test_a_sim_engine_on_simulated_gpus_reads_their_power_limit():
    # Where the agent's simulated GPUs keep their power cap; a profile's own flag wins.
    capped = build_command(spec("sim"), node(sim_power_file="/var/lib/llmgw/sim-power"))
    assert flag_value(capped.argv, "--power-file") == "/var/lib/llmgw/sim-power"
    own = spec("sim", args=["--power-file", "/tmp/p"])
    assert (
        flag_value(build_command(own, node(sim_power_file="/x")).argv, "--power-file") == "/tmp/p"
    )
    assert "--power-file" not in build_command(spec("sim"), node()).argv


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sim"])
def test_the_api_key_is_never_on_the_command_line(engine):
    cmd = build_command(spec(engine, gpus=[0]), node())
    assert not any(KEY in arg for arg in cmd.argv)
    assert KEY in cmd.env.values()


def test_the_profile_env_is_merged_but_cannot_replace_the_key_or_the_gpus():
    s = spec(
        env={"LLAMA_API_KEY": "mine", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "OMP_PROC_BIND": "1"},
        gpus=[1],
    )
    env = build_command(s, node()).env
    assert env["OMP_PROC_BIND"] == "1"
    assert env["LLAMA_API_KEY"] == KEY
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_an_unknown_engine_is_refused_with_a_sentence():
    with pytest.raises(EngineError, match="'tgi' of profile p is not one this agent runs"):
        build_command(spec("tgi"), node())


def test_start_shard_is_read_into_a_spec():
    s = ShardSpec.from_message(
        {
            "type": "start_shard",
            "shard_id": "s9",
            "replica_id": "r9",
            "rank": 0,
            "model": "m",
            "profile": {"name": "cpu", "engine": "sim"},
            "profile_fp": "fp",
            "source": None,
            "gpu_indices": [0, 1],
            "http_port": 21000,
            "api_key": "k",
            "threads": 0,
            "startup_timeout_s": 120,
        }
    )
    assert (s.shard_id, s.gpu_indices, s.http_port, s.threads, s.startup_timeout_s) == (
        "s9",
        (0, 1),
        21000,
        None,
        120.0,
    )
    with pytest.raises(EngineError, match="no profile"):
        ShardSpec.from_message({"shard_id": "s9", "model": "m"})


LLAMA_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 5
"""

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B"} 7.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B"} 3.0
vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B"} 0.42
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="Qwen/Qwen2.5-7B"} 9
"""

SIM_METRICS = """\
llmgw_sim:requests_running{model="m"} 1
llmgw_sim:requests_waiting{model="m"} 0
llmgw_sim:kv_cache_usage_perc{model="m"} 0.125 1712345678000
"""


def test_llama_server_load_has_no_kv_cache_figure():
    assert engine_load("llamacpp", LLAMA_METRICS) == {"running": 2, "waiting": 5}


def test_vllm_load_reads_running_waiting_and_kv_cache():
    assert engine_load("vllm", VLLM_METRICS) == {"running": 7, "waiting": 3, "kv_cache": 0.42}


def test_vllm_v1s_renamed_kv_cache_gauge_is_read_too():
    text = "vllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.5\n"
    assert engine_load("vllm", text) == {"running": 1, "kv_cache": 0.5}


def test_sim_load_and_a_zero_reading_is_kept():
    # Zero waiting is a reading here, not an unknown: the engine said so.
    assert engine_load("sim", SIM_METRICS) == {"running": 1, "waiting": 0, "kv_cache": 0.125}


def test_a_missing_figure_is_left_out():
    assert engine_load("sim", "llmgw_sim:requests_waiting 4\n") == {"waiting": 4}
    assert engine_load("vllm", "") == {}


def test_prometheus_labels_may_hold_braces_spaces_and_quotes():
    text = 'x{a="} {",b="say \\"hi\\""} 3\nx{a="2"} 4\nbad line\ny NaN\nz +Inf\n'
    assert parse_prometheus(text) == {"x": [3.0, 4.0]}


def test_an_older_llama_server_s_kv_cache_ratio_is_read():
    text = LLAMA_METRICS + "llamacpp:kv_cache_usage_ratio 0.75\n"
    assert engine_load("llamacpp", text)["kv_cache"] == 0.75


def test_the_sim_engine_is_read_by_vllm_s_names():
    text = (
        "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"
    )
    assert engine_load("sim", text) == {"running": 2, "waiting": 1, "kv_cache": 0.5}


def test_prefix_cache_counters_are_read_in_tokens():
    vllm = (
        'vllm:prefix_cache_queries_total{engine="0"} 1000.0\n'
        'vllm:prefix_cache_hits_total{engine="0"} 250.0\n'
    )
    assert engine_load("vllm", vllm) == {"cache_hits": 250.0, "cache_queries": 1000.0}
    # llama-server counts what it prefilled apart from what it found cached.
    llama = "llamacpp:prompt_tokens_total 300\nllamacpp:prompt_tokens_cached_total 100\n"
    assert engine_load("llamacpp", llama) == {"cache_hits": 100.0, "cache_queries": 400.0}
    # One counter of the two is no hit rate.
    assert engine_load("vllm", 'vllm:prefix_cache_hits_total{engine="0"} 250.0\n') == {}


def test_hit_rate_is_over_the_window_and_absent_when_nothing_was_looked_up():
    assert hit_rate((0, 0), (30, 100)) == 0.3
    assert hit_rate((30, 100), (30, 100)) is None  # idle: no rate, not 0
    assert hit_rate((30, 100), (0, 10)) is None  # counters went back
    window = CacheWindow(window_s=60)
    assert window.add(0, 0, 0) is None
    assert window.add(5, 50, 100) == 0.5
    assert window.add(30, 50, 200) == 0.25  # the first read is still in the window
    assert window.add(70, 50, 300) == 0.0  # over 5..70, the read at 0 left it
    assert window.add(200, 50, 300) is None  # nothing looked up in the last minute
    assert window.add(205, 10, 20) is None  # the engine started again: counters anew
    assert window.add(210, 20, 40) == 0.5


def test_kv_cache_use_above_one_is_read_as_full():
    assert engine_load("vllm", "vllm:kv_cache_usage_perc 1.0000001\n") == {"kv_cache": 1.0}


def test_vllm_on_a_cpu_runs_eager_offline_with_a_kv_cache_from_the_profiles_memory():
    cmd = build_command(spec("vllm", min_memory_gb=8), node())
    assert cmd.argv[-1] == "--enforce-eager"
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert cmd.env["HF_HUB_OFFLINE"] == cmd.env["TRANSFORMERS_OFFLINE"] == "1"


def test_vllm_on_gpus_is_neither_eager_nor_given_a_cpu_kv_cache():
    cmd = build_command(spec("vllm", gpus=[0], gpu_class="h100-80g", min_memory_gb=8), node())
    assert "--enforce-eager" not in cmd.argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in cmd.env


def test_vllm_asks_the_hub_only_for_weights_named_by_a_hub_id():
    s = ShardSpec(shard_id="s1", model="m", source="acme/tiny", profile={"engine": "vllm"})
    assert "HF_HUB_OFFLINE" not in build_command(s, node()).env


def test_the_profile_may_compile_vllm_on_a_cpu_and_set_its_own_kv_cache():
    cmd = build_command(
        spec("vllm", args=["--no-enforce-eager"], env={"VLLM_CPU_KVCACHE_SPACE": "5"}), node()
    )
    assert "--enforce-eager" not in cmd.argv
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "5"


@pytest.mark.parametrize(
    ("memory_gb", "space"), [(None, None), (0, None), (4, 1), (6, 1), (8, 2), (19, 8)]
)
def test_the_cpu_kv_cache_is_half_what_vllms_runtime_leaves_at_least_one_gib(memory_gb, space):
    assert engines.vllm_cpu_kv_space_gib(memory_gb) == space


@pytest.mark.parametrize(
    ("engine", "args", "slots"),
    [
        ("llamacpp", ["--parallel", "4"], 4),
        ("llamacpp", ["-np", "2"], 2),
        ("llamacpp", ["--parallel=6"], 6),
        ("vllm", ["--max-num-seqs", "64"], 64),
        ("sim", ["--slots", "3"], 3),
        # Left to the engine's default, which changes by version and device: unknown.
        ("llamacpp", [], None),
        ("vllm", ["--parallel", "4"], None),
        # Nonsense is no figure.
        ("llamacpp", ["--parallel", "0"], None),
        ("llamacpp", ["--parallel"], None),
        ("vllm", ["--max-num-seqs=x"], None),
    ],
)
def test_an_engines_slots_are_read_from_its_command(engine, args, slots):
    assert engine_slots(engine, args) == slots
    # And from the command the agent builds for the profile's args.
    if slots is not None:
        argv = build_command(spec(engine, args=args), NodeContext(port=8001, cpu_count=4)).argv
        assert engine_slots(engine, argv) == slots
