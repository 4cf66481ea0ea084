"""Engine builds in the mirror over REST: uploaded with their digest checked, listed, served
by the file server like weights, removed; every bad upload a sentence with nothing kept."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import replace

import pytest

from llmgw.core import clock
from mirror import builds as engines, selectors, store
from mirror.domain.platforms import this_platform
from mirror.models import EngineBuild
from tests.helpers import detail
from tests.mirror.wheels import wheel

pytestmark = pytest.mark.django_db

BINARY = b"#!/bin/sh\necho 'version: b6000 (abc)'\n" + os.urandom(3 * (1 << 20))
DIGEST = hashlib.sha256(BINARY).hexdigest()


@pytest.fixture(autouse=True)
def mirror_dir(settings, tmp_path):
    mirror = replace(settings.LLMGW.mirror, dir=tmp_path / "mirror")
    settings.LLMGW = replace(settings.LLMGW, mirror=mirror)
    return tmp_path / "mirror"


def _upload(api, admin_token, data=BINARY, name="llama-server", **fields):
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = {"engine": "llamacpp", "version": "b6000", **fields}
    if data is not None:
        body["file"] = SimpleUploadedFile(name, data)
    return api.post("/api/v1/engines", body, HTTP_AUTHORIZATION=f"Bearer {admin_token}")


def _kept(mirror_dir) -> list[str]:
    return sorted(p.name for p in mirror_dir.rglob("*") if p.is_file())


def test_an_uploaded_build_is_kept_by_its_digest_and_listed(api, admin_token):
    response = _upload(api, admin_token, sha256=DIGEST)
    assert response.status_code == 201, response.content
    build = response.json()
    assert build["engine"] == "llamacpp"
    assert build["version"] == "b6000"
    assert build["platform"] == this_platform()
    assert (build["sha256"], build["size"]) == (DIGEST, len(BINARY))
    assert store.blob(DIGEST).read_bytes() == BINARY
    listed = api.call("GET", "/engines").json()
    assert [b["id"] for b in listed] == [build["id"]]


def test_the_same_build_uploaded_again_is_the_same_build(api, admin_token):
    first = _upload(api, admin_token).json()
    again = _upload(api, admin_token)
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert EngineBuild.objects.count() == 1


def test_another_binary_under_the_same_name_is_refused_naming_the_build(api, admin_token):
    first = _upload(api, admin_token).json()
    other = _upload(api, admin_token, data=b"another binary")
    assert other.status_code == 409
    assert f"llmgw ctl engines rm {first['id']}" in detail(other)


def test_a_file_that_does_not_match_its_digest_is_refused_and_nothing_kept(
    api, admin_token, mirror_dir
):
    response = _upload(api, admin_token, sha256="0" * 64)
    assert response.status_code == 400
    assert "does not match its digest" in detail(response)
    assert f"got {DIGEST}" in detail(response)
    assert EngineBuild.objects.count() == 0
    assert _kept(mirror_dir) == []


@pytest.mark.parametrize(
    ("data", "fields", "said"),
    [
        (None, {}, "a file field `file`"),
        (b"", {}, "The file is empty"),
        (BINARY, {"engine": "vllm"}, "vLLM is installed with pip"),
        (BINARY, {"engine": ""}, "not '(no engine)'"),
        (BINARY, {"version": ""}, "version must be 1 to 100 characters"),
        (BINARY, {"version": "1/2"}, "no slash"),
        (BINARY, {"platform": "Linux x86"}, "is not <os>-<machine>"),
        (BINARY, {"sha256": "abc"}, "sha256 must be 64 hexadecimal digits"),
    ],
)
def test_a_bad_upload_is_a_sentence_and_keeps_nothing(
    api, admin_token, mirror_dir, data, fields, said
):
    response = _upload(api, admin_token, data=data, **fields)
    assert response.status_code == 400, response.content
    assert said in detail(response)
    assert EngineBuild.objects.count() == 0
    assert _kept(mirror_dir) == []


def test_a_json_body_is_told_to_send_a_multipart_upload(api):
    response = api.call("POST", "/engines", {"engine": "llamacpp", "version": "b6000"})
    assert response.status_code == 400
    assert "multipart upload" in detail(response)


def test_removing_a_build_deletes_its_blob(api, admin_token):
    build = _upload(api, admin_token).json()
    assert api.call("DELETE", f"/engines/{build['id']}").status_code == 204
    assert not store.blob(DIGEST).exists()
    assert api.call("GET", "/engines").json() == []
    missing = api.call("DELETE", f"/engines/{build['id']}")
    assert missing.status_code == 404
    assert detail(missing) == f"There is no engine build {build['id']}."


def test_removing_one_of_two_builds_of_the_same_bytes_keeps_the_blob(api, admin_token):
    one = _upload(api, admin_token).json()
    _upload(api, admin_token, platform="linux-aarch64")
    api.call("DELETE", f"/engines/{one['id']}")
    assert store.blob(DIGEST).read_bytes() == BINARY


def test_a_build_needs_an_admin_token(client):
    assert client.get("/api/v1/engines").status_code == 401


def test_the_newest_build_is_the_one_offered_per_platform(tmp_path):
    path = tmp_path / "llama-server"
    for version in ("b5000", "b6000"):
        path.write_bytes(BINARY + version.encode())
        engines.engine_build_add_file(
            path=path, engine="llamacpp", version=version, actor="ops", now=clock.now()
        )
    offered = selectors.builds_offered()
    assert set(offered) == {this_platform()}
    ref = offered[this_platform()]["llamacpp"]
    assert ref.version == "b6000"
    assert ref.url.endswith(f"/api/v1/mirror/files/{ref.sha256}")
    assert selectors.build_for(engine="llamacpp", platform="linux-riscv64") is None
    assert selectors.build_for(engine="llamacpp", platform="") is None


def test_a_file_that_cannot_be_read_is_a_sentence(tmp_path):
    from llmgw.core.errors import Invalid

    with pytest.raises(Invalid, match="cannot be read"):
        engines.engine_build_add_file(
            path=tmp_path / "nope", engine="llamacpp", version="b1", actor="ops", now=clock.now()
        )


# A release of llmgw is checked at upload: a wheel holding the llmgw package at the version
# it is added as (mirror/domain/releases.py); anything else is refused, nothing kept.
def _release(api, admin_token, path, name=None, version="0.12.0"):
    return _upload(
        api, admin_token, data=path.read_bytes(), name=name or path.name, engine="llmgw",
        version=version,
    )  # fmt: skip


def test_a_wheel_of_llmgw_at_its_version_is_added_as_a_release(api, admin_token, tmp_path):
    response = _release(api, admin_token, wheel(tmp_path, "0.12.0"))
    assert response.status_code == 201, response.content
    assert (response.json()["engine"], response.json()["platform"]) == ("llmgw", "python-any")


@pytest.mark.parametrize(
    ("made", "name", "said"),
    [
        (
            {"files": {"evil/__init__.py": ""}},
            None,
            "llmgw-0.12.0-py3-none-any.whl does not hold the llmgw package (llmgw/__init__.py):"
            " an agent upgraded to it could not start again; nothing was kept.",
        ),
        ({"declared": "0.11.0"}, None, "holds llmgw 0.11.0, not 0.12.0; nothing was kept."),
        ({}, "release.zip", "release.zip is not named as a wheel of llmgw 0.12.0: a release"),
    ],
)
def test_a_release_that_is_not_llmgw_at_its_version_is_refused_and_nothing_kept(
    api, admin_token, mirror_dir, tmp_path, made, name, said
):
    response = _release(api, admin_token, wheel(tmp_path, "0.12.0", **made), name=name)
    assert response.status_code == 400, response.content
    assert said in detail(response)
    assert EngineBuild.objects.count() == 0
    assert _kept(mirror_dir) == []


def test_a_binary_uploaded_as_a_release_is_refused(api, admin_token, mirror_dir):
    response = _upload(api, admin_token, name="llmgw-0.12.0-py3-none-any.whl", engine="llmgw",
                       version="0.12.0")  # fmt: skip
    assert response.status_code == 400
    assert "is not a wheel: it is not a zip archive" in detail(response)
    assert _kept(mirror_dir) == []


CUT = b'--xx\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\nabc'


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", CUT),
        ("multipart/form-data; boundary=", CUT),
        ("multipart/form-data; boundary=xx", CUT),
        ("multipart/form-data; boundary=xx", b"\xff\xfe not a multipart body"),
    ],
    ids=["no boundary", "empty boundary", "cut short", "garbage"],
)
@pytest.mark.parametrize("who", ["token", "session"])
def test_a_malformed_multipart_upload_is_a_sentence_and_one_log_line(
    api, admin_token, admin_user, mirror_dir, caplog, content_type, body, who
):
    client, headers = api, {"HTTP_AUTHORIZATION": f"Bearer {admin_token}"}
    if who == "session":  # its CSRF check reads the body first
        client, headers = _csrf_session(admin_user)
    client.raise_request_exception = False
    response = client.generic("POST", "/api/v1/engines", body, content_type=content_type, **headers)
    assert response.status_code == 400, response.content
    assert "multipart upload" in detail(response)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].exc_info is None
    assert EngineBuild.objects.count() == 0
    assert _kept(mirror_dir) == []


def _csrf_session(user):
    """A browser's session, its CSRF checked as on the pages: cookie and header."""
    from django.middleware.csrf import _get_new_csrf_string
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    return client, {"HTTP_X_CSRFTOKEN": token}
