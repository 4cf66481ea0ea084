"""The audit trail in Django admin: who changed what, to read and never to edit."""

from __future__ import annotations

from django.contrib import admin

from llmgw.core.admin import ViewOnly
from tenancy.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: the record of who changed what; nobody adds to it or edits it by hand."
    )
    list_display = ["at", "actor", "token", "action", "target"]
    list_filter = ["action", "at"]
    search_fields = ["actor", "token", "target", "action"]
