"""The admin's one shape for every app: rows to look at, not to change.

Every change goes through an app's services, which validate it and record who made it; an
admin form would write the rows behind their backs. Each app's admin mixes this in.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse


class ViewOnly:
    """No add, change or delete: the admin shows rows, the API and `llmgw ctl` change them."""

    # Changes go elsewhere; the sentence on the list page says where.
    description = ""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Said under the heading (templates/admin/change_list.html), not as the subtitle,
        # which the admin also puts in the page's <title>.
        extra = {"view_only_said": self.description, **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)  # type: ignore[misc]  # a mixin of ModelAdmin
