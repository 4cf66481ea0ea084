"""``llmgw ctl quota list|set|clear`` and ``model owner``."""

from __future__ import annotations

import json

import pytest

from llmgw.cli.ctl_quota import quota_cell
from tests.cli.helpers import FakeServer, row_for, run, table

QUOTAS = [
    {
        "scope": "org:1",
        "name": "Acme",
        "guarantee": {},
        "limit": {"gpus": 16, "memory_gb": 0},
        "holds": {"gpus": 6, "cpu_cores": 4, "memory_gb": 12.5},
        "updated_by": "ops",
        "updated_at": "2026-01-01T00:00:00Z",
    },
    {
        "scope": "team:7",
        "name": "Acme / ml",
        "guarantee": {"gpus": 8, "cpu_cores": 16},
        "limit": {"gpus": 16},
        "holds": {"gpus": 6, "cpu_cores": 4, "memory_gb": 12.5},
        "updated_by": "ops",
        "updated_at": "2026-01-01T00:00:00Z",
    },
]


@pytest.mark.parametrize(
    "holds, guarantee, limit, cell",
    [
        (6, 8, 16, "6 / 8 (≤ 16)"),
        (6, 8, None, "6 / 8"),
        (6, None, 16, "6 / - (≤ 16)"),
        (6, None, None, "-"),
        (0, 0, 0, "0 / 0 (≤ 0)"),
        (12.5, None, 0, "12.5 / - (≤ 0)"),
    ],
)
def test_a_quota_cell_is_holds_over_guarantee_with_the_limit(holds, guarantee, limit, cell):
    assert quota_cell(holds, guarantee, limit) == cell


def test_quota_list_shows_a_cell_per_resource_and_how_to_read_them(capsys):
    server = FakeServer({("GET", "/api/v1/quotas"): (200, QUOTAS)})

    code, out, err = run(capsys, server, "quota", "list")

    assert (code, err) == (0, "")
    body, legend = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0] == ["SCOPE", "NAME", "GPUS", "CORES", "MEMORY GB"]
    assert row_for(rows, "org:1") == ["org:1", "Acme", "6 / - (≤ 16)", "-", "12.5 / - (≤ 0)"]
    assert row_for(rows, "team:7") == ["team:7", "Acme / ml", "6 / 8 (≤ 16)", "4 / 16", "-"]
    assert legend == "Each cell: holds / guaranteed (at most limit). - is not governed."


def test_no_quotas_says_everything_shares_by_class(capsys):
    server = FakeServer({("GET", "/api/v1/quotas"): (200, [])})

    _, out, _ = run(capsys, server, "quota", "list")

    assert out == "No capacity quotas: everything shares the cluster by class alone.\n"


def test_quota_list_json_is_the_servers_answer(capsys):
    server = FakeServer({("GET", "/api/v1/quotas"): (200, QUOTAS)})

    _, out, _ = run(capsys, server, "quota", "list", "--json")

    assert json.loads(out) == QUOTAS


def test_quota_set_sends_only_the_flags_given(capsys):
    server = FakeServer({("PUT", "/api/v1/quotas"): (200, {"scope": "team:7"})})

    code, out, _ = run(
        capsys, server, "quota", "set", "team:Acme/ml", "--gpus", "8", "--limit-gpus", "16"
    )

    assert code == 0
    assert server.last.method == "PUT"
    assert server.body() == {
        "scope": "team:Acme/ml",
        "guarantee": {"gpus": 8},
        "limit": {"gpus": 16},
    }
    assert out == "team:Acme/ml: set; it takes effect at the next reconciler pass\n"


def test_quota_set_maps_every_flag_to_its_resource(capsys):
    server = FakeServer({("PUT", "/api/v1/quotas"): (200, {"scope": "org:1"})})

    run(capsys, server, "quota", "set", "org:Acme", "--cores", "0", "--memory", "256")
    assert server.body() == {"scope": "org:Acme", "guarantee": {"cpu_cores": 0, "memory_gb": 256}}

    run(capsys, server, "quota", "set", "org:Acme", "--limit-cores", "64", "--limit-memory", "512")
    assert server.body() == {"scope": "org:Acme", "limit": {"cpu_cores": 64, "memory_gb": 512}}


def test_quota_set_shows_the_servers_refusal(capsys):
    refusal = "a quota needs a guarantee or a limit; to remove one, DELETE it"
    server = FakeServer({("PUT", "/api/v1/quotas"): (400, {"detail": refusal})})

    code, out, err = run(capsys, server, "quota", "set", "team:ml")

    assert server.body() == {"scope": "team:ml"}
    assert (code, out, err) == (1, "", f"error: {refusal}\n")


@pytest.mark.parametrize("value", ["-1", "1.5", "many"])
def test_quota_set_refuses_a_figure_that_is_not_a_whole_number_before_asking(capsys, value):
    server = FakeServer()

    code, _, err = run(capsys, server, "quota", "set", "org:Acme", "--gpus", value)

    assert code == 2
    assert "--gpus" in err
    assert server.requests == []


def test_quota_clear_deletes_the_scope_written_as_one_path_segment(capsys):
    path = "/api/v1/quotas/team:Acme%2Fml"
    server = FakeServer({("DELETE", "/api/v1/quotas/team:Acme/ml"): (200, {"removed": "team:7"})})

    code, out, _ = run(capsys, server, "quota", "clear", "team:Acme/ml")

    assert code == 0
    assert server.last.url.raw_path.decode() == path.replace(":", "%3A")
    assert out == "team:Acme/ml: quota removed\n"


def test_quota_clear_of_a_scope_with_none_says_so(capsys):
    server = FakeServer()  # 404 {"detail": ...} to everything

    code, _, err = run(capsys, server, "quota", "clear", "team:web")

    assert code == 1
    assert err.startswith("error: Not Found")


@pytest.mark.parametrize(
    "given, sent, answer, said",
    [
        ("team:Acme/ml", "team:Acme/ml", "team:7", "llama counts against team:Acme/ml"),
        ("shared", "", "", "llama is shared"),
    ],
)
def test_model_owner_sends_the_scope_and_says_whom_it_counts_against(
    capsys, given, sent, answer, said
):
    server = FakeServer(
        {("POST", "/api/v1/models/llama/owner"): (200, {"model": "llama", "owner": answer})}
    )

    code, out, _ = run(capsys, server, "model", "owner", "llama", given)

    assert code == 0
    assert server.body() == {"owner": sent}
    assert out == f"{said}\n"


def test_model_owner_shows_the_servers_refusal(capsys):
    refusal = '"ml" could be any of 2 teams; give its ID'
    server = FakeServer({("POST", "/api/v1/models/llama/owner"): (400, {"detail": refusal})})

    code, out, err = run(capsys, server, "model", "owner", "llama", "team:ml")

    assert (code, out, err) == (1, "", f"error: {refusal}\n")
