"""The tenancy pages' forms: they read the fields; tenancy.services judges them."""

from __future__ import annotations

from django import forms


class QuotaForm(forms.Form):
    """A scope's guarantee and limit; a figure left empty is not governed.

    No bounds here: quota_set refuses a negative figure or a guarantee above its
    limit, with the sentence the page shows beside that figure.
    """

    scope = forms.CharField(
        max_length=400,
        widget=forms.TextInput(attrs={"placeholder": "team:Acme/ml", "autocomplete": "off"}),
    )
    gpus = forms.IntegerField(required=False, label="GPUs")
    cores = forms.IntegerField(required=False, label="Cores")
    memory = forms.IntegerField(required=False, label="Memory GB")
    limit_gpus = forms.IntegerField(required=False, label="GPUs")
    limit_cores = forms.IntegerField(required=False, label="Cores")
    limit_memory = forms.IntegerField(required=False, label="Memory GB")

    # Form field → the resource quota_set takes, for the guarantee and the limit.
    GUARANTEE = {"gpus": "gpus", "cores": "cpu_cores", "memory": "memory_gb"}
    LIMIT = {"limit_gpus": "gpus", "limit_cores": "cpu_cores", "limit_memory": "memory_gb"}
