"""The fleet pages' forms: the nodes table's filters, and a node's cordon, uncordon, drain,
approve and forget."""

from __future__ import annotations

from django import forms

from .reads import SHOWN_STATES, SORTS


class NodeFilterForm(forms.Form):
    """What the nodes table shows (GET): a state, a label, a GPU class, its order and page.

    A field that does not validate is shown with its error and left out of the filter;
    the others still apply.
    """

    state = forms.ChoiceField(
        required=False, choices=[("", "any state")] + [(s, s) for s in SHOWN_STATES]
    )
    label = forms.CharField(
        required=False, max_length=300, widget=forms.TextInput(attrs={"placeholder": "key=value"})
    )
    gpu_class = forms.ChoiceField(required=False, label="GPU class")
    sort = forms.ChoiceField(
        required=False,
        choices=[(s, s) for s in SORTS] + [(f"-{s}", f"-{s}") for s in SORTS],
        widget=forms.HiddenInput,
    )
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def __init__(self, *args, classes: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_class"].choices = [("", "any class")] + [(c, c) for c in classes]

    def clean_label(self) -> tuple[str, str] | None:
        text = self.cleaned_data["label"].strip()
        if not text:
            return None
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise forms.ValidationError("A label is key=value, as rack=r12.")
        return key.strip(), value.strip()


class NodeActionForm(forms.Form):
    """An operator's order for a node (fleet.services.node_set_schedule)."""

    action = forms.ChoiceField(
        choices=[(a, a) for a in ("cordon", "uncordon", "drain", "approve", "forget")]
    )
    # With approve: the address its engines are at, believed from then on (behind NAT).
    address = forms.CharField(max_length=255, required=False)
