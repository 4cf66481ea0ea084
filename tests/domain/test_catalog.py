"""The catalog's rules: names, scaling, profiles, classes, fingerprints, warnings (domain.md, Catalog)."""

import re

import pytest

from catalog.domain import (
    MAX_REPLICAS,
    CatalogError,
    Slo,
    new_model_warnings_as_errors,
    parse_model,
    parse_profile,
    parse_scaling,
    reservation_warnings,
    validate_catalog,
)


def gpu(**kw):
    return {"name": "tp1", "engine": "vllm", "gpu_class": "h100-80g", **kw}


def cpu(**kw):
    return {"name": "cpu", "engine": "llamacpp", **kw}


def a_model(name="chat", **kw):
    return {"name": name, "profiles": [gpu()], **kw}


def refused(data, match):
    with pytest.raises(CatalogError, match=match):
        parse_model(data)


# Names


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2_5", "7b", "a" * 64])
def test_lowercase_names_of_letters_digits_dots_dashes_and_underscores_are_accepted(name):
    assert parse_model(a_model(name)).name == name


@pytest.mark.parametrize(
    "name", ["Llama", "-chat", ".chat", "_chat", "chat model", "chat/7b", "", "a" * 65, None, 7]
)
def test_bad_names_are_refused_with_what_a_name_may_be(name):
    refused(a_model(name), "lowercase letters, digits")


def test_an_alias_must_be_a_valid_name_too():
    refused(a_model(aliases=["Chat"]), "alias 'Chat' is not a valid model name")


def test_an_unknown_field_is_named():
    refused(a_model(replicas=2), "unknown field 'replicas'")


def test_a_model_needs_at_least_one_profile():
    refused({"name": "chat", "profiles": []}, "at least one profile")
    refused({"name": "chat"}, "at least one profile")


def test_two_profiles_of_one_model_may_not_share_a_name():
    refused(a_model(profiles=[gpu(), gpu(tp=2)]), "two profiles are named tp1")


# Scaling


def test_max_left_out_follows_min():
    m = parse_model(a_model(scaling={"min": 3}))
    assert (m.min_replicas, m.max_replicas) == (3, 3)


def test_scaling_left_out_is_one_replica():
    m = parse_model(a_model())
    assert (m.min_replicas, m.max_replicas) == (1, 1)


def test_max_below_min_is_refused():
    refused(a_model(scaling={"min": 3, "max": 2}), r"max \(2\) is below min \(3\)")


def test_scaling_takes_a_target_of_waiting_requests_and_a_kv_ceiling():
    m = parse_model(a_model(scaling={"min": 1, "max": 3, "target_waiting": 2, "kv_ceiling": 0.9}))
    assert (m.target_waiting, m.kv_ceiling) == (2.0, 0.9)
    m = parse_model(a_model(scaling={"min": 1, "max": 3}))
    assert (m.target_waiting, m.kv_ceiling) == (None, None)


@pytest.mark.parametrize(
    ("scaling", "match"),
    [
        ({"kv_ceiling": 1.5}, r"kv_ceiling must be a share of the KV cache above 0 and at most 1 "
         r"\(0.9 is 90 %\), not 1.5"),
        ({"kv_ceiling": 0}, "kv_ceiling must be more than 0, not 0"),
        ({"kv_ceiling": "high"}, "kv_ceiling must be a number, not 'high'"),
        ({"target_waiting": -1}, "target_waiting must be more than 0, not -1"),
        ({"target_waiting": float("inf")}, "target_waiting must be above 0"),
    ],
)  # fmt: skip
def test_bad_scaling_thresholds_are_refused_with_a_sentence(scaling, match):
    refused(a_model(scaling=scaling), match)


def test_negative_min_is_refused():
    refused(a_model(scaling={"min": -1}), "min must be at least 0")


def test_changing_only_the_idle_timeout_keeps_min_and_max():
    assert parse_scaling({"idle_timeout": 60}, where="m", current=(1, 4, 600)) == (1, 4, 60)


def test_changing_min_alone_takes_max_with_it():
    assert parse_scaling({"min": 2}, where="m", current=(1, 4, 600)) == (2, 2, 600)


