from django.contrib import admin

from .models import ApiKey, AuditEvent, CapacityQuota, Organization, Project, Team, Token


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "org", "created_at"]
    list_filter = ["org"]
    search_fields = ["name", "org__name"]
    list_select_related = ["org"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "created_at"]
    list_filter = ["team__org"]
    search_fields = ["name", "team__name", "team__org__name"]
    list_select_related = ["team__org"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "prefix", "project", "revoked_at", "created_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "secret_hash", "created_at"]
    list_select_related = ["project__team__org"]


@admin.register(CapacityQuota)
class CapacityQuotaAdmin(admin.ModelAdmin):
    list_display = [
        "scope",
        "guarantee_gpus",
        "limit_gpus",
        "guarantee_cpu_cores",
        "limit_cpu_cores",
        "guarantee_memory_gb",
        "limit_memory_gb",
        "updated_by",
        "updated_at",
    ]
    search_fields = ["scope"]


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "prefix", "created_at", "revoked_at"]
    list_filter = ["kind"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "secret_hash", "created_at"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor", "action", "target"]
    list_filter = ["action"]
    search_fields = ["actor", "target"]

    def has_change_permission(self, request, obj=None):
        return False
