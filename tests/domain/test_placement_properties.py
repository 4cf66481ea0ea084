"""Placement's invariants over random clusters and catalogs, pass after pass (quality.md).

A random fleet and catalog are reconciled for several passes; between passes the
agents report random outcomes (started, ready, failed, stopped) and nodes may fall
silent. After every pass: no GPU is held twice, no node holds more memory or cores
than it reports, every start went to a node `refuse()` accepted at that moment,
and no model runs more replicas than it wants.
"""

from collections import Counter, defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from catalog.domain import ModelSpec, Profile
from fleet.domain.placement import Inventory, Placement, refuse
from fleet.domain.reconcile import Plan
from fleet.domain.types import ACTIVE, FABRIC_LABEL, HOLDING, ModelState, Snapshot

from .builders import Cluster, gpu_node, snapshot

GPU_CLASSES = ("h100-80g", "a100-80g")
ENGINES = ("vllm", "llamacpp", "sim")
SOURCES = ("org/a", "org/b")


def sometimes(one_in: int):
    """True about once in `one_in` draws."""
    return st.integers(1, one_in).map(lambda x: x == 1)


@st.composite
def nodes(draw):
    out = []
    for i in range(draw(st.integers(1, 4))):
        has_gpus = draw(st.booleans())
        out.append(
            gpu_node(
                f"n{i}",
                gpus=draw(st.integers(1, 8)) if has_gpus else 0,
                gpu_class=draw(st.sampled_from(GPU_CLASSES)),
                unhealthy=draw(st.sets(st.integers(0, 7), max_size=2)),
                memory_gb=draw(st.none() | st.sampled_from([0, 16, 32, 64, 128])),
                cpus=draw(st.none() | st.sampled_from([0, 4, 8, 16])),
                fabric=draw(st.none() | st.sampled_from(["ib-a", "ib-b"])),
                labels={"zone": draw(st.sampled_from("ab"))},
                engines=draw(st.none() | st.frozensets(st.sampled_from(ENGINES), min_size=1)),
                disk_free_gb=draw(st.none() | st.sampled_from([10, 100])),
                weights=draw(st.sets(st.sampled_from(SOURCES), max_size=1)),
                cordoned=draw(sometimes(6)),
                draining=draw(sometimes(8)),
            )
        )
    return out


@st.composite
def profiles(draw, name: str) -> Profile:
    selector = draw(st.sampled_from([{}, {}, {"zone": "a"}]))
    priority = draw(st.integers(0, 2))
    if draw(st.booleans()):
        spread = draw(st.sampled_from([1, 1, 1, 2]))
        return Profile(
            name=name,
            engine=draw(st.sampled_from(["vllm", "sim"])),
            gpu_class=draw(st.sampled_from(GPU_CLASSES)),
            tp=draw(st.sampled_from([1, 2, 4])) * spread,
            nodes=spread,
            min_memory_gb=draw(st.none() | st.sampled_from([8.0, 32.0])),
            min_disk_gb=draw(st.none() | st.just(50.0)),
            node_selector=selector,
            priority=priority,
        )
    return Profile(
        name=name,
        engine="llamacpp",
        min_memory_gb=draw(st.none() | st.sampled_from([4.0, 8.0, 16.0, 24.5])),
        cpu_cores=draw(st.none() | st.sampled_from([1, 2, 3, 8])),
        node_selector=selector,
        priority=priority,
    )


@st.composite
def catalogs(draw):
    models, states = [], []
    for i in range(draw(st.integers(1, 4))):
        lo = draw(st.integers(0, 4))
        hi = lo + draw(st.integers(0 if lo else 1, 2))
        name = f"m{i}"
        count = draw(st.integers(1, 3))
        models.append(
            ModelSpec(
                name=name,
                profiles=tuple(draw(profiles(f"p{j}")) for j in range(count)),
                min_replicas=lo,
                max_replicas=hi,
                capacity_class=draw(st.sampled_from(["", "critical", "standard", "opportunistic"])),
                source=draw(st.sampled_from(("", *SOURCES))),
            )
        )
        if lo == 0 and draw(st.booleans()):
            states.append(ModelState(name))
    return models, states


def held_by_node(snap: Snapshot):
    """Per node: GPU indices (with repeats), memory and cores held by replicas that hold room."""
    gpus, memory, cores = defaultdict(list), Counter(), Counter()
    for r in snap.replicas:
        if r.state not in HOLDING:
            continue
        for s in r.shards:
            gpus[s.node_id].extend(s.gpu_indices)
            memory[s.node_id] += s.memory_gb or 0
            cores[s.node_id] += s.cpu_cores or 0
    return gpus, memory, cores


