"""The fleet in Django admin: to look at, not to change.

Nodes and GPUs are what agents report and replicas what the reconciler made;
an operator cordons, uncordons and drains through the API, which records who
did it, and the reconciler is the only one to start or stop a replica.
"""

from django.contrib import admin

from llmgw.core.admin import ViewOnly

from .models import DomainCondition, DomainHold, Gpu, Node, PowerBudget, Replica, Shard


class GpuInline(ViewOnly, admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: nodes are what their agents report; cordon, uncordon and drain with "
        "llmgw ctl node or the REST API (/api/v1/nodes/{id}/cordon), which record who did it."
    )
    list_display = [
        "id",
        "hostname",
        "state",
        "cordoned",
        "draining",
        "gpu_summary",
        "cpu_count",
        "memory",
        "agent_version",
        "last_seen",
    ]
    list_filter = ["state", "cordoned", "draining", "gpus__gpu_class"]
    search_fields = ["id", "hostname", "mgmt_addr"]
    inlines = [GpuInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpus")

    @admin.display(description="GPUs")
    def gpu_summary(self, obj) -> str:
        """`8 × h100-80g`, one part per class; `-` for a node without GPUs."""
        classes: dict[str, int] = {}
        for gpu in obj.gpus.all():
            classes[gpu.gpu_class or "unknown"] = classes.get(gpu.gpu_class or "unknown", 0) + 1
        return ", ".join(f"{n} × {c}" for c, n in classes.items()) or "-"

    @admin.display(description="memory", ordering="memory_total_mb")
    def memory(self, obj) -> str:
        if obj.memory_total_mb is None:
            return "-"
        return f"{obj.memory_total_mb / 1024:,.0f} GB"


class ShardInline(ViewOnly, admin.TabularInline):
    model = Shard
    extra = 0


@admin.register(Replica)
class ReplicaAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: the reconciler starts and stops replicas; replace a model's with "
        "llmgw ctl restart --model NAME."
    )
    list_display = [
        "id",
        "model",
        "profile",
        "state",
        "nodes",
        "retiring",
        "preempted_for",
        "created_at",
        "ready_at",
    ]
    list_filter = ["state", "retiring", "profile"]
    search_fields = ["id", "model", "shards__node__id"]
    inlines = [ShardInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("shards")

    @admin.display(description="nodes")
    def nodes(self, obj) -> str:
        return ", ".join(s.node_id for s in obj.shards.all()) or "-"


@admin.register(PowerBudget)
class PowerBudgetAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: set and clear budgets with llmgw ctl facility or the REST API "
        "(/api/v1/facility/budgets), which check them and record who did it."
    )
    list_display = ["kind", "name", "watts", "updated_by", "updated_at"]
    list_filter = ["kind"]
    search_fields = ["name"]


@admin.register(DomainCondition)
class DomainConditionAdmin(ViewOnly, admin.ModelAdmin):
    """Shown, never changed here: the reconciler writes conditions."""

    list_display = ("kind", "name", "condition", "since", "why", "read_at")
    list_filter = ("kind", "condition")
    search_fields = ("name",)


@admin.register(DomainHold)
class DomainHoldAdmin(ViewOnly, admin.ModelAdmin):
    """Shown, never changed here: holds are set and released through the API (audited)."""

    list_display = ("kind", "name", "held_by", "held_at", "reason")
    search_fields = ("name",)
