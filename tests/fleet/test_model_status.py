"""A model's one-word status and the sentence behind it (fleet/listings.model_status): a
model whose replicas keep failing is `failing`, with why and its next try, not `waiting`."""

import pytest

from fleet.domain.types import Failure, ModelState
from fleet.selectors.listings import model_status
from tests.domain.builders import NOW, at, model

CAUSE = "invalid magic characters: 'This', expected 'GGUF'"
FAILURE = Failure(
    "chat-1",
    node="cpu-1",
    exit_code=1,
    detail=(
        "The engine exited with code 1.\n"
        f"0.00.006.996 E gguf_init_from_file_impl: {CAUSE}\n"
        "0.00.007.248 E srv llama_server: exiting due to model loading error"
    ),
)


def failing(failures: int, backoff_s: float | None) -> ModelState:
    return ModelState(
        model="chat",
        desired=1,
        failures=failures,
        backoff_until=at(backoff_s) if backoff_s is not None else None,
        last_failure=FAILURE,
        explanation=({"profile": "gpu", "reasons": ["backing off after 3 failures"]},),
    )


@pytest.mark.parametrize(
    ("case", "state", "ready", "starting", "expected"),
    [
        (
            "backing off: why, and when it tries again",
            failing(3, 40),
            0,
            0,
            ("failing", f"{CAUSE}; 3 failures, next try in 40s"),
        ),
        (
            "trying again now",
            failing(1, None),
            0,
            1,
            ("failing", f"{CAUSE}; 1 failure, trying again now"),
        ),
        (
            "its backoff over, before the pass that tries",
            failing(2, -1),
            0,
            0,
            ("failing", f"{CAUSE}; 2 failures, next try on the next pass"),
        ),
        ("ready again: not failing", failing(3, 40), 1, 0, ("ready", "")),
        (
            "no failures: waiting, with placement's reason",
            ModelState(
                model="chat",
                desired=1,
                explanation=({"profile": "gpu", "reasons": ["no node has room"]},),
            ),
            0,
            0,
            ("waiting", "no node has room"),
        ),
    ],
)
def test_a_model_that_keeps_failing_reads_as_failing_with_its_next_try(
    case, state, ready, starting, expected
):
    assert model_status(model("chat"), state, 1, ready, starting, now=NOW) == expected, case
