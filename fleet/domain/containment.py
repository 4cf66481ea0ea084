"""When an engine has outgrown its reservation long enough to be stopped, and what is said.

A replica reserves memory on its node (the profile's ``min_memory_gb``) and placement
counts on it; an engine that takes far more (llama.cpp asked for a huge ``--ctx-size``)
takes the node's memory from every other replica on it. The agent measures each engine's
memory (the resident memory of its process tree, and on a GPU node what NVML says its
processes hold) and stops one that stays past its reservation by a margin for longer
than a grace: a moment over (a load's peak) is not a runaway.

Pure: the figures and the time come in, a verdict with its sentence goes out.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1024**3

# How each engine is named in the sentence, and the flag that sizes what it allocates.
ENGINE_NAMES = {"llamacpp": "llama-server", "vllm": "vLLM", "sim": "llmgw sim-engine"}
SIZING_FLAGS = {"llamacpp": "--ctx-size", "vllm": "--max-model-len"}


@dataclass(frozen=True)
class Limits:
    """The rule's settings: how far past its reservation an engine may go (0.25: a
    quarter), and for how many seconds before it is stopped."""

    margin: float = 0.25
    grace_s: float = 5.0


@dataclass(frozen=True)
class Reservation:
    """What a shard reserved: host memory (bytes; None: nothing declared, not watched) and
    the GPU memory of the GPUs it was given (bytes; None: no GPUs, or not known)."""

    memory_bytes: int | None = None
    gpu_bytes: int | None = None


@dataclass(frozen=True)
class Use:
    """What an engine used at one moment: the resident memory of its process tree and the
    GPU memory its processes hold, in bytes; None where it could not be read."""

    rss_bytes: int | None = None
    gpu_bytes: int | None = None


@dataclass(frozen=True)
class Verdict:
    """Since when the engine has been over (None: it is not), whether to stop it now, and
    the sentence that says why when it is stopped."""

    over_since: float | None
    stop: bool = False
    said: str = ""


def _over(used: int | None, reserved: int | None, margin: float) -> bool:
    # An unread figure or a reservation of nothing declared is never "over".
    if used is None or not reserved:
        return False
    return used > reserved * (1 + margin)


def judge(
    engine: str,
    reserved: Reservation,
    use: Use,
    *,
    over_since: float | None,
    now: float,
    limits: Limits,
) -> Verdict:
    """Whether the engine, over since ``over_since`` (or not), is to be stopped at ``now``.

    Over: its resident memory past ``memory_bytes × (1 + margin)``, or its GPU memory past
    ``gpu_bytes × (1 + margin)``. Stopped once it has been over for ``grace_s``. A moment
    where nothing could be read leaves the count as it was; a moment under ends it.
    """
    if use.rss_bytes is None and use.gpu_bytes is None:
        return Verdict(over_since)
    host = _over(use.rss_bytes, reserved.memory_bytes, limits.margin)
    gpu = _over(use.gpu_bytes, reserved.gpu_bytes, limits.margin)
    if not (host or gpu):
        return Verdict(None)
    since = now if over_since is None else over_since
    if now - since < limits.grace_s:
        return Verdict(since)
    if host:
        said = outgrown_said(engine, used=use.rss_bytes or 0, reserved=reserved.memory_bytes or 0)
    else:
        said = outgrown_said(
            engine, used=use.gpu_bytes or 0, reserved=reserved.gpu_bytes or 0, gpu=True
        )
    return Verdict(since, stop=True, said=said)


def outgrown_said(engine: str, *, used: int, reserved: int, gpu: bool = False) -> str:
    """ "llama-server used 11.2 GB of its 2 GB reservation; stopped. Raise the profile's
    memory or lower --ctx-size." (``used`` and ``reserved`` in bytes)."""
    name = ENGINE_NAMES.get(engine, engine or "the engine")
    flag = SIZING_FLAGS.get(engine)
    if gpu:
        kind, advice = " of GPU memory", "Give the profile more GPUs"
    else:
        kind, advice = "", "Raise the profile's memory"
    advice += f" or lower {flag}." if flag else "."
    return (
        f"{name} used {used / GB:.1f} GB{kind} of its {round(reserved / GB, 1):g} GB "
        f"reservation; stopped. {advice}"
    )
