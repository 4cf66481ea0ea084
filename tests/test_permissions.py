"""Staff is not superuser: each action of the REST API and the console needs the Django
permission of the model it touches, and the built-in groups hold them.

For each family of actions: a staff user with no permissions is refused (403, with the
sentence naming the permission), a viewer may read but not change, an operator may
change, and a superuser and an admin token may do everything.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.test import Client

from catalog.models import Model
from fleet.models import Event, Gpu, Node, PowerBudget
from llmgw.api import api
from llmgw.core import clock
from llmgw.core.permissions import OPERATORS, RELEASE_MANAGERS, VIEWERS
from mirror.models import EngineBuild, WeightFile, Weights
from tenancy.auth import StaffSession
from tenancy.models import ApiKey, CapacityQuota, Organization
from tenancy.services import org_create, project_create, team_create
from tests.catalog.test_pages import add_form
from tests.fleet.builders import gpu_model, model_added
from tests.helpers import detail

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(db):
    """One of everything the actions touch."""
    now = clock.now()
    Node.objects.create(id="gpu-a", state_since=now, registered_at=now, last_seen=now)
    Gpu.objects.create(node_id="gpu-a", index=0, gpu_class="h100-80g")
    model_added(gpu_model("llama"))
    org_create(name="Acme", actor="test")
    team_create(org="Acme", name="ml", actor="test")
    project_create(team="Acme/ml", name="chat", actor="test")
    weights = Weights.objects.create(source="hf://acme/w", added_by="test", added_at=now)
    WeightFile.objects.create(
        weights=weights, path="w.gguf", fetch_url="https://acme/w.gguf", state="failed",
        detail="the hub said 404",
    )  # fmt: skip
    EngineBuild.objects.create(
        engine="llamacpp", version="b1", platform="linux-x86_64", sha256="0" * 64, size=1,
        added_by="test", added_at=now,
    )  # fmt: skip


def session(django_user_model, name: str, *, group: str | None = None, superuser=False):
    """A browser logged in as a staff user, in `group` when given."""
    user = django_user_model.objects.create_user(
        name, password="x", is_staff=True, is_superuser=superuser
    )
    if group:
        user.groups.add(Group.objects.get(name=group))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def nobody(django_user_model):
    return session(django_user_model, "nobody")


@pytest.fixture
def viewer(django_user_model):
    return session(django_user_model, "vera", group=VIEWERS)


@pytest.fixture
def operator(django_user_model):
    return session(django_user_model, "otto", group=OPERATORS)


@pytest.fixture
def root(django_user_model):
    return session(django_user_model, "root", superuser=True)


@dataclass(frozen=True)
class Family:
    """A family of API actions: one that reads, one that changes, and how to see the change."""

    name: str
    read: str
    read_perm: str
    change: tuple[str, str, dict | None]
    change_perm: str
    changed: Callable[[], bool]

    def __str__(self) -> str:
        return self.name


API = [
    Family(
        "nodes",
        "/nodes",
        "fleet.view_node",
        ("post", "/nodes/gpu-a/cordon", None),
        "fleet.change_node",
        lambda: Node.objects.get(pk="gpu-a").cordoned,
    ),
    Family(
        "GPUs",
        "/fabric",
        "fleet.view_node",
        ("post", "/nodes/gpu-a/gpus/0/cordon", None),
        "fleet.change_node",
        lambda: Gpu.objects.get(node="gpu-a", index=0).cordoned,
    ),
    Family(
        "models",
        "/models",
        "catalog.view_model",
        ("post", "/models/llama/scale", {"max": 3}),
        "catalog.change_model",
        lambda: Model.objects.get(name="llama").max_replicas == 3,
    ),
    Family(
        "adding models",
        "/models/llama",
        "catalog.view_model",
        ("post", "/models", gpu_model("mistral")),
        "catalog.add_model",
        lambda: Model.objects.filter(name="mistral").exists(),
    ),
    Family(
        "replicas",
        "/replicas",
        "fleet.view_replica",
        ("post", "/models/llama/restart", None),
        "fleet.change_replica",
        lambda: (
            __import__("tenancy.models")
            .models.AuditEvent.objects.filter(action="model.restart")
            .exists()
        ),
    ),
    Family(
        "keys",
        "/keys",
        "tenancy.view_apikey",
        ("post", "/keys", {"project": "Acme/ml/chat", "name": "bot"}),
        "tenancy.add_apikey",
        lambda: ApiKey.objects.filter(name="bot").exists(),
    ),
    Family(
        "quotas",
        "/quotas",
        "tenancy.view_capacityquota",
        ("put", "/quotas", {"scope": "org:Acme", "limit": {"gpus": 4}}),
        "tenancy.change_capacityquota",
        lambda: CapacityQuota.objects.exists(),
    ),
    Family(
        "power budgets",
        "/facility",
        "fleet.view_powerbudget",
        ("put", "/facility/budgets", {"kind": "rack", "name": "r1", "watts": 16000}),
        "fleet.change_powerbudget",
        lambda: PowerBudget.objects.exists(),
    ),
    Family(
        "organizations",
        "/orgs",
        "tenancy.view_organization",
        ("post", "/orgs", {"name": "Globex"}),
        "tenancy.add_organization",
        lambda: Organization.objects.filter(name="Globex").exists(),
    ),
    Family(
        "weights",
        "/weights",
        "mirror.view_weights",
        ("delete", "/weights/{weights}", None),
        "mirror.delete_weights",
        lambda: not Weights.objects.exists(),
    ),
    Family(
        "engine builds",
        "/engines",
        "mirror.view_enginebuild",
        ("delete", "/engines/{build}", None),
        "mirror.delete_enginebuild",
        lambda: not EngineBuild.objects.exists(),
    ),
]


def call(client: Client, method: str, path: str, body=None, **headers):
    path = path.format(weights=_pk(Weights), build=_pk(EngineBuild))
    kwargs = dict(headers)
    if body is not None:
        kwargs |= {"data": json.dumps(body), "content_type": "application/json"}
    return getattr(client, method)(f"/api/v1{path}", **kwargs)


def _pk(model) -> int:
    row = model.objects.first()
    return row.pk if row else 0


def refused(response, perm: str) -> str:
    assert response.status_code == 403, response.content
    sentence = detail(response)
    assert perm in sentence
    return sentence


@pytest.mark.parametrize("family", API, ids=str)
def test_a_staff_user_without_permissions_may_neither_read_nor_change(world, nobody, family):
    sentence = refused(call(nobody, "get", family.read), family.read_perm)
    assert sentence.startswith("nobody may not see ")
    assert "the viewers and operators groups have it" in sentence

    sentence = refused(call(nobody, *family.change), family.change_perm)
    assert "the operators group has it" in sentence
    assert not family.changed()


@pytest.mark.parametrize("family", API, ids=str)
def test_a_viewer_reads_but_may_not_change(world, viewer, family):
    assert call(viewer, "get", family.read).status_code == 200

    refused(call(viewer, *family.change), family.change_perm)
    assert not family.changed()


@pytest.mark.parametrize("family", API, ids=str)
def test_an_operator_reads_and_changes(world, operator, family):
    assert call(operator, "get", family.read).status_code == 200

    response = call(operator, *family.change)

    assert response.status_code < 300, response.content
    assert family.changed()


@pytest.mark.parametrize("family", API, ids=str)
def test_a_superuser_changes_anything(world, root, family):
    assert call(root, *family.change).status_code < 300
    assert family.changed()


@pytest.mark.parametrize("family", API, ids=str)
def test_an_admin_token_changes_anything(world, admin_token, family):
    response = call(Client(), *family.change, HTTP_AUTHORIZATION=f"Bearer {admin_token}")

    assert response.status_code < 300, response.content
    assert family.changed()


def test_the_refusal_says_who_what_and_which_permission(world, viewer):
    response = call(viewer, "post", "/nodes/gpu-a/drain")

    assert detail(response) == (
        "vera may not change nodes: that needs the fleet.change_node permission "
        "(the operators group has it)."
    )


def operations():
    for _, router in api._routers:
        for path, view in router.path_operations.items():
            for op in view.operations:
                yield path, op


def test_every_api_operation_names_the_permissions_a_session_needs():
    unnamed, unknown = [], []
    for path, op in operations():
        sessions = [a for a in op.auth_callbacks if isinstance(a, StaffSession)]
        perms = [p for s in sessions for p in s.perms]
        if not perms:
            unnamed.append(f"{op.methods} {path}")
        for perm in perms:
            label, codename = perm.split(".")
            if not Permission.objects.filter(
                content_type__app_label=label, codename=codename
            ).exists():
                unknown.append(perm)
    assert unnamed == [] and unknown == []


def test_an_operation_naming_no_permission_is_for_superusers(rf, django_user_model):
    request = rf.get("/api/v1/x")
    request.user = django_user_model.objects.create_user("otto", is_staff=True)
    with pytest.raises(Exception, match="otto may not make this call: it is for superusers."):
        StaffSession().authenticate(request, None)


def test_the_groups_hold_the_permissions_of_llmgws_apps_but_not_admin_tokens():
    def held(name: str) -> set[str]:
        return {
            f"{p.content_type.app_label}.{p.codename}"
            for p in Group.objects.get(name=name).permissions.select_related("content_type")
        }

    viewers, operators = held(VIEWERS), held(OPERATORS)
    every = {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(
            content_type__app_label__in=["tenancy", "catalog", "fleet", "mirror"]
        ).select_related("content_type")
    }
    tokens = {p for p in every if p.endswith("_token") and p.startswith("tenancy.")}
    assert tokens == {f"tenancy.{a}_token" for a in ("add", "change", "delete", "view")}
    assert operators == every - tokens - set(PUSH)
    assert viewers == {p for p in operators if ".view_" in p}
    assert {"fleet.view_node", "tenancy.view_apikey", "mirror.view_weights"} <= viewers
    assert {"fleet.change_node", "tenancy.add_apikey", "catalog.delete_model"} <= operators


def test_a_migrate_gives_a_group_back_what_it_lost_and_keeps_what_was_added():
    viewers = Group.objects.get(name=VIEWERS)
    view_node = Permission.objects.get(content_type__app_label="fleet", codename="view_node")
    add_user = Permission.objects.get(content_type__app_label="auth", codename="add_user")
    viewers.permissions.remove(view_node)
    viewers.permissions.add(add_user)

    call_command("migrate", verbosity=0, interactive=False)

    assert {view_node, add_user} <= set(viewers.permissions.all())


@dataclass(frozen=True)
class PageFamily:
    """A page, the form on it that changes something, and the element only those who may
    use that form are shown."""

    name: str
    path: str
    read_perm: str
    form: dict
    change_perm: str
    shown: str
    changed: Callable[[], bool]

    def __str__(self) -> str:
        return self.name


def _restarted() -> bool:
    from tenancy.models import AuditEvent

    return AuditEvent.objects.filter(action="model.restart").exists()


PAGES = [
    PageFamily(
        "node",
        "/nodes/gpu-a",
        "fleet.view_node",
        {"action": "cordon"},
        "fleet.change_node",
        'id="cordon-button"',
        lambda: Node.objects.get(pk="gpu-a").cordoned,
    ),
    PageFamily(
        "model",
        "/models/llama",
        "catalog.view_model",
        {"form": "scale", "max": "3"},
        "catalog.change_model",
        'id="scale-form"',
        lambda: Model.objects.get(name="llama").max_replicas == 3,
    ),
    PageFamily(
        "replicas",
        "/models/llama",
        "catalog.view_model",
        {"form": "restart"},
        "fleet.change_replica",
        'id="restart-form"',
        _restarted,
    ),
    PageFamily(
        "models",
        "/models",
        "catalog.view_model",
        add_form(),
        "catalog.add_model",
        'id="model-add-form"',
        lambda: Model.objects.filter(name="mistral").exists(),
    ),
    PageFamily(
        "quotas",
        "/quotas",
        "tenancy.view_capacityquota",
        {"form": "set", "scope": "org:Acme", "limit_gpus": "4"},
        "tenancy.change_capacityquota",
        'id="quota-form"',
        lambda: CapacityQuota.objects.exists(),
    ),
    PageFamily(
        "mirror",
        "/mirror?state=failed",
        "mirror.view_weights",
        {"form": "remove", "weights": "{weights}"},
        "mirror.delete_weights",
        "data-remove=",
        lambda: not Weights.objects.exists(),
    ),
]


def post(client: Client, family: PageFamily, **headers):
    form = {k: v.format(weights=_pk(Weights)) for k, v in family.form.items()}
    return client.post(family.path, form, **headers)


def page_refused(response, perm: str) -> None:
    assert response.status_code == 403
    body = response.content.decode()
    assert perm in body and 'id="refused"' in body


@pytest.mark.parametrize("family", PAGES, ids=str)
def test_a_staff_user_without_permissions_is_refused_the_page_and_its_form(world, nobody, family):
    page_refused(nobody.get(family.path), family.read_perm)
    page_refused(nobody.get(family.path, HTTP_HX_REQUEST="true"), family.read_perm)
    assert post(nobody, family).status_code == 403
    assert not family.changed()


@pytest.mark.parametrize("family", PAGES, ids=str)
def test_a_viewer_sees_the_page_without_the_form_and_its_post_is_refused(world, viewer, family):
    page = viewer.get(family.path)
    assert page.status_code == 200
    assert family.shown not in page.content.decode()

    page_refused(post(viewer, family), family.change_perm)
    page_refused(post(viewer, family, HTTP_HX_REQUEST="true"), family.change_perm)
    assert not family.changed()


@pytest.mark.parametrize("family", PAGES, ids=str)
def test_an_operator_sees_the_form_and_uses_it(world, operator, family):
    assert family.shown in operator.get(family.path).content.decode()

    assert post(operator, family).status_code in (200, 302)
    assert family.changed()


@pytest.mark.parametrize("family", PAGES, ids=str)
def test_a_superuser_sees_the_form_and_uses_it(world, root, family):
    assert family.shown in root.get(family.path).content.decode()

    assert post(root, family).status_code in (200, 302)
    assert family.changed()


@pytest.mark.parametrize(
    ("path", "perm"),
    [
        ("/", "fleet.view_node"),
        ("/scopes?q=acme", "tenancy.view_organization"),
        ("/replicas/r-1/log", "fleet.view_replica"),
        ("/fabric", "fleet.view_node"),
    ],
)
def test_the_other_pages_need_their_view_permission_too(world, nobody, viewer, path, perm):
    page_refused(nobody.get(path), perm)
    assert viewer.get(path).status_code == 200


@pytest.mark.parametrize("what", ["preemption", "defrag"])
def test_a_models_dry_runs_need_its_view_permission(world, nobody, viewer, what):
    refused(call(nobody, "get", f"/models/llama/{what}"), "catalog.view_model")
    assert call(viewer, "get", f"/models/llama/{what}").status_code == 200


# Pushing code to nodes: an engine build or an llmgw release runs as the agent's user on
# every node, so adding one and upgrading nodes need permissions of their own, which the
# operators group does not hold (issue 35, item 4).
PUSH = ("mirror.push_enginebuild", "fleet.upgrade_node")


@pytest.fixture
def release_manager(django_user_model):
    return session(django_user_model, "rita", group=RELEASE_MANAGERS)


def _upload_build(client: Client, **headers):
    from django.core.files.uploadedfile import SimpleUploadedFile

    body = {"engine": "llamacpp", "version": "b2", "platform": "linux-x86_64"}
    body["file"] = SimpleUploadedFile("llama-server", b"#!/bin/sh\nid > /tmp/owned\n")
    return client.post("/api/v1/engines", body, **headers)


def _ask_upgrade(client: Client, **headers):
    return call(client, "post", "/nodes/gpu-a/upgrade", {"version": "b1"}, **headers)


def _ask_release(client: Client, **headers):
    return call(client, "post", "/releases", {"version": "b1"}, **headers)


@pytest.fixture
def pushable(world, settings, tmp_path):
    """A connected node and a release in the mirror to upgrade it to."""
    from dataclasses import replace

    settings.LLMGW = replace(settings.LLMGW, mirror=replace(settings.LLMGW.mirror, dir=tmp_path))
    EngineBuild.objects.update(engine="llmgw", platform="python-any")
    Node.objects.filter(pk="gpu-a").update(state=Node.READY, session="s-1")


def test_an_operator_may_neither_push_a_build_nor_upgrade_a_node(pushable, operator):
    sentence = refused(_upload_build(operator), "mirror.push_enginebuild")
    assert sentence == (
        "otto may not push engine builds: that needs the mirror.push_enginebuild permission "
        "(the release managers group has it)."
    )
    assert EngineBuild.objects.count() == 1
    sentence = refused(_ask_upgrade(operator), "fleet.upgrade_node")
    assert sentence == (
        "otto may not upgrade nodes: that needs the fleet.upgrade_node permission "
        "(the release managers group has it)."
    )
    refused(_ask_release(operator), "fleet.upgrade_node")
    assert not Event.objects.filter(kind="upgrade").exists()


def test_a_release_manager_pushes_builds_and_upgrades_nodes(pushable, release_manager):
    assert _upload_build(release_manager).status_code == 201
    assert EngineBuild.objects.count() == 2
    assert _ask_release(release_manager).json()["version"] == "b1"
    assert _ask_upgrade(release_manager).status_code == 200
    assert Event.objects.filter(kind="upgrade").exists()


@pytest.mark.parametrize("who", ["superuser", "admin token"])
def test_a_superuser_and_an_admin_token_push(pushable, root, admin_token, who):
    client, headers = root, {}
    if who == "admin token":
        client, headers = Client(), {"HTTP_AUTHORIZATION": f"Bearer {admin_token}"}
    assert _upload_build(client, **headers).status_code == 201
    assert _ask_upgrade(client, **headers).status_code == 200


def test_only_the_release_managers_group_holds_the_permissions_to_push():
    def held(name: str) -> set[str]:
        return {
            f"{p.content_type.app_label}.{p.codename}"
            for p in Group.objects.get(name=name).permissions.select_related("content_type")
        }

    assert held(RELEASE_MANAGERS) == set(PUSH)
    assert not set(PUSH) & held(OPERATORS)
    assert not set(PUSH) & held(VIEWERS)


def test_the_permission_uploads_needed_before_is_deleted_from_the_operators_group():
    """`add_enginebuild` was what uploads needed; an operators group holding it would read
    as if it still could (mirror's migration 0004 deletes it)."""
    from importlib import import_module
    from types import SimpleNamespace

    from django.apps import apps
    from django.contrib.contenttypes.models import ContentType
    from django.db import connection

    migration = import_module("mirror.migrations.0004_engine_build_push_permission")
    kind = ContentType.objects.get_for_model(EngineBuild)
    old = Permission.objects.create(content_type=kind, codename="add_enginebuild", name="Can add")
    Group.objects.get(name=OPERATORS).permissions.add(old)

    migration.stale_delete(apps, SimpleNamespace(connection=connection))

    assert set(kind.permission_set.values_list("codename", flat=True)) == {
        "push_enginebuild", "view_enginebuild", "delete_enginebuild",
    }  # fmt: skip


def test_no_admin_page_or_console_form_pushes_code(operator):
    """Engine builds and releases are added, and nodes upgraded, only through the REST API,
    which checks the permission; admin shows nodes read-only and no engine builds."""
    from django.contrib import admin

    assert EngineBuild not in admin.site._registry
    assert operator.get("/admin/mirror/enginebuild/").status_code == 404
    assert not admin.site._registry[Node].has_change_permission(_request_of("root"))


def _request_of(name: str):
    from django.contrib.auth import get_user_model
    from django.test import RequestFactory

    request = RequestFactory().get("/admin/")
    request.user = get_user_model().objects.create_superuser(name, password="x")
    return request