def test_min_zero_with_a_max_is_on_demand_and_keeps_its_idle_timeout():
    m = parse_model(a_model(scaling={"min": 0, "max": 2, "idle_timeout": 120}))
    assert m.on_demand
    assert m.idle_timeout_s == 120


def test_min_zero_and_max_zero_is_not_on_demand_but_off():
    m = parse_model(a_model(scaling={"min": 0}))
    assert (m.min_replicas, m.max_replicas, m.on_demand) == (0, 0, False)


@pytest.mark.parametrize("key", ["min", "max"])
def test_more_than_ten_thousand_replicas_is_refused_naming_the_field(key):
    with pytest.raises(CatalogError, match=f"m: {key} must be at most 10000 replicas, not 10001"):
        parse_scaling({key: 10_001}, where="m", current=(1, None, 600))


def test_ten_thousand_replicas_is_the_most_accepted():
    assert MAX_REPLICAS == 10_000
    assert parse_scaling({"min": 10_000}, where="m", current=(1, None, 600))[:2] == (10_000, 10_000)


def test_a_new_model_takes_the_same_replica_bound_as_scaling():
    refused(a_model(scaling={"min": 0, "max": 10**12}), "max must be at most 10000 replicas")


def test_an_idle_timeout_over_thirty_days_is_refused():
    with pytest.raises(CatalogError, match="idle_timeout must be at most 2592000 seconds"):
        parse_scaling({"idle_timeout": 30 * 86400 + 1}, where="m", current=(0, 1, 600))


# SLO, context length and longest output


def test_slo_context_length_and_max_output_are_read():
    m = parse_model(
        a_model(slo={"ttft_p95_ms": 800, "tpot_p95_ms": 45.5}, context_length=8192, max_output=2048)
    )
    assert m.slo == Slo(ttft_p95_ms=800.0, tpot_p95_ms=45.5)
    assert (m.context_length, m.max_output) == (8192, 2048)


def test_slo_context_length_and_max_output_left_out_are_unknown():
    m = parse_model(a_model(slo={"tpot_p95_ms": 40}))
    assert m.slo.to_dict() == {"ttft_p95_ms": None, "tpot_p95_ms": 40.0}
    assert (m.context_length, m.max_output) == (None, None)
    assert parse_model(a_model()).slo == Slo()


@pytest.mark.parametrize(
    ("slo", "match"),
    [
        ({"ttft_p95": 800}, "slo has an unknown field 'ttft_p95'"),
        ({"ttft_p95_ms": 0}, r"slo: ttft_p95_ms must be more than 0, not 0"),
        ({"tpot_p95_ms": -5}, r"slo: tpot_p95_ms must be more than 0"),
        ({"ttft_p95_ms": "800ms"}, r"slo: ttft_p95_ms must be a number, not '800ms'"),
        ({"ttft_p95_ms": True}, r"slo: ttft_p95_ms must be a number"),
        ({"ttft_p95_ms": float("inf")}, r"slo: ttft_p95_ms must be a finite number"),
        ({"ttft_p95_ms": 10**400}, r"slo: ttft_p95_ms is too large"),
        ([800], "slo must be an object"),
        ("fast", "slo must be an object"),
    ],
)
def test_a_bad_slo_is_refused_naming_the_field(slo, match):
    refused(a_model(slo=slo), f"model chat, {match}" if match.startswith("slo:") else match)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"context_length": 0}, "context_length must be at least 1, not 0"),
        ({"max_output": -1}, "max_output must be at least 1"),
        ({"context_length": 8192.5}, "context_length must be a whole number"),
        ({"max_output": "4k"}, "max_output must be a whole number"),
        (
            {"context_length": 4096, "max_output": 8192},
            r"max_output \(8192\) is more than context_length \(4096\)",
        ),
    ],
)
def test_a_bad_context_length_or_max_output_is_refused(fields, match):
    refused(a_model(**fields), match)


def test_max_output_may_equal_the_context_length_or_stand_alone():
    assert parse_model(a_model(context_length=4096, max_output=4096)).max_output == 4096
    assert parse_model(a_model(max_output=100_000)).max_output == 100_000


# Class


