"""The check the catalog asks of a model before it is added or replaced (issue 36, item 5):
a llama.cpp profile on mirror weights sized as serve sizes it, in the same sentences.

Apart from mirror.plans, which adds the models it sizes through catalog.services: the
catalog imports this module, which imports nothing of the catalog's services.
"""

from __future__ import annotations

from catalog.domain import ModelSpec

from . import store
from .domain.refs import FolderRef
from .domain.sizing import profile_refusal
from .gguf import GgufError, read_gguf
from .selectors import weights_for_source


def model_sizing_refusal(spec: ModelSpec) -> str | None:
    """Why a model's llama.cpp profiles cannot run on the mirror weights its source names,
    in the plan's sentences (not a GGUF file, a context past the trained one, less memory
    than the estimate); None when they can, or when its source is not mirror weights ready
    to read (then there is nothing yet to size)."""
    if not any(p.engine == "llamacpp" for p in spec.profiles):
        return None
    ref = weights_for_source(spec.source)
    if ref is None or isinstance(ref, str):
        return None
    if isinstance(ref, FolderRef):
        return (
            f"model {spec.name}: its source {spec.source} is a folder of {len(ref.files)} files, "
            "not a GGUF file; llama.cpp serves one GGUF (name it as the source's path), "
            "vLLM serves a folder."
        )
    try:
        info = read_gguf(store.blob(ref.sha256))
    except GgufError as exc:
        return f"model {spec.name}: {str(exc).replace(ref.sha256, ref.file)}"
    for profile in spec.profiles:
        if profile.engine == "llamacpp" and (
            why := profile_refusal(info, profile, model=spec.name)
        ):
            return why
    return None
