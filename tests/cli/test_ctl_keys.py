"""``llmgw ctl key``: create prints the secret alone on its last line; list never shows one."""

from __future__ import annotations

import json

from .helpers import FakeServer, run


def test_key_create_sends_what_was_asked_and_prints_the_secret_last(capsys):
    made = {"id": 3, "name": "ci", "prefix": "llmgw_key_abcd", "secret": "llmgw_key_abcdSECRET"}
    server = FakeServer({("POST", "/api/v1/keys"): (201, made)})

    code, out, _ = run(
        capsys,
        server,
        "key",
        "create",
        "ci",
        "--project",
        "Acme/ml/training",
        "--models",
        "llama, chat",
        "--rpm",
        "60",
    )

    assert code == 0
    assert out.strip().splitlines()[-1] == "llmgw_key_abcdSECRET"
    assert json.loads(server.requests[0].content) == {
        "project": "Acme/ml/training",
        "name": "ci",
        "models": ["llama", "chat"],
        "limits": {"requests_per_minute": 60},
    }


def test_key_list_shows_prefixes_models_limits_and_state(capsys):
    keys = [
        {
            "id": 3,
            "name": "ci",
            "prefix": "llmgw_key_abcd",
            "project": "Acme/ml/training",
            "models": [],
            "requests_per_minute": 60,
            "tokens_per_minute": None,
            "revoked_at": "2026-11-30T10:00:00+00:00",
        }
    ]
    code, out, _ = run(capsys, FakeServer({("GET", "/api/v1/keys"): (200, keys)}), "key", "list")
    assert code == 0
    assert "llmgw_key_abcd…" in out and "all" in out and "60 req/min" in out and "revoked" in out


def test_key_revoke_says_so_and_a_server_refusal_is_an_error(capsys):
    server = FakeServer({("DELETE", "/api/v1/keys/3"): (200, {"revoked": 3})})
    code, out, _ = run(capsys, server, "key", "revoke", "3")
    assert (code, out.strip()) == (0, "API key 3 revoked: the gateway refuses it now")

    code, _, err = run(capsys, FakeServer(), "key", "revoke", "9")
    assert code != 0 and "Not Found" in err
