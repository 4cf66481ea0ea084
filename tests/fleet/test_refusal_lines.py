"""The one-line "cannot be placed" as the readers of a stored explanation say it: the
gateway's 503 and the model views take each profile's summary (refusals.one_line)."""

import pytest

from catalog.selectors.listings import model_views
from fleet.models import ModelState
from fleet.selectors.routing import on_demand_trouble

from .builders import gpu_model, model_added

pytestmark = pytest.mark.django_db

EXPLANATION = [
    {
        "profile": "gpu",
        "reasons": [
            "node cpu-1 has no h100-80g GPUs",
            "node gpu-a has 0 free h100-80g GPUs of 8, needs 4",
            "node gpu-b is draining",
        ],
        "summary": "gpu-a has 0 free h100-80g GPUs of 8, needs 4; gpu-b is draining; "
        "1 other node has no h100-80g GPUs",
    },
    {"profile": "preemption", "reasons": ["no candidate would make room"]},
]


def test_the_gateways_503_names_the_binding_reasons_not_the_first_node():
    model_added(gpu_model("code", scaling={"min": 0, "max": 1}))
    ModelState.objects.create(model="code", unplaceable=True, explanation=EXPLANATION)
    assert on_demand_trouble("code") == (
        "no room: gpu-a has 0 free h100-80g GPUs of 8, needs 4; gpu-b is draining; "
        "1 other node has no h100-80g GPUs"
    )


def test_ctl_models_says_the_same_line():
    model_added(gpu_model("code"))
    ModelState.objects.create(model="code", desired=1, unplaceable=True, explanation=EXPLANATION)
    [view] = model_views(name="code")
    assert (view["status"], view["reason"]) == ("unplaceable", EXPLANATION[0]["summary"])
