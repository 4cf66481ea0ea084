"""Admission beyond the per-minute limits: spend budgets (refused past one, warned near one)
and priority bands under overload, through the gateway's ASGI app in this process in front
of real sim engines; the bands' rule itself by table and by property."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, strategies as st

from fleet.domain.readings import Reading
from llmgw.gateway import bands
from llmgw.gateway.bands import Pressure, model_work, refused, refused_bands, slots_learnt
from tenancy.bands import BANDS, DEFAULT
from tenancy.models import ApiKey, AuditEvent
from tenancy.services import api_key_create
from tenancy.services.bands import band_set
from tenancy.services.budgets import budget_set
from tenancy.services.usage import usage_add
from tests.fleet.builders import gpu_model, model_added
from tests.gateway.test_app import add, chat, client, new_key, refreshed
from tests.gateway.world import _replica

# The rule: which bands are refused at which waiting work.


@pytest.mark.parametrize(
    ("present", "work", "bound", "out"),
    [
        ({"low", "high"}, 3, 4, set()),  # under the bound: nobody
        ({"low", "high"}, 4, 4, {"low"}),  # at it: the lowest present
        ({"low", "normal", "high"}, 4, 4, {"low"}),
        ({"low", "normal", "high"}, 8, 4, {"low", "normal"}),  # twice: one band more
        ({"low", "normal", "high"}, 40, 4, {"low", "normal"}),  # never the highest present
        ({"normal", "high"}, 5, 4, {"normal"}),  # the lowest present, whichever it is
        ({"low"}, 40, 4, set()),  # one band alone is never displaced
        ({"low", "high"}, 40, 0, set()),  # no bound (no replica): nothing to judge by
    ],
)
def test_the_lowest_bands_present_are_refused_one_more_per_bound_passed(present, work, bound, out):
    assert refused_bands(present, work, bound) == out


def test_a_request_counts_its_own_band_as_present():
    assert refused("low", {"high"}, Pressure(4, 4, 4))
    assert not refused("high", {"low"}, Pressure(40, 4, 4))


def test_past_the_bound_one_band_more_is_refused_each_step():
    three = {"low", "normal", "high"}
    assert refused_bands(three, 3, 3, 1) == {"low"}
    assert refused_bands(three, 4, 3, 1) == {"low", "normal"}
    assert refused_bands(three, 6, 4, 4) == {"low"}


@given(
    present=st.sets(st.sampled_from(BANDS), min_size=1),
    work=st.integers(0, 200),
    bound=st.integers(0, 20),
    data=st.data(),
)
def test_displacement_never_refuses_the_top_band_and_refuses_from_the_bottom(
    present, work, bound, data
):
    step = data.draw(st.integers(0, 20))
    out = refused_bands(present, work, bound, step)
    top = max(present, key=bands.rank)
    assert top not in out
    assert out <= present
    # Whatever is refused, every band below it is refused too.
    for band in out:
        assert all(b in out for b in present if bands.rank(b) < bands.rank(band))
    # More waiting work never lets a refused band in.
    assert out <= refused_bands(present, work + max(bound, 1), bound, step)
    # A longer step between bands never refuses more (a step of 0 means `bound`).
    if step:
        assert refused_bands(present, work, bound, step + 1) <= out


def test_waiting_work_is_the_engines_queue_where_they_say_it_and_in_flight_otherwise():
    readings = {"a": Reading(running=4, waiting=3)}
    # a: queued 3 when read, and 2 more sent since (6 in flight, 4 then); b: 5 in flight.
    work, bound, step = model_work([("a", 1), ("b", 2)], {"a": 6, "b": 5}, readings, {"a": 4})
    assert work == 3 + 2 + 5
    assert bound == step == bands.WAITING_BOUND + bands.INFLIGHT_BOUND * 2
    # Requests ended since the reading take from its queue, never below nothing.
    assert model_work([("a", 1)], {"a": 0}, readings, {"a": 9}).work == 0


def test_an_engines_slots_are_what_it_ran_while_requests_waited():
    read = {"a": Reading(running=4, waiting=3), "b": Reading(running=2, waiting=0)}
    assert slots_learnt({}, read) == {"a": 4}  # b never queued: its slots are not known
    # Kept until more is seen; a replica no longer read is dropped.
    later = {"a": Reading(running=3, waiting=1), "b": Reading(running=6, waiting=2)}
    assert slots_learnt({"a": 4, "gone": 8}, later) == {"a": 4, "b": 6}
    assert slots_learnt({}, {"a": Reading(waiting=5)}) == {}


def test_slots_an_agent_read_from_the_engines_command_win_at_once():
    # Said before the engine ever queued, and over what was seen: the command says it.
    read = {"a": Reading(running=0, waiting=0, slots=8), "b": Reading(running=2, waiting=0)}
    assert slots_learnt({"a": 3}, read) == {"a": 8}


@pytest.mark.parametrize(("slots", "kept"), [(1, 0), (2, 1), (4, 1), (8, 2), (10, 3), (64, 16)])
def test_a_quarter_of_the_slots_is_kept_for_the_higher_bands_never_all(slots, kept):
    assert bands.reserve(slots) == kept


def test_with_its_slots_known_a_replica_is_judged_by_what_it_holds():
    # 8 slots, 2 kept: the lowest band refused from 6 held, the next from 8 (no slot free).
    read = {"a": Reading(running=5, waiting=0)}
    assert model_work([("a", 1)], {"a": 5}, read, {"a": 5}, {"a": 8}) == Pressure(5, 6, 2)
    # One more sent since the reading: 6 held, at the bound.
    assert model_work([("a", 1)], {"a": 6}, read, {"a": 5}, {"a": 8}).work == 6
    # A queue counts whole: 8 running, 3 waiting.
    full = {"a": Reading(running=8, waiting=3)}
    assert model_work([("a", 1)], {"a": 11}, full, {"a": 11}, {"a": 8}).work == 11


@given(
    slots=st.integers(1, 256),
    held=st.integers(0, 512),
    present=st.sets(st.sampled_from(BANDS), min_size=2),
)
def test_the_lowest_band_leaves_a_slot_free_for_the_others(slots, held, present):
    running, waiting = min(held, slots), max(held - slots, 0)
    read = {"a": Reading(running=running, waiting=waiting)}
    pressure = model_work([("a", 1)], {"a": held}, read, {"a": held}, {"a": slots})
    lowest = min(present, key=bands.rank)
    # Let in only while, with it, the reserve is still free for the bands above it.
    assert refused(lowest, present, pressure) == (held >= slots - bands.reserve(slots))


# Through the gateway.

pytestmark_db = pytest.mark.django_db(transaction=True)


async def spend(secret_key_id: int, prompt: int, completion: int) -> None:
    key = await add(ApiKey.objects.get, pk=secret_key_id)
    minute = int(time.time() // 60)
    await add(
        usage_add,
        tallies={(minute, key.pk, key.project_id, "llama"): [1, 0, prompt, completion, 5, 0]},
    )


async def made_key(**kwargs) -> tuple[int, str]:
    key, secret = await add(api_key_create, project="Acme/ml/chat", name="k", actor="t", **kwargs)
    return key.pk, secret


async def llama(world) -> None:
    await add(model_added, gpu_model("llama"))
    await add(_replica, "llama-1", "llama", await world.engine("llama-1", "llama"))


@pytestmark_db
async def test_a_key_past_its_budget_is_refused_until_it_resets(world, gateway):
    await llama(world)
    kid, secret = await made_key()
    await add(budget_set, scope=f"key:{kid}", actor="t", tokens_per_day=100)
    await spend(kid, 90, 20)
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert "has spent 110 of its 100 tokens for" in error["message"]
    assert "it resets at" in error["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 86_400
    assert world.engines["llama-1"].requests_total == 0


@pytestmark_db
async def test_a_budget_up_the_tree_refuses_every_key_beneath(world, gateway):
    await llama(world)
    (first, _), second = await made_key(), await new_key()
    await add(budget_set, scope="team:Acme/ml", actor="t", tokens_per_month=50)
    await spend(first, 40, 10)
    async with client(gateway, second) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 429
    assert r.json()["error"]["message"].startswith("team:Acme/ml has spent 50 of its 50 tokens")


@pytestmark_db
async def test_a_budget_past_its_warning_share_is_said_in_a_header_and_told_once(world, gateway):
    await llama(world)
    kid, secret = await made_key()
    await add(budget_set, scope=f"key:{kid}", actor="t", tokens_per_day=1000)
    await spend(kid, 800, 50)
    async with client(gateway, secret) as c:
        first = await c.post("/v1/chat/completions", json=chat("llama"))
        gateway.runtime.loader._book_at = float("-inf")  # the next refresh reads the book
        await refreshed(gateway)
        second = await c.post("/v1/chat/completions", json=chat("llama"))
    for r in (first, second):
        assert r.status_code == 200
        warning = r.headers["x-llmgw-budget-warning"]
        assert "has spent 85 % of its 1,000 tokens for" in warning
        assert warning.startswith("key:k (") and "...)" in warning  # the key's name, in ASCII
    told = await add(
        lambda: list(AuditEvent.objects.filter(action="budget.warning").values("target", "actor"))
    )
    assert told == [{"target": f"key:{kid}", "actor": "gateway"}]


@pytestmark_db
async def test_a_budget_under_its_warning_share_adds_no_header(world, gateway):
    await llama(world)
    kid, secret = await made_key()
    await add(budget_set, scope=f"key:{kid}", actor="t", tokens_per_day=1000)
    await spend(kid, 10, 10)
    async with client(gateway, secret) as c:
        r = await c.post("/v1/chat/completions", json=chat("llama"))
    assert r.status_code == 200
    assert "x-llmgw-budget-warning" not in r.headers


@pytestmark_db
async def test_keys_carry_their_own_band_or_their_projects(world, gateway):
    await llama(world)
    own, secret = await made_key(band="high")
    inherits, _ = await made_key()
    await add(band_set, scope="project:Acme/ml/chat", band="low", actor="t")
    async with client(gateway, secret) as c:
        assert (await c.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
    keys = {k.id: k.band for k in gateway.runtime.tables.keys.values()}
    assert keys == {own: "high", inherits: "low"}


@pytestmark_db
async def test_under_overload_the_lowest_band_present_is_refused_and_the_top_band_goes(
    world, gateway
):
    await llama(world)
    high, low = await new_key(band="high"), await new_key(band="low")
    async with client(gateway, high) as hc, client(gateway, low) as lc:
        assert (await hc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        assert (await lc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        # The engine says it queues past the bound: the low band is refused, the high goes.
        rt = gateway.runtime
        rt.readings_read({"llama-1": Reading(running=4, waiting=bands.WAITING_BOUND)})
        refused_answer = await lc.post("/v1/chat/completions", json=chat("llama"))
        assert (await hc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        # Caught up again: both go.
        rt.readings_read({"llama-1": Reading(running=1, waiting=0)})
        assert (await lc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
    assert refused_answer.status_code == 429
    error = refused_answer.json()["error"]
    assert error["code"] == "model_overloaded"
    assert "band low" in error["message"]
    assert refused_answer.headers["retry-after"] == str(bands.RETRY_AFTER_S)


@pytestmark_db
async def test_a_band_alone_is_never_displaced_and_one_gone_quiet_stops_counting(world, gateway):
    await llama(world)
    high, low = await new_key(band="high"), await new_key(band="low")
    async with client(gateway, high) as hc, client(gateway, low) as lc:
        assert (await hc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        rt = gateway.runtime
        # The high band last asked longer ago than PRESENT_S: the low band is alone.
        rt.bands["llama"]["high"] -= bands.PRESENT_S + 1
        rt.readings_read({"llama-1": Reading(running=4, waiting=50)})
        assert (await lc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200


@pytestmark_db
async def test_without_readings_the_bound_is_on_requests_in_flight(world, gateway):
    await llama(world)
    high, low = await new_key(band="high"), await new_key(band="low")
    async with client(gateway, high) as hc, client(gateway, low) as lc:
        assert (await hc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        rt = gateway.runtime
        rt.inflight["llama-1"] = bands.INFLIGHT_BOUND
        r = await lc.post("/v1/chat/completions", json=chat("llama"))
        rt.inflight["llama-1"] = 0
    assert r.status_code == 429 and r.json()["error"]["code"] == "model_overloaded"


def test_bands_are_named_once_and_the_models_choices_are_those():
    from llmgw.cli import ctl_keys
    from tenancy.models import Project

    assert bands.BANDS is BANDS and ctl_keys.BANDS is BANDS
    for model in (ApiKey, Project):
        assert tuple(b for b, _ in model._meta.get_field("band").choices) == BANDS
    assert Project._meta.get_field("band").default == DEFAULT


@pytestmark_db
async def test_spend_and_displacement_reach_metrics(world, gateway):
    from llmgw.gateway.metrics import gateway_text

    await llama(world)
    kid, secret = await made_key(band="low")
    await add(budget_set, scope=f"key:{kid}", actor="t", tokens_per_month=1000)
    await spend(kid, 30, 12)
    _, high = await made_key(band="high")
    async with client(gateway, high) as hc, client(gateway, secret) as lc:
        assert (await hc.post("/v1/chat/completions", json=chat("llama"))).status_code == 200
        gateway.runtime.inflight["llama-1"] = bands.INFLIGHT_BOUND
        assert (await lc.post("/v1/chat/completions", json=chat("llama"))).status_code == 429
        gateway.runtime.inflight["llama-1"] = 0
    text = gateway_text()
    assert 'llmgw_gateway_displaced_total{band="low",model="llama"}' in text
    spent = [
        line
        for line in text.splitlines()
        if line.startswith("llmgw_gateway_budget_spent{") and 'period="month"' in line
    ]
    assert any(line.endswith(" 42.0") and 'unit="tokens"' in line for line in spent), spent
