"""``llmgw ctl``: an engine's failure in ``models`` and ``model explain``, and ``ctl logs``."""

from __future__ import annotations

from tests.cli.helpers import FakeServer, run

FAILURE = {
    "replica": "chat-1a2b3c",
    "node": "cpu-1",
    "exit_code": 1,
    "detail": (
        "The engine exited with code 1.\n"
        "llama_model_load: loading model from /models/chat.gguf\n"
        "error: failed to open GGUF file '/models/chat.gguf' (No such file or directory)"
    ),
    "at": "2026-05-01T12:00:00+00:00",
}
BACKING_OFF = {
    "name": "chat",
    "ready": 0,
    "desired": 1,
    "status": "waiting",
    "reason": "backing off after 3 failures; next try at 12:00:40 UTC",
    "class": "standard",
    "failures": 3,
    "last_failure": FAILURE,
    "profiles": [{"name": "cpu"}],
}


def test_models_says_under_the_table_why_a_model_backs_off(capsys):
    fine = {**BACKING_OFF, "name": "ok", "ready": 1, "failures": 0, "last_failure": None}
    server = FakeServer({("GET", "/api/v1/models"): (200, [BACKING_OFF, fine])})
    code, out, _ = run(capsys, server, "models")
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 4  # header, two rows, one failure
    assert lines[-1] == (
        "failing: chat: error: failed to open GGUF file '/models/chat.gguf' "
        "(No such file or directory) (replica chat-1a2b3c on node cpu-1, exit code 1)"
    )


def test_explain_shows_the_engines_own_error_and_where_to_read_more(capsys):
    answer = {
        "model": "chat",
        "unplaceable": False,
        "reason": BACKING_OFF["reason"],
        "explanation": [{"profile": "", "reasons": [BACKING_OFF["reason"]]}],
        "last_failure": FAILURE,
    }
    server = FakeServer({("GET", "/api/v1/models/chat/explain"): (200, answer)})
    code, out, _ = run(capsys, server, "model", "explain", "chat")
    assert code == 0
    assert out.splitlines() == [
        f"chat: its last placement failed: {BACKING_OFF['reason']}",
        f"  - {BACKING_OFF['reason']}",
        "last failure: replica chat-1a2b3c on node cpu-1, exit code 1 at 2026-05-01T12:00:00+00:00:",
        "  The engine exited with code 1.",
        "  llama_model_load: loading model from /models/chat.gguf",
        "  error: failed to open GGUF file '/models/chat.gguf' (No such file or directory)",
        "its engine's log: llmgw ctl logs chat-1a2b3c",
    ]


def test_logs_asks_for_the_lines_and_prints_them_as_they_are(capsys):
    answer = {"replica": "chat-1", "shard": "chat-1-0", "node": "cpu-1", "lines": ["a", "  b"]}
    server = FakeServer({("GET", "/api/v1/replicas/chat-1/logs"): (200, answer)})
    code, out, _ = run(capsys, server, "logs", "chat-1", "-n", "20")
    assert code == 0
    assert server.last.url.params["lines"] == "20"
    assert out == "a\n  b\n"


def test_logs_of_an_engine_that_wrote_nothing_says_so(capsys):
    answer = {"replica": "chat-1", "shard": "chat-1-0", "node": "cpu-1", "lines": []}
    server = FakeServer({("GET", "/api/v1/replicas/chat-1/logs"): (200, answer)})
    _, out, _ = run(capsys, server, "logs", "chat-1")
    assert server.last.url.params["lines"] == "100"
    assert out.strip() == "chat-1-0 on node cpu-1 has logged nothing yet."


def test_logs_of_a_node_that_is_away_prints_the_servers_sentence(capsys):
    detail = "Node cpu-1 is unreachable: the log of chat-1 can be read once its agent is back."
    server = FakeServer({("GET", "/api/v1/replicas/chat-1/logs"): (503, {"detail": detail})})
    code, out, err = run(capsys, server, "logs", "chat-1")
    assert code == 1
    assert out == ""
    assert err.strip() == f"error: {detail}"


def test_models_shows_the_servers_one_line_and_how_the_engine_ended(capsys):
    failure = FAILURE | {
        "exit_code": -9,
        "said": "torch.OutOfMemoryError: CUDA out of memory.",
        "exit": "stopped by SIGKILL",
    }
    failing = BACKING_OFF | {"status": "failing", "last_failure": failure}
    server = FakeServer({("GET", "/api/v1/models"): (200, [failing])})
    code, out, _ = run(capsys, server, "models")
    assert code == 0
    assert out.strip().splitlines()[-1] == (
        "failing: chat: torch.OutOfMemoryError: CUDA out of memory. "
        "(replica chat-1a2b3c on node cpu-1, stopped by SIGKILL)"
    )
    assert "failing" in out.splitlines()[1]


def test_explain_of_a_failing_model_says_it_is_failing_with_why_and_its_next_try(capsys):
    reason = "error: failed to open GGUF file '/models/chat.gguf'; 3 failures, next try in 40s"
    answer = {
        "model": "chat",
        "unplaceable": False,
        "status": "failing",
        "reason": reason,
        "explanation": [{"profile": "cpu", "reasons": ["backing off after 3 failures"]}],
        "last_failure": FAILURE,
    }
    server = FakeServer({("GET", "/api/v1/models/chat/explain"): (200, answer)})
    code, out, _ = run(capsys, server, "model", "explain", "chat")
    assert code == 0
    assert out.splitlines()[0] == f"chat is failing: {reason}"
