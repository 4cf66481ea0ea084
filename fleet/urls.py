"""The fleet pages (HTMX, staff only): the cluster at `/` and each node; views in fleet/console/views.py."""

from django.urls import path

from .console import views

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("nodes/<str:node_id>", views.node, name="node"),
    path("replicas/<str:replica_id>/log", views.replica_log, name="replica-log"),
]