@pytest.mark.parametrize(
    ("klass", "scaling", "effective", "rank"),
    [
        ("", {"min": 1}, "standard", 2),
        ("", {"min": 0, "max": 1}, "opportunistic", 1),
        ("critical", {"min": 0, "max": 1}, "critical", 3),
        ("opportunistic", {"min": 2}, "opportunistic", 1),
    ],
)
def test_an_empty_class_is_opportunistic_on_demand_and_standard_otherwise(
    klass, scaling, effective, rank
):
    m = parse_model(a_model(scaling=scaling, **{"class": klass}))
    assert (m.effective_class, m.class_rank) == (effective, rank)


def test_an_unknown_class_is_refused():
    refused(a_model(**{"class": "gold"}), "class must be one of critical, standard, opportunistic")


@pytest.mark.parametrize("owner", ["team:7", "org:1", "project:42", ""])
def test_an_owner_is_a_scope_id_or_empty(owner):
    assert parse_model(a_model(owner=owner)).owner == owner


@pytest.mark.parametrize("owner", ["team:Acme/ml", "group:1", "team:", "7"])
def test_an_owner_that_is_not_a_scope_id_is_refused(owner):
    refused(a_model(owner=owner), "owner must be org:ID, team:ID or project:ID")


# Profiles


def test_gpus_per_node_defaults_to_tp_times_pp_over_the_nodes():
    p = parse_profile(gpu(tp=4, pp=2, nodes=2), model="m")
    assert p.gpus_on_each_node == 4


def test_a_given_gpus_per_node_wins():
    assert parse_profile(gpu(tp=2, gpus_per_node=4), model="m").gpus_on_each_node == 4


def test_tp_times_pp_that_does_not_divide_over_the_nodes_is_refused():
    with pytest.raises(CatalogError, match=r"tp × pp \(3\) does not divide over 2 nodes"):
        parse_profile(gpu(tp=3, nodes=2), model="m")


def test_a_cpu_profile_takes_no_gpus_and_reserves_its_cores():
    p = parse_profile(cpu(min_memory_gb=6, cpu_cores=3), model="m")
    assert (p.cpu_only, p.gpus_on_each_node, p.reserved_cores) == (True, 0, 3)


def test_a_gpu_profile_reserves_no_cores_even_when_it_names_some():
    p = parse_profile(gpu(cpu_cores=3), model="m")
    assert p.reserved_cores is None


def test_tensor_parallelism_without_a_gpu_class_is_refused():
    with pytest.raises(CatalogError, match="need a gpu_class"):
        parse_profile(cpu(tp=2), model="m")


def test_an_unknown_engine_is_refused():
    with pytest.raises(CatalogError, match="engine must be one of llamacpp, vllm, sim"):
        parse_profile(gpu(engine="tgi"), model="m")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tp", 0, "tp must be at least 1"),
        ("tp", "2", "tp must be a whole number"),
        ("tp", True, "tp must be a whole number"),
        ("min_memory_gb", 0, "min_memory_gb must be more than 0"),
        ("min_memory_gb", "8", "min_memory_gb must be a number"),
        ("min_memory_gb", 10**400, "min_memory_gb is too large"),
        ("cpu_cores", 0, "cpu_cores must be at least 1"),
        ("gpu_class", "H100 80GB", "gpu_class must look like h100-80g"),
        ("node_selector", {"zone": 1}, "node_selector must map strings to strings"),
        ("args", "--flag", "args must be a list of strings"),
    ],
)
def test_a_bad_profile_figure_is_refused_naming_the_field(field, value, match):
    with pytest.raises(CatalogError, match=match):
        parse_profile(gpu(**{field: value}), model="m")


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("args", ["--port", "1\ud800"], "args[1]"),
        ("env", {"HF_HOME": "\udfff"}, "env.HF_HOME"),
        ("env", {"A\ud800": "1"}, "env"),
        ("node_selector", {"zone": "\ud800"}, "node_selector.zone"),
    ],
)
def test_a_lone_surrogate_in_a_profile_is_refused_naming_the_field(field, value, where):
    # No agent can put one in an engine's arguments or environment: it crashed its session.
    with pytest.raises(
        CatalogError, match=rf"model m, profile tp1, {re.escape(where)}: .*surrogate"
    ):
        parse_profile(gpu(**{field: value}), model="m")


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("description", "a \ud800", "description"),
        ("source", "org/\ud800", "source"),
        ("fallbacks", ["\ud800"], "fallbacks[0]"),
    ],
)
def test_a_lone_surrogate_in_a_model_is_refused_naming_the_field(field, value, where):
    with pytest.raises(CatalogError, match=rf"model chat, {re.escape(where)}: .*surrogate"):
        parse_model(a_model(**{field: value}))


