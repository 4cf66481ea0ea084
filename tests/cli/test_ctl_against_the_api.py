"""``llmgw ctl`` against the real REST API (through Django's test client, no sockets):
the shapes each command sends are the ones the server takes, and back."""

from __future__ import annotations

import re

import pytest

from catalog.models import Measurement, Model
from catalog.services import model_add
from llmgw.cli import ctl
from tenancy.models import CapacityQuota, Organization, Team
from tests.cli.helpers import table
from tests.fleet.builders import cpu_model, gpu_model

pytestmark = pytest.mark.django_db


def ctl_run(capsys, server, *argv: str) -> tuple[int, str, str]:
    code = ctl.main(list(argv), transport=server)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def acme(db):
    org = Organization.objects.create(name="Acme")
    return {"org": org.pk, "ml": Team.objects.create(org=org, name="ml").pk}


def test_a_power_budget_is_set_listed_and_cleared_with_ctl(capsys, server):
    from fleet.models import PowerBudget

    code, out, err = ctl_run(capsys, server, "facility", "set", "rack", "r12-07", "16000")
    assert (code, err) == (0, "")
    assert out == "rack r12-07: budget 16,000 W; it takes effect at the next reconciler pass\n"
    assert list(PowerBudget.objects.values_list("kind", "name", "watts")) == [
        ("rack", "r12-07", 16000.0)
    ]

    _, out, _ = ctl_run(capsys, server, "facility", "list")
    rows = table(out.split("\n\n")[0])
    assert rows[1] == ["rack", "r12-07", "0", "0", "0", "-", "16,000"]

    code, _, err = ctl_run(capsys, server, "facility", "set", "rack", "r 1", "100")
    assert code == 1 and "is not a rack's name" in err
    code, out, _ = ctl_run(capsys, server, "facility", "clear", "rack", "r12-07")
    assert (code, out) == (0, "rack r12-07: budget removed\n")
    assert PowerBudget.objects.count() == 0
    code, _, err = ctl_run(capsys, server, "facility", "clear", "rack", "r12-07")
    assert (code, err) == (1, "error: rack r12-07 has no power budget.\n")


def test_a_pdu_phases_budget_is_set_listed_and_cleared_with_ctl(capsys, server):
    from fleet.models import PowerBudget

    argv = ("facility", "set", "phase", "r12-a/L2", "7400", "--margin", "0.1")
    code, out, err = ctl_run(capsys, server, *argv)
    assert (code, err) == (0, "")
    assert out == (
        "phase r12-a/L2: budget 7,400 W, less a 10 % margin; "
        "it takes effect at the next reconciler pass\n"
    )
    _, out, _ = ctl_run(capsys, server, "facility", "list")
    rows = table(out.split("\n\n")[0])
    assert rows[1] == ["phase", "r12-a/L2", "0", "0", "0", "-", "7,400 (6,660 after margin)"]

    code, _, err = ctl_run(capsys, server, "facility", "set", "phase", "r12-a/L 2", "100")
    assert code == 1 and "'L 2' is not a phase" in err
    code, out, _ = ctl_run(capsys, server, "facility", "clear", "phase", "r12-a/L2")
    assert (code, out) == (0, "phase r12-a/L2: budget removed\n")
    assert PowerBudget.objects.count() == 0


def test_a_pdu_phase_is_held_and_released_with_ctl(capsys, server):
    from fleet.models import DomainHold

    argv = ("facility", "hold", "phase", "r12-a/L2", "--reason", "breaker work")
    code, out, err = ctl_run(capsys, server, *argv)
    assert (code, err) == (0, "")
    assert out == (
        "phase r12-a/L2 held: no new placements there from the next reconciler pass; "
        "nothing running is stopped\n"
    )
    assert list(DomainHold.objects.values_list("kind", "name", "reason")) == [
        ("phase", "r12-a/L2", "breaker work")
    ]
    _, out, _ = ctl_run(capsys, server, "facility", "conditions")
    assert "pdu r12-a phase L2 has no condition of its own: it takes pdu r12-a's" in out

    code, _, err = ctl_run(capsys, server, "facility", "hold", "phase", "r12-a")
    assert code == 1 and "a phase is named by its PDU and its phase, as r12-a/L2" in err
    code, out, _ = ctl_run(capsys, server, "facility", "release", "phase", "r12-a/L2")
    assert code == 0 and out.startswith("phase r12-a/L2 released (was held by ")
    assert not DomainHold.objects.exists()


