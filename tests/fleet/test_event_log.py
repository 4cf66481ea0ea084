"""The event log (issue 14, item 3): what happened to each model and node, from the
reconciler's passes, the agents' reports and who changed what, newest first and paged."""

from __future__ import annotations

from datetime import timedelta

import pytest

from catalog.services import model_scale
from fleet import event_log, models
from fleet.domain.plan import Event
from fleet.event_log import expire, record
from fleet.models import Replica
from fleet.nodes.reports import shard_status_record
from fleet.protocol import ShardStatus
from fleet.reconciler.run import reconcile_once
from fleet.selectors.events import events_page
from llmgw.core.errors import Invalid

from .builders import T0, at, gpu_model, model_added, node_add

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_what_this_process_wrote():
    """A test's rows go with its transaction: what the log remembers of them must too."""
    event_log._last.clear()
    event_log._expired_at = float("-inf")
    yield
    event_log._last.clear()


def rows() -> list[tuple]:
    return list(models.Event.objects.order_by("id").values_list("kind", "message", "count"))


def test_the_same_sentence_again_counts_on_its_row_and_another_is_a_row_of_its_own():
    said = Event("model m cannot be placed: no node has 8 GPUs", "unplaceable", model="m")
    record([said], now=at(0))
    record([said], now=at(5))
    event_log._last.clear()  # a process started since: the database tells it the last row
    record([said], now=at(10))
    record([Event("model m cannot be placed: 3 GB short", "unplaceable", model="m")], now=at(15))
    record([said], now=at(20))

    assert rows() == [
        ("unplaceable", "model m cannot be placed: no node has 8 GPUs", 3),
        ("unplaceable", "model m cannot be placed: 3 GB short", 1),
        ("unplaceable", "model m cannot be placed: no node has 8 GPUs", 1),
    ]
    first = models.Event.objects.order_by("id").first()
    assert (first.at, first.last_at) == (at(0), at(10))


def test_a_sentence_said_again_after_a_day_is_told_again():
    said = Event("node a is unreachable: silent for 15 s", "node_state", node="a")
    record([said], now=at(0))
    record([said], now=at(0) + event_log.REPEAT_WITHIN + timedelta(seconds=1))
    assert [c for _, _, c in rows()] == [1, 1]


def test_a_passs_decisions_are_kept_under_their_model_and_node(no_settle):
    model_added(gpu_model("llama"))
    huge = gpu_model("huge")
    huge["profiles"][0]["tp"] = 16  # more GPUs than any node has
    model_added(huge)
    node_add("gpu-a", now=T0)

    for second in (0, 5, 10):
        reconcile_once(now=at(second))

    replica = Replica.objects.get(model="llama")
    placed = models.Event.objects.get(kind="placement")
    assert (placed.model, placed.node, placed.replica) == ("llama", "gpu-a", replica.id)
    assert placed.message.startswith(f"replica {replica.id} of llama placed on gpu-a")
    # A row per sentence: the room changed once (llama took a GPU), the third pass said
    # nothing new.
    unplaceable = list(
        models.Event.objects.filter(kind="unplaceable")
        .order_by("id")
        .values_list("model", "message")
    )
    assert unplaceable == [
        ("huge", "model huge cannot be placed: gpu-a has 2 free h100-80g GPUs of 2, needs 16"),
        ("huge", "model huge cannot be placed: gpu-a has 1 free h100-80g GPUs of 2, needs 16"),
    ]


