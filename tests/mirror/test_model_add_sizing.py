"""A llama.cpp profile on mirror weights is checked against the same sizing as serve when a
model is added, replaced, or added from the console's form (issue 36, item 5): not a GGUF,
a context past the trained one, memory below the estimate. Each a 400 that changes nothing,
in the plan's sentences."""

from __future__ import annotations

import pytest

from catalog.models import Model
from mirror.worker import work_until_idle
from tests.catalog.test_pages import add_form
from tests.helpers import detail
from tests.mirror.ggufs import write_gguf
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def tiny(api, mirror_dir):  # noqa: F811
    # Trained on 8,192; at 4,096 it needs 2 GB (test_serve: 512 MiB of cache + 1 GiB + weights).
    path = write_gguf(mirror_dir / "allowed" / "model.gguf", name="Tiny", context_length=8192)
    api.call("POST", "/weights", {"source": str(path)})
    work_until_idle()
    return str(path)


def llamacpp(source: str, *, ctx: int | None, memory: float, name: str = "tiny") -> dict:
    args = ["--ctx-size", str(ctx)] if ctx is not None else []
    return {
        "name": name,
        "source": source,
        "profiles": [{"name": "cpu", "engine": "llamacpp", "args": args, "min_memory_gb": memory}],
    }


@pytest.mark.parametrize(
    ("ctx", "memory", "said"),
    [
        (
            16384,
            8,
            "model tiny, profile cpu: Tiny was trained on 8,192 tokens of context; a context "
            "of 16,384 is more than it can use.",
        ),
        (
            4096,
            1,
            "model tiny, profile cpu: it reserves 1 GB, and Tiny needs 2 GB at a context of 4,096",
        ),
        # No --ctx-size: llama-server's own 4,096.
        (None, 1, "needs 2 GB at a context of 4,096"),
    ],
)
def test_a_profile_the_weights_cannot_run_is_refused_when_added(api, tiny, ctx, memory, said):
    response = api.call("POST", "/models", llamacpp(tiny, ctx=ctx, memory=memory))

    assert response.status_code == 400, response.content
    assert said in detail(response)
    assert not Model.objects.exists()


def test_a_profile_sized_as_the_plan_says_is_added(api, tiny):
    response = api.call("POST", "/models", llamacpp(tiny, ctx=4096, memory=2))

    assert response.status_code == 201, response.content


def test_a_file_that_is_not_gguf_is_refused_by_name(api, mirror_dir):  # noqa: F811
    path = mirror_dir / "allowed" / "model.bin"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    api.call("POST", "/weights", {"source": str(path)})
    work_until_idle()

    response = api.call("POST", "/models", llamacpp(str(path), ctx=4096, memory=4))

    assert response.status_code == 400
    assert detail(response).startswith("model tiny: model.bin is not a GGUF file")


def test_a_replacement_is_checked_and_a_refused_one_changes_nothing(api, tiny):
    assert api.call("POST", "/models", llamacpp(tiny, ctx=4096, memory=2)).status_code == 201

    response = api.call("PUT", "/models/tiny", llamacpp(tiny, ctx=4096, memory=1))

    assert response.status_code == 400
    assert "it reserves 1 GB, and Tiny needs 2 GB" in detail(response)
    assert Model.objects.get(name="tiny").profiles.get().min_memory_gb == 2


def test_the_console_add_form_says_it_beside_the_profile(staff, tiny):  # noqa: F811
    body = add_form(
        name="tiny",
        source=tiny,
        profiles=[
            {
                "name": "cpu",
                "engine": "llamacpp",
                "args": "--ctx-size 16384",
                "min_memory_gb": "8",
            }
        ],
    )

    response = staff.post("/models", body)

    assert response.status_code == 400
    assert "Tiny was trained on 8,192 tokens of context" in response.content.decode()
    assert not Model.objects.exists()


def test_a_serve_asking_less_memory_than_the_estimate_is_the_same_sentence(api, tiny):
    from mirror.models import Weights

    weights = Weights.objects.get()
    response = api.call(
        "POST",
        "/models/serve",
        {"weights": weights.pk, "name": "tiny", "ctx": 4096, "memory_gb": 1, "cores": 2},
    )

    assert response.status_code == 400
    assert "it reserves 1 GB, and Tiny needs 2 GB at a context of 4,096" in detail(response)
    assert not Model.objects.exists()