def test_a_quota_is_set_listed_and_cleared_with_ctl(capsys, server, acme):
    team = f"team:{acme['ml']}"

    code, out, err = ctl_run(
        capsys, server, "quota", "set", "team:Acme/ml", "--gpus", "8", "--limit-gpus", "16"
    )
    assert (code, err) == (0, "")
    assert out == "team:Acme/ml: set; it takes effect at the next reconciler pass\n"
    assert CapacityQuota.objects.get().guarantee_gpus == 8

    _, out, _ = ctl_run(capsys, server, "quota", "list")
    rows = table(out.split("\n\n")[0])
    assert rows[1] == [team, "Acme / ml", "0 / 8 (≤ 16)", "-", "-"]

    code, out, _ = ctl_run(capsys, server, "quota", "clear", "team:Acme/ml")
    assert (code, out) == (0, "team:Acme/ml: quota removed\n")
    assert CapacityQuota.objects.count() == 0

    code, _, err = ctl_run(capsys, server, "quota", "clear", "team:Acme/ml")
    assert (code, err) == (1, "error: team:Acme/ml has no capacity quota.\n")


def test_a_models_owner_class_and_resources_are_set_with_ctl(capsys, server, acme):
    model_add(data=cpu_model("tiny", cores=2, memory_gb=4), actor="test")

    assert ctl_run(capsys, server, "model", "owner", "tiny", "team:ml")[1] == (
        "tiny counts against team:ml\n"  # as typed, not the key kept
    )
    assert ctl_run(capsys, server, "model", "owner", "tiny", "shared")[1] == "tiny is shared\n"
    assert ctl_run(capsys, server, "model", "class", "tiny", "critical")[1] == "tiny is critical\n"
    assert ctl_run(capsys, server, "model", "class", "tiny", "default")[1] == "tiny is standard\n"

    code, out, _ = ctl_run(
        capsys, server, "model", "resources", "tiny", "--memory", "6", "--cores", "3"
    )
    assert code == 0
    assert out.splitlines() == [
        "tiny/cpu: 6 GB memory, 3 cores",
        "Running replicas keep their old figures until restarted: llmgw ctl restart --model tiny",
    ]
    row = Model.objects.get()
    assert (row.owner, row.capacity_class, row.updated_by) == ("", "", "ops")
    assert list(row.profiles.values_list("min_memory_gb", "cpu_cores")) == [(6.0, 3)]

    code, _, err = ctl_run(capsys, server, "model", "owner", "tiny", "team:nope")
    assert (code, err) == (1, 'error: there is no team "nope"\n')


def test_capacity_lists_what_was_measured(capsys, server, api):
    model_add(data=gpu_model("llama"), actor="test")
    measured = {"profile": "gpu", "max_concurrency": 16, "tok_per_sec": 500}
    assert api.call("PUT", "/models/llama/capacity", measured).status_code == 200
    assert Measurement.objects.count() == 1

    code, out, _ = ctl_run(capsys, server, "capacity")

    assert code == 0
    assert table(out)[1][:6] == ["llama", "gpu", "16", "500", "-", "-"]