def assert_nothing_given_twice(snap: Snapshot) -> None:
    gpus, memory, cores = held_by_node(snap)
    for node_id, indices in gpus.items():
        twice = [i for i, n in Counter(indices).items() if n > 1]
        assert not twice, f"GPUs {twice} of {node_id} are held twice"
    for node_id, node in snap.nodes.items():
        if node.memory_gb:
            assert memory[node_id] <= node.memory_gb, (
                f"{node_id} holds {memory[node_id]} GB of {node.memory_gb}"
            )
        if node.cpu_count:
            assert cores[node_id] <= node.cpu_count, (
                f"{node_id} holds {cores[node_id]} cores of {node.cpu_count}"
            )


def assert_every_start_was_allowed(before: Snapshot, plan: Plan) -> None:
    """Replay the pass's starts in order on the room that was left, asking refuse() each time."""
    node_views = dict(before.nodes)
    for change in plan.node_changes:
        node_views[change.node_id] = replace(node_views[change.node_id], state=change.state)
    forgotten = {f.replica_id for f in plan.forgets}
    inventory = Inventory(node_views, [r for r in before.replicas if r.id not in forgotten])
    existing = {r.id for r in before.replicas}
    for start in plan.starts:
        assert start.replica_id not in existing, f"replica id {start.replica_id} given twice"
        existing.add(start.replica_id)
        source = before.models[start.model].source
        shards = [p for _, p in start.shards]
        assert len(shards) == start.profile.nodes
        assert len({p.node_id for p in shards}) == len(shards), "two shards on one node"
        if len(shards) > 1:
            fabrics = {node_views[p.node_id].labels.get(FABRIC_LABEL) for p in shards}
            assert len(fabrics) == 1 and None not in fabrics, f"shards across fabrics {fabrics}"
        for p in shards:
            node = node_views[p.node_id]
            # Said again without refuse(), so a filter dropped from it is caught here too.
            assert node.state == "ready" and not node.cordoned and not node.draining
            assert all(node.labels.get(k) == v for k, v in start.profile.node_selector.items())
            assert node.engines is None or start.profile.engine in node.engines
            room = inventory.rooms[p.node_id]
            why = refuse(room, start.profile, frozenset(), source)
            assert why is None, f"{start.replica_id} placed where refused: {why}"
            healthy = {
                g.index for g in node.gpus if g.healthy and g.gpu_class == start.profile.gpu_class
            }
            assert set(p.gpu_indices) <= healthy, f"{start.replica_id} got GPUs {p.gpu_indices}"
            assert len(p.gpu_indices) == start.profile.gpus_on_each_node
        inventory.reserve(start.model, Placement(start.profile, tuple(shards)))


def assert_no_model_runs_more_than_it_wants(after: Snapshot, plan: Plan) -> None:
    counting = Counter(r.model for r in after.replicas if r.state in ACTIVE and not r.retiring)
    for name, count in counting.items():
        if name in plan.states:
            assert count <= plan.states[name].desired, f"{name} runs {count}"


OUTCOMES = ("pending", "starting", "ready", "ready", "failed")


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(fleet=nodes(), catalog=catalogs(), data=st.data())
def test_repeated_passes_never_give_a_gpu_a_gb_or_a_core_twice(fleet, catalog, data):
    models, states = catalog
    c = Cluster(snapshot(fleet, models, states=states))
    for _ in range(8):
        for node_id in sorted(c.snap.nodes):
            if data.draw(sometimes(25), label=f"silence {node_id}"):
                c.silent.add(node_id)
        c.wait(data.draw(st.sampled_from([5, 20, 70]), label="wait"))
        before = c.snap
        plan = c.step()
        assert_every_start_was_allowed(before, plan)
        assert_nothing_given_twice(c.snap)
        assert_no_model_runs_more_than_it_wants(c.snap, plan)
        agents_report(c, data)


def agents_report(c: Cluster, data) -> None:
    """The agents report a random outcome for each replica starting, and some stop."""
    for r in c.snap.replicas:
        if r.state in ("pending", "starting"):
            outcome = data.draw(st.sampled_from(OUTCOMES), label=f"{r.id} reports")
            if outcome != r.state and outcome != "pending":
                c.report(r.id, outcome, reason="exit code 1")
        elif r.state == "stopping" and data.draw(st.booleans(), label=f"{r.id} stops"):
            c.report(r.id, "stopped")


@settings(max_examples=100, deadline=None)
@given(fleet=nodes(), catalog=catalogs())
def test_a_cluster_left_alone_places_no_more_once_settled(fleet, catalog):
    """Every replica comes up ready: after the fleet fills, further passes change nothing."""
    models, states = catalog
    c = Cluster(snapshot(fleet, models, states=states))
    for _ in range(4):
        c.wait(5)
        c.step()
        for r in c.snap.replicas:
            if r.state == "pending":
                c.report(r.id, "ready")
            elif r.state == "stopping":
                c.report(r.id, "stopped")
        assert_nothing_given_twice(c.snap)
    c.wait(5)
    c.step()
    c.wait(5)
    plan = c.step()
    assert plan.starts == [], "it kept placing on a cluster where nothing changed"
