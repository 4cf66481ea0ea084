"""Spend budgets and model prices in Django admin: set and cleared through their tenancy
services (budget_set and budget_clear, price_set and price_clear), which record who changed
them; a budget's scope is named as people write it (`team:Acme/ml`, `key:3`)."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from llmgw.core.errors import Invalid
from tenancy.models import Budget, ModelPrice
from tenancy.selectors import scope_tree
from tenancy.services.budgets import (
    budget_clear,
    budget_figures,
    budget_scope,
    budget_set,
    price_clear,
    price_set,
)

from .actor import who
from .limits import ScopedAdmin

FIGURES = ("tokens_per_day", "tokens_per_month", "cost_per_day", "cost_per_month")


class BudgetForm(forms.ModelForm):
    """A key or scope and its budgets, checked as budget_set checks them, each refusal beside
    its field."""

    class Meta:
        model = Budget
        fields = ["scope", *FIGURES]
        help_texts = {
            "scope": "key:3, org:Acme, team:Acme/ml, project:Acme/ml/training, or team:7.",
            **{f: "Left empty: not budgeted." for f in FIGURES},
        }

    def clean_scope(self) -> str:
        try:
            return budget_scope(self.cleaned_data.get("scope") or "", scope_tree())
        except Invalid as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self):
        cleaned = super().clean()
        for field in FIGURES:
            if cleaned.get(field) is None:
                continue
            try:
                budget_figures({field: cleaned[field]})
            except Invalid as exc:
                self.add_error(field, str(exc))
                cleaned[field] = None
        if all(cleaned.get(f) is None for f in FIGURES) and not self.errors:
            raise forms.ValidationError(
                "A budget needs tokens or a cost per day or month; to remove one, delete it."
            )
        return cleaned


@admin.register(Budget)
class BudgetAdmin(ScopedAdmin):
    """Each key's or scope's budgets on one line, set and cleared through the budget services."""

    form = BudgetForm
    clear = staticmethod(budget_clear)

    def get_list_display(self, request):
        return ["scope", self.scope_name_column(), *FIGURES, "updated_by", "updated_at"]

    def get_fields(self, request, obj=None):
        fields = list(BudgetForm.Meta.fields)
        return fields + ["updated_by", "updated_at"] if obj is not None else fields

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        key = budget_set(scope=obj.scope, actor=who(request), **{f: data.get(f) for f in FIGURES})
        self.saved_as(obj, key)


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """Each model's price per million tokens, set and cleared through the price services."""

    list_display = [
        "model",
        "prompt_per_million",
        "completion_per_million",
        "updated_by",
        "updated_at",
    ]
    search_fields = ["model"]

    def get_readonly_fields(self, request, obj=None):
        return ["model", "updated_by", "updated_at"] if obj is not None else []

    def save_model(self, request, obj, form, change):
        price_set(
            model=obj.model,
            prompt_per_million=obj.prompt_per_million,
            completion_per_million=obj.completion_per_million,
            actor=who(request),
        )
        saved = ModelPrice.objects.get(model=obj.model.strip())
        obj.pk, obj.updated_at, obj.updated_by = saved.pk, saved.updated_at, saved.updated_by

    def delete_model(self, request, obj):
        price_clear(model=obj.model, actor=who(request))

    def delete_queryset(self, request, queryset):
        for row in queryset:
            price_clear(model=row.model, actor=who(request))