def test_target_headroom_and_the_preemption_dry_run_read_the_servers_answers(capsys, server, api):
    from llmgw.core import clock
    from tests.fleet.builders import node_add

    node_add("gpu-a", now=clock.now())  # two H100s
    model_add(data=gpu_model("llama", scaling={"min": 0, "max": 0}), actor="test")
    api.call(
        "PUT",
        "/models/llama/capacity",
        {"profile": "gpu", "max_concurrency": 8, "tok_per_sec": 400},
    )

    code, out, err = ctl_run(capsys, server, "model", "target", "llama", "--tokens-per-sec", "1000")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "llama: 1000 tokens/s needs 3 replicas at 400.0 each (measured on gpu); 0 running",
        "3 more, and there is room for 2:",
        *out.splitlines()[2:],
    ]
    assert len(out.splitlines()) > 2, "why the third does not fit"

    code, out, _ = ctl_run(capsys, server, "model", "headroom", "llama", "--limit", "1")
    assert code == 0
    assert out.splitlines()[:2] == [
        "llama: 0 running; room for 1 more (at least; asked up to 1)",
        "one more serves 400 tokens/s",
    ]

    code, out, _ = ctl_run(capsys, server, "model", "preemption", "llama")
    assert code == 0
    assert out.strip()
    assert Model.objects.get().min_replicas == 0, "nothing changed"


def test_ctl_models_says_when_no_reconciler_pass_ran_for_several_intervals(capsys, server):
    from datetime import timedelta

    from fleet.models import Lease
    from fleet.reconciler.run import LEASE
    from llmgw.core import clock

    model_add(data=cpu_model("tiny", cores=2, memory_gb=4), actor="test")
    now = clock.now()
    Lease.objects.create(name=LEASE, expires_at=now, last_pass_at=now - timedelta(seconds=2))

    code, out, _ = ctl_run(capsys, server, "models")
    assert code == 0
    assert "no reconciler pass" not in out

    Lease.objects.filter(pk=LEASE).update(last_pass_at=now - timedelta(seconds=47))
    code, out, _ = ctl_run(capsys, server, "models")
    assert code == 0
    # The seconds are counted by the real clock, from 47 s ago; the cause is the mode's.
    from django.conf import settings

    cause = (
        r"the reconciler in llmgw serve has stopped; see its log"
        if settings.LLMGW.embedded
        else r"is celery beat running, and a worker\?"
    )
    assert re.fullmatch(
        r"warning: no reconciler pass for (4[7-9]|[5-9]\d) s \(every 5 s expected\): " + cause,
        out.rstrip().splitlines()[-1],
    )


def test_a_model_is_named_by_its_alias_wherever_ctl_names_one(capsys, server, caplog):
    model_add(data=gpu_model("llama", aliases=["chat"]), actor="test")
    caplog.set_level("WARNING", logger="django.request")

    code, out, err = ctl_run(capsys, server, "scale", "chat", "--min", "2", "--max", "3")
    assert (code, out, err) == (0, "llama: min 2, max 3\n", "")
    row = Model.objects.get()
    assert (row.name, row.min_replicas, row.max_replicas) == ("llama", 2, 3)

    code, out, _ = ctl_run(capsys, server, "model", "show", "chat")
    assert code == 0
    assert "llama" in out
    code, out, _ = ctl_run(capsys, server, "model", "class", "chat", "critical")
    assert (code, out) == (0, "llama is critical\n")
    assert ctl_run(capsys, server, "--json", "replicas", "--model", "chat")[0] == 0
    # Found by its alias without asking for a path that is not there (issue 37, item 4).
    refused = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert refused == []

    # A name nothing has is still told as it was.
    code, _, err = ctl_run(capsys, server, "scale", "nope", "--min", "1")
    assert code == 1
    assert "nope" in err


