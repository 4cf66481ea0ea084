"""Capacity quotas and scope limits in Django admin: the rows kept per scope.

Each is set and cleared through its tenancy service (quota_set and quota_clear,
limit_set and limit_clear), which record who changed it; a scope is named as people
write it and shown by its path in the tree.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin

from llmgw.core.errors import Invalid
from tenancy.models import CapacityQuota, ScopeLimit
from tenancy.quota import RESOURCES
from tenancy.selectors import scope_find, scope_tree
from tenancy.services import limit_clear, limit_figures, limit_set, quota_clear, quota_set

from .actor import who

# The largest figure a quota column holds on every backend (PostgreSQL's integer).
LARGEST = 2**31 - 1

RESOURCE_WORDS = {"gpus": "GPUs", "cpu_cores": "CPU cores", "memory_gb": "memory GB"}


class ScopedForm(forms.ModelForm):
    """A form naming a scope of the tenancy tree, by path or ID, never guessed."""

    def clean_scope(self) -> str:
        try:
            return scope_find(self.cleaned_data.get("scope") or "")
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None


class QuotaForm(ScopedForm):
    """A scope named as people write it (`team:Acme/ml` or `team:7`) and each resource's
    guarantee and limit; a guarantee above its limit is refused beside it."""

    class Meta:
        model = CapacityQuota
        fields = [
            "scope",
            *(f"guarantee_{r}" for r in RESOURCES),
            *(f"limit_{r}" for r in RESOURCES),
        ]
        help_texts = {"scope": "org:Acme, team:Acme/ml, project:Acme/ml/training, or team:7."}

    def clean(self):
        cleaned = super().clean()
        figures = [cleaned.get(f"{side}_{r}") for side in ("guarantee", "limit") for r in RESOURCES]
        if all(f is None for f in figures) and not self.errors:
            raise forms.ValidationError(
                "A quota needs a guarantee or a limit; to remove one, delete it."
            )
        for field in [f"{side}_{r}" for side in ("guarantee", "limit") for r in RESOURCES]:
            if (cleaned.get(field) or 0) > LARGEST:
                self.add_error(field, f"At most {LARGEST:,}.")
                cleaned[field] = None
        for r in RESOURCES:
            g, lim = cleaned.get(f"guarantee_{r}"), cleaned.get(f"limit_{r}")
            if g is not None and lim is not None and g > lim:
                self.add_error(
                    f"guarantee_{r}",
                    f"The guarantee of {RESOURCE_WORDS[r]} ({g}) is above its limit ({lim}).",
                )
        return cleaned


def _figures(obj: CapacityQuota, resource: str) -> str:
    """`4 (≤ 8)`: the guarantee and, in brackets, the limit; `-` for what is not governed."""
    g, lim = getattr(obj, f"guarantee_{resource}"), getattr(obj, f"limit_{resource}")
    if g is None and lim is None:
        return "-"
    shown = "-" if g is None else f"{g:,}"
    return shown if lim is None else f"{shown} (≤ {lim:,})"


class ScopedAdmin(admin.ModelAdmin):
    """What the admin of rows kept per scope (quotas, limits) shares: names and search."""

    search_fields = ["scope"]
    list_filter = ["updated_by", "updated_at"]

    @staticmethod
    def scope_name_column():
        tree = None

        def name(obj) -> str:
            nonlocal tree
            tree = tree or scope_tree()  # three queries for the whole page, on first use
            return tree.display(obj.scope)

        name.short_description = "name"
        return name

    def get_search_results(self, request, queryset, search_term):
        """Scopes by key (`team:7`) and by path (`acme/ml`), without case."""
        found, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().casefold()
        if term:
            tree = scope_tree()
            keys = [k for k in tree.names if term in tree.names[k].casefold()]
            found = found | queryset.filter(scope__in=keys)
        return found, duplicates

    def get_readonly_fields(self, request, obj=None):
        return ["scope", "updated_by", "updated_at"] if obj is not None else []

    clear: Callable[..., str]  # each admin's service that removes a scope's row

    def saved_as(self, obj, key: str) -> None:
        """`obj` as the service saved it, for the admin's message and redirect."""
        saved = type(obj).objects.get(scope=key)
        obj.pk, obj.updated_at, obj.updated_by = saved.pk, saved.updated_at, saved.updated_by

    def delete_model(self, request, obj):
        self.clear(scope=obj.scope, actor=who(request))

    def delete_queryset(self, request, queryset):
        for row in queryset:
            self.clear(scope=row.scope, actor=who(request))


