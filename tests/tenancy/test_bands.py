"""Priority bands under overload on the tenancy side: a key's own or its project's, set
through the service (and REST, and `ctl key`), checked and audited."""

from __future__ import annotations

import pytest

from llmgw.core.errors import Invalid
from tenancy.models import ApiKey, AuditEvent
from tenancy.selectors import key_rows
from tenancy.services import api_key_create
from tenancy.services.bands import band_set
from tests.cli.conftest import server  # noqa: F401 - the ctl test's fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def project(scopes):
    return scopes("Acme/ml/chat", actor="t")["Acme/ml/chat"]


def bands_of_rows() -> dict[str, str]:
    return {row[1]: row[-1] for row in key_rows()}


def test_a_key_without_a_band_has_its_projects(project):
    api_key_create(project=project.pk, name="plain", actor="t")
    api_key_create(project=project.pk, name="urgent", band="high", actor="t")
    assert bands_of_rows() == {"plain": "normal", "urgent": "high"}
    band_set(scope="project:Acme/ml/chat", band="low", actor="ops")
    assert bands_of_rows() == {"plain": "low", "urgent": "high"}


def test_a_keys_band_set_empty_is_its_projects_again_and_each_change_is_audited(project):
    key, _ = api_key_create(project=project.pk, name="k", band="low", actor="t")
    assert band_set(scope=f"key:{key.pk}", band="HIGH ", actor="ops") == f"key:{key.pk}"
    assert ApiKey.objects.get(pk=key.pk).band == "high"
    band_set(scope=f"key:{key.pk}", band="", actor="ops")
    assert bands_of_rows() == {"k": "normal"}
    told = list(AuditEvent.objects.filter(action="band.set").values_list("target", "detail"))
    assert sorted(told, key=lambda t: t[1]["band"]) == [
        (f"key:{key.pk}", {"band": ""}),
        (f"key:{key.pk}", {"band": "high"}),
    ]


@pytest.mark.parametrize(
    ("scope", "band", "says"),
    [
        ("project:Acme/ml/chat", "urgent", "a band is low, normal, high; not 'urgent'"),
        ("project:Acme/ml/chat", "", "a band is low, normal, high; not ''"),
        ("team:Acme/ml", "high", "a band belongs to a key (key:ID) or a project, not team"),
        ("key:999", "high", "there is no API key '999'"),
    ],
)
def test_a_bad_band_or_scope_is_refused_and_changes_nothing(project, scope, band, says):
    with pytest.raises(Invalid, match=says.replace("(", r"\(").replace(")", r"\)")):
        band_set(scope=scope, band=band, actor="ops")
    assert not AuditEvent.objects.filter(action="band.set").exists()


def test_a_key_made_with_a_band_not_known_is_refused(project):
    with pytest.raises(Invalid, match="a band is low, normal, high, or empty"):
        api_key_create(project=project.pk, name="k", band="urgent", actor="t")


def test_the_api_sets_a_band_and_lists_it_with_the_key(api, project):
    made = api.call("POST", "/keys", {"project": "Acme/ml/chat", "name": "k"}).json()
    answer = api.call("PUT", "/bands", {"scope": f"key:{made['id']}", "band": "high"})
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"scope": f"key:{made['id']}", "band": "high"}
    keys = api.call("GET", "/keys").json()
    assert [k["band"] for k in keys] == ["high"]
    refused = api.call("PUT", "/bands", {"scope": "team:Acme/ml", "band": "high"})
    assert refused.status_code == 400


def test_ctl_key_makes_a_key_in_a_band_lists_it_and_moves_a_project(
    capsys,
    server,  # noqa: F811 - the fixture imported above
    project,
):
    from llmgw.cli import ctl

    def run(*argv: str) -> tuple[int, str, str]:
        code = ctl.main(list(argv), transport=server)
        out = capsys.readouterr()
        return code, out.out, out.err

    code, _, err = run("key", "create", "--project", "Acme/ml/chat", "--band", "low", "ci")
    assert (code, err) == (0, "")
    key = ApiKey.objects.get()
    assert key.band == "low"
    _, out, _ = run("key", "list")
    assert "BAND" in out.splitlines()[0] and " low " in out.splitlines()[1]
    code, out, _ = run("key", "band", "project:Acme/ml/chat", "high")
    assert (code, out) == (0, f"project:{project.pk} is in band high from the next refresh\n")
    code, out, _ = run("key", "band", f"key:{key.pk}", "")
    assert (code, out) == (0, f"key:{key.pk} is in band of its project from the next refresh\n")
    assert bands_of_rows() == {"ci": "high"}
