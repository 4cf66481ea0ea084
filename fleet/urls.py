"""The fleet pages (HTMX, staff only): the cluster at `/`, each node, the NVLink fabric;
views in fleet/console/views.py."""

from django.urls import path

from .console import views

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("fabric", views.fabric, name="fabric"),
    path("nodes/<str:node_id>", views.node, name="node"),
    path("replicas/<str:replica_id>/log", views.replica_log, name="replica-log"),
]
