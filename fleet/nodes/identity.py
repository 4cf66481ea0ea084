"""Node identity: a join token makes a node's first registration; its own credential every one
after, as kubelet's bootstrap does.

The control plane keeps only the credential's SHA-256. A node id that has a credential
cannot be registered with a join token, so whoever holds the cluster's join token cannot
take another node's place; `node_forget` revokes it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from catalog.selectors import adapters_load, model_sources
from llmgw.core.errors import Invalid, NotFound, ServiceError
from llmgw.core.secrets import digest, new_secret
from mirror.selectors import file_sources, source_reads
from tenancy.models import Token
from tenancy.selectors import token_find
from tenancy.services import audit_record

from ..domain.endpoints import address_refusal
from ..models import Node, Replica, Shard
from .dispatch import Command, stop_command
from .figures import node_figures_refresh

log = logging.getLogger("llmgw.agents")

NODE_TOKEN_PREFIX = "llmgw_node_"
JOIN_WINDOW = timedelta(minutes=1)


class Refused(ServiceError):
    """This credential may not register this node (403); `reason` names the kind for metrics."""

    status = 403

    def __init__(self, sentence: str, reason: str) -> None:
        super().__init__(sentence)
        self.reason = reason


@dataclass(frozen=True)
class AgentCredential:
    """Who a connection's bearer is: one node's own credential, or a cluster join token."""

    node_id: str | None = None
    join_token: str = ""

    @property
    def joining(self) -> bool:
        return self.node_id is None


def agent_authenticate(*, secret: str) -> AgentCredential | None:
    """The credential this bearer secret is, else None (never saying which part was wrong)."""
    return agents_authenticate([secret])[0]


def agents_authenticate(secrets: list[str]) -> list[AgentCredential | None]:
    """agent_authenticate for each of many bearers, the nodes' own credentials found in one
    query: a fleet connecting again after a restart is 5,000 of them in a few seconds."""
    digests = {
        s: digest(s) for s in secrets if s and len(s) <= 200 and s.startswith(NODE_TOKEN_PREFIX)
    }
    nodes = dict(
        Node.objects.filter(credential_hash__in=set(digests.values())).values_list(
            "credential_hash", "id"
        )
        if digests
        else ()
    )
    found: list[AgentCredential | None] = []
    for secret in secrets:
        if secret in digests:
            node_id = nodes.get(digests[secret])
            found.append(AgentCredential(node_id=node_id) if node_id else None)
        elif not secret or len(secret) > 200 or secret.startswith(NODE_TOKEN_PREFIX):
            found.append(None)
        else:
            token = token_find(secret=secret, kind=Token.AGENT)
            found.append(AgentCredential(join_token=token.name) if token else None)
    return found


def mirror_refusal(*, secret: str, sha256: str) -> tuple[int, str] | None:
    """Why this bearer may not read the mirror file `sha256`, as (HTTP status, sentence);
    None when it may. Only a node's own credential reads files: an engine build any node,
    a file of weights only a node while a shard the control plane placed on it needs it
    (on its way to running, of a model that runs on the file: the one its source names, or
    any of the folder it names; no other file of the same weights), or the files of an
    adapter of a model whose engine is ready there, which it may be asked to load. What a
    node reported itself (an adopted shard) reads nothing: weights follow placements, not
    claims."""
    credential = agent_authenticate(secret=secret)
    if credential is None or credential.joining:
        return 401, "A node's own credential is needed: Authorization: Bearer <node credential>."
    sources = file_sources(sha256)
    if sources is None:
        return 404, f"The mirror holds no file with sha256 {sha256}."
    if not sources:
        return None
    models = Shard.objects.filter(
        node_id=credential.node_id,
        adopted_at__isnull=True,
        state__in=NEEDS_WEIGHTS,
        replica__state__in=NEEDS_WEIGHTS,
    ).values("replica__model")
    needed = list(model_sources(names=models).values())
    if source_reads(needed, sha256):  # the file a model runs on, or one of its folder's
        return None
    if source_reads(_adapter_sources(credential.node_id), sha256):
        return None
    return (
        403,
        f"Node {credential.node_id} was given no shard that needs the file {sha256} now.",
    )


def _adapter_sources(node_id: str) -> list[str]:
    """The sources of the adapters a replica with its engine ready on this node may be asked
    to load (its model's adapters, loaded through the shard serving HTTP, rank 0): the files
    its agent fetches before the engine loads one (docs/adapters.md)."""
    bases = set(
        Shard.objects.filter(
            node_id=node_id, adopted_at__isnull=True, rank=0, state="ready", replica__state="ready"
        ).values_list("replica__model", flat=True)
    )
    return [a.source for a in adapters_load().values() if a.base in bases] if bases else []


# The states of a shard, and of its replica, on the way to running: while its agent may
# still fetch the weights.
NEEDS_WEIGHTS = ("pending", "fetching", "starting")


def register_refusal(*, credential: AgentCredential, node_id: str, now: datetime) -> None:
    """Raise Refused when this credential may not register `node_id`: asked before the
    connection disturbs anything, and again inside the registration's transaction."""
    if not credential.joining:
        if credential.node_id != node_id:
            raise Refused(
                f"this connection's credential is node {credential.node_id}'s; "
                f"it cannot register node {node_id}",
                "wrong_node",
            )
        return
    if Node.objects.filter(pk=node_id, credential_hash__isnull=False).exists():
        raise Refused(
            f"node {node_id} has its own credential, and a join token cannot register it "
            f"again; an agent that lost its credential joins again once an operator runs "
            f"`llmgw ctl node forget {node_id}`",
            "node_has_credential",
        )
    limit = settings.LLMGW.agents.joins_per_minute
    recent = Node.objects.filter(
        joined_with=credential.join_token, credential_issued_at__gte=now - JOIN_WINDOW
    ).count()
    if recent >= limit:
        raise Refused(
            f"join token {credential.join_token!r} registered {recent} nodes in the last "
            f"minute, the most LLMGW_JOINS_PER_MINUTE ({limit}) allows; try again in a minute",
            "join_rate",
        )


def credential_issue(node: Node, *, credential: AgentCredential, now: datetime) -> str:
    """Give a joining node its own credential (the caller saves the node); the secret is
    returned to be sent once and is kept nowhere here."""
    secret = new_secret(NODE_TOKEN_PREFIX)
    node.credential_hash = digest(secret)
    node.credential_issued_at = now
    node.joined_with = credential.join_token
    log.info(
        "node %s joined with join token %r and was given its own credential",
        node.id,
        credential.join_token,
        extra={"node": node.id},
    )
    return secret


def node_address_refusal(node: Node) -> str:
    """Why the address `node` declares is not believed, from what its row holds (declared,
    seen and approved addresses) and LLMGW_TRUST_NODE_ADDRESSES; "" when it is."""
    why = address_refusal(
        node_id=node.id,
        declared=node.mgmt_addr,
        seen=node.seen_addr,
        approved=node.approved_addr,
        trust_declared=settings.LLMGW.agents.trust_declared_addresses,
    )
    return (why or "")[: Node._meta.get_field("address_refusal").max_length]


# An IP address (v4, or v6 with or without brackets) or a host name.
ADDRESS_RE = re.compile(r"^(\[?[0-9A-Fa-f:.]+\]?|[A-Za-z0-9]([A-Za-z0-9.-]{0,253}[A-Za-z0-9])?)$")


def node_approve(*, node_id: str, actor: str, address: str = "", now: datetime) -> str:
    """Let a node held by LLMGW_NODE_APPROVAL=manual into placement; with `address`, also
    believe that its engines are at that address (behind NAT or a proxy, where its
    connection comes from another). Invalid (400) for an address that is neither an IP
    address nor a host name; the sentence says what now holds."""
    address = address.strip()
    if address and not ADDRESS_RE.match(address):
        raise Invalid(
            f"{address[:100]!r} is not an address: give the IP address or host name the "
            "node's engines are reached at."
        )
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        if node is None:
            raise NotFound(f"There is no node {node_id!r}.")
        if node.approved and not address:
            if node.address_refusal:
                return node.address_refusal
            return f"node {node_id} is approved already"
        node.approved = True
        if address:
            node.approved_addr = address
            node.address_refusal = node_address_refusal(node)
        node.spec_at = now  # what placement knows of it is read again
        node.save(update_fields=["approved", "approved_addr", "address_refusal", "spec_at"])
        audit_record(
            actor=actor,
            action="node.approve",
            target=node_id,
            detail={"address": address} if address else None,
        )
    if node.address_refusal:
        return f"node {node_id} approved, but: {node.address_refusal}"
    where = f" with its engines at {address}" if address else ""
    return f"node {node_id} approved{where}: placement may use it from the next reconciler pass"


def node_forget(*, node_id: str, actor: str, now: datetime) -> tuple[str, list[Command]]:
    """Forget a node: revoke its credential, give up the replicas it ran and remove it.

    Returns the sentence and the stop commands for what its agent runs and for the other
    shards of replicas it was part of; the caller sends them, then closes its connection."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=node_id).first()
        if node is None:
            raise NotFound(f"There is no node {node_id!r}.")
        shards = list(Shard.objects.filter(node=node).values_list("id", "replica_id"))
        replicas = {replica for _, replica in shards}
        elsewhere = list(
            Shard.objects.filter(replica_id__in=replicas)
            .exclude(node=node)
            .values_list("node_id", "id", "replica__stop_grace_s")
        )
        Replica.objects.filter(pk__in=replicas).exclude(state__in=("stopped", "failed")).update(
            state="failed",
            state_since=now,
            reason=f"node {node_id} was forgotten by {actor}",
            counts_as_failure=False,
        )
        node.delete()
        node_figures_refresh(nodes={other for other, _, _ in elsewhere})
        audit_record(
            actor=actor, action="node.forget", target=node_id, detail={"replicas": sorted(replicas)}
        )
    commands = [stop_command(node_id, shard_id, 0) for shard_id, _ in shards]
    commands += [stop_command(other, shard_id, grace) for other, shard_id, grace in elsewhere]
    log.info("node %s forgotten by %s", node_id, actor, extra={"node": node_id})
    return (
        f"node {node_id} forgotten: its credential is revoked and {len(replicas)} replica(s) "
        f"it ran are given up; its agent can join again only with a join token",
        commands,
    )
