"""``llmgw ctl model class|resources|target|headroom|preemption`` and ``capacity``."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import FakeServer, ago, row_for, run, table

# class


@pytest.mark.parametrize(
    "given, sent, effective",
    [
        ("critical", "critical", "critical"),
        ("standard", "standard", "standard"),
        ("opportunistic", "opportunistic", "opportunistic"),
        ("default", "", "standard"),
    ],
)
def test_model_class_sends_the_class_and_says_the_effective_one(capsys, given, sent, effective):
    server = FakeServer(
        {("POST", "/api/v1/models/llama/class"): (200, {"model": "llama", "class": effective})}
    )

    code, out, _ = run(capsys, server, "model", "class", "llama", given)

    assert code == 0
    assert server.body() == {"class": sent}
    assert out == f"llama is {effective}\n"


def test_model_class_refuses_an_unknown_class_before_asking(capsys):
    server = FakeServer()

    code, _, err = run(capsys, server, "model", "class", "llama", "urgent")

    assert code == 2
    assert "invalid choice: 'urgent'" in err
    assert server.requests == []


# resources

VIEW = {
    "name": "tiny",
    "profiles": [
        {"name": "cpu", "min_memory_gb": 6.0, "cpu_cores": 3},
        {"name": "gpu", "min_memory_gb": 6.0, "cpu_cores": None},
    ],
}
RESTART = "Running replicas keep their old figures until restarted: llmgw ctl restart --model tiny"


def test_model_resources_sends_memory_and_cores_and_lists_each_profile(capsys):
    server = FakeServer({("POST", "/api/v1/models/tiny/resources"): (200, VIEW)})

    code, out, _ = run(
        capsys, server, "model", "resources", "tiny", "--memory", "6", "--cores", "3"
    )

    assert code == 0
    assert server.body() == {"memory_gb": 6, "cpu_cores": 3}
    assert out.splitlines() == [
        "tiny/cpu: 6 GB memory, 3 cores",
        "tiny/gpu: 6 GB memory, 0 cores",
        RESTART,
    ]


def test_model_resources_of_one_profile_names_it_and_shows_only_it(capsys):
    server = FakeServer({("POST", "/api/v1/models/tiny/resources"): (200, VIEW)})

    run(capsys, server, "model", "resources", "tiny", "--memory", "6.5", "--profile", "cpu")

    assert server.body() == {"memory_gb": 6.5, "profile": "cpu"}
    assert capsys.readouterr().out == ""  # run() already read it
    _, out, _ = run(
        capsys, server, "model", "resources", "tiny", "--memory", "6", "--profile", "cpu"
    )
    assert out.splitlines() == ["tiny/cpu: 6 GB memory, 3 cores", RESTART]


@pytest.mark.parametrize(
    "argv, says",
    [
        (("--cores", "3"), "--memory"),
        (("--memory", "-1"), "--memory"),
        (("--memory", "0"), "--memory"),
        (("--memory", "6", "--cores", "-1"), "--cores"),
    ],
)
def test_model_resources_refuses_what_it_cannot_send_before_asking(capsys, argv, says):
    server = FakeServer()

    code, _, err = run(capsys, server, "model", "resources", "tiny", *argv)

    assert code == 2
    assert says in err
    assert server.requests == []


def test_model_resources_shows_the_servers_refusal(capsys):
    refusal = 'model tiny has no profile "nope"'
    server = FakeServer({("POST", "/api/v1/models/tiny/resources"): (400, {"detail": refusal})})

    code, out, err = run(
        capsys, server, "model", "resources", "tiny", "--memory", "6", "--profile", "nope"
    )

    assert (code, out, err) == (1, "", f"error: {refusal}\n")


# capacity


def test_capacity_lists_every_measurement(capsys):
    measured = [
        {
            "model": "llama",
            "profile": "tp8",
            "max_concurrency": 16,
            "tok_per_sec": 500.25,
            "ttft_p95_ms": 420,
            "tpot_p95_ms": None,
            "measured_at": ago(7200),
            "measured_by": "bench",
        }
    ]
    server = FakeServer({("GET", "/api/v1/capacity"): (200, measured)})

    code, out, _ = run(capsys, server, "capacity")

    assert code == 0
    rows = table(out)
    assert rows[0] == [
        "MODEL",
        "PROFILE",
        "MAX CONCURRENCY",
        "TOK/S",
        "TTFT P95",
        "TPOT P95",
        "MEASURED",
        "BY",
    ]
    assert row_for(rows, "llama") == ["llama", "tp8", "16", "500.2", "420 ms", "-", "2h", "bench"]


def test_capacity_with_nothing_measured_says_how_to_measure(capsys):
    server = FakeServer({("GET", "/api/v1/capacity"): (200, [])})

    _, out, _ = run(capsys, server, "capacity")

    assert out == "Nothing measured yet: llmgw ctl bench MODEL --save\n"


# target


def target(**changes) -> dict:
    answer = {
        "model": "llama",
        "tok_per_sec": 1200.0,
        "per_replica_tok_per_sec": 500.0,
        "profile": "tp8",
        "needed": 3,
        "current": 1,
        "more": 2,
        "room": 2,
        "fits": True,
        "blocked": [],
    }
    return {**answer, **changes}


TARGET = ("GET", "/api/v1/models/llama/target")
HEAD = "llama: 1200 tokens/s needs 3 replicas at 500.0 each (measured on tp8); 1 running"


def test_target_asks_for_the_throughput_and_says_what_it_needs(capsys):
    server = FakeServer({TARGET: (200, target())})

    code, out, _ = run(capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200")

    assert code == 0
    assert server.last.url.params["tokens_per_sec"] == "1200"
    assert out.splitlines() == [HEAD, "2 more, and there is room for them."]
    assert [r.method for r in server.asked] == ["GET"]


CAPPED = (
    "node gpu-1's GPUs are capped to 80 % of their default power: its replica counts "
    "87.5 % of its measured 500 tokens/s"
)


def test_target_says_which_running_replicas_count_less_than_measured(capsys):
    server = FakeServer({TARGET: (200, target(capped=[CAPPED]))})

    _, out, _ = run(capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200")

    assert out.splitlines() == [
        HEAD,
        "Running replicas count less than measured:",
        f"  {CAPPED}",
        "2 more, and there is room for them.",
    ]


def test_headroom_says_when_one_more_counts_less_than_measured(capsys):
    answer = {
        "model": "llama",
        "current": 0,
        "more": 1,
        "nodes": [["gpu-1"]],
        "limited": False,
        "blocked": [],
        "tok_per_sec": 437.3,
        "capped": [CAPPED],
    }
    server = FakeServer({HEADROOM: (200, answer)})

    _, out, _ = run(capsys, server, "model", "headroom", "llama")

    assert out.splitlines() == [
        "llama: 0 running; room for 1 more",
        "one more serves 437.3 tokens/s",
        f"  {CAPPED}",
    ]


def test_target_already_met_says_so(capsys):
    server = FakeServer({TARGET: (200, target(current=3, more=0))})

    _, out, _ = run(
        capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200", "--apply"
    )

    assert out.splitlines()[1] == "It already has them."
    assert len(server.asked) == 1


def test_target_that_does_not_fit_says_how_many_do_and_why_not(capsys):
    blocked = ["node gpu-3 has 0 free h100-80g GPUs, needs 8", "team:7 is at its capacity limit"]
    server = FakeServer({TARGET: (200, target(room=1, fits=False, blocked=blocked))})

    code, out, _ = run(capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200")

    assert code == 0
    assert out.splitlines() == [
        HEAD,
        "2 more, and there is room for 1:",
        *(f"  {b}" for b in blocked),
    ]


def test_target_apply_sets_min_to_what_is_needed_and_keeps_a_higher_max(capsys):
    server = FakeServer(
        {
            TARGET: (200, target()),
            ("GET", "/api/v1/models/llama"): (200, {"name": "llama", "min": 1, "max": 4}),
            ("POST", "/api/v1/models/llama/scale"): (200, {"min": 3, "max": 4}),
        }
    )

    code, out, _ = run(
        capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200", "--apply"
    )

    assert code == 0
    assert server.body() == {"min": 3, "max": 4}
    assert out.splitlines()[-1] == "Applied: llama runs 3 (up to 4 under load)."


def test_target_apply_raises_max_to_what_is_needed(capsys):
    server = FakeServer(
        {
            TARGET: (200, target()),
            ("GET", "/api/v1/models/llama"): (200, {"name": "llama", "min": 1, "max": 1}),
            ("POST", "/api/v1/models/llama/scale"): (200, {"min": 3, "max": 3}),
        }
    )

    _, out, _ = run(
        capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200", "--apply"
    )

    assert server.body() == {"min": 3, "max": 3}
    assert out.splitlines()[-1] == "Applied: llama runs 3 (up to 3 under load)."


def test_target_apply_without_room_changes_nothing_and_fails(capsys):
    server = FakeServer({TARGET: (200, target(room=1, fits=False, blocked=["no room"]))})

    code, out, err = run(
        capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200", "--apply"
    )

    assert code == 1
    assert out.splitlines()[0] == HEAD
    assert err == "error: not applied: the cluster has no room for them\n"
    assert [r.method for r in server.asked] == ["GET"]


def test_target_json_prints_the_answer_and_says_what_was_applied_on_stderr(capsys):
    server = FakeServer(
        {
            TARGET: (200, target()),
            ("GET", "/api/v1/models/llama"): (200, {"name": "llama", "max": 2}),
            ("POST", "/api/v1/models/llama/scale"): (200, {}),
        }
    )

    code, out, err = run(
        capsys, server, "model", "target", "llama", "--tokens-per-sec", "1200", "--apply", "--json"
    )

    assert code == 0
    assert json.loads(out) == target()
    assert err == "Applied: llama runs 3 (up to 3 under load).\n"


@pytest.mark.parametrize("argv", [(), ("--tokens-per-sec", "0"), ("--tokens-per-sec", "x")])
def test_target_needs_a_positive_throughput_before_asking(capsys, argv):
    server = FakeServer()

    code, _, err = run(capsys, server, "model", "target", "llama", *argv)

    assert code == 2
    assert "--tokens-per-sec" in err
    assert server.requests == []


def test_an_unmeasured_model_shows_the_servers_sentence(capsys):
    refusal = "llama has not been measured; run `llmgw ctl bench llama --save` first"
    server = FakeServer({TARGET: (400, {"detail": refusal})})

    code, _, err = run(capsys, server, "model", "target", "llama", "--tokens-per-sec", "5")

    assert (code, err) == (1, f"error: {refusal}\n")


# headroom

HEADROOM = ("GET", "/api/v1/models/llama/headroom")


def test_headroom_says_how_many_more_fit_what_one_serves_and_why_not_more(capsys):
    answer = {
        "model": "llama",
        "current": 2,
        "more": 3,
        "nodes": [["gpu-1"], ["gpu-2"], ["gpu-2"]],
        "limited": False,
        "blocked": ["node gpu-1 has 0 free h100-80g GPUs, needs 1", "node gpu-3 is cordoned"],
        "tok_per_sec": 500.0,
    }
    server = FakeServer({HEADROOM: (200, answer)})

    code, out, _ = run(capsys, server, "model", "headroom", "llama")

    assert code == 0
    assert "limit" not in server.last.url.params
    assert out.splitlines() == [
        "llama: 2 running; room for 3 more",
        "one more serves 500 tokens/s",
        "Not more because:",
        "  node gpu-1 has 0 free h100-80g GPUs, needs 1",
        "  node gpu-3 is cordoned",
    ]


def test_headroom_that_reached_the_limit_asked_says_at_least(capsys):
    answer = {
        "model": "llama",
        "current": 0,
        "more": 4,
        "nodes": [["a"], ["b"], ["c"], ["d"]],
        "limited": True,
        "blocked": [],
        "tok_per_sec": None,
    }
    server = FakeServer({HEADROOM: (200, answer)})

    _, out, _ = run(capsys, server, "model", "headroom", "llama", "--limit", "4")

    assert server.last.url.params["limit"] == "4"
    assert out.splitlines() == ["llama: 0 running; room for 4 more (at least; asked up to 4)"]


# preemption

PREEMPTION = ("GET", "/api/v1/models/llama/preemption")


def test_preemption_shows_what_would_stop_what_is_protected_and_why(capsys):
    answer = {
        "model": "llama",
        "class": "critical",
        "wants": 1,
        "fits": True,
        "summary": "llama would fit by stopping 1 replica",
        "victims": [
            {
                "replica": "chat-7f3",
                "model": "chat",
                "class": "opportunistic",
                "node": "gpu-1",
                "why": "a lower class",
            }
        ],
        "protected": [
            {"replica": "code-1a2", "model": "code", "why": "ready 2 min; protected until 12:05"}
        ],
        "blocked": ["blocked by multi-node replica train-2a1"],
    }
    server = FakeServer({PREEMPTION: (200, answer)})

    code, out, _ = run(capsys, server, "model", "preemption", "llama")

    assert code == 0
    assert [r.method for r in server.asked] == ["GET"]
    summary, stop, protected, blocked = out.rstrip("\n").split("\n\n")
    assert summary == "llama would fit by stopping 1 replica"
    stop_rows = table(stop)
    assert stop_rows[0] == ["Would stop:"]
    assert stop_rows[1] == ["REPLICA", "MODEL", "CLASS", "NODE", "WHY"]
    assert stop_rows[2] == ["chat-7f3", "chat", "opportunistic", "gpu-1", "a lower class"]
    protected_rows = table(protected)
    assert protected_rows[:2] == [["Protected:"], ["REPLICA", "MODEL", "WHY"]]
    assert protected_rows[2] == ["code-1a2", "code", "ready 2 min; protected until 12:05"]
    assert blocked == "blocked by multi-node replica train-2a1"


def test_preemption_with_nothing_to_stop_shows_the_summary_alone(capsys):
    answer = {
        "model": "llama",
        "class": "standard",
        "wants": 0,
        "fits": True,
        "summary": "llama has the replicas it wants",
        "victims": [],
        "protected": [],
        "blocked": [],
    }
    server = FakeServer({PREEMPTION: (200, answer)})

    _, out, _ = run(capsys, server, "model", "preemption", "llama")

    assert out == "llama has the replicas it wants\n"


def test_an_answer_of_another_shape_says_so_and_points_at_json(capsys):
    server = FakeServer({PREEMPTION: (200, {"model": "llama"})})

    code, _, err = run(capsys, server, "model", "preemption", "llama")

    assert code == 1
    assert "--json prints it as it came" in err


def test_sizing_figures_are_sent_exactly_and_infinity_is_refused():
    from llmgw.cli.ctl_capacity import exact

    assert (exact(1200.0), exact(1e-9), exact(2.5)) == ("1200", "1e-09", "2.5")
    import argparse

    import pytest

    from llmgw.cli.base import positive_number

    with pytest.raises(argparse.ArgumentTypeError):
        positive_number("inf")
