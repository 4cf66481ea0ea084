"""``llmgw ctl facility list|set|clear``."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import FakeServer, row_for, run, table

DOMAINS = [
    {
        "kind": "rack",
        "name": "r12-07",
        "nodes": 4,
        "gpus": 32,
        "estimated_w": 14200.0,
        "measured_w": 9100.5,
        "unknown_gpus": 0,
        "budget_w": 16000.0,
        "over": False,
        "said": "14.2 of 16 kW",
    },
    {
        "kind": "pdu",
        "name": "r12-07-a",
        "nodes": 4,
        "gpus": 32,
        "estimated_w": 14200.0,
        "measured_w": None,
        "unknown_gpus": 2,
        "budget_w": None,
        "over": False,
        "said": "14.2 kW",
    },
]


def test_a_rack_whose_gpus_report_no_power_holds_an_unknown_draw_not_zero(capsys):
    silent = {**DOMAINS[0], "estimated_w": None, "measured_w": None, "unknown_gpus": 4}
    server = FakeServer({("GET", "/api/v1/facility"): (200, [silent])})

    code, out, _ = run(capsys, server, "facility", "list")

    assert code == 0
    rows = table(out.rstrip("\n").split("\n\n")[0])
    assert row_for(rows, "rack")[4] == "unknown (4 GPUs unknown)"


def test_facility_list_shows_each_rack_and_pdu_with_its_draw_and_budget(capsys):
    server = FakeServer({("GET", "/api/v1/facility"): (200, DOMAINS)})

    code, out, err = run(capsys, server, "facility", "list")

    assert (code, err) == (0, "")
    body, legend = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0] == ["KIND", "NAME", "NODES", "GPUS", "RESERVED W", "MEASURED W", "BUDGET W"]
    assert row_for(rows, "rack") == ["rack", "r12-07", "4", "32", "14,200", "9,100", "16,000"]
    assert row_for(rows, "pdu") == [
        "pdu",
        "r12-07-a",
        "4",
        "32",
        "14,200 (2 GPUs unknown)",
        "-",
        "-",
    ]
    assert legend.startswith("RESERVED W: per GPU held by a replica")


def test_facility_list_shows_what_is_reserved_and_the_limit_after_a_margin(capsys):
    rack = {**DOMAINS[0], "reserved_w": 15400.0, "limit_w": 14400.0, "over": True}
    server = FakeServer({("GET", "/api/v1/facility"): (200, [rack])})

    _, out, _ = run(capsys, server, "facility", "list")

    rows = table(out.rstrip("\n").split("\n\n")[0])
    assert row_for(rows, "rack")[4:] == ["15,400 (over)", "9,100", "16,000 (14,400 after margin)"]


def test_facility_set_sends_feeds_a_margin_and_other_equipment(capsys):
    answer = {
        "kind": "rack",
        "name": "r1",
        "watts": 5920.0,
        "margin": 0.1,
        "feeds": [7400.0, 9000.0],
        "derating": 0.8,
        "other_watts": 1200.0,
    }
    server = FakeServer({("PUT", "/api/v1/facility/budgets"): (200, answer)})

    code, out, _ = run(
        capsys,
        server,
        "facility",
        "set",
        "rack",
        "r1",
        "--feeds",
        "7400,9000",
        "--margin",
        "0.1",
        "--other-watts",
        "1200",
    )

    assert code == 0
    assert server.body() == {
        "kind": "rack",
        "name": "r1",
        "feeds": [7400.0, 9000.0],
        "margin": 0.1,
        "other_watts": 1200.0,
    }
    assert out == (
        "rack r1: budget 5,920 W (the smaller of 7,400 and 9,000 W at 80 %), less a 10 % "
        "margin, 1,200 W of other equipment held; it takes effect at the next reconciler pass\n"
    )


def test_facility_list_with_nothing_says_power_is_not_looked_at(capsys):
    server = FakeServer({("GET", "/api/v1/facility"): (200, [])})
    _, out, _ = run(capsys, server, "facility", "list")
    assert "placement does not look at power" in out


def test_facility_list_json_is_the_servers_answer(capsys):
    server = FakeServer({("GET", "/api/v1/facility"): (200, DOMAINS)})
    _, out, _ = run(capsys, server, "facility", "list", "--json")
    assert json.loads(out) == DOMAINS


def test_facility_set_puts_the_budget(capsys):
    answer = {"kind": "rack", "name": "r12-07", "watts": 16000.0}
    server = FakeServer({("PUT", "/api/v1/facility/budgets"): (200, answer)})

    code, out, _ = run(capsys, server, "facility", "set", "rack", "r12-07", "16000")

    assert code == 0
    assert server.body() == {"kind": "rack", "name": "r12-07", "watts": 16000.0}
    assert out == "rack r12-07: budget 16,000 W; it takes effect at the next reconciler pass\n"


def test_facility_set_shows_the_servers_refusal(capsys):
    refusal = "a power budget is for a rack or a pdu, not 'row'."
    server = FakeServer({("PUT", "/api/v1/facility/budgets"): (400, {"detail": refusal})})

    code, out, err = run(capsys, server, "facility", "set", "row", "r1", "100")

    assert (code, out, err) == (1, "", f"error: {refusal}\n")


@pytest.mark.parametrize("value", ["-5", "0", "lots", "inf"])
def test_facility_set_refuses_watts_that_are_not_a_positive_number_before_asking(capsys, value):
    server = FakeServer()

    code, _, err = run(capsys, server, "facility", "set", "rack", "r1", value)

    assert code == 2
    assert "WATTS" in err or "watts" in err
    assert server.requests == []


def test_facility_clear_deletes_the_budget_by_kind_and_name(capsys):
    answer = {"kind": "pdu", "name": "r12-07-a", "watts": 7400.0}
    server = FakeServer({("DELETE", "/api/v1/facility/budgets/pdu/r12-07-a"): (200, answer)})

    code, out, _ = run(capsys, server, "facility", "clear", "pdu", "r12-07-a")

    assert code == 0
    assert out == "pdu r12-07-a: budget removed\n"


def test_facility_clear_of_a_rack_with_none_says_so(capsys):
    server = FakeServer()  # 404 {"detail": ...} to everything
    code, _, err = run(capsys, server, "facility", "clear", "rack", "r1")
    assert code == 1
    assert err.startswith("error: ")


CONDITIONS = [
    {
        "kind": "rack",
        "name": "r12-07",
        "condition": "hot",
        "said": "rack r12-07 is hot (inlet 31 °C for 6 min)",
        "since": "2026-12-07T10:00:00Z",
        "reading_age_s": 12.0,
        "enforced": False,
        "held": True,
        "held_by": "fac-team",
        "hold_reason": "PDU swap",
    },
    {
        "kind": "row",
        "name": "12",
        "condition": "unknown",
        "said": "row 12's condition is unknown (no fresh reading), treated as ok",
        "since": None,
        "reading_age_s": None,
        "enforced": False,
        "held": False,
        "held_by": "",
        "hold_reason": "",
    },
]


def test_facility_conditions_lists_each_domains_condition_age_and_hold(capsys):
    server = FakeServer({("GET", "/api/v1/facility/conditions"): (200, CONDITIONS)})

    code, out, err = run(capsys, server, "facility", "conditions")

    assert (code, err) == (0, "")
    body, mode = out.rstrip("\n").split("\n\n")
    rows = table(body)
    assert rows[0] == ["KIND", "NAME", "CONDITION", "READ", "HOLD"]
    assert row_for(rows, "rack") == [
        "rack",
        "r12-07",
        "rack r12-07 is hot (inlet 31 °C for 6 min)",
        "12 s ago",
        "held by fac-team: PDU swap",
    ]
    assert row_for(rows, "row")[3:] == ["never", "-"]
    assert mode.startswith("Observe-only (LLMGW_FACILITY_ENFORCE off)")


def test_facility_hold_puts_the_hold_with_its_reason_and_release_deletes_it(capsys):
    hold = {"kind": "rack", "name": "r1", "reason": "PDU swap", "held_by": "ops"}
    server = FakeServer(
        {
            ("PUT", "/api/v1/facility/holds"): (200, {**hold, "held_at": "2026-12-07T10:00:00Z"}),
            ("DELETE", "/api/v1/facility/holds/rack/r1"): (200, {**hold, "held_at": "x"}),
        }
    )

    code, out, _ = run(capsys, server, "facility", "hold", "rack", "r1", "--reason", "PDU swap")

    assert code == 0
    assert server.body() == {"kind": "rack", "name": "r1", "reason": "PDU swap"}
    assert out.startswith("rack r1 held: no new placements there from the next reconciler pass")
    code, out, _ = run(capsys, server, "facility", "release", "rack", "r1")
    assert (code, out) == (0, "rack r1 released (was held by ops)\n")


def test_facility_conditions_says_which_source_fails_and_why(capsys):
    failing = {
        "checked_at": "2026-12-07T10:05:00Z",
        "failed": [
            {
                "source": "prometheus (signal inlet_temp_c)",
                "why": "Prometheus at http://monitoring:9090 could not be reached: refused.",
                "since": "2026-12-07T10:00:00Z",
            }
        ],
    }
    server = FakeServer(
        {
            ("GET", "/api/v1/facility/conditions"): (200, CONDITIONS),
            ("GET", "/api/v1/facility/sources"): (200, failing),
        }
    )

    code, out, err = run(capsys, server, "facility", "conditions")

    assert (code, err) == (0, "")
    assert out.rstrip("\n").split("\n\n")[-1] == (
        "Source prometheus (signal inlet_temp_c) failing since 2026-12-07T10:00:00Z: "
        "Prometheus at http://monitoring:9090 could not be reached: refused.\n"
        "(domains it reads are unknown, treated as ok)"
    )