def test_the_tenancy_tree_is_made_listed_and_renamed_with_ctl(capsys, server):
    from tenancy.models import AuditEvent, Project

    assert ctl_run(capsys, server, "org", "list")[1] == (
        "No organizations yet: llmgw ctl org create Acme\n"
    )
    code, out, err = ctl_run(capsys, server, "org", "create", "Acme")
    assert (code, err) == (0, "")
    org = Organization.objects.get()
    assert out == f"organization Acme added (org:{org.pk})\n"
    assert ctl_run(capsys, server, "team", "create", "Acme/ml")[0] == 0
    code, out, _ = ctl_run(capsys, server, "project", "create", "Acme/ml/training")
    project = Project.objects.get()
    assert (code, out) == (0, f"project Acme/ml/training added (project:{project.pk})\n")
    # The README's own next step now works on a fresh install.
    assert ctl_run(capsys, server, "key", "create", "--project", "Acme/ml/training", "ci")[0] == 0

    _, out, _ = ctl_run(capsys, server, "project", "list")
    assert table(out) == [["ID", "PATH"], [str(project.pk), "Acme/ml/training"]]

    code, out, _ = ctl_run(capsys, server, "team", "rename", "Acme/ml", "research")
    team = Team.objects.get()
    assert (code, out) == (0, f"team Acme/ml is now Acme/research (team:{team.pk})\n")
    code, out, _ = ctl_run(capsys, server, "project", "rename", str(project.pk), "train")
    assert (code, out) == (
        0,
        f"project {project.pk} is now Acme/research/train (project:{project.pk})\n",
    )
    assert list(
        AuditEvent.objects.filter(action__endswith=".rename")
        .order_by("pk")
        .values_list("detail", flat=True)
    ) == [
        {"name": "research", "was": "ml"},
        {"name": "train", "was": "training"},
    ]
    # The key follows its project: it holds the project's ID.
    _, out, _ = ctl_run(capsys, server, "key", "list")
    assert "Acme/research/train" in out


def test_bad_tenancy_input_is_refused_and_changes_nothing(capsys, server):
    ctl_run(capsys, server, "org", "create", "Acme")
    ctl_run(capsys, server, "org", "create", "Beta")
    ctl_run(capsys, server, "team", "create", "Acme/ml")

    code, _, err = ctl_run(capsys, server, "team", "create", "ml")
    assert (code, err) == (2, "error: give the team as NAME/NAME, e.g. Acme/ml\n")
    code, _, err = ctl_run(capsys, server, "org", "create", "Acme")
    assert (code, err) == (1, "error: there is already an organization named Acme.\n")
    code, _, err = ctl_run(capsys, server, "org", "rename", "Beta", "acme")
    assert (code, err) == (1, "error: there is already an organization named Acme.\n")
    code, _, err = ctl_run(capsys, server, "team", "rename", "Acme/nope", "x")
    assert code == 1
    assert "nope" in err
    code, _, err = ctl_run(capsys, server, "team", "rename", "Acme/ml", "a/b")
    assert code == 1
    assert "may not contain '/'" in err
    code, _, err = ctl_run(capsys, server, "project", "create", "Acme/nope/x")
    assert code == 1
    assert sorted(Organization.objects.values_list("name", flat=True)) == ["Acme", "Beta"]
    assert list(Team.objects.values_list("name", flat=True)) == ["ml"]


def test_ctl_events_pages_through_the_real_api(capsys, server):
    from datetime import UTC, datetime

    from fleet.domain.plan import Event
    from fleet.event_log import record

    at = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    record([Event(f"model m restarted ({i})", "restart", model="m") for i in range(3)], now=at)
    code, out, _ = ctl_run(capsys, server, "events", "--model", "m", "--limit", "2")
    assert code == 0
    assert "model m restarted (2)" in out
    assert "model m restarted (0)" not in out
    cursor = out.rsplit("--before ", 1)[1].strip().strip("'")
    assert out.splitlines()[-1].startswith("older: llmgw ctl events --model m --limit 2 --before ")
    code, out, _ = ctl_run(capsys, server, "events", "--model", "m", "--before", cursor)
    assert (code, "model m restarted (0)" in out) == (0, True)
    code, _, err = ctl_run(capsys, server, "events", "--since", "yesterday")
    assert (code, "since must be a time such as" in err) == (1, True)


