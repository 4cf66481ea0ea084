"""Measured capacity (measured_test.go and the headroom tests): profile order, scaling from
load against what a replica was measured to serve, and headroom on a copy of the room."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.domain.capacity import headroom
from fleet.domain.measured import ordered_profiles
from fleet.domain.placement import Inventory
from fleet.domain.types import Load, Measured
from tenancy.quota import Policy

from .builders import (
    TIMINGS,
    Cluster,
    cpu_node,
    cpu_profile,
    gpu_node,
    gpu_profile,
    inventory,
    model,
    replica,
    snapshot,
)

TP4 = gpu_profile("tp4", tp=4)


def two_nodes_llama(measurements=None) -> Cluster:
    llama = model("llama", TP4, min=1, max=2)
    c = Cluster(snapshot([gpu_node("1"), gpu_node("2")], [llama]))
    c.change(measurements=measurements or {})
    c.step()
    for r in c.snap.replicas:
        c.report(r.id, "ready")
    return c


def live(c: Cluster) -> int:
    return sum(1 for r in c.snap.replicas if r.state in ("pending", "starting", "ready"))


def hold(c: Cluster, load: Load, seconds: float) -> None:
    c.change(loads={"llama": load})
    c.step()
    c.wait(seconds)
    c.step()


def test_more_requests_than_were_measured_to_meet_the_slo_is_busy():
    # Six in flight, nothing waiting at the engine: by the queue it is fine.
    c = two_nodes_llama()
    hold(c, Load(running=6, waiting=0), TIMINGS.scale_up_after + 1)
    assert live(c) == 1, "scaled up with no measurement and an empty queue"
    # Measured to meet its SLO at four at once: six is past it.
    c.change(measurements={("llama", "tp4"): Measured(4, 200)})
    hold(c, Load(running=6, waiting=0), TIMINGS.scale_up_after + 1)
    assert live(c) == 2
    assert c.state("llama").extra == 1


def test_a_replica_is_taken_back_only_if_the_rest_would_have_room_to_spare():
    c = two_nodes_llama({("llama", "tp4"): Measured(4, 200)})
    c.set_state("llama", extra=1)
    c.step()
    for r in c.snap.replicas:
        if r.state == "pending":
            c.report(r.id, "ready")
    assert live(c) == 2

    def quiet_for(load: Load) -> None:
        for _ in range(3):
            hold(c, load, TIMINGS.scale_down_after + 1)
            c.all_stopped()

    # Nothing waiting, but three running: one replica left would be at 3 of its 4, past 70%.
    quiet_for(Load(running=3, waiting=0))
    assert live(c) == 2, "scaled down to the edge of what one replica holds"
    quiet_for(Load(running=2, waiting=0))
    assert live(c) == 1, "two running fits one replica's 70% of 4"


def test_a_model_no_engine_reported_on_is_not_idle_and_keeps_its_replicas():
    c = two_nodes_llama({("llama", "tp4"): Measured(4, 200)})
    c.set_state("llama", extra=1)
    for _ in range(3):
        c.step()
        c.wait(TIMINGS.scale_down_after + 1)
    assert c.state("llama").extra == 1, "unknown load is not quiet"


def test_the_profile_measured_to_serve_most_per_gpu_is_tried_first():
    llama = model(
        "llama",
        gpu_profile("tp4", tp=4),
        gpu_profile("tp2", tp=2),
        gpu_profile("tp8", tp=8, priority=10),
    )
    # tp4: 400/4 = 100 per GPU; tp2: 300/2 = 150. tp8 is unmeasured but has the higher
    # priority, which an operator set and a benchmark does not overrule.
    measured = {("llama", "tp4"): Measured(8, 400), ("llama", "tp2"): Measured(6, 300)}
    assert [p.name for p in ordered_profiles(llama, measured)] == ["tp8", "tp2", "tp4"]
    assert [p.name for p in ordered_profiles(llama, {})] == ["tp8", "tp4", "tp2"]


def test_a_cpu_profile_is_judged_per_core():
    coder = model("coder", cpu_profile("big", cores=8), cpu_profile("small", cores=2))
    measured = {("coder", "big"): Measured(4, 80), ("coder", "small"): Measured(2, 30)}
    assert [p.name for p in ordered_profiles(coder, measured)] == ["small", "big"]


def test_headroom_counts_memory_already_claimed():
    node = cpu_node("a", cpus=64, memory_gb=64)
    coder = model("coder", cpu_profile(memory_gb=12))
    running = replica("coder-1", "coder", on="a", gpus=(), memory_gb=12, profile="cpu")
    inv = Inventory({"a": node}, [running])
    room = headroom(coder, inv, 1, 10, Policy(), {}, {})
    # 64 GB, 12 claimed: 52 left, room for four more of 12.
    assert (room.current, room.more, room.limited) == (1, 4, False)
    assert room.blocked == ["node a has 64 GB of memory with 4 GB free, needs 12"]


def test_headroom_stops_at_the_number_asked_for_and_says_so():
    llama = replace(model("llama", TP4), min_replicas=0, max_replicas=0)
    inv = inventory([gpu_node("1"), gpu_node("2")])
    room = headroom(llama, inv, 0, 3, Policy(), {}, {("llama", "tp4"): Measured(8, 640)})
    assert (room.more, room.limited, room.blocked) == (3, True, [])
    assert room.tok_per_sec == 640


def test_the_gateway_and_the_engines_load_combine_without_counting_a_request_twice():
    from fleet.domain.measured import combined_load

    engines, gateway = Load(running=4, waiting=2), Load(running=6, waiting=3)
    # The gateway's 6 in flight are the engines' 4 running and 2 queued: not added again.
    assert combined_load(engines, gateway) == Load(running=4, waiting=5)
    assert combined_load(None, gateway) == gateway
    assert combined_load(engines, None) == engines
    assert combined_load(None, None) is None


def test_kv_caches_held_above_the_model_s_ceiling_scale_it_up_and_say_why():
    c = two_nodes_llama()
    full = Load(running=3, waiting=0, kv_cache=0.95)
    hold(c, full, TIMINGS.scale_up_after + 1)
    assert live(c) == 1, "scaled up on KV use with no ceiling set"
    c.change(models={"llama": replace(c.snap.models["llama"], kv_ceiling=0.9)})
    c.change(loads={"llama": full})
    c.step()
    c.wait(TIMINGS.scale_up_after + 1)
    plan = c.step()
    assert live(c) == 2
    [said] = [e for e in plan.events if "scales up" in e]
    assert said == (
        "model llama scales up to 2: 0 waiting and 3 running on 1 ready; "
        "its engines' KV caches 95% full on average, above its ceiling of 90%"
    )


def test_kv_use_that_dips_below_the_ceiling_restarts_the_busy_clock():
    c = two_nodes_llama()
    c.change(models={"llama": replace(c.snap.models["llama"], kv_ceiling=0.9)})
    hold(c, Load(running=3, kv_cache=0.95), TIMINGS.scale_up_after - 1)
    hold(c, Load(running=3, kv_cache=0.5), 2)
    hold(c, Load(running=3, kv_cache=0.95), TIMINGS.scale_up_after - 1)
    assert live(c) == 1


@pytest.mark.parametrize(
    ("load", "target_waiting", "kv_ceiling", "measured", "why"),
    [
        (Load(running=4, waiting=0), None, None, None, None),
        (Load(running=4, waiting=1), None, None, None, "1 waiting and 4 running on 1 ready, 1 a replica (its target 1)"),
        (Load(running=4, waiting=1), 2.0, None, None, None),
        (Load(running=4, waiting=2), 2.0, None, None, "2 waiting and 4 running on 1 ready, 2 a replica (its target 2)"),
        # A KV use not reported is not full; one at the ceiling is not above it.
        (Load(running=4, waiting=0, kv_cache=None), None, 0.9, None, None),
        (Load(running=4, waiting=0, kv_cache=0.9), None, 0.9, None, None),
        (Load(running=4, waiting=0, kv_cache=0.91), None, None, None, None),
        (
            Load(running=4, waiting=1, kv_cache=0.99),
            None,
            0.8,
            Measured(4, 100),
            "1 waiting and 4 running on 1 ready, 1 a replica (its target 1); "
            "its engines' KV caches 99% full on average, above its ceiling of 80%; "
            "5 in flight, above the 4 a replica was measured to serve within its SLO",
        ),
    ],
)  # fmt: skip
def test_busy_because_names_each_reason_with_its_figures(
    load, target_waiting, kv_ceiling, measured, why
):
    from fleet.domain.measured import busy_because

    spec = replace(
        model("llama", TP4, min=1, max=2), target_waiting=target_waiting, kv_ceiling=kv_ceiling
    )
    assert busy_because(spec, load, 1, measured) == why


def test_capped_replicas_serve_whole_requests_and_the_sentence_says_the_figure_compared():
    from fleet.domain.capped import Capped, Counted
    from fleet.domain.measured import busy_because

    llama = model("llama", TP4, min=1, max=2)
    # One replica measured at 8 at once, held to 80 %: 8 × 0.8747 = 6.998, so 6 whole.
    counts = Counted(0.8747, 0.0, (Capped("1", 0.8, 0.8747),))
    assert busy_because(llama, Load(running=6, waiting=0), 1, Measured(8, 200), counts) is None
    why = busy_because(llama, Load(running=7, waiting=0), 1, Measured(8, 200), counts)
    assert "7 in flight, above the 6 its ready replicas serve" in why


def test_with_every_measured_profiles_draw_known_the_most_tokens_per_watt_goes_first():
    llama = model("llama", gpu_profile("tp4", tp=4), gpu_profile("tp2", tp=2))
    # Per GPU tp2 serves more (150 against 100); per watt tp4 does (400/2000 > 300/1600).
    measured = {
        ("llama", "tp4"): Measured(8, 400, watts=2000),
        ("llama", "tp2"): Measured(6, 300, watts=1600),
    }
    assert [p.name for p in ordered_profiles(llama, measured)] == ["tp4", "tp2"]
    # One draw unknown: tokens per GPU, as before.
    measured[("llama", "tp2")] = Measured(6, 300)
    assert [p.name for p in ordered_profiles(llama, measured)] == ["tp2", "tp4"]


def test_a_declared_power_watts_stands_in_for_an_unmeasured_draw_and_priority_still_wins():
    llama = model(
        "llama",
        gpu_profile("tp4", tp=4, power_watts=2000),
        gpu_profile("tp2", tp=2, power_watts=1600),
        gpu_profile("tp8", tp=8, priority=10),
    )
    measured = {("llama", "tp4"): Measured(8, 400), ("llama", "tp2"): Measured(6, 300)}
    assert [p.name for p in ordered_profiles(llama, measured)] == ["tp8", "tp4", "tp2"]
