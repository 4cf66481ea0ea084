from django.contrib import admin

from .models import Gpu, Node, Replica, Shard


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["id", "hostname", "state", "cordoned", "draining", "cpu_count", "last_seen"]
    list_filter = ["state", "cordoned", "draining"]
    search_fields = ["id", "hostname"]
    inlines = [GpuInline]


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "profile", "state", "created_at", "ready_at"]
    list_filter = ["state"]
    search_fields = ["id", "model"]
    inlines = [ShardInline]