@pytest.mark.parametrize("field", ["tp", "pp", "nodes", "weight", "priority", "startup_timeout"])
def test_a_figure_left_empty_takes_its_default(field):
    # YAML's `tp:` with nothing after it is None: the default, not a crash.
    p = parse_profile(gpu(**{field: None}), model="m")
    assert (p.tp, p.pp, p.nodes, p.weight, p.priority, p.startup_timeout_s) == (1, 1, 1, 1, 0, 600)


def test_an_empty_scaling_figure_takes_its_default():
    m = parse_model(a_model(scaling={"min": None, "max": 3}))
    assert (m.min_replicas, m.max_replicas) == (1, 3)


@pytest.mark.parametrize("field", ["startup_timeout", "startup_timeout_s"])
def test_a_startup_timeout_that_is_not_whole_seconds_is_refused_naming_it(field):
    with pytest.raises(
        CatalogError, match=f"profile tp1: {field} must be a whole number, not '10m'"
    ):
        parse_profile(gpu(**{field: "10m"}), model="m")


@pytest.mark.parametrize("name", ["", "-gpu", "gpu profile", None])
def test_a_profile_needs_a_name_of_letters_digits_and_dashes(name):
    with pytest.raises(CatalogError, match="a profile needs a name"):
        parse_profile(gpu(name=name), model="m")


def test_the_startup_timeout_is_read_under_its_spec_name():
    assert parse_profile(gpu(startup_timeout=120), model="m").startup_timeout_s == 120


# Fingerprints


def test_a_profile_fingerprint_is_stable_for_the_same_profile():
    a = parse_profile(gpu(env={"A": "1", "B": "2"}), model="m")
    b = parse_profile(gpu(env={"B": "2", "A": "1"}), model="m")
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize(
    "change",
    [
        {"tp": 2},
        {"args": ["--max-model-len", "8192"]},
        {"env": {"VLLM_X": "1"}},
        {"min_memory_gb": 40},
        {"node_selector": {"zone": "a"}},
        {"engine": "sim"},
    ],
)
def test_the_fingerprint_changes_when_a_profile_changes(change):
    before = parse_profile(gpu(), model="m").fingerprint()
    assert parse_profile(gpu(**change), model="m").fingerprint() != before


# Across the catalog


def test_a_name_used_twice_is_refused():
    with pytest.raises(CatalogError, match="model chat: chat is already the name"):
        validate_catalog([parse_model(a_model("chat")), parse_model(a_model("chat"))])


def test_an_alias_that_is_another_models_name_is_refused():
    with pytest.raises(CatalogError, match="model code: chat is already the name"):
        validate_catalog(
            [parse_model(a_model("chat")), parse_model(a_model("code", aliases=["chat"]))]
        )


def test_an_alias_two_models_claim_is_refused_naming_the_first():
    models = [
        parse_model(a_model("chat", aliases=["default"])),
        parse_model(a_model("code", aliases=["default"])),
    ]
    with pytest.raises(CatalogError, match="model code: default is already the alias of chat"):
        validate_catalog(models)


def test_a_fallback_must_be_a_model():
    with pytest.raises(CatalogError, match="fallback nope is not a model"):
        validate_catalog([parse_model(a_model("chat", fallbacks=["nope"]))])


def test_a_model_cannot_fall_back_to_itself():
    with pytest.raises(CatalogError, match="cannot fall back to itself"):
        validate_catalog([parse_model(a_model("chat", fallbacks=["chat"]))])


