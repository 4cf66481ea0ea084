from django.contrib import admin

from .models import WeightFile


@admin.register(WeightFile)
class WeightFileAdmin(admin.ModelAdmin):
    list_display = ["source", "state", "size", "sha256", "last_used_at"]
    list_filter = ["state"]
    search_fields = ["source", "sha256"]
