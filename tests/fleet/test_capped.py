"""A capped GPU's measured capacity through the reconciler and the dry runs, over real rows
(docs/facility.md, "What a capped replica counts"): the GPUs' limits come from the nodes'
latest heartbeats, and a replica on GPUs held below their default counts less."""

from __future__ import annotations

from dataclasses import replace

import pytest

from catalog.services import measurement_save
from fleet.models import Event, ModelState, Node, Replica
from fleet.reconciler.run import reconcile_once
from llmgw.core import clock

from .builders import H100, T0, at, gpu_model, model_added, node_add
from .test_reconciler import heard, ready

pytestmark = pytest.mark.django_db

SAID = (
    "node gpu-a's GPUs are capped to 80 % of their default power: its replica counts "
    "87.5 % of its measured 1,200 tokens/s"
)


def measure(model: str, profile: str, tok_per_sec: float, concurrency: int, **extra) -> None:
    measurement_save(
        model=model,
        profile=profile,
        max_concurrency=concurrency,
        tok_per_sec=tok_per_sec,
        actor="bench",
        now=clock.now(),
        **extra,
    )


def gpus(limit, default, count=2) -> list[dict]:
    """A heartbeat's GPUs, each held to `limit` of its `default` (None: not said)."""
    return [{"index": i, "power_limit_w": limit, "power_default_w": default} for i in range(count)]


def loaded(shard_id: str, running: int, reported: list[dict]) -> None:
    Node.objects.filter(pk="gpu-a").update(
        load={"engines": {shard_id: {"running": running, "waiting": 0}}, "gpus": reported}
    )


def _busy_for_a_minute(reported: list[dict], **measured) -> Replica:
    """One replica of chat (min 1, max 2) measured to serve 8 at once, 8 running on it."""
    node_add("gpu-a", now=T0, gpus=(H100, H100))
    model_added(gpu_model("chat", scaling={"min": 1, "max": 2}))
    reconcile_once(now=T0)
    first = Replica.objects.get()
    ready(first, at(1))
    measure("chat", "gpu", 1200, 8, **measured)
    shard = first.shards.get()
    for second in (5, 35, 66):
        heard("gpu-a", at(second))
        loaded(shard.id, 8, reported)
        reconcile_once(now=at(second))
    return first


def test_a_replica_on_capped_gpus_counts_less_and_the_model_scales_up_saying_why(no_settle):
    _busy_for_a_minute(gpus(560, 700))

    assert ModelState.objects.get(pk="chat").extra == 1
    assert Replica.objects.count() == 2
    scaled = Event.objects.get(message__startswith="model chat scales up to 2")
    assert scaled.message == (
        "model chat scales up to 2: 0 waiting and 8 running on 1 ready; 8 in flight, above "
        "the 6 its ready replicas serve within its SLO at their power limits (8 a replica was "
        f"measured to serve); {SAID}"
    )


@pytest.mark.parametrize(
    ("reported", "measured"),
    [
        (gpus(700, 700), {}),  # at their default: the measured 8 hold
        (gpus(560, None), {}),  # the default not said: unknown, the measured figure stands
        (gpus(None, 700), {}),  # the limit not said
        ([], {}),  # an agent that says nothing of its GPUs' power
        (gpus(560, 700), {"power_share": 0.8}),  # measured at that cap: not scaled again
    ],
)
def test_a_replica_not_known_to_count_less_than_measured_does_not_scale_up(
    no_settle, reported, measured
):
    _busy_for_a_minute(reported, **measured)

    assert ModelState.objects.get(pk="chat").extra == 0
    assert Replica.objects.count() == 1


def test_the_exponent_is_a_setting_and_zero_leaves_the_measured_figure(no_settle, settings):
    settings.LLMGW = replace(settings.LLMGW, power_cap_exponent=0.0)
    _busy_for_a_minute(gpus(560, 700))

    assert ModelState.objects.get(pk="chat").extra == 0


def tp2(name: str) -> dict:
    profile = {"name": "tp2", "engine": "sim", "gpu_class": "h100-80g", "tp": 2}
    return {"name": name, "source": f"hf://acme/{name}", "profiles": [profile]}


def test_headroom_and_target_count_a_capped_replica_and_say_so(api, no_settle):
    node_add("gpu-a", now=T0, gpus=(H100,) * 4)
    model_added(tp2("chat"))
    reconcile_once(now=T0)
    ready(Replica.objects.get(), at(1))
    measure("chat", "tp2", 1200, 8)
    Node.objects.filter(pk="gpu-a").update(load={"gpus": gpus(560, 700, count=4)})

    room = api.call("GET", "/models/chat/headroom?limit=5").json()
    assert (room["more"], room["tok_per_sec"]) == (1, pytest.approx(1200 * 0.8**0.6))
    assert room["capped"] == [SAID]

    # 2,400 tokens/s: two replicas as measured, but the running one counts 87.5 %.
    view = api.call("GET", "/models/chat/target?tokens_per_sec=2400").json()
    assert (view["needed"], view["current"], view["more"]) == (3, 1, 2)
    assert view["capped"] == [SAID]
    # 2,000 tokens/s: two either way, and nothing to say.
    view = api.call("GET", "/models/chat/target?tokens_per_sec=2000").json()
    assert (view["needed"], view["capped"]) == (2, [])

    Node.objects.filter(pk="gpu-a").update(load={"gpus": gpus(700, 700, count=4)})
    room = api.call("GET", "/models/chat/headroom?limit=5").json()
    assert (room["tok_per_sec"], room["capped"]) == (1200, [])
