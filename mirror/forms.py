"""The /mirror page's forms: they read the fields; mirror.services and mirror.plans judge them."""

from __future__ import annotations

from django import forms


class WeightsAddForm(forms.Form):
    """Weights by source, with the digest an operator may give for a single file.

    No checks of the source here: weights_add says what is wrong with one, and the
    page shows that sentence beside the field.
    """

    source = forms.CharField(
        max_length=500,
        widget=forms.TextInput(
            attrs={"placeholder": "hf://org/repo/file.gguf, https://…, or /path", "size": 60}
        ),
    )
    sha256 = forms.CharField(
        required=False,
        max_length=200,
        label="SHA-256 (optional)",
        widget=forms.TextInput(attrs={"placeholder": "64 hexadecimal digits", "size": 40}),
    )


class WeightsActionForm(forms.Form):
    """Retry or remove: which weights the button is on."""

    weights = forms.IntegerField(min_value=1)


class ServeForm(forms.Form):
    """A model from ready weights: a llama.cpp model from a GGUF file (on CPU, or on a GPU
    class), a vLLM model from a safetensors repository (no file); its name, context,
    replicas, and what each replica reserves and where it may go (issue 37, item 5).

    Figures are only read as numbers; model_serve and the catalog refuse the rest (a
    context past the trained one, memory below the estimate, a max below min) with
    their sentences.
    """

    weights = forms.IntegerField(widget=forms.HiddenInput)
    file = forms.CharField(max_length=500, required=False, widget=forms.HiddenInput)
    name = forms.CharField(
        max_length=200, widget=forms.TextInput(attrs={"placeholder": "gemma3-270m"})
    )
    ctx = forms.IntegerField(required=False, label="Context (tokens)")
    min = forms.IntegerField(required=False, label="Min replicas")
    max = forms.IntegerField(required=False, label="Max replicas")
    gpu_class = forms.CharField(
        required=False,
        max_length=100,
        label="GPU class",
        widget=forms.TextInput(attrs={"placeholder": "each that fits"}),
    )
    cores = forms.IntegerField(required=False, label="Cores")
    memory_gb = forms.FloatField(required=False, label="Memory (GB)")
    selector = forms.CharField(
        required=False,
        max_length=500,
        label="Node selector",
        widget=forms.TextInput(attrs={"placeholder": "zone=a,pool=chat"}),
    )
    owner = forms.CharField(
        required=False,
        max_length=200,
        label="Owner",
        widget=forms.TextInput(attrs={"placeholder": "team:Acme/ml"}),
    )
