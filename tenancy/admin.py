"""Tenancy in Django admin: one line per record, with the columns an operator looks for.

Writes go through the tenancy services where there is one (adding an
organization, team or project; setting and clearing a quota or a scope's
limits), so admin keeps
their rules and leaves the same audit trail as the API, the CLI and the pages.
An API key's secret is made here and shown once, in the message after it is
added; only its hash and first characters are kept.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from catalog.admin import ViewOnly
from llmgw.core.errors import Invalid

from .models import (
    ApiKey,
    AuditEvent,
    CapacityQuota,
    Organization,
    Project,
    ScopeLimit,
    Team,
    Token,
)
from .quota import RESOURCES
from .selectors import scope_find, scope_tree
from .services import (
    _name,
    api_key_create,
    api_key_models,
    api_key_revoke,
    audit_record,
    limit_clear,
    limit_figures,
    limit_set,
    org_create,
    policy_revision_bump,
    project_create,
    quota_clear,
    quota_set,
    team_create,
    token_create,
    token_revoke,
)

# What an API key's secret starts with; its first KEY_PREFIX_LENGTH characters name it in lists.
KEY_SECRET_PREFIX = "llmgw_key_"
KEY_PREFIX_LENGTH = 14

# The largest figure a quota column holds on every backend (PostgreSQL's integer).
LARGEST = 2**31 - 1

RESOURCE_WORDS = {"gpus": "GPUs", "cpu_cores": "CPU cores", "memory_gb": "memory GB"}


def _who(request) -> str:
    return request.user.get_username() or "admin"


class NamedForm(forms.ModelForm):
    """A tenancy name checked as the services check it: no '/', not digits alone, unique
    without case among its siblings (Acme and acme would be one path)."""

    what = "A scope"
    parent_field = ""

    def clean_name(self) -> str:
        try:
            name = _name(self.cleaned_data.get("name"), what=self.what)
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None
        return name

    def clean(self):
        cleaned = super().clean()
        name = cleaned.get("name")
        if name is None:
            return cleaned
        siblings = self._meta.model.objects.filter(name__iexact=name)
        if self.parent_field:
            parent = cleaned.get(self.parent_field) or getattr(
                self.instance, self.parent_field, None
            )
            siblings = siblings.filter(**{self.parent_field: parent})
        taken = siblings.exclude(pk=self.instance.pk).values_list("name", flat=True).first()
        if taken is not None:
            self.add_error("name", f"There is already one named {taken} there.")
        return cleaned


class OrganizationForm(NamedForm):
    what = "An organization"


class TeamForm(NamedForm):
    what = "A team"
    parent_field = "org"


class ProjectForm(NamedForm):
    what = "A project"
    parent_field = "team"


class TenancyAdmin(admin.ModelAdmin):
    """Adds through the service, which records who did it; a rename is recorded here, and a
    rename or delete moves the quota policy's revision, since the policy names the tree."""

    kind = ""
    parent_field = ""

    def get_readonly_fields(self, request, obj=None):
        # Moving a team or project would change every path below it: not from a form.
        moved = [self.parent_field] if obj is not None and self.parent_field else []
        return [*super().get_readonly_fields(request, obj), *moved, "created_at"]

    def create(self, obj, actor: str):
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        if not change:
            made = self.create(obj, _who(request))
            obj.pk, obj.created_at = made.pk, made.created_at
            return
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if "name" in form.changed_data:
                audit_record(
                    actor=_who(request),
                    action=f"{self.kind}.rename",
                    target=f"{self.kind}:{obj.pk}",
                    detail={"name": obj.name, "was": form.initial.get("name")},
                )
            policy_revision_bump()

    def delete_model(self, request, obj):
        with transaction.atomic():
            super().delete_model(request, obj)
            policy_revision_bump()

    def delete_queryset(self, request, queryset):
        # The admin's "delete selected" action: one write, one bump, whatever the rows.
        with transaction.atomic():
            super().delete_queryset(request, queryset)
            policy_revision_bump()


@admin.register(Organization)
class OrganizationAdmin(TenancyAdmin):
    form = OrganizationForm
    kind = "org"
    list_display = ["name", "id", "team_count", "project_count", "created_at"]
    search_fields = ["name"]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_teams=Count("teams", distinct=True),
                n_projects=Count("teams__projects", distinct=True),
            )
        )

    @admin.display(description="teams", ordering="n_teams")
    def team_count(self, obj) -> int:
        return obj.n_teams

    @admin.display(description="projects", ordering="n_projects")
    def project_count(self, obj) -> int:
        return obj.n_projects

    def create(self, obj, actor):
        return org_create(name=obj.name, actor=actor)


@admin.register(Team)
class TeamAdmin(TenancyAdmin):
    form = TeamForm
    kind = "team"
    parent_field = "org"
    list_display = ["name", "org", "id", "project_count", "created_at"]
    list_filter = ["org"]
    search_fields = ["name", "org__name"]
    list_select_related = ["org"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(n_projects=Count("projects"))

    @admin.display(description="projects", ordering="n_projects")
    def project_count(self, obj) -> int:
        return obj.n_projects

    def create(self, obj, actor):
        return team_create(org=obj.org_id, name=obj.name, actor=actor)


@admin.register(Project)
class ProjectAdmin(TenancyAdmin):
    form = ProjectForm
    kind = "project"
    parent_field = "team"
    list_display = ["name", "team", "id", "live_keys", "created_at"]
    list_filter = ["team__org", "team"]
    search_fields = ["name", "team__name", "team__org__name"]
    list_select_related = ["team__org"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(n_keys=Count("api_keys", filter=Q(api_keys__revoked_at__isnull=True)))
        )

    @admin.display(description="live API keys", ordering="n_keys")
    def live_keys(self, obj) -> int:
        return obj.n_keys

    def create(self, obj, actor):
        return project_create(team=obj.team_id, name=obj.name, actor=actor)


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
        ]
        help_texts = {
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
            },
            actor=_who(request),
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
            if api_key_revoke(key_id=key.pk, actor=_who(request)).revoked_at is not None:
                revoked += 1
        self.message_user(
            request,
            f"Revoked {revoked} API key{'s' if revoked != 1 else ''}."
            if revoked
            else "Those keys were already revoked.",
            messages.SUCCESS if revoked else messages.INFO,
        )


class QuotaForm(forms.ModelForm):
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

    def clean_scope(self) -> str:
        try:
            return scope_find(self.cleaned_data.get("scope") or "")
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None

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
        self.clear(scope=obj.scope, actor=_who(request))

    def delete_queryset(self, request, queryset):
        for row in queryset:
            self.clear(scope=row.scope, actor=_who(request))


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
            actor=_who(request),
        )
        self.saved_as(obj, key)


class ScopeLimitForm(forms.ModelForm):
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

    def clean_scope(self) -> str:
        try:
            return scope_find(self.cleaned_data.get("scope") or "")
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None

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
            actor=_who(request),
        )
        self.saved_as(obj, key)


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


@admin.register(AuditEvent)
class AuditEventAdmin(ViewOnly, admin.ModelAdmin):
    description = (
        "View only: the record of who changed what; nobody adds to it or edits it by hand."
    )
    list_display = ["at", "actor", "token", "action", "target"]
    list_filter = ["action", "at"]
    search_fields = ["actor", "token", "target", "action"]
