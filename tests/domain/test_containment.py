"""When an engine past its reservation is stopped (fleet/domain/containment.py)."""

import pytest
from hypothesis import given, strategies as st

from fleet.domain.containment import GB, Limits, Reservation, Use, Verdict, judge, outgrown_said

LIMITS = Limits(margin=0.25, grace_s=5.0)
TWO_GB = Reservation(memory_bytes=2 * GB)
LLAMA_SAID = (
    "llama-server used 11.2 GB of its 2 GB reservation; stopped. Raise the profile's memory "
    "or lower --ctx-size."
)


def verdict(use, *, over_since=None, now=100.0, reserved=TWO_GB, engine="llamacpp"):
    return judge(engine, reserved, use, over_since=over_since, now=now, limits=LIMITS)


@pytest.mark.parametrize(
    ("case", "use", "over_since", "now", "expected"),
    [
        ("under its reservation", Use(rss_bytes=1 * GB), None, 100.0, Verdict(None)),
        ("over, but within the margin", Use(rss_bytes=int(2.5 * GB)), None, 100.0, Verdict(None)),
        ("past the margin: counted from now", Use(rss_bytes=3 * GB), None, 100.0, Verdict(100.0)),
        ("past it for less than the grace", Use(rss_bytes=3 * GB), 96.0, 100.0, Verdict(96.0)),
        (
            "past it for the grace: stopped, with the figures",
            Use(rss_bytes=int(11.2 * GB)),
            95.0,
            100.0,
            Verdict(95.0, stop=True, said=LLAMA_SAID),
        ),
        ("back under: the count ends", Use(rss_bytes=1 * GB), 90.0, 100.0, Verdict(None)),
        ("nothing read: the count stays", Use(), 90.0, 100.0, Verdict(90.0)),
        ("nothing read, never over", Use(), None, 100.0, Verdict(None)),
    ],
)
def test_an_engine_is_stopped_once_past_its_reservation_for_the_grace(
    case, use, over_since, now, expected
):
    assert verdict(use, over_since=over_since, now=now) == expected, case


def test_a_reservation_of_nothing_declared_is_not_watched():
    huge = Use(rss_bytes=100 * GB)
    assert verdict(huge, over_since=0.0, reserved=Reservation()) == Verdict(None)
    assert verdict(huge, over_since=0.0, reserved=Reservation(memory_bytes=0)) == Verdict(None)


def test_gpu_memory_past_the_gpus_given_is_stopped_too():
    reserved = Reservation(memory_bytes=16 * GB, gpu_bytes=80 * GB)
    use = Use(rss_bytes=4 * GB, gpu_bytes=101 * GB)
    got = verdict(use, over_since=0.0, reserved=reserved, engine="vllm")
    assert got.stop
    assert got.said == (
        "vLLM used 101.0 GB of GPU memory of its 80 GB reservation; stopped. Give the profile "
        "more GPUs or lower --max-model-len."
    )


def test_each_engine_is_named_with_the_flag_that_sizes_it():
    assert outgrown_said("vllm", used=int(20.44 * GB), reserved=int(15.5 * GB)) == (
        "vLLM used 20.4 GB of its 15.5 GB reservation; stopped. Raise the profile's memory "
        "or lower --max-model-len."
    )
    assert outgrown_said("sim", used=3 * GB, reserved=1 * GB) == (
        "llmgw sim-engine used 3.0 GB of its 1 GB reservation; stopped. Raise the profile's memory."
    )


figures = st.integers(min_value=0, max_value=200 * GB)


@given(
    reserved=st.integers(min_value=1, max_value=100 * GB),
    samples=st.lists(st.tuples(st.one_of(st.none(), figures), st.floats(0, 3)), max_size=40),
)
def test_never_stopped_unless_over_the_margin_for_the_whole_grace(reserved, samples):
    """Walked sample by sample: a stop comes only after readings past the margin that
    span the grace, with no reading under it between."""
    over_since, now, last_under = None, 0.0, 0.0
    for rss, step in samples:
        now += step
        got = judge(
            "llamacpp",
            Reservation(memory_bytes=reserved),
            Use(rss_bytes=rss),
            over_since=over_since,
            now=now,
            limits=LIMITS,
        )
        if rss is not None and rss <= reserved * 1.25:
            last_under = now
            assert got == Verdict(None)
        if got.stop:
            assert rss is not None and rss > reserved * 1.25
            assert got.over_since is not None and now - got.over_since >= LIMITS.grace_s
            assert got.over_since >= last_under  # two readings may share an instant
            assert got.said.startswith("llama-server used ")
            return
        over_since = got.over_since
