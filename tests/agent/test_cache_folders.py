"""A model that is a folder (a Hugging Face repository) in the agent's cache: each file
fetched into the digest store once, resumed, refused when the disk is short of what is
still to come, assembled as a folder of links under each file's path, refused when a path
would leave the folder; reclaimed with the folders it is in; and a shard that runs on it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from collections import namedtuple

import httpx
import pytest

from fleet.agent.cache import CacheError, WeightCache
from fleet.agent.engines import SIM_COMMAND
from mirror.domain.refs import FolderRef, WeightsRef
from tests.mirror.hub import Hub

from .test_supervisor import Recorder, start_msg

FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "tokenizer/tokenizer.json": b'{"model": {"type": "BPE"}}',
    "model.safetensors": os.urandom(3 * (1 << 20) + 11),
}
BLOBS = {hashlib.sha256(data).hexdigest(): data for data in FILES.values()}


def digest(path: str) -> str:
    return hashlib.sha256(FILES[path]).hexdigest()


@pytest.fixture
def mirror():
    hub = Hub(plain=dict(BLOBS)).start()
    yield hub
    hub.stop()


def folder(mirror, files=FILES, name="hf://acme/tiny") -> FolderRef:
    refs = [
        WeightsRef(
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            url=f"{mirror.url}/files/{hashlib.sha256(data).hexdigest()}",
            file=path,
        )
        for path, data in sorted(files.items())
    ]
    return FolderRef(files=tuple(refs), name=name)


def cache_of(tmp_path, mirror) -> WeightCache:
    return WeightCache(tmp_path / "cache", server=mirror.url, bearer=lambda: "llmgw_node_x")


async def test_each_file_is_fetched_once_and_the_folder_holds_it_under_its_path(tmp_path, mirror):
    cache = cache_of(tmp_path, mirror)
    seen = []

    path = await cache.ensure_folder(
        folder(mirror), source="hf://acme/tiny", on_progress=lambda d, t: seen.append((d, t))
    )

    assert path == cache.root / "folders" / folder(mirror).key
    assert {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()} == (
        FILES
    )
    # Links to the digest store, not copies: the disk holds each file once.
    weights = path / "model.safetensors"
    assert weights.stat().st_ino == cache.path(digest("model.safetensors")).stat().st_ino
    assert sorted(w["sha256"] for w in cache.held()) == sorted(BLOBS)
    assert {w["source"] for w in cache.held()} == {"hf://acme/tiny"}
    total = sum(len(d) for d in FILES.values())
    assert seen[-1] == (total, total) and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    again = await cache.ensure_folder(folder(mirror))

    assert again == path
    assert sum(mirror.gets.values()) == 3


async def test_a_folder_cut_short_resumes_each_file_from_its_part(tmp_path, mirror):
    cache = cache_of(tmp_path, mirror)
    big = digest("model.safetensors")
    part = cache.root / "partial" / f"{big}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(FILES["model.safetensors"][:1_000_000])

    path = await cache.ensure_folder(folder(mirror))

    assert (path / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert "bytes=1000000-" in mirror.ranges
    assert not part.exists()


async def test_a_file_two_folders_share_is_fetched_once_and_in_both(tmp_path, mirror):
    cache = cache_of(tmp_path, mirror)
    other = {"config.json": FILES["config.json"], "model.safetensors": FILES["model.safetensors"]}

    a, b = await asyncio.gather(
        cache.ensure_folder(folder(mirror)), cache.ensure_folder(folder(mirror, other))
    )

    assert a != b
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert mirror.gets[digest("model.safetensors")] == 1
    assert mirror.gets[digest("config.json")] == 1


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("../x", "leaves its folder"),
        ("a/../../x", "leaves its folder"),
        ("/etc/passwd", "is absolute"),
        ("a//b", "leaves its folder or is not plain"),
    ],
)
async def test_a_path_that_would_leave_the_folder_is_refused_and_nothing_fetched(
    tmp_path, mirror, path, said
):
    cache = cache_of(tmp_path, mirror)
    hostile = folder(mirror, {**FILES, path: b"x"})

    with pytest.raises(CacheError) as err:
        await cache.ensure_folder(hostile)

    assert str(err.value).startswith("hf://acme/tiny cannot be assembled: The path")
    assert said in str(err.value)
    assert mirror.gets == {}
    assert not (tmp_path / "x").exists() and not cache.root.exists()


async def test_a_node_without_room_for_what_is_still_to_come_is_refused_with_the_figures(
    tmp_path, mirror, monkeypatch
):
    cache = cache_of(tmp_path, mirror)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(100 << 30, 99 << 30, 1 << 30))
    refs = folder(mirror).files
    huge = FolderRef(
        files=tuple(WeightsRef(r.sha256, 7 << 30, r.url, r.file) for r in refs),
        name="hf://acme/big",
    )

    with pytest.raises(CacheError) as err:
        await cache.ensure_folder(huge)

    assert str(err.value) == (
        f"This node has 1.0 GB free in {cache.root}; hf://acme/big needs 21.0 GB more "
        "(3 of its 3 files) and 1 GB is kept free: nothing was fetched."
    )
    assert mirror.gets == {}


async def test_deleting_a_file_deletes_the_folders_it_is_in_and_only_those(tmp_path, mirror):
    cache = cache_of(tmp_path, mirror)
    small = {"config.json": FILES["config.json"]}
    full = await cache.ensure_folder(folder(mirror))
    kept = await cache.ensure_folder(folder(mirror, small))

    gone = cache.delete([digest("model.safetensors")], in_use=set())

    assert gone == [digest("model.safetensors")]
    assert not full.exists() and not full.with_suffix(".json").exists()
    assert (kept / "config.json").read_bytes() == FILES["config.json"]
    assert json.loads(kept.with_suffix(".json").read_text())["files"] == {
        "config.json": digest("config.json")
    }


async def test_a_shard_on_a_folder_runs_its_engine_on_the_assembled_folder(tmp_path, mirror):
    rec = Recorder(tmp_path)
    rec.sup.sim_command = SIM_COMMAND  # the real sim engine, which says what it was given
    rec.sup.cache = cache_of(tmp_path, mirror)
    ref = folder(mirror)
    msg = start_msg() | {"source": "hf://acme/tiny", "weights": ref.message()}

    try:
        await rec.sup.start(msg)
        await rec.until("ready")

        fetching = [m for m in rec.statuses if m["state"] == "fetching"]
        assert fetching[0]["progress"] == {"done": 0, "total": ref.size}
        shard = rec.sup.get("s1")
        assert shard.spec.source == str(rec.sup.cache.folder_path(ref))
        assert rec.sup.weights_in_use() == set(BLOBS)
        async with httpx.AsyncClient(trust_env=False) as client:
            r = await client.get(
                f"{shard.endpoint}/v1/models", headers={"Authorization": "Bearer k1"}
            )
        assert r.json()["data"][0]["root"] == shard.spec.source
    finally:
        await rec.close()


async def test_a_shard_on_a_folder_with_a_file_that_fails_is_failed_with_the_sentence(
    tmp_path, mirror
):
    rec = Recorder(tmp_path)
    rec.sup.cache = cache_of(tmp_path, mirror)
    good = folder(mirror).files
    bad = WeightsRef("e" * 64, good[0].size, good[0].url, good[0].file)
    msg = start_msg() | {"weights": FolderRef((bad, *good[1:]), "hf://acme/tiny").message()}

    await rec.sup.start(msg)
    await rec.until("failed")

    failed = [m for m in rec.statuses if m["state"] == "failed"][0]
    assert "The weights config.json could not be fetched from the mirror" in failed["detail"]
    assert "does not match its digest" in failed["detail"]
    assert rec.sup.get("s1") is None
    assert not (rec.sup.cache.root / "folders").exists()