def test_a_shards_way_to_ready_is_told_once_a_step(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    shard = Replica.objects.get().shards.get()

    def says(state: str, second: float, **more) -> None:
        msg = ShardStatus(type="shard_status", shard_id=shard.id, state=state, **more)
        shard_status_record(node_id="gpu-a", msg=msg, now=at(second))

    says("fetching", 1, progress={"done": 1, "total": 10})
    says("fetching", 2, progress={"done": 5, "total": 10})  # progress: no new event
    says("starting", 3)
    says("ready", 4)

    told = list(
        models.Event.objects.filter(kind__startswith="shard_")
        .order_by("id")
        .values_list("kind", "node", "count")
    )
    assert told == [
        ("shard_fetching", "gpu-a", 1),
        ("shard_starting", "gpu-a", 1),
        ("shard_ready", "gpu-a", 1),
    ]
    happened = [e for e in events_page(model="llama")["events"] if not e["by"]]
    assert happened[0]["message"] == f"replica {shard.replica_id} of llama is ready"


def test_a_page_is_newest_first_with_who_changed_what_beside_what_happened(no_settle):
    model_added(gpu_model("llama", scaling={"min": 1, "max": 3}))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    model_scale(name="llama", actor="dana", scaling={"min": 2})

    page = events_page(model="llama")
    kinds = [e["kind"] for e in page["events"]]
    assert kinds[0] == "model.scale"
    assert page["events"][0]["by"] == "dana"
    assert page["events"][0]["message"] == "model llama scaled by dana: min 2"
    assert "placement" in kinds
    assert page["next"] is None
    # Another model's or node's are not on it.
    record([Event("replica q-1 of qwen placed", "placement", model="qwen")], now=T0)
    assert all(e["model"] == "llama" for e in events_page(model="llama")["events"])
    assert [e["model"] for e in events_page(node="gpu-b")["events"]] == []


def test_pages_follow_one_another_without_losing_or_repeating_one():
    # Many said in the same pass share its moment: the cursor still cuts between them.
    record(
        [Event(f"replica r{i} placed", "placement", model="m", replica=f"r{i}") for i in range(7)],
        now=at(0),
    )
    record([Event(f"model m restarted ({i})", "restart", model="m") for i in range(3)], now=at(5))
    seen, before = [], None
    while True:
        page = events_page(model="m", limit=3, before=before)
        seen += [e["message"] for e in page["events"]]
        if page["next"] is None:
            break
        before = page["next"]
    assert len(seen) == len(set(seen)) == 10
    assert seen[0] == "model m restarted (2)"
    assert events_page(model="m", since=at(1))["events"][-1]["message"] == "model m restarted (0)"


@pytest.mark.parametrize(
    "cursor", ["yesterday", "2026-03-02T09:00:00~2~1", "2026-03-02T09:00:00~1~x", "~~"]
)
def test_a_cursor_that_is_not_a_pages_is_refused(cursor):
    with pytest.raises(Invalid, match="before must be the `next` of a page"):
        events_page(before=cursor)


def test_rows_kept_past_their_days_are_deleted_at_most_hourly():
    record([Event("model m restarted", "restart", model="m")], now=at(0))
    record([Event("model n restarted", "restart", model="n")], now=at(0) + timedelta(days=20))
    assert expire(now=at(0) + timedelta(days=20), keep_days=14) == 1
    assert [m for _, m, _ in rows()] == ["model n restarted"]
    # Within the hour nothing is looked at again.
    assert expire(now=at(0) + timedelta(days=40), keep_days=14) == 0


def test_the_api_pages_events_and_refuses_what_is_not_a_query(api, no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)

    answer = api.call("GET", "/events?model=llama&since=1000w")
    assert answer.status_code == 200
    body = answer.json()
    assert body["next"] is None
    assert {"placement"} <= {e["kind"] for e in body["events"]}
    for query, says in [
        ("limit=0", "limit must be from 1 to 500"),
        ("limit=501", "limit must be from 1 to 500"),
        ("since=yesterday", "since must be a time such as"),
        ("before=nope", "before must be the `next` of a page"),
        ("limit=x", "limit"),
    ]:
        refused = api.call("GET", f"/events?{query}")
        assert refused.status_code == 400, (query, refused.content)
        assert says in refused.content.decode(), (query, refused.content)


def test_the_model_and_node_pages_show_what_happened_newest_first(admin_client, no_settle):
    model_added(gpu_model("llama", scaling={"min": 1, "max": 3}))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    model_scale(name="llama", actor="dana", scaling={"min": 2})
    replica = Replica.objects.get()

    # The events come after the page as a fragment of their own; ?all=1 has them inline.
    page = admin_client.get("/models/llama?all=1").content.decode()
    events = page[page.index('<section id="events">') :]
    assert events.index("model llama scaled by dana: min 2") < events.index(
        f"replica {replica.id} of llama placed on gpu-a"
    )
    assert "llmgw ctl events --model llama" in events

    page = admin_client.get("/nodes/gpu-a").content.decode()
    events = page[page.index('<section id="events">') :]
    assert f"replica {replica.id} of llama placed on gpu-a" in events
    assert "scaled by dana" not in events  # a change to the model, not to the node
    assert "llmgw ctl events --node gpu-a" in events


H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559}


