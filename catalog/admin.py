"""The catalog in Django admin: to look at, not to change.

Every change to a model goes through the catalog's one update path, which
re-validates the whole catalog and records who made it; an admin form would
write the rows behind its back.
"""

from django.contrib import admin

from llmgw.core.admin import ViewOnly
from tenancy.selectors import scope_tree

from .models import Adapter, Measurement, Model, Profile
from .selectors import spec_from_row


class ProfileInline(ViewOnly, admin.StackedInline):
    model = Profile
    extra = 0


class OwnerKind(admin.SimpleListFilter):
    """Shared models, or those owned by an organization, a team or a project."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        return [
            ("shared", "shared"),
            ("org", "an organization"),
            ("team", "a team"),
            ("project", "a project"),
        ]

    def queryset(self, request, queryset):
        if self.value() == "shared":
            return queryset.filter(owner="")
        if self.value() in ("org", "team", "project"):
            return queryset.filter(owner__startswith=f"{self.value()}:")
        return queryset


class Kind(admin.SimpleListFilter):
    """Always running (min ≥ 1) or on demand (min 0): what decides an unset class."""

    title = "runs"
    parameter_name = "runs"

    def lookups(self, request, model_admin):
        return [("always", "always (min ≥ 1)"), ("on-demand", "on demand (min 0)")]

    def queryset(self, request, queryset):
        if self.value() == "always":
            return queryset.filter(min_replicas__gte=1)
        if self.value() == "on-demand":
            return queryset.filter(min_replicas=0)
        return queryset


@admin.register(Model)
class ModelAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: change models with llmgw ctl or the REST API (/api/v1/models), "
        "which check the whole catalog and record who changed what; "
        "declared models are changed in the catalog file (LLMGW_CATALOG)."
    )
    list_filter = ["declared", "capacity_class", OwnerKind, Kind, "routing_profile"]
    search_fields = ["name", "description", "source", "owner"]
    inlines = [ProfileInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("profiles")

    def get_list_display(self, request):
        tree = None

        def owner(obj) -> str:
            """`team:7 (Acme / ml)`; the scope tree is read once per page, on first use."""
            nonlocal tree
            if not obj.owner:
                return "shared"
            if tree is None:
                tree = scope_tree()
            shown = tree.display(obj.owner)
            return obj.owner if shown == obj.owner else f"{obj.owner} ({shown})"

        owner.short_description = "owner"
        owner.admin_order_field = "owner"
        return [
            "name",
            "shown_class",
            owner,
            "replicas",
            "profile_names",
            "declared",
            "updated_at",
            "updated_by",
        ]

    @admin.display(description="class", ordering="capacity_class")
    def shown_class(self, obj) -> str:
        """The class set, or the one it gets by default, marked as such."""
        if obj.capacity_class:
            return obj.capacity_class
        return f"{spec_from_row(obj).effective_class} (default)"

    @admin.display(description="min–max", ordering="min_replicas")
    def replicas(self, obj) -> str:
        return f"{obj.min_replicas}–{obj.max_replicas}"

    @admin.display(description="profiles")
    def profile_names(self, obj) -> str:
        return ", ".join(p.name for p in obj.profiles.all()) or "-"


@admin.register(Measurement)
class MeasurementAdmin(ViewOnly, admin.ModelAdmin):
    description = "View only: measurements are what llmgw ctl bench --save found."
    list_display = [
        "model",
        "profile",
        "max_concurrency",
        "tok_per_sec",
        "measured_at",
        "measured_by",
    ]
    list_select_related = ["model"]
    list_filter = ["measured_by", "measured_at"]
    search_fields = ["model__name", "profile"]


@admin.register(Adapter)
class AdapterAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: add and remove adapters with llmgw ctl adapter or the REST API "
        "(/api/v1/adapters), which check them against their base model."
    )
    list_display = ["name", "base", "format", "rank", "owner", "created_at", "updated_by"]
    list_select_related = ["base"]
    list_filter = ["format"]
    search_fields = ["name", "base__name", "source", "owner"]