def test_fallbacks_that_go_round_in_a_circle_are_refused_showing_the_circle():
    models = [
        parse_model(a_model("a", fallbacks=["b"])),
        parse_model(a_model("b", fallbacks=["c"])),
        parse_model(a_model("c", fallbacks=["a"])),
    ]
    with pytest.raises(CatalogError, match="fallbacks go round in a circle: a → b → c → a"):
        validate_catalog(models)


def test_fallbacks_that_share_a_target_are_not_a_circle():
    models = [
        parse_model(a_model("a", fallbacks=["b", "c"])),
        parse_model(a_model("b", fallbacks=["c"])),
        parse_model(a_model("c")),
    ]
    validate_catalog(models)  # raises if it took the diamond for a circle


# Memory and reservation warnings


def test_a_cpu_model_added_now_must_say_how_much_memory_it_needs():
    m = parse_model({"name": "bare", "profiles": [cpu()]})
    with pytest.raises(CatalogError, match="profile cpu: a CPU profile must declare min_memory_gb"):
        new_model_warnings_as_errors(m)


def test_a_new_cpu_model_with_memory_and_a_new_gpu_model_without_are_accepted():
    new_model_warnings_as_errors(parse_model({"name": "c", "profiles": [cpu(min_memory_gb=6)]}))
    new_model_warnings_as_errors(parse_model(a_model("g")))


def test_a_stored_cpu_model_without_memory_still_loads_and_carries_a_warning():
    m = parse_model({"name": "bare", "profiles": [cpu()]})
    [warning] = reservation_warnings(m)
    assert "profile cpu runs on CPU and reserves no memory" in warning
    assert "llmgw ctl model resources bare --memory GB" in warning


def test_a_reservation_measured_past_a_tenth_over_is_said_with_both_figures():
    m = parse_model({"name": "m", "profiles": [cpu(min_memory_gb=6)]})
    [warning] = reservation_warnings(m, measured_memory_gb=8.2)
    assert "use 8.2 GB but reserve 6 GB" in warning


def test_within_a_tenth_over_is_mapped_weights_not_a_wrong_figure():
    m = parse_model({"name": "m", "profiles": [cpu(min_memory_gb=6)]})
    assert reservation_warnings(m, measured_memory_gb=6.4) == []


def test_a_gpu_model_needs_no_host_memory_figure():
    assert reservation_warnings(parse_model(a_model("g")), measured_memory_gb=3) == []


def test_a_model_of_several_profiles_is_not_judged_on_one_measurement():
    m = parse_model({"name": "m", "profiles": [cpu(min_memory_gb=6), gpu(min_memory_gb=6)]})
    assert reservation_warnings(m, measured_memory_gb=20) == []


# Routing


def test_routing_defaults_to_prefix_where_the_engine_caches_prefixes():
    assert parse_profile(gpu(), model="m").routes_by == "prefix"
    assert parse_profile(cpu(), model="m").routes_by == "prefix"
    assert parse_profile({"name": "s", "engine": "sim"}, model="m").routes_by == "least_loaded"
    assert parse_profile(gpu(routing="least_loaded"), model="m").routes_by == "least_loaded"


def test_an_unknown_routing_is_refused_with_the_choices():
    refused(
        a_model(profiles=[gpu(routing="fastest")]),
        "routing must be one of prefix, least_loaded, round_robin",
    )


def test_changing_routing_restarts_nothing():
    # The gateway's, not the engine's: a replica started before is not outdated.
    assert (
        parse_profile(gpu(routing="round_robin"), model="m").fingerprint()
        == parse_profile(gpu(), model="m").fingerprint()
    )


def test_a_declared_power_watts_is_read_and_restarts_nothing():
    declared = parse_profile(gpu(power_watts=1100), model="m")
    assert declared.power_watts == 1100.0
    assert declared.shard_power_w == 1100.0
    # Placement's figure, not the engine's: a replica started before is not outdated.
    assert declared.fingerprint() == parse_profile(gpu(), model="m").fingerprint()


@pytest.mark.parametrize(
    ("value", "says"),
    [(0, "power_watts must be more than 0"), ("700", "power_watts must be a number")],
)
def test_a_power_watts_that_is_no_draw_is_refused(value, says):
    with pytest.raises(CatalogError, match=says):
        parse_profile(gpu(power_watts=value), model="m")
