"""Admin and agent tokens: made by `createtoken`, kept only as a hash, refused once revoked."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from channels.testing import WebsocketCommunicator
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client

from tenancy.models import Token
from tenancy.services import token_create, token_revoke

pytestmark = pytest.mark.django_db


def createtoken(*args: str) -> tuple[str, str]:
    out = StringIO()
    call_command("createtoken", *args, stdout=out)
    text = out.getvalue()
    return text, text.rstrip("\n").splitlines()[-1]


def nodes(secret: str):
    return Client().get("/api/v1/nodes", HTTP_AUTHORIZATION=f"Bearer {secret}")


def test_createtoken_prints_the_secret_alone_on_its_last_line_and_keeps_only_its_hash():
    text, secret = createtoken("ci-deploy")

    token = Token.objects.get()
    assert secret.startswith("llmgw_adm_") and " " not in secret
    assert (token.name, token.kind) == ("ci-deploy", Token.ADMIN)
    assert token.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in text.splitlines()[0]
    stored = [str(v) for v in Token.objects.values().get().values()]
    assert not any(secret in v for v in stored)
    assert secret.startswith(token.prefix)
    assert nodes(secret).status_code == 200


def test_each_token_is_new():
    _, first = createtoken("a")
    _, second = createtoken("a")

    assert first != second
    assert Token.objects.count() == 2


def test_createtoken_agent_makes_a_join_token_the_api_refuses():
    _, secret = createtoken("--agent", "rack-7")

    assert Token.objects.get().kind == Token.AGENT
    assert secret.startswith("llmgw_agt_")
    assert nodes(secret).status_code == 401


@pytest.mark.parametrize("name", ["   ", "x" * 101])
def test_createtoken_refuses_a_bad_name_with_a_sentence(name):
    with pytest.raises(CommandError, match="name"):
        createtoken(name)

    assert Token.objects.count() == 0


def test_a_revoked_admin_token_is_refused_as_if_it_never_existed():
    token, secret = token_create(name="old-ci")
    assert nodes(secret).status_code == 200

    token_revoke(token=token)

    revoked, unknown = nodes(secret), nodes("llmgw_adm_never-made")
    assert revoked.status_code == unknown.status_code == 401
    assert revoked.json() == unknown.json()


async def agent_connects(secret: str) -> bool:
    from llmgw.asgi import application

    comm = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"authorization", f"Bearer {secret}".encode())]
    )
    connected, _ = await comm.connect(timeout=5)
    if connected:
        await comm.disconnect()
    return connected


@pytest.mark.django_db(transaction=True)
async def test_an_agent_token_joins_the_websocket_until_it_is_revoked():
    from asgiref.sync import sync_to_async

    token, secret = await sync_to_async(token_create)(name="rack-7", kind=Token.AGENT)
    try:
        assert await agent_connects(secret)

        await sync_to_async(token_revoke)(token=token)

        assert not await agent_connects(secret)
    finally:
        # The database thread's connection would keep the test database from being dropped.
        await sync_to_async(connections.close_all)()
