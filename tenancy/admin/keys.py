"""API keys and tokens in Django admin: added here, revoked, never deleted.

A key or token is made by its tenancy service; its secret is shown once, in the
message after it is added, and only its hash and first characters are kept.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from llmgw.core.errors import Invalid
from tenancy.models import ApiKey, Token
from tenancy.services import (
    api_key_create,
    api_key_models,
    api_key_revoke,
    token_create,
    token_revoke,
)

from .actor import who


class KeyState(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "live"), ("revoked", "revoked")]

    def queryset(self, request, queryset):
        if self.value() == "live":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = [
            "project",
            "name",
            "models_allowed",
            "requests_per_minute",
            "tokens_per_minute",
            "max_tokens",
        ]
        help_texts = {
            "max_tokens": "The most completion tokens one request may ask for; left empty: any.",
            "models_allowed": 'A JSON list of model names, such as ["llama", "chat"]; '
            "an empty list allows every model.",
        }

    def clean_name(self) -> str:
        name = (self.cleaned_data.get("name") or "").strip()
        if not name:
            raise forms.ValidationError("A key needs a name.")
        return name

    def clean_models_allowed(self) -> list[str]:
        value = self.cleaned_data.get("models_allowed")
        if value in (None, ""):
            return []
        if not isinstance(value, list) or not all(isinstance(m, str) and m for m in value):
            raise forms.ValidationError('Give a list of model names, such as ["llama"].')
        try:
            return api_key_models(value)
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are added here for a project and revoked, never deleted: their usage stays."""

    form = ApiKeyForm
    list_display = [
        "name",
        "shown_prefix",
        "project",
        "models",
        "limits",
        "state",
        "created_at",
        "created_by",
    ]
    list_filter = [KeyState, "project__team__org", "created_at"]
    search_fields = [
        "name",
        "prefix",
        "project__name",
        "project__team__name",
        "project__team__org__name",
    ]
    list_select_related = ["project__team__org"]
    autocomplete_fields = ["project"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        fields = list(ApiKeyForm.Meta.fields)
        if obj is not None:
            fields += ["prefix", "revoked_at", "created_at", "created_by"]
        return fields

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        # The key stays with its project; the secret behind the prefix is never shown again.
        return ["project", "prefix", "revoked_at", "created_at", "created_by"]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="prefix", ordering="prefix")
    def shown_prefix(self, obj) -> str:
        return f"{obj.prefix}…"

    @admin.display(description="models")
    def models(self, obj) -> str:
        return ", ".join(obj.models_allowed) if obj.models_allowed else "all"

    @admin.display(description="limits")
    def limits(self, obj) -> str:
        parts = []
        if obj.requests_per_minute is not None:
            parts.append(f"{obj.requests_per_minute:,} req/min")
        if obj.tokens_per_minute is not None:
            parts.append(f"{obj.tokens_per_minute:,} tok/min")
        if obj.max_tokens is not None:
            parts.append(f"≤ {obj.max_tokens:,} tok/request")
        return ", ".join(parts) or "-"

    @admin.display(description="state", ordering="revoked_at")
    def state(self, obj) -> str:
        if obj.revoked_at is None:
            return "live"
        return f"revoked {timezone.localtime(obj.revoked_at):%Y-%m-%d %H:%M}"

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        # Made by the one key service (the REST API's too); the secret lives only in this
        # request and the message that shows it once.
        key, secret = api_key_create(
            project=obj.project_id,
            name=obj.name,
            models=obj.models_allowed or None,
            limits={
                "requests_per_minute": obj.requests_per_minute,
                "tokens_per_minute": obj.tokens_per_minute,
                "max_tokens": obj.max_tokens,
            },
            actor=who(request),
        )
        obj.pk, obj.prefix, obj.secret_hash = key.pk, key.prefix, key.secret_hash
        obj.created_at, obj.created_by = key.created_at, key.created_by
        obj._state.adding, obj._state.db = False, key._state.db
        messages.warning(
            request,
            f"The secret of API key {obj.name}, shown only this once; copy it now: {secret}",
        )

    @admin.action(description="Revoke the selected API keys")
    def revoke(self, request, queryset):
        revoked = 0
        for key in queryset.filter(revoked_at__isnull=True):
            if api_key_revoke(key_id=key.pk, actor=who(request)).revoked_at is not None:
                revoked += 1
        self.message_user(
            request,
            f"Revoked {revoked} API key{'s' if revoked != 1 else ''}."
            if revoked
            else "Those keys were already revoked.",
            messages.SUCCESS if revoked else messages.INFO,
        )


@admin.register(Token)
class TokenAdmin(admin.ModelAdmin):
    """Admin and agent tokens: added through the service, the secret shown once, as a key's is."""

    list_display = ["name", "kind", "shown_prefix", "created_at", "revoked_at"]
    list_filter = ["kind", "revoked_at"]
    search_fields = ["name", "prefix"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        return (
            ["name", "kind"]
            if obj is None
            else ["name", "kind", "prefix", "created_at", "revoked_at"]
        )

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else ["kind", "prefix", "created_at", "revoked_at"]

    @admin.display(description="prefix", ordering="prefix")
    def shown_prefix(self, obj) -> str:
        return f"{obj.prefix}…"

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        # The form has checked the name as token_create does: given, and at most 100 long.
        made, secret = token_create(name=obj.name, kind=obj.kind)
        obj.pk, obj.prefix, obj.created_at = made.pk, made.prefix, made.created_at
        messages.warning(
            request, f"The secret of token {made.name}, shown only this once; copy it now: {secret}"
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset.filter(revoked_at__isnull=True):
            token_revoke(token=token)
        self.message_user(request, "Revoked.", messages.SUCCESS)