def test_ctl_upgrade_refuses_what_it_cannot_roll_and_sends_nothing(
    capsys, server, settings, tmp_path
):
    import io
    from dataclasses import replace
    from datetime import UTC, datetime

    from fleet.models import Event
    from mirror.builds import engine_build_add
    from tests.fleet.builders import node_add
    from tests.mirror.wheels import wheel

    settings.LLMGW = replace(settings.LLMGW, mirror=replace(settings.LLMGW.mirror, dir=tmp_path))
    now = datetime.now(UTC)
    node_add("gpu-a", now=now)
    code, _, err = ctl_run(capsys, server, "upgrade", "1.2.3")
    assert code == 1
    assert "The mirror holds no llmgw 1.2.3: add its wheel with llmgw ctl engines add" in err

    made = wheel(tmp_path / "upload", "1.2.3")
    engine_build_add(
        data=io.BytesIO(made.read_bytes()), filename=made.name, engine="llmgw", version="1.2.3",
        actor="t", now=now,
    )  # fmt: skip
    code, _, err = ctl_run(capsys, server, "upgrade", "1.2.3", "--nodes", "gpu-a,nope")
    assert (code, err) == (2, "error: there is no node nope; nothing was upgraded\n")
    code, _, err = ctl_run(capsys, server, "upgrade", "1.2.3", "--wait", "0")
    assert code == 2
    assert not Event.objects.filter(kind="upgrade").exists()


def test_a_request_is_found_by_its_id_with_ctl_usage(capsys, server, monkeypatch):
    from datetime import UTC, datetime

    from llmgw.core import clock
    from tenancy.services import api_key_create, org_create, project_create, team_create
    from tenancy.services.usage import request_records_add

    org = org_create(name="Acme", actor="t")
    project_create(team=team_create(org=org.pk, name="ml", actor="t").pk, name="chat", actor="t")
    key, _ = api_key_create(project="Acme/ml/chat", name="ci", actor="t")
    at = 1_772_366_403.0  # 2026-03-01 12:00:03 UTC
    monkeypatch.setattr(clock, "now", lambda: datetime(2026, 3, 1, 12, 5, tzinfo=UTC))
    request_records_add([("req_ab12", at, key.pk, key.project_id, "llama",
                          "/v1/chat/completions", 200, 12, 3, 812, "llama-1", "")])  # fmt: skip

    code, out, err = ctl_run(capsys, server, "usage", "--request", "req_ab12")
    assert (code, err) == (0, "")
    assert out.startswith(
        "Request req_ab12: /v1/chat/completions for llama, at 2026-03-01 12:00:03 UTC.\n"
        f"Key ci ({key.prefix}…), of Acme / ml / chat (project:{key.project_id}).\n"
    )

    code, out, err = ctl_run(capsys, server, "usage", "--request", "req_gone")
    assert (code, out) == (1, "")
    assert err.startswith("error: No request 'req_gone' is kept.")
    assert "24 hours (LLMGW_REQUESTS_KEEP_HOURS)" in err


def test_node_show_puts_each_gpus_readings_from_the_real_api_beside_it(capsys, server):
    from fleet.nodes.heard import node_live_flush
    from fleet.nodes.live import NodeWrite
    from fleet.protocol import Load
    from llmgw.core import clock
    from tests.fleet.builders import node_add

    now = clock.now()
    node_add("gpu-a", now=now)  # two H100s
    load = {
        "load1": 0.5,
        "cpu_temp_c": 61,
        "node_power_w": 1180,
        "gpus": [
            {"index": 0, "temp_c": 54, "power_w": 310, "power_limit_w": 700, "throttle": []},
            {"index": 1, "temp_c": 88, "utilization": 97, "throttle": ["hw_slowdown"]},
        ],
    }
    # The heartbeat as the agents' consumer validates and writes it.
    write = NodeWrite(
        node_id="gpu-a",
        session="session-gpu-a",
        last_seen=now,
        sample=Load.model_validate(load),
        engines={},
        memory_total_mb=None,
        cpu_count=None,
        used_replicas=frozenset(),
    )
    node_live_flush(writes=[write], now=now)

    code, out, err = ctl_run(capsys, server, "node", "show", "gpu-a")

    assert (code, err) == (0, "")
    assert re.search(r"^sensors: +cpu 61 °C, node 1180 W \(BMC\)$", out, re.M)
    gpus = table(out.split("\n\n")[1])
    assert gpus[0][5:] == ["TEMP", "MEM TEMP", "POWER", "THROTTLE", "UTIL"]
    assert gpus[1][5:] == ["54 °C", "-", "310/700 W", "none", "-"]
    assert gpus[2][5:] == ["88 °C", "-", "-", "hw_slowdown", "97%"]
