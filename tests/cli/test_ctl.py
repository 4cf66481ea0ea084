"""``llmgw ctl``: what each command asks the REST API, and what it shows of the answer."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from llmgw.cli import ctl
from llmgw.cli.tables import age, key_values, number, render
from tests.cli.helpers import TOKEN, FakeServer, ago, row_for, run, table

NODES_HEADERS = ["NODE", "STATE", "GPUS", "MEMORY", "CPUS", "LOAD", "REPLICAS", "LAST SEEN"]
MODELS_HEADERS = [
    "MODEL",
    "SERVING",
    "REPLICAS",
    "STATUS",
    "CLASS",
    "RESERVES",
    "ALIASES",
    "PROFILES",
    "FALLBACKS",
]
REPLICAS_HEADERS = ["REPLICA", "MODEL", "PROFILE", "STATE", "NODES", "GPUS"]
REPLICAS_HEADERS += ["RUN", "WAIT", "KV", "HITS", "ENDPOINT", "AGE"]


# Requests: method, path, headers


def test_every_request_carries_the_token_and_goes_under_api_v1(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (200, [])})
    code, _, _ = run(capsys, server, "nodes")
    assert code == 0
    request = server.last
    assert request.url == "http://127.0.0.1:8000/api/v1/nodes"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert "X-Llmgw-Actor" not in request.headers


def test_the_actor_is_sent_only_when_given(capsys):
    server = FakeServer({("POST", "/api/v1/nodes/n1/cordon"): (200, {})})
    run(capsys, server, "node", "cordon", "n1", "--actor", "alice")
    assert server.last.headers["X-Llmgw-Actor"] == "alice"


def test_server_and_token_come_from_the_environment_and_options_win(capsys, monkeypatch):
    monkeypatch.setenv("LLMGW_SERVER", "https://llmgw.example:9443/")
    server = FakeServer({("GET", "/api/v1/nodes"): (200, [])})
    run(capsys, server, "nodes")
    assert str(server.last.url) == "https://llmgw.example:9443/api/v1/nodes"
    run(capsys, server, "nodes", "--server", "http://other:8000", "--token", "another")
    assert str(server.last.url) == "http://other:8000/api/v1/nodes"
    assert server.last.headers["Authorization"] == "Bearer another"


def test_global_options_work_before_the_command_too(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (200, [])})
    run(capsys, server, "--server", "http://before:1", "--actor", "bob", "nodes")
    assert server.last.url.host == "before"
    assert server.last.headers["X-Llmgw-Actor"] == "bob"


# nodes and node


def nodes() -> list[dict[str, Any]]:
    """Two nodes, built when asked so their ages are measured from now."""
    return [
        {
            "id": "gpu-1",
            "hostname": "gpu-1.lab",
            "state": "ready",
            "labels": {"rack": "r1"},
            "gpu_total": 8,
            "gpu_free": 6,
            "gpu_class": "h100-80g",
            "memory_gb": 1024,
            "cpu_count": 96,
            "engines": {"vllm": "0.6.3"},
            "disk": {"free_gb": 800, "total_gb": 1000},
            "replicas": ["r-a", "r-b"],
            "load": {"cpu_percent": 12.5, "load1": 3.5, "load5": 2.0, "load15": 1.25},
            "last_seen": ago(3),
        },
        {
            # A new CPU node whose agent has not said its memory or CPUs: unknown, not zero.
            "id": "cpu-1",
            "hostname": "cpu-1.lab",
            "state": "unreachable",
            "labels": {},
            "gpu_total": 0,
            "gpu_free": 0,
            "memory_gb": 0,
            "cpu_count": None,
            "engines": {},
            "disk": {},
            "replicas": [],
            "load": None,
            "last_seen": ago(150),
        },
    ]


def test_nodes_shows_free_gpus_memory_load_replicas_and_last_seen(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (200, nodes())})
    code, out, err = run(capsys, server, "nodes")
    assert (code, err) == (0, "")
    rows = table(out)
    assert rows[0] == NODES_HEADERS
    assert row_for(rows, "gpu-1") == [
        "gpu-1",
        "ready",
        "6/8 h100-80g",
        "1024 GB",
        "96",
        "3.50",
        "2",
        "3s",
    ]


def test_nodes_say_where_they_stand_only_in_a_fleet_that_says_it(capsys):
    located = nodes()
    located[0] = {**located[0], "location": {"zone": "a", "rack": "r12-07", "pdu": "p1,p2"}}
    server = FakeServer({("GET", "/api/v1/nodes"): (200, located)})
    _, out, _ = run(capsys, server, "nodes")
    rows = table(out)
    assert rows[0][:3] == ["NODE", "STATE", "WHERE"]
    assert row_for(rows, "gpu-1")[2] == "zone a, rack r12-07, pdu p1,p2"
    assert row_for(rows, "cpu-1")[2] == "-"


def test_a_node_that_did_not_report_a_figure_shows_a_dash_never_zero(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (200, nodes())})
    _, out, _ = run(capsys, server, "nodes")
    assert row_for(table(out), "cpu-1") == ["cpu-1", "unreachable", "-", "-", "-", "-", "0", "2m"]


def test_node_show_lists_its_fields_and_a_row_per_gpu_with_sensors(capsys):
    node = {
        **nodes()[0],
        "gpu_total": 2,
        "gpu_free": 1,
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81920},
            {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81920},
        ],
        "load": {
            "load1": 0.5,
            "cpu_temp_c": 61,
            "gpus": [
                {"index": 0, "temp_c": 54, "power_w": 310, "power_limit_w": 700, "throttle": []},
                {"index": 1, "temp_c": 88, "throttle": ["hw_slowdown"]},
            ],
        },
    }
    server = FakeServer({("GET", "/api/v1/nodes/gpu-1"): (200, node)})
    code, out, _ = run(capsys, server, "node", "show", "gpu-1")
    assert code == 0
    assert "hostname:  gpu-1.lab" in out
    assert "labels:    rack=r1" in out
    assert "disk:      800 of 1000 GB free" in out
    assert "sensors:   cpu 61 °C" in out
    gpu_table = table(out.split("\n\n")[1])
    assert gpu_table[0][:4] == ["GPU", "NAME", "CLASS", "MEMORY"]
    assert gpu_table[1] == [
        "0",
        "NVIDIA H100 80GB HBM3",
        "-",
        "80 GB",
        "-",
        "54 °C",
        "-",
        "310/700 W",
        "none",
        "-",
    ]
    assert gpu_table[2][7:9] == ["-", "hw_slowdown"]


@pytest.mark.parametrize(
    ("action", "sentence"),
    [
        ("cordon", "node n1 cordoned"),
        ("uncordon", "node n1 uncordoned"),
        ("drain", "node n1 draining"),
    ],
)
def test_node_actions_post_to_the_node_and_say_what_was_done(capsys, action, sentence):
    server = FakeServer({("POST", f"/api/v1/nodes/n1/{action}"): (200, {"id": "n1"})})
    code, out, _ = run(capsys, server, "node", action, "n1")
    assert code == 0
    assert server.last.method == "POST"
    assert out.strip() == sentence


def test_a_node_action_prints_the_servers_own_sentence_when_it_has_one(capsys):
    answer = {"detail": "node n1 is draining: 3 replicas are being moved"}
    server = FakeServer({("POST", "/api/v1/nodes/n1/drain"): (200, answer)})
    _, out, _ = run(capsys, server, "node", "drain", "n1")
    assert out.strip() == answer["detail"]


# models and model


MODELS = [
    {
        "name": "llama-70b",
        "aliases": ["llama", "chat"],
        "ready": 2,
        "desired": 2,
        "min": 2,
        "max": 4,
        "status": "serving",
        "class": "critical",
        "owner": "team:3",
        "memory_gb": None,
        "cpu_cores": None,
        "measured_memory_gb": None,
        "warnings": [],
        "profiles": [
            {"name": "tp4", "engine": "vllm", "gpu_class": "h100-80g", "tp": 4},
            {"name": "tp8", "engine": "vllm", "gpu_class": "a100-80g", "tp": 8},
        ],
        "fallbacks": ["qwen-7b"],
        "declared": True,
    },
    {
        "name": "qwen-7b",
        "aliases": [],
        "ready": 0,
        "desired": 1,
        "min": 1,
        "max": 1,
        "status": "cannot place",
        "class": "standard",
        "owner": "",
        "memory_gb": 16,
        "cpu_cores": 4,
        "measured_memory_gb": 18.04,
        "warnings": [
            "uses 18.0 GB and reserves 16: raise it, or nodes will be filled past their memory"
        ],
        "unplaceable": True,
        "reason": "no node has 4 free cores",
        "profiles": [{"name": "cpu", "engine": "llamacpp", "gpu_class": "", "min_memory_gb": 16}],
        "fallbacks": [],
        "declared": False,
    },
]


def test_models_has_the_seeds_columns_and_one_row_per_model(capsys):
    server = FakeServer({("GET", "/api/v1/models"): (200, MODELS)})
    code, out, _ = run(capsys, server, "models")
    assert code == 0
    rows = table(out)
    assert rows[0] == MODELS_HEADERS
    assert row_for(rows, "llama-70b") == [
        "llama-70b",
        "yes",
        "2/2",
        "serving",
        "critical",
        "-",
        "llama, chat",
        "tp4, tp8",
        "qwen-7b",
    ]
    assert row_for(rows, "qwen-7b") == [
        "qwen-7b",
        "no",
        "0/1",
        "cannot place",
        "standard",
        "16 GB, 4 cores (18 GB used)",
        "-",
        "cpu",
        "-",
    ]


def test_a_held_model_says_whom_it_gave_room_to_beside_its_class(capsys):
    held = [{**MODELS[1], "held_for": "llama-70b", "preempted": 1}]
    server = FakeServer({("GET", "/api/v1/models"): (200, held)})
    _, out, _ = run(capsys, server, "models")
    assert row_for(table(out), "qwen-7b")[4] == "standard, gave room to llama-70b"


def test_model_warnings_are_printed_under_the_table(capsys):
    server = FakeServer({("GET", "/api/v1/models"): (200, MODELS)})
    _, out, _ = run(capsys, server, "models")
    lines = out.strip().splitlines()
    assert lines[-1] == f"warning: qwen-7b: {MODELS[1]['warnings'][0]}"
    # The table ends before the warnings: header plus one row per model.
    assert all(not line.startswith("warning:") for line in lines[:3])
    assert len(lines) == 4


def test_model_show_gives_its_state_profiles_and_warnings(capsys):
    server = FakeServer({("GET", "/api/v1/models/qwen-7b"): (200, MODELS[1])})
    code, out, _ = run(capsys, server, "model", "show", "qwen-7b")
    assert code == 0
    assert "replicas:     0 ready of 1 wanted (min 1, max 1)" in out
    assert "owner:        shared" in out
    assert "cannot place: no node has 4 free cores" in out
    profiles = table(out.split("\n\n")[1])
    assert profiles[0] == ["PROFILE", "ENGINE", "GPU CLASS", "TP", "MEMORY", "CORES"]
    assert profiles[1] == ["cpu", "llamacpp", "cpu only", "-", "16 GB", "-"]
    assert out.strip().endswith(MODELS[1]["warnings"][0])


def test_model_add_posts_the_yaml_file_as_one_model(capsys, tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "name: phi-3\nsource: microsoft/phi-3\nscaling: {min: 1}\n"
        "profiles:\n  - {name: cpu, engine: llamacpp, min_memory_gb: 8, cpu_cores: 4}\n"
    )
    server = FakeServer({("POST", "/api/v1/models"): (201, {"name": "phi-3"})})
    code, out, _ = run(capsys, server, "model", "add", "--file", str(path))
    assert code == 0
    assert server.body() == {
        "name": "phi-3",
        "source": "microsoft/phi-3",
        "scaling": {"min": 1},
        "profiles": [{"name": "cpu", "engine": "llamacpp", "min_memory_gb": 8, "cpu_cores": 4}],
    }
    assert server.last.headers["Content-Type"] == "application/json"
    assert out.strip() == "model phi-3 added"


def test_model_add_reads_json_and_shows_the_servers_refusal(capsys, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"name": "phi-3", "profiles": []}))
    refusal = {"detail": "model phi-3 exists; remove it first or pick another name."}
    server = FakeServer({("POST", "/api/v1/models"): (409, refusal)})
    code, out, err = run(capsys, server, "model", "add", "--file", str(path))
    assert server.body() == {"name": "phi-3", "profiles": []}
    assert (code, out) == (1, "")
    assert err.strip() == f"error: {refusal['detail']}"


def test_model_add_refuses_a_file_that_is_not_one_model_without_asking_the_server(capsys, tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("- name: a\n- name: b\n")
    server = FakeServer()
    code, _, err = run(capsys, server, "model", "add", "--file", str(path))
    assert code == 2
    assert "must hold one model object" in err
    code, _, err = run(capsys, server, "model", "add", "--file", str(tmp_path / "missing.yaml"))
    assert code == 2
    assert err.startswith("error: cannot read")
    assert server.requests == []


@pytest.mark.parametrize("verb", ["rm", "remove"])
def test_model_rm_deletes_it_as_weights_rm_does_and_remove_still_works(capsys, verb):
    server = FakeServer({("DELETE", "/api/v1/models/phi-3"): (204, None)})
    code, out, _ = run(capsys, server, "model", verb, "phi-3")
    assert code == 0
    assert server.last.method == "DELETE"
    assert out.strip() == "model phi-3 removed"


def test_a_reason_of_no_profile_reads_as_the_models_own(capsys):
    answer = {
        "model": "chat-70b",
        "unplaceable": False,
        "reason": "",
        "explanation": [{"profile": "", "reasons": ["waiting for room being freed by chat-1"]}],
    }
    server = FakeServer({("GET", "/api/v1/models/chat-70b/explain"): (200, answer)})
    code, out, _ = run(capsys, server, "model", "explain", "chat-70b")
    assert code == 0
    assert out.splitlines() == [
        "chat-70b: its last placement failed",
        "  - waiting for room being freed by chat-1",
    ]
    assert "profile" not in out


def test_model_explain_lists_each_profiles_reasons(capsys):
    answer = {
        "model": "llama-70b",
        "unplaceable": True,
        "reason": "no profile fits any node",
        "explanation": [
            {
                "profile": "tp4",
                "reasons": [
                    "node gpu-1 has 2 free h100-80g GPUs, needs 4",
                    "node gpu-2 is cordoned",
                ],
            },
            {"profile": "tp8", "reasons": ["no ready node has a100-80g GPUs"]},
        ],
    }
    server = FakeServer({("GET", "/api/v1/models/llama-70b/explain"): (200, answer)})
    code, out, _ = run(capsys, server, "model", "explain", "llama-70b")
    assert code == 0
    assert out.splitlines() == [
        "llama-70b cannot be placed: no profile fits any node",
        "profile tp4:",
        "  - node gpu-1 has 2 free h100-80g GPUs, needs 4",
        "  - node gpu-2 is cordoned",
        "profile tp8:",
        "  - no ready node has a100-80g GPUs",
    ]


# scale, restart, retry


def test_scale_sends_min_max_and_the_idle_timeout_in_seconds(capsys):
    server = FakeServer({("POST", "/api/v1/models/qwen-7b/scale"): (200, {"min": 0, "max": 3})})
    code, out, _ = run(
        capsys, server, "scale", "qwen-7b", "--min", "0", "--max", "3", "--idle-timeout", "10m"
    )
    assert code == 0
    assert server.body() == {"min": 0, "max": 3, "idle_timeout": 600}
    assert out.strip() == "qwen-7b: min 0, max 3"
    run(capsys, server, "scale", "qwen-7b", "--min", "2")
    assert server.body() == {"min": 2}
    run(capsys, server, "scale", "qwen-7b", "--min", "1", "--kv-ceiling", "0.9")
    assert server.body() == {"min": 1, "kv_ceiling": 0.9}
    run(capsys, server, "scale", "qwen-7b", "--min", "1", "--target-waiting", "2")
    assert server.body() == {"min": 1, "target_waiting": 2.0}


def test_scale_refuses_a_negative_count_before_asking(capsys):
    server = FakeServer()
    code, _, _ = run(capsys, server, "scale", "qwen-7b", "--min", "-1")
    assert code == 2
    assert server.requests == []


def test_restart_and_retry_post_to_the_model(capsys):
    server = FakeServer(
        {
            ("POST", "/api/v1/models/qwen-7b/restart"): (200, {}),
            ("POST", "/api/v1/models/qwen-7b/retry"): (200, {"detail": "qwen-7b unparked"}),
        }
    )
    code, out, _ = run(capsys, server, "restart", "--model", "qwen-7b")
    assert code == 0
    assert server.last.url.path == "/api/v1/models/qwen-7b/restart"
    assert out.startswith("restarting qwen-7b")
    code, out, _ = run(capsys, server, "retry", "qwen-7b")
    assert code == 0
    assert server.last.url.path == "/api/v1/models/qwen-7b/retry"
    assert out.strip() == "qwen-7b unparked"


# replicas and reconcile


def replicas() -> list[dict[str, Any]]:
    """Two replicas, built when asked so their ages are measured from now."""
    return [
        {
            "id": "llama-70b-9f1",
            "model": "llama-70b",
            "profile": "tp8",
            "state": "ready",
            "shards": [
                {"id": "s2", "node": "gpu-2", "rank": 1, "gpu_indices": [0, 1, 2, 3]},
                {"id": "s1", "node": "gpu-1", "rank": 0, "gpu_indices": [4, 5, 6, 7]},
            ],
            "endpoint": "http://10.0.0.1:20001",
            "created_at": ago(7200),
            "outdated": True,
            # A llama-server: no KV use said.
            "engine": {"running": 4, "waiting": 2, "kv_cache": None, "prefix_hit_rate": 0.625},
        },
        {
            "id": "qwen-7b-1a2",
            "model": "qwen-7b",
            "profile": "cpu",
            "state": "starting",
            "shards": [{"id": "s3", "node": "cpu-1", "rank": 0, "gpu_indices": []}],
            "endpoint": None,
            "created_at": ago(42),
            "outdated": False,
        },
    ]


def test_replicas_shows_shard_nodes_gpus_and_outdated(capsys):
    server = FakeServer({("GET", "/api/v1/replicas"): (200, replicas())})
    code, out, _ = run(capsys, server, "replicas")
    assert code == 0
    rows = table(out)
    assert rows[0] == REPLICAS_HEADERS
    assert row_for(rows, "llama-70b-9f1") == [
        "llama-70b-9f1",
        "llama-70b",
        "tp8",
        "ready (outdated)",
        "gpu-1, gpu-2",
        "gpu-1:4,5,6,7 gpu-2:0,1,2,3",
        "4",
        "2",
        "-",
        "62%",
        "http://10.0.0.1:20001",
        "2h",
    ]
    assert row_for(rows, "qwen-7b-1a2") == [
        "qwen-7b-1a2",
        "qwen-7b",
        "cpu",
        "starting",
        "cpu-1",
        "-",
        "-",
        "-",
        "-",
        "-",
        "-",
        "42s",
    ]


def test_replicas_of_one_model_asks_the_server_to_filter(capsys):
    server = FakeServer({("GET", "/api/v1/replicas"): (200, replicas()[1:])})
    run(capsys, server, "replicas", "--model", "qwen-7b")
    assert server.last.url.params["model"] == "qwen-7b"


def test_reconcile_prints_what_the_pass_did_or_that_there_was_nothing(capsys):
    events = ["placed qwen-7b-1a2 on cpu-1", "stopped llama-70b-0c3: too many"]
    server = FakeServer({("POST", "/api/v1/reconcile"): (200, {"events": events})})
    code, out, _ = run(capsys, server, "reconcile")
    assert code == 0
    assert out.splitlines() == events
    server.routes[("POST", "/api/v1/reconcile")] = (200, {"events": []})
    _, out, _ = run(capsys, server, "reconcile")
    assert out.strip() == "nothing to do"


# --json


@pytest.mark.parametrize(
    "argv",
    [("--json", "models"), ("models", "--json")],
    ids=["before the command", "after the command"],
)
def test_json_prints_the_servers_answer_as_it_came(capsys, argv):
    server = FakeServer({("GET", "/api/v1/models"): (200, MODELS)})
    code, out, _ = run(capsys, server, *argv)
    assert code == 0
    assert json.loads(out) == MODELS
    assert "MODEL" not in out.splitlines()[0]


# Errors


@pytest.mark.parametrize(
    ("status", "detail"),
    [
        (400, "max (1) is below min (2)."),
        (404, "no model called nope"),
        (
            400,
            "model llama-70b is declared in the catalog file; edit that file and restart "
            "llmgw serve, since the file would undo a change made here on the next start",
        ),
        (409, "model llama-70b is a fallback of chat; remove it there first."),
    ],
)
def test_a_refusal_prints_the_servers_sentence_on_stderr_and_exits_1(capsys, status, detail):
    server = FakeServer({("POST", "/api/v1/models/nope/scale"): (status, {"detail": detail})})
    code, out, err = run(capsys, server, "scale", "nope", "--min", "2", "--max", "1")
    assert (code, out) == (1, "")
    assert err == f"error: {detail}\n"


def test_a_refusal_without_a_sentence_prints_the_status_line(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (502, "<html>Bad Gateway</html>")})
    code, _, err = run(capsys, server, "nodes")
    assert code == 1
    assert err == "error: 502 Bad Gateway\n"


DJANGO_404 = "<!doctype html><html><head><title>Not Found</title></head><body><h1>Not Found</h1></body></html>"


def test_a_path_the_server_does_not_know_asks_whether_it_is_an_older_llmgw(capsys):
    # Django, not the API, answers a path it has no route for: an HTML page.
    server = FakeServer({("GET", "/api/v1/nodes"): (404, DJANGO_404)})
    code, out, err = run(capsys, server, "nodes", "--server", "http://old:8000")
    assert (code, out) == (1, "")
    assert err == "error: http://old:8000 has no /api/v1/nodes (404); is it an older llmgw?\n"


def test_a_404_with_the_servers_sentence_shows_that_sentence(capsys):
    # An API 404 (an unknown model) is JSON and says what is missing.
    server = FakeServer()  # answers 404 {"detail": "Not Found: ..."} to everything
    code, _, err = run(capsys, server, "model", "show", "ghost")
    assert code == 1
    assert err == "error: Not Found: /api/v1/models/ghost\n"


def test_a_method_the_server_does_not_take_on_a_path_asks_the_same(capsys):
    server = FakeServer({("POST", "/api/v1/reconcile"): (405, b"")})
    code, _, err = run(capsys, server, "reconcile")
    assert code == 1
    assert err == (
        "error: http://127.0.0.1:8000 does not take POST on /api/v1/reconcile (405); "
        "is it an older llmgw?\n"
    )


def test_a_schema_refusal_lists_each_problem_in_one_line(capsys):
    detail = [{"loc": ["body", "payload", "min"], "msg": "Input should be a valid integer"}]
    server = FakeServer({("POST", "/api/v1/models/m/scale"): (422, {"detail": detail})})
    code, _, err = run(capsys, server, "scale", "m", "--min", "1")
    assert code == 1
    assert err == "error: payload.min: Input should be a valid integer\n"


def test_no_token_exits_2_with_a_sentence_and_sends_nothing(capsys, monkeypatch):
    monkeypatch.delenv("LLMGW_TOKEN")
    server = FakeServer()
    code, out, err = run(capsys, server, "nodes")
    assert (code, out) == (2, "")
    assert "LLMGW_TOKEN" in err and "--token" in err
    assert "Traceback" not in err
    assert server.requests == []


def test_a_server_that_cannot_be_reached_is_said_so(capsys):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    code, out, err = run(capsys, refuse, "nodes", "--server", "http://10.9.9.9:8000")
    assert (code, out) == (1, "")
    assert (
        err == "error: cannot reach llmgw at http://10.9.9.9:8000: [Errno 111] Connection refused\n"
    )


def test_a_closed_port_on_this_machine_is_a_cannot_reach_not_a_traceback(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Bound then closed: nothing listens there now, so the connection is refused.
    code, _, err = run(capsys, None, "nodes", "--server", f"http://127.0.0.1:{port}")
    assert code == 1
    assert err.startswith(f"error: cannot reach llmgw at http://127.0.0.1:{port}: ")
    assert "Traceback" not in err


def test_a_server_that_does_not_answer_in_time_is_said_so(capsys):
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    code, _, err = run(capsys, hang, "nodes", "--timeout", "2.5")
    assert code == 1
    assert err == "error: llmgw at http://127.0.0.1:8000 did not answer within 2.5 s\n"


def test_an_answer_that_is_not_json_is_an_error_not_a_traceback(capsys):
    server = FakeServer({("GET", "/api/v1/nodes"): (200, "<html>login</html>")})
    code, _, err = run(capsys, server, "nodes")
    assert code == 1
    assert "is not JSON" in err


def test_help_and_usage_errors_return_a_status_instead_of_exiting(capsys):
    assert ctl.main(["--help"]) == 0
    assert "nodes" in capsys.readouterr().out
    assert ctl.main(["frobnicate"]) == 2
    assert ctl.main(["node"]) == 2


# The table helpers


def test_render_sizes_columns_to_fit_and_shows_absent_values_as_a_dash():
    text = render(["name", "free gpus"], [["a-long-name", 0], ["b", None], ["c", ""]])
    assert text.splitlines() == [
        "NAME         FREE GPUS",
        "a-long-name  0",
        "b            -",
        "c            -",
    ]


def test_key_values_line_the_values_up():
    assert key_values([("node", "n1"), ("last seen", None)]).splitlines() == [
        "node:      n1",
        "last seen: -",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"), [(3, "3s"), (59, "59s"), (150, "2m"), (7200, "2h"), (3 * 86400, "3d")]
)
def test_age_is_the_largest_whole_unit(seconds, text):
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert age((now - timedelta(seconds=seconds)).isoformat(), now) == text


def test_age_of_an_unknown_or_future_time():
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert age(None, now) == "-"
    assert age("not a time", now) == "-"
    assert age((now + timedelta(seconds=5)).isoformat(), now) == "0s"


def test_number_drops_a_trailing_zero_but_keeps_a_real_zero():
    assert [number(16.0), number(5.25), number(0), number(None)] == ["16", "5.2", "0", "-"]


def test_ctrl_c_during_a_call_stops_with_a_sentence_not_a_traceback(capsys):
    def interrupted(request):
        raise KeyboardInterrupt

    code = ctl.main(["nodes"], transport=httpx.MockTransport(interrupted))

    assert code == 130
    assert "stopped by Ctrl-C" in capsys.readouterr().err
