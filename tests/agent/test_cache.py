"""The agent's weight cache: fetched once, resumed, checked, refused when the disk is
short, reclaimed only where nothing uses it; and a shard that waits for its weights."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
from collections import namedtuple

import pytest

from fleet.agent.cache import CacheError, WeightCache
from mirror.domain.refs import RefError, WeightsRef
from tests.mirror.hub import Hub

from .helpers import PATIENCE_S
from .test_supervisor import Recorder, start_msg

DATA = os.urandom(2 * (1 << 20) + 5)
DIGEST = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def mirror():
    hub = Hub(plain={"blob": DATA}).start()
    yield hub
    hub.stop()


def _ref(mirror, digest=DIGEST, size=len(DATA)):
    return WeightsRef(sha256=digest, size=size, url=f"{mirror.url}/files/blob", file="tiny.gguf")


def _cache(tmp_path, mirror) -> WeightCache:
    return WeightCache(tmp_path / "cache", server=mirror.url, bearer=lambda: "llmgw_agt_x")


async def test_a_file_is_fetched_checked_and_reported_with_its_source(tmp_path, mirror):
    cache = _cache(tmp_path, mirror)

    path = await cache.ensure(_ref(mirror), source="hf://acme/tiny/tiny.gguf")

    assert path.read_bytes() == DATA
    (held,) = cache.held()
    assert (held["sha256"], held["size"]) == (DIGEST, len(DATA))
    assert held["source"] == "hf://acme/tiny/tiny.gguf"
    assert abs(held["used_at"] - time.time()) < 60
    await cache.ensure(_ref(mirror))
    assert mirror.gets == {"blob": 1}


async def test_a_relative_url_is_fetched_from_the_server(tmp_path, mirror):
    cache = _cache(tmp_path, mirror)
    ref = WeightsRef(sha256=DIGEST, size=len(DATA), url="/files/blob", file="tiny.gguf")

    assert (await cache.ensure(ref)).read_bytes() == DATA


async def test_a_fetch_cut_short_resumes_from_its_part(tmp_path, mirror):
    cache = _cache(tmp_path, mirror)
    part = cache.root / "partial" / f"{DIGEST}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:700_000])

    path = await cache.ensure(_ref(mirror))

    assert mirror.ranges == ["bytes=700000-"]
    assert path.read_bytes() == DATA and not part.exists()


async def test_a_file_that_does_not_match_its_digest_is_refused_and_nothing_kept(tmp_path, mirror):
    cache = _cache(tmp_path, mirror)

    with pytest.raises(CacheError, match="does not match its digest"):
        await cache.ensure(_ref(mirror, digest="e" * 64))

    assert cache.held() == []
    assert not any(p.is_file() for p in cache.root.rglob("*"))


async def test_a_node_without_the_disk_is_refused_with_the_figures_before_fetching(
    tmp_path, mirror, monkeypatch
):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(100 << 30, 99 << 30, 1 << 30))
    cache = _cache(tmp_path, mirror)

    with pytest.raises(CacheError) as err:
        await cache.ensure(_ref(mirror, size=20 << 30))

    assert "This node has 1.0 GB free" in str(err.value)
    assert "tiny.gguf needs 20.0 GB more" in str(err.value)
    assert mirror.gets == {}


async def test_two_shards_wanting_one_file_fetch_it_once(tmp_path, mirror):
    import threading

    mirror.hold = threading.Event()
    cache = _cache(tmp_path, mirror)

    both = asyncio.gather(cache.ensure(_ref(mirror)), cache.ensure(_ref(mirror)))
    await asyncio.sleep(0.3)
    mirror.hold.set()
    a, b = await both

    assert a == b and a.read_bytes() == DATA
    assert mirror.gets == {"blob": 1}


async def test_reclaim_deletes_only_what_nothing_uses(tmp_path, mirror):
    cache = _cache(tmp_path, mirror)
    await cache.ensure(_ref(mirror))
    other = cache.path("f" * 64)
    other.write_bytes(b"old")

    gone = cache.delete(["f" * 64, DIGEST, "not-a-digest"], in_use={DIGEST})

    assert gone == ["f" * 64]
    assert [w["sha256"] for w in cache.held()] == [DIGEST]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("x", "not an object"),
        ({"size": 1, "url": "/f"}, "no sha256"),
        ({"sha256": DIGEST, "url": "/f"}, "no size"),
        ({"sha256": DIGEST, "size": True, "url": "/f"}, "no size"),
        ({"sha256": DIGEST, "size": 1}, "no url"),
    ],
)
def test_weights_that_cannot_be_fetched_are_a_sentence(raw, said):
    with pytest.raises(RefError, match=said):
        WeightsRef.from_message(raw)


async def test_a_shard_with_weights_fetches_them_then_starts_on_the_cached_file(tmp_path, mirror):
    rec = Recorder(tmp_path)
    rec.sup.cache = _cache(tmp_path, mirror)
    msg = start_msg() | {"source": "hf://acme/tiny", "weights": _ref(mirror).__dict__}

    await rec.sup.start(msg)
    await rec.until("ready")

    states = rec.states()
    assert states[0] == "fetching" and states[-2:] == ["starting", "ready"]
    fetching = [m for m in rec.statuses if m["state"] == "fetching"]
    assert fetching[0]["progress"] == {"done": 0, "total": len(DATA)}
    shard = rec.sup.get("s1")
    assert shard.spec.source == str(rec.sup.cache.path(DIGEST))
    assert rec.sup.weights_in_use() == {DIGEST}
    await rec.sup.stop_all(grace_s=1)


async def test_a_shard_whose_weights_fail_is_failed_with_the_sentence(tmp_path, mirror):
    rec = Recorder(tmp_path)
    rec.sup.cache = _cache(tmp_path, mirror)
    msg = start_msg() | {"weights": _ref(mirror, digest="e" * 64).__dict__}

    await rec.sup.start(msg)
    await rec.until("failed")

    failed = [m for m in rec.statuses if m["state"] == "failed"][0]
    assert "could not be fetched from the mirror" in failed["detail"]
    assert "does not match its digest" in failed["detail"]
    assert rec.sup.get("s1") is None


async def test_a_shard_stopped_while_fetching_never_starts(tmp_path, mirror):
    import threading

    mirror.hold = threading.Event()
    rec = Recorder(tmp_path)
    rec.sup.cache = _cache(tmp_path, mirror)
    await rec.sup.start(start_msg() | {"weights": _ref(mirror).__dict__})
    await rec.until("fetching")

    await rec.sup.stop("s1", grace_s=1)
    mirror.hold.set()
    await asyncio.sleep(0.5)

    assert rec.states() == ["fetching", "stopped"]
    async with asyncio.timeout(PATIENCE_S):
        while not rec.sup.cache.path(DIGEST).exists():  # the fetch itself still completes
            await asyncio.sleep(0.05)


def _agent(tmp_path, mirror):
    from tests.agent.test_client import make_agent

    agent = make_agent(tmp_path, "ws://127.0.0.1:9/ws/agent/")
    agent.supervisor.cache = _cache(tmp_path, mirror)
    return agent


async def test_register_and_heartbeats_say_what_the_cache_holds_and_only_when_it_changed(
    tmp_path, mirror
):
    agent = _agent(tmp_path, mirror)
    assert agent.register_message()["weights"] == []
    assert "weights" not in agent.heartbeat_message(1, load={})

    await agent.supervisor.cache.ensure(_ref(mirror), source="hf://acme/tiny")
    beat = agent.heartbeat_message(2, load={})

    (held,) = beat["weights"]
    assert (held["sha256"], held["size"], held["source"]) == (DIGEST, len(DATA), "hf://acme/tiny")
    assert held["used_at"] > 0
    assert beat["disk"] == {"free_gb": 500.0, "total_gb": 500.0}
    assert "weights" not in agent.heartbeat_message(3, load={})


async def test_delete_weights_keeps_what_a_shard_here_runs_on(tmp_path, mirror):
    agent = _agent(tmp_path, mirror)
    cache = agent.supervisor.cache
    await cache.ensure(_ref(mirror))
    other = "f" * 64
    cache.path(other).write_bytes(b"old")
    agent.supervisor.weights_in_use = lambda: {DIGEST}

    await agent._dispatch({"type": "delete_weights", "sha256": [DIGEST, other]})
    await agent._dispatch({"type": "delete_weights", "sha256": "not a list"})

    assert [w["sha256"] for w in cache.held()] == [DIGEST]


async def test_a_disk_that_fails_fails_the_shard_rather_than_leaving_it_fetching(tmp_path, mirror):
    (tmp_path / "blocked").write_text("a file where the cache folder should be")
    rec = Recorder(tmp_path)
    rec.sup.cache = WeightCache(
        tmp_path / "blocked" / "cache", server=mirror.url, bearer=lambda: "t"
    )

    await rec.sup.start(start_msg() | {"weights": _ref(mirror).__dict__})
    await rec.until("failed")

    failed = [m for m in rec.statuses if m["state"] == "failed"][0]
    assert "could not be put in the cache" in failed["detail"]
    assert rec.sup.get("s1") is None


async def test_a_file_counts_as_used_until_the_shard_on_it_ends(tmp_path, mirror):
    import json as json_

    rec = Recorder(tmp_path)
    rec.sup.cache = _cache(tmp_path, mirror)
    await rec.sup.start(start_msg() | {"weights": _ref(mirror).__dict__})
    await rec.until("ready")
    meta = rec.sup.cache.path(DIGEST).with_suffix(".json")
    started = json_.loads(meta.read_text())["used_at"]
    await asyncio.sleep(0.05)

    await rec.sup.stop("s1", grace_s=1)

    assert json_.loads(meta.read_text())["used_at"] > started
