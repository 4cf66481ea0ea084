"""Nodes, replicas and the reconciler over REST."""

from __future__ import annotations

from ninja import Router

from llmgw.api import actor

from . import selectors, services
from .reconciler import reconcile_once
from .schemas import DetailOut, NodeOut, ReconcileOut, ReplicaOut

router = Router(tags=["fleet"])


@router.get("/nodes", response=list[NodeOut])
def nodes_list(request):
    return selectors.nodes_list()


@router.get("/nodes/{node_id}", response=NodeOut)
def node_get(request, node_id: str):
    return selectors.nodes_list(node_id=node_id)[0]


def _schedule(request, node_id: str, action: str) -> dict:
    return {
        "detail": services.node_set_schedule(node_id=node_id, action=action, actor=actor(request))
    }


@router.post("/nodes/{node_id}/cordon", response=DetailOut)
def node_cordon(request, node_id: str):
    return _schedule(request, node_id, "cordon")


@router.post("/nodes/{node_id}/uncordon", response=DetailOut)
def node_uncordon(request, node_id: str):
    return _schedule(request, node_id, "uncordon")


@router.post("/nodes/{node_id}/drain", response=DetailOut)
def node_drain(request, node_id: str):
    return _schedule(request, node_id, "drain")


@router.get("/replicas", response=list[ReplicaOut])
def replicas_list(request, model: str | None = None):
    return selectors.replicas_list(model=model or None)


@router.post("/reconcile", response=ReconcileOut)
def reconcile(request):
    """Run one pass now and answer what it did."""
    return reconcile_once()
