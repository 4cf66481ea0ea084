"""The catalog pages' forms: they read the fields; catalog.services judges them.

Bounds and names are the catalog's to check (domain.parse_model and friends), so a
refusal reads the same here as from the API and the catalog file.
"""

from __future__ import annotations

import shlex

from django import forms

from .domain import CLASSES, ENGINES

CLASS_CHOICES = [("", "default"), *((c, c) for c in CLASSES)]
# The most profile rows one form takes; more is a form someone scripted, not typed.
MAX_PROFILES = 16


class ModelAddForm(forms.Form):
    """A runtime model's own fields; its profiles come in ProfileFormSet beside it."""

    name = forms.CharField(required=False, max_length=200)
    source = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.TextInput(attrs={"placeholder": "hf://org/repo"}),
    )
    description = forms.CharField(required=False, max_length=2000, label="What it is for")
    capacity_class = forms.ChoiceField(required=False, choices=CLASS_CHOICES, label="Class")
    owner = forms.CharField(
        required=False,
        max_length=400,
        widget=forms.TextInput(attrs={"placeholder": "shared, or team:Acme/ml"}),
    )
    min = forms.IntegerField(required=False, label="Min replicas")
    max = forms.IntegerField(required=False, label="Max replicas")


class ProfileForm(forms.Form):
    """One way the model may run."""

    name = forms.CharField(required=False, max_length=200)
    engine = forms.ChoiceField(choices=[(e, e) for e in ENGINES], initial=ENGINES[0])
    gpu_class = forms.CharField(
        required=False,
        max_length=200,
        label="GPU class",
        widget=forms.TextInput(attrs={"placeholder": "h100-80g, empty for CPU"}),
    )
    tp = forms.IntegerField(required=False, label="TP")
    min_memory_gb = forms.FloatField(required=False, label="Memory GB")
    cpu_cores = forms.IntegerField(required=False, label="Cores")
    args = forms.CharField(
        required=False,
        max_length=2000,
        label="Engine arguments",
        widget=forms.TextInput(attrs={"placeholder": "--ctx-size 8192 --parallel 4"}),
    )

    def clean_args(self) -> list[str] | None:
        """The arguments as a shell would split them; the catalog judges each."""
        text = self.cleaned_data["args"].strip()
        if not text:
            return None
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise forms.ValidationError(f"The engine arguments cannot be read: {exc}.") from None


ProfileFormSet = forms.formset_factory(
    ProfileForm, extra=1, max_num=MAX_PROFILES, absolute_max=MAX_PROFILES, validate_max=True
)


class ScaleForm(forms.Form):
    min = forms.IntegerField(required=False, label="Min replicas")
    max = forms.IntegerField(required=False, label="Max replicas")
    idle_timeout = forms.IntegerField(required=False, label="Idle timeout (s)")


class ClassForm(forms.Form):
    capacity_class = forms.ChoiceField(
        choices=[*((c, c) for c in CLASSES), ("default", "default")], label="Class"
    )


class OwnerForm(forms.Form):
    owner = forms.CharField(
        required=False,
        max_length=400,
        widget=forms.TextInput(attrs={"placeholder": "empty for shared, or team:Acme/ml"}),
    )


class ResourcesForm(forms.Form):
    """Memory and cores one profile, or every profile, reserves."""

    profile = forms.ChoiceField(required=False, choices=[("", "every profile")])
    memory_gb = forms.FloatField(label="Memory GB")
    cpu_cores = forms.IntegerField(required=False, label="Cores")

    def __init__(self, *args, profiles: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["profile"].choices = [("", "every profile"), *((p, p) for p in profiles)]
