from django.contrib import admin

from .models import WeightFile, Weights


class WeightFileInline(admin.TabularInline):
    model = WeightFile
    extra = 0
    fields = ["path", "state", "size", "bytes_done", "sha256", "detail"]
    readonly_fields = fields
    can_delete = False


@admin.register(Weights)
class WeightsAdmin(admin.ModelAdmin):
    list_display = ["source", "added_by", "added_at", "last_used_at"]
    search_fields = ["source", "files__sha256"]
    readonly_fields = ["source", "sha256", "revision", "added_by", "added_at", "last_used_at"]
    inlines = [WeightFileInline]
