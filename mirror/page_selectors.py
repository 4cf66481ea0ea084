"""Reads for the /mirror page: the plans of many ready GGUF files and safetensors models in
one go.

`mirror.plans.weights_plan` sizes one file and reads the weights and the fleet's
free room each time it is called; a page of thirty cards would read them thirty
times. Here the weights come from the views the page already holds and the
fleet's room is read once, so the page's queries do not grow with its cards.
The figures are the same: the same header reader, the same `plan`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from fleet.selectors.dry_runs import node_rooms

from . import store
from .domain.hf import HfError, HfModel
from .domain.hf_sizing import HfPlan, hf_plan
from .domain.sizing import Plan, SizingError, plan
from .gguf import GgufError, GgufInfo, read_gguf
from .safetensors import read_hf

# Headers kept per blob path: a blob is named by its digest, so its header never changes.
_HEADERS = 256


@lru_cache(maxsize=_HEADERS)
def _header(path: str) -> GgufInfo:
    return read_gguf(path)


@lru_cache(maxsize=_HEADERS)
def _model(files: tuple[tuple[str, str], ...]) -> HfModel:
    return read_hf({path: store.blob(sha256) for path, sha256 in files})


def file_plans(
    files: Iterable[tuple[int, str, str]],
    models: Iterable[tuple[int, str, dict[str, str]]] = (),
) -> dict[tuple[int, str], Plan | HfPlan | str]:
    """For each ready file (weights id, path, verified sha256): its plan at the default
    context, or the sentence saying why it has none (not a GGUF file, a header sizing
    cannot use); for each safetensors model (weights id, its title, path → sha256 of its
    files), its
    GPU plan under the key (weights id, ""). One read of the fleet whatever the count;
    none when there is nothing to plan."""
    files, models = list(files), list(models)
    if not files and not models:
        return {}
    rooms = node_rooms()
    out: dict[tuple[int, str], Plan | HfPlan | str] = {}
    for weights_id, title, shas in models:
        try:
            model = _model(tuple(sorted(shas.items())))
            out[weights_id, ""] = hf_plan(model, title=title, ctx=None, rooms=rooms)
        except (HfError, SizingError) as exc:
            out[weights_id, ""] = str(exc)
    for weights_id, path, sha256 in files:
        try:
            out[weights_id, path] = plan(_header(str(store.blob(sha256))), nodes=rooms)
        except (GgufError, SizingError) as exc:
            # The reader names the blob, which is the digest; the page names the file.
            out[weights_id, path] = str(exc).replace(sha256, path)
    return out
