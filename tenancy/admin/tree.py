"""The tenancy tree in Django admin: organizations, teams and projects.

Each is added and renamed through its tenancy service, so admin keeps their rules (a
name checked as the services check it) and leaves the same audit trail as the API,
the CLI and the pages; a delete moves the quota policy's revision here, since the
policy names the tree.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import Count, Q

from llmgw.core.errors import Invalid
from tenancy.models import Organization, Project, Team
from tenancy.services import (
    org_create,
    policy_revision_bump,
    project_create,
    team_create,
    tree_name,
    tree_rename,
)

from .actor import who


class NamedForm(forms.ModelForm):
    """A tenancy name checked as the services check it: no '/', not digits alone, unique
    without case among its siblings (Acme and acme would be one path)."""

    what = "A scope"
    parent_field = ""

    def clean_name(self) -> str:
        try:
            name = tree_name(self.cleaned_data.get("name"), what=self.what)
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


# Each kind's service that adds one, taking its parent (org, team) by the admin's field.
_CREATE = {"org": org_create, "team": team_create, "project": project_create}


class TenancyAdmin(admin.ModelAdmin):
    """Adds and renames through the services, which record who did it; a delete moves the
    quota policy's revision, since the policy names the tree."""

    kind = ""
    parent_field = ""

    def get_readonly_fields(self, request, obj=None):
        # Moving a team or project would change every path below it: not from a form.
        moved = [self.parent_field] if obj is not None and self.parent_field else []
        return [*super().get_readonly_fields(request, obj), *moved, "created_at"]

    def save_model(self, request, obj, form, change):
        if not change:
            # team_create(org=ID), project_create(team=ID): the parent by its admin field.
            parent = (
                {self.parent_field: obj.serializable_value(self.parent_field)}
                if self.parent_field
                else {}
            )
            made = _CREATE[self.kind](name=obj.name, actor=who(request), **parent)
            obj.pk, obj.created_at = made.pk, made.created_at
        elif "name" in form.changed_data:
            tree_rename(kind=self.kind, scope=obj.pk, name=obj.name, actor=who(request))

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
