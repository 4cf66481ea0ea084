from django.contrib import admin

from .models import Measurement, Model, Profile


class ProfileInline(admin.StackedInline):
    model = Profile
    extra = 0


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
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
class MeasurementAdmin(admin.ModelAdmin):
    list_display = [
        "model",
        "profile",
        "max_concurrency",
        "tok_per_sec",
        "measured_at",
        "measured_by",
    ]
    list_select_related = ["model"]
