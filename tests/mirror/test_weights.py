"""Weights through the REST API and the mirror's worker, against a hub and an https
server on loopback: download, resume after a cut, a wrong digest refused with nothing
kept, one download for many, a claim a dead worker left, and every refusal a sentence."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from datetime import timedelta

import pytest
import trustme

from llmgw.core import clock
from mirror import store
from mirror.models import WeightFile, Weights
from mirror.worker import work_once, work_until_idle
from tests.helpers import detail
from tests.mirror.hub import COMMIT, Hub, HubFile

pytestmark = pytest.mark.django_db

GGUF = b"GGUF" + os.urandom(300_000)
README = b"# a model\n"


@pytest.fixture
def mirror_dir(settings, tmp_path):
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    mirror = replace(settings.LLMGW.mirror, dir=tmp_path / "mirror", sources=(str(allowed),))
    settings.LLMGW = replace(settings.LLMGW, mirror=mirror)
    return tmp_path


@pytest.fixture
def hub(monkeypatch, mirror_dir):
    from huggingface_hub import constants

    h = Hub(
        repos={
            "acme/tiny": {
                "tiny.Q4_K_M.gguf": HubFile(GGUF),
                "README.md": HubFile(README, lfs=False),
            }
        }
    )
    h.start()
    monkeypatch.setattr(constants, "ENDPOINT", h.url)
    yield h
    h.stop()


def _add(api, source, **extra):
    return api.call("POST", "/weights", {"source": source, **extra})


def test_weights_from_the_hub_are_queued_at_once_then_fetched_and_checked(api, hub):
    response = _add(api, "hf://acme/tiny/*.gguf")

    assert response.status_code == 201
    view = response.json()
    assert (view["state"], view["bytes_done"], view["bytes_total"]) == ("queued", 0, len(GGUF))
    assert view["revision"] == COMMIT
    assert view["added_by"] == "ops"
    assert [(f["path"], f["size"], f["sha256"]) for f in view["files"]] == [
        ("tiny.Q4_K_M.gguf", len(GGUF), hashlib.sha256(GGUF).hexdigest())
    ]

    assert work_until_idle() == 1

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert (view["state"], view["bytes_done"], view["detail"]) == ("ready", len(GGUF), "")
    assert store.blob(hashlib.sha256(GGUF).hexdigest()).read_bytes() == GGUF


def test_a_whole_repository_is_every_file_but_the_hubs_own(api, hub):
    view = _add(api, "hf://acme/tiny").json()

    assert sorted(f["path"] for f in view["files"]) == ["README.md", "tiny.Q4_K_M.gguf"]
    work_until_idle()
    assert api.call("GET", f"/weights/{view['id']}").json()["state"] == "ready"


def test_a_cut_download_resumes_from_where_it_stopped(api, hub):
    hub.cut_after["acme/tiny/tiny.Q4_K_M.gguf"] = 100_000
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()

    work_once()

    f = WeightFile.objects.get()
    assert (f.state, f.attempts) == ("queued", 1)
    assert "try 1 of 6 failed" in f.detail and "cut at 100,000 bytes" in f.detail
    assert store.part(f.pk).stat().st_size == 100_000
    WeightFile.objects.update(next_try_at=clock.now() - timedelta(seconds=1))

    work_once()

    assert hub.ranges == [None, "bytes=100000-"]
    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "ready"
    assert store.blob(hashlib.sha256(GGUF).hexdigest()).read_bytes() == GGUF


def test_a_file_that_does_not_match_the_hubs_digest_is_refused_and_nothing_kept(api, hub):
    hub.repos["acme/tiny"]["tiny.Q4_K_M.gguf"].claimed_sha256 = "0" * 64
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()

    work_until_idle()

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "failed"
    assert "does not match its digest: expected sha256 " + "0" * 64 in view["detail"]
    assert "nothing was kept" in view["detail"]
    assert not any(p.is_file() for p in store.root().rglob("*"))


def test_the_same_source_twice_is_one_weights_and_one_download(api, hub):
    first = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf")
    again = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf")

    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    work_until_idle()
    assert hub.gets == {"acme/tiny/tiny.Q4_K_M.gguf": 1}


def test_a_file_two_weights_share_is_fetched_once(api, hub):
    hub.repos["acme/copy"] = {"copy.gguf": HubFile(GGUF)}
    a = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    b = _add(api, "hf://acme/copy").json()

    work_until_idle()

    assert sum(hub.gets.values()) == 1
    assert {api.call("GET", f"/weights/{w['id']}").json()["state"] for w in (a, b)} == {"ready"}


def test_a_claim_a_dead_worker_left_lapses_and_the_download_resumes(api, hub):
    hub.cut_after["acme/tiny/tiny.Q4_K_M.gguf"] = 50_000
    _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf")
    work_once()
    # As a worker killed mid-download leaves it: downloading, claimed, its part on disk.
    WeightFile.objects.update(
        state="downloading", next_try_at=None, claimed_until=clock.now() + timedelta(seconds=30)
    )

    assert work_once() is False  # still claimed
    WeightFile.objects.update(claimed_until=clock.now() - timedelta(seconds=1))
    assert work_once() is True

    assert hub.ranges[-1] == "bytes=50000-"
    assert WeightFile.objects.get().state == "ready"


def test_a_source_that_keeps_failing_gives_up_with_its_sentence(api, hub):
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    hub.repos["acme/tiny"].clear()  # the hub lost the file after it was listed

    for _ in range(6):
        WeightFile.objects.update(next_try_at=None)
        work_once()

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "failed"
    assert "answered HTTP 404" in view["detail"]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("ftp://example.org/model.gguf", "has the scheme ftp://, which the mirror does not fetch"),
        ("s3://bucket/model.gguf", "has the scheme s3://"),
        ("model.gguf", "neither hf://ORG/REPO, https://… nor an absolute path"),
        ("hf://acme", "is not hf://ORG/REPO"),
        ("hf://acme/tiny/../../etc/passwd", "leaves the repository"),
        ("hf://acme/nothing-here", "There is no repository acme/nothing-here on"),
        ("hf://acme/tiny@v9", "has no revision 'v9'"),
        (
            "hf://acme/tiny/*.safetensors",
            "Nothing in acme/tiny@0123456789ab matches '*.safetensors'",
        ),
        ("/etc/passwd", "is outside the folders the mirror may read"),
        ("https://user:pw@127.0.0.1/x.gguf", "carries a user name or password"),
        ("", "A source is needed"),
        ("hf://acme/tiny\x00", "control character"),
    ],
)
def test_a_source_that_cannot_be_used_is_a_sentence_and_nothing_is_stored(api, hub, source, said):
    response = _add(api, source)

    assert response.status_code == 400, response.content
    assert said in detail(response)
    assert not Weights.objects.exists() and not WeightFile.objects.exists()


def test_a_body_that_is_not_a_source_is_a_400(api, hub):
    assert api.call("POST", "/weights", {"source": 7}).status_code == 400
    assert api.call("POST", "/weights", {"source": "hf://acme/tiny", "extra": 1}).status_code == 400
    response = api.call("POST", "/weights", {"source": "hf://acme/tiny", "sha256": "abc"})
    assert response.status_code == 400
    assert not Weights.objects.exists()


def test_a_private_repository_is_read_with_hf_token(api, hub, monkeypatch):
    hub.token = "hf_secret"
    assert _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").status_code == 400

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").status_code == 201
    assert hub.seen_auth[-1] == "Bearer hf_secret"


def test_the_hub_away_is_a_502_with_a_sentence(api, monkeypatch, mirror_dir):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    response = _add(api, "hf://acme/tiny")

    assert response.status_code == 502
    assert "The hub at http://127.0.0.1:9 could not be asked about acme/tiny" in detail(response)


@pytest.fixture
def tls_server(monkeypatch, mirror_dir, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ctx = __import__("ssl").create_default_context(__import__("ssl").Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    server = Hub(plain={"model.gguf": GGUF}).start(tls=ctx)
    yield server
    server.stop()


def test_an_https_file_is_fetched_and_checked_against_the_digest_given(api, tls_server):
    digest = hashlib.sha256(GGUF).hexdigest()
    view = _add(api, f"{tls_server.url}/files/model.gguf", sha256=digest.upper()).json()

    assert view["files"][0]["size"] == len(GGUF)
    work_until_idle()

    assert api.call("GET", f"/weights/{view['id']}").json()["state"] == "ready"
    assert WeightFile.objects.get().sha256 == digest


def test_an_https_file_with_the_wrong_digest_is_refused(api, tls_server):
    view = _add(api, f"{tls_server.url}/files/model.gguf", sha256="1" * 64).json()

    work_until_idle()

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "failed" and "does not match its digest" in view["detail"]
    assert not any(p.is_file() for p in store.root().rglob("*"))


def test_an_https_file_that_is_not_there_is_a_400(api, tls_server):
    response = _add(api, f"{tls_server.url}/files/missing.gguf")

    assert response.status_code == 400
    assert "answered HTTP 404: there is no such file" in detail(response)


def test_a_local_file_and_folder_inside_the_allowed_folders(api, mirror_dir):
    folder = mirror_dir / "allowed" / "tiny"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.gguf").write_bytes(GGUF)
    (folder / "sub" / "tokenizer.json").write_bytes(b"{}")

    one = _add(api, str(folder / "model.gguf")).json()
    whole = _add(api, str(folder)).json()
    work_until_idle()

    assert api.call("GET", f"/weights/{one['id']}").json()["state"] == "ready"
    whole = api.call("GET", f"/weights/{whole['id']}").json()
    assert whole["state"] == "ready"
    assert sorted(f["path"] for f in whole["files"]) == ["model.gguf", "sub/tokenizer.json"]


def test_a_link_out_of_the_allowed_folders_is_refused(api, mirror_dir):
    (mirror_dir / "allowed" / "escape").symlink_to("/etc")

    response = _add(api, str(mirror_dir / "allowed" / "escape" / "hostname"))

    assert response.status_code == 400
    assert "outside the folders the mirror may read" in detail(response)


def test_removing_weights_a_model_uses_names_the_model(api, hub):
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    work_until_idle()
    from catalog.models import Model

    Model.objects.create(name="tiny", source="hf://acme/tiny/tiny.Q4_K_M.gguf")

    response = api.call("DELETE", f"/weights/{view['id']}")

    assert response.status_code == 409
    assert "used by tiny" in detail(response)
    assert api.call("GET", f"/weights/{view['id']}").json()["models"] == ["tiny"]


def test_removing_weights_nothing_uses_deletes_their_files(api, hub):
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    work_until_idle()
    blob = store.blob(hashlib.sha256(GGUF).hexdigest())
    assert blob.exists()

    assert api.call("DELETE", f"/weights/{view['id']}").status_code == 204

    assert not blob.exists()
    assert api.call("GET", f"/weights/{view['id']}").status_code == 404


def test_failed_weights_can_be_tried_again(api, hub):
    hub.repos["acme/tiny"]["tiny.Q4_K_M.gguf"].claimed_sha256 = "0" * 64
    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    work_until_idle()
    hub.repos["acme/tiny"]["tiny.Q4_K_M.gguf"].claimed_sha256 = None
    WeightFile.objects.update(expected_sha256=hashlib.sha256(GGUF).hexdigest())

    assert api.call("POST", f"/weights/{view['id']}/retry").json()["state"] == "queued"
    work_until_idle()

    assert api.call("GET", f"/weights/{view['id']}").json()["state"] == "ready"


def test_weights_need_an_admin_token(client, hub):
    assert client.get("/api/v1/weights").status_code == 401
    assert client.post("/api/v1/weights", {"source": "hf://acme/tiny"}).status_code == 401


def test_a_link_swapped_after_adding_does_not_make_the_mirror_copy_what_it_points_to(
    api, mirror_dir
):
    folder = mirror_dir / "allowed" / "tiny"
    folder.mkdir()
    (folder / "real.gguf").write_bytes(GGUF)
    (folder / "link.gguf").symlink_to(folder / "real.gguf")
    secret = mirror_dir / "secret"
    secret.write_bytes(b"not weights")
    view = _add(api, str(folder)).json()

    (folder / "link.gguf").unlink()
    (folder / "link.gguf").symlink_to(secret)
    work_until_idle()

    assert not store.blob(hashlib.sha256(b"not weights").hexdigest()).exists()
    files = {f["path"]: f for f in api.call("GET", f"/weights/{view['id']}").json()["files"]}
    assert files["link.gguf"]["sha256"] == hashlib.sha256(GGUF).hexdigest()


def test_a_local_file_replaced_after_adding_is_refused_not_copied(api, mirror_dir):
    path = mirror_dir / "allowed" / "model.gguf"
    path.write_bytes(GGUF)
    view = _add(api, str(path)).json()
    path.unlink()
    path.symlink_to(mirror_dir / "outside.gguf")
    (mirror_dir / "outside.gguf").write_bytes(b"elsewhere")

    work_until_idle()

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "failed"
    assert "no longer inside LLMGW_MIRROR_SOURCES" in view["detail"]
    assert not any(p.is_file() for p in store.root().rglob("*"))


def test_a_local_file_that_changed_size_after_adding_is_refused(api, mirror_dir):
    path = mirror_dir / "allowed" / "model.gguf"
    path.write_bytes(GGUF)
    view = _add(api, str(path)).json()
    path.write_bytes(GGUF + b"more")

    work_until_idle()

    view = api.call("GET", f"/weights/{view['id']}").json()
    assert view["state"] == "failed" and "changed since it was added" in view["detail"]


def test_a_folder_holding_a_path_longer_than_the_mirror_keeps_is_a_400(api, mirror_dir):
    deep = mirror_dir / "allowed" / "deep"
    path = deep
    for i in range(6):
        path = path / (f"{i}" * 90)
    path.mkdir(parents=True)
    (path / "model.gguf").write_bytes(b"GGUF")

    response = _add(api, str(deep))

    assert response.status_code == 400
    assert "longer than the mirror keeps (500 characters)" in detail(response)
    assert not Weights.objects.exists()


def test_removing_weights_keeps_bytes_an_engine_build_holds_too(api, hub):
    from mirror.models import EngineBuild

    view = _add(api, "hf://acme/tiny/tiny.Q4_K_M.gguf").json()
    work_until_idle()
    digest = hashlib.sha256(GGUF).hexdigest()
    EngineBuild.objects.create(
        engine="llamacpp", version="b1", platform="linux-x86_64", sha256=digest,
        size=len(GGUF), added_by="test", added_at=clock.now(),
    )  # fmt: skip

    assert api.call("DELETE", f"/weights/{view['id']}").status_code == 204

    assert store.blob(digest).exists()


def test_a_file_with_no_digest_to_check_is_fetched_again_whole_not_resumed(api, tls_server):
    # Nothing would tell a file that changed between tries from its first part.
    tls_server.cut_after["model.gguf"] = 100_000
    view = _add(api, f"{tls_server.url}/files/model.gguf").json()
    work_once()
    WeightFile.objects.update(next_try_at=clock.now() - timedelta(seconds=1))

    work_once()

    assert tls_server.ranges == [None, None]
    assert api.call("GET", f"/weights/{view['id']}").json()["state"] == "ready"