@admin.register(CapacityQuota)
class CapacityQuotaAdmin(ScopedAdmin):
    """Each quota on one line, guaranteed (≤ limit) per resource, set and cleared through the
    quota services, which record who changed it."""

    form = QuotaForm
    clear = staticmethod(quota_clear)
    fieldsets = [
        (None, {"fields": ["scope"]}),
        ("Guarantee", {"fields": [f"guarantee_{r}" for r in RESOURCES]}),
        ("Limit", {"fields": [f"limit_{r}" for r in RESOURCES]}),
    ]

    def get_list_display(self, request):
        name = self.scope_name_column()
        return [
            "scope",
            name,
            "gpus",
            "cpu_cores",
            "memory_gb",
            "updated_by",
            "updated_at",
        ]

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is not None:
            fieldsets = [*fieldsets, ("Changed", {"fields": ["updated_by", "updated_at"]})]
        return fieldsets

    @admin.display(description="GPUs")
    def gpus(self, obj) -> str:
        return _figures(obj, "gpus")

    @admin.display(description="CPU cores")
    def cpu_cores(self, obj) -> str:
        return _figures(obj, "cpu_cores")

    @admin.display(description="memory GB")
    def memory_gb(self, obj) -> str:
        return _figures(obj, "memory_gb")

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        key = quota_set(
            scope=obj.scope,
            guarantee={r: data.get(f"guarantee_{r}") for r in RESOURCES},
            limit={r: data.get(f"limit_{r}") for r in RESOURCES},
            actor=who(request),
        )
        self.saved_as(obj, key)


class ScopeLimitForm(ScopedForm):
    """A scope named as people write it and its requests and tokens per minute, checked as
    the limit service checks them, each refusal beside its field."""

    class Meta:
        model = ScopeLimit
        fields = ["scope", "requests_per_minute", "tokens_per_minute"]
        help_texts = {
            "scope": "org:Acme, team:Acme/ml, project:Acme/ml/training, or team:7.",
            "requests_per_minute": "Left empty: not limited.",
            "tokens_per_minute": "Left empty: not limited.",
        }

    def clean(self):
        cleaned = super().clean()
        for field in ("requests_per_minute", "tokens_per_minute"):
            try:
                limit_figures({field: cleaned.get(field)})
            except Invalid as exc:
                self.add_error(field, str(exc))
                cleaned[field] = None
        figures = [cleaned.get(f) for f in ("requests_per_minute", "tokens_per_minute")]
        if all(f is None for f in figures) and not self.errors:
            raise forms.ValidationError(
                "a limit needs requests_per_minute or tokens_per_minute; to remove one, delete it."
            )
        return cleaned


@admin.register(ScopeLimit)
class ScopeLimitAdmin(ScopedAdmin):
    """Each scope's requests and tokens per minute on one line, set and cleared through the
    limit services, which record who changed them."""

    form = ScopeLimitForm
    clear = staticmethod(limit_clear)

    def get_list_display(self, request):
        name = self.scope_name_column()
        return ["scope", name, "requests", "tokens", "updated_by", "updated_at"]

    def get_fields(self, request, obj=None):
        fields = list(ScopeLimitForm.Meta.fields)
        return fields + ["updated_by", "updated_at"] if obj is not None else fields

    @admin.display(description="requests/min", ordering="requests_per_minute")
    def requests(self, obj) -> str:
        return "-" if obj.requests_per_minute is None else f"{obj.requests_per_minute:,}"

    @admin.display(description="tokens/min", ordering="tokens_per_minute")
    def tokens(self, obj) -> str:
        return "-" if obj.tokens_per_minute is None else f"{obj.tokens_per_minute:,}"

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        key = limit_set(
            scope=obj.scope,
            requests_per_minute=data.get("requests_per_minute"),
            tokens_per_minute=data.get("tokens_per_minute"),
            actor=who(request),
        )
        self.saved_as(obj, key)
