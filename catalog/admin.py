"""The catalog in Django admin: to look at, not to change.

Every change to a model goes through the catalog's one update path, which
re-validates the whole catalog and records who made it; an admin form would
write the rows behind its back.
"""

from django.contrib import admin

from .models import Measurement, Model, Profile


class ViewOnly:
    """No add, change or delete: the admin shows rows, the API and `llmgw ctl` change them."""

    # Changes go elsewhere; the sentence on the list page says where.
    description = ""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        extra = {"subtitle": self.description, **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)


class ProfileInline(ViewOnly, admin.StackedInline):
    model = Profile
    extra = 0


@admin.register(Model)
class ModelAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: change models with llmgw ctl or the REST API (/api/v1/models), "
        "which check the whole catalog and record who changed what; "
        "declared models are changed in the catalog file (LLMGW_CATALOG)."
    )
    list_display = [
        "name",
        "min_replicas",
        "max_replicas",
        "capacity_class",
        "owner",
        "declared",
        "updated_by",
    ]
    list_filter = ["declared", "capacity_class"]
    search_fields = ["name", "description", "source"]
    inlines = [ProfileInline]


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