def test_a_preemption_says_for_whom_and_the_drain_and_stop_say_why(no_settle):
    from tests.fleet.test_reconciler import heard, ready

    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 2}))
    reconcile_once(now=T0)
    for r in Replica.objects.all():
        ready(r, at(10))
    heard("gpu-a", at(400))
    model_added(gpu_model("vital", **{"class": "critical"}))
    reconcile_once(now=at(400))
    heard("gpu-a", at(431))
    reconcile_once(now=at(431))

    victim = Replica.objects.get(preempted_for="vital")
    told = {e["kind"]: e for e in events_page(model="chat")["events"] if not e["by"]}
    assert "preempted for vital (critical)" in told["preemption"]["message"]
    assert told["preemption"]["replica"] == victim.pk
    assert told["preemption"]["node"] == "gpu-a"
    stops = [e for e in events_page(model="chat", limit=100)["events"] if e["replica"] == victim.pk]
    assert any("it gave room to vital" in e["message"] for e in stops)


def test_a_failure_says_its_cause_and_a_node_its_state(no_settle):
    model_added(gpu_model("llama"))
    node_add("gpu-a", now=T0)
    reconcile_once(now=T0)
    shard = Replica.objects.get().shards.get()
    shard_status_record(
        node_id="gpu-a",
        msg=ShardStatus(
            type="shard_status",
            shard_id=shard.id,
            state="failed",
            exit_code=1,
            detail="CUDA out of memory: tried to allocate 20.00 GiB\nlast line",
        ),
        now=at(5),
    )
    reconcile_once(now=at(6))
    failed = models.Event.objects.get(kind="replica_failed")
    assert failed.model == "llama"
    assert "(exit code 1): CUDA out of memory: tried to allocate 20.00 GiB" in failed.message

    for second in range(10, 30, 5):  # passes on their beat while the node stays silent
        reconcile_once(now=at(second))
    states = [
        e["message"] for e in events_page(node="gpu-a")["events"] if e["kind"] == "node_state"
    ]
    assert states and all(m.startswith("node gpu-a is ") for m in states)


def test_quota_and_limit_changes_are_in_the_list_with_who_made_them():
    from tenancy.services import limit_set, org_create, quota_set

    org_create(name="Acme", actor="t")
    quota_set(scope="org:Acme", guarantee={"gpus": 8}, limit=None, actor="dana")
    limit_set(scope="org:Acme", requests_per_minute=600, tokens_per_minute=None, actor="erin")
    told = {e["kind"]: e for e in events_page()["events"]}
    assert told["quota.set"]["by"] == "dana"
    # By the names typed, not the keys kept (org:1): issue 37, item 4.
    assert told["quota.set"]["message"] == "quota org:Acme set by dana"
    assert told["limit.set"]["by"] == "erin"
    assert told["limit.set"]["message"].startswith("limit org:Acme set by erin: ")
    assert told["org.add"]["message"].startswith("org Acme added by t")


def test_a_page_says_how_long_ago_as_a_person_would():
    from llmgw.core.text import ago

    said = [ago(T0, T0 + timedelta(seconds=s)) for s in (0.4, 12, 61, 3 * 3600 + 5, 2 * 86400)]
    assert said == ["just now", "12 s ago", "1 min ago", "3 h ago", "2 d ago"]
