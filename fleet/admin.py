"""The fleet in Django admin: to look at, not to change.

Nodes and GPUs are what agents report and replicas what the reconciler made;
an operator cordons, uncordons and drains through the API, which records who
did it, and the reconciler is the only one to start or stop a replica.
"""

from django.contrib import admin

from catalog.admin import ViewOnly

from .models import Gpu, Node, Replica, Shard


class GpuInline(ViewOnly, admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: nodes are what their agents report; cordon, uncordon and drain with "
        "llmgw ctl node or the REST API (/api/v1/nodes/{id}/cordon), which record who did it."
    )
    list_display = ["id", "hostname", "state", "cordoned", "draining", "cpu_count", "last_seen"]
    list_filter = ["state", "cordoned", "draining"]
    search_fields = ["id", "hostname"]
    inlines = [GpuInline]


class ShardInline(ViewOnly, admin.TabularInline):
    model = Shard
    extra = 0


@admin.register(Replica)
class ReplicaAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: the reconciler starts and stops replicas; replace a model's with "
        "llmgw ctl restart --model NAME."
    )
    list_display = ["id", "model", "profile", "state", "created_at", "ready_at"]
    list_filter = ["state"]
    search_fields = ["id", "model"]
    inlines = [ShardInline]
