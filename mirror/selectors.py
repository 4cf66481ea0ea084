"""Reads of the mirror: weights as the API and pages show them, what a model's source names,
the engine builds placement and ``start_shard`` offer, llmgw's own releases, and the
check the catalog asks of a model before it is added or replaced (issue 36, item 5): a
llama.cpp profile on mirror weights sized as serve sizes it, in the same sentences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from catalog.domain import ModelSpec
from catalog.selectors import model_sources
from llmgw.core.errors import NotFound

from . import store
from .domain.platforms import BINARY_ENGINES, RELEASE, RELEASE_PLATFORM
from .domain.progress import READY, FileProgress, fetched_said, progress
from .domain.refs import FolderRef, WeightsRef
from .domain.sizing import profile_refusal
from .domain.sources import fetched_remotely
from .gguf import GgufError, gguf_architecture, read_gguf
from .models import EngineBuild, WeightFile, Weights


def _users(weights: list[Weights]) -> dict[int, list[str]]:
    """Names of the models whose source is each weights' source or one of its files."""
    sources = {w.source: w.pk for w in weights}
    out: dict[int, list[str]] = {w.pk: [] for w in weights}
    if not sources:
        return out
    for name, source in model_sources().items():
        pk = sources.get(source)
        if pk is None:
            pk = next(
                (p for s, p in sources.items() if source.startswith(s.rstrip("/") + "/")), None
            )
        if pk is not None:
            out[pk].append(name)
    return out


def weights_views(*, weights_id: int | None = None) -> list[dict]:
    """Weights with their state derived from their files, newest first; [] when none match."""
    qs = Weights.objects.prefetch_related("files").order_by("-pk")
    if weights_id is not None:
        qs = qs.filter(pk=weights_id)
    weights = list(qs)
    users = _users(weights)
    return [_view(w, users[w.pk]) for w in weights]


def _view(w: Weights, models: list[str]) -> dict:
    files = list(w.files.all())
    p = progress(
        FileProgress(path=f.path, state=f.state, done=f.bytes_done, size=f.size, detail=f.detail)
        for f in files
    )
    return {
        "id": w.pk,
        "source": w.source,
        "revision": w.revision,
        "state": p.state,
        "detail": p.detail,
        "bytes_done": p.done,
        "bytes_total": p.total,
        "files": [
            {
                "path": f.path,
                "size": f.size,
                "sha256": f.sha256 or f.expected_sha256 or None,
                "state": f.state,
                "bytes_done": f.bytes_done,
                "detail": f.detail,
            }
            for f in files
        ],
        "added_by": w.added_by,
        "added_at": w.added_at,
        "last_used_at": w.last_used_at,
        "models": sorted(models),
    }


def weights_using(*, weights_id: int) -> list[str]:
    """Names of the models whose source names these weights."""
    w = Weights.objects.filter(pk=weights_id).first()
    return [] if w is None else _users([w])[w.pk]


def weights_for_source(source: str) -> WeightsRef | FolderRef | str | None:
    """The mirror file, or the folder of files, a model's source names, ready to fetch.

    None when the source is not mirror weights (a path on the node, a hub id
    vLLM fetches itself); a sentence when it is but cannot be served yet.
    """
    return _ref(source, _index()) if source else None


def weights_holding(source: str) -> int | None:
    """The ID of the weights `source` names (their own source, or a file or folder of
    them: SOURCE/PATH), None when the mirror holds none: whether an adapter's source must
    be added to the mirror."""
    found = _match(source, list(Weights.objects.only("source"))) if source else None
    return None if found is None else found[0].pk


def adapters_mirror_said(sources: Sequence[str]) -> dict[str, str | None]:
    """How far the mirror got with each adapter's weights (weights_said), by source; None
    for an adapter on the nodes' own disk, which the mirror does not fetch. Two queries
    however many adapters: the mirror's weights are read once for the whole listing."""
    remote = {s for s in sources if fetched_remotely(s)}
    index = _index() if remote else []
    return {s: weights_said(s, index) if s in remote else None for s in sources}


def weights_said(source: str, index: list[Weights] | None = None) -> str:
    """How far the mirror got with the weights `source` names, for a sentence about what
    waits on them (an adapter's load): not in the mirror at all (and how to add it), a file
    that failed (and how to retry), or the share of their bytes fetched so far ("40% of 12
    MB"); "ready" once every file is. `index`: the mirror's weights, when the caller has
    read them already (a listing's, read once for all its adapters)."""
    found = _match(source, _index() if index is None else index)
    if found is None:
        return f"{source} is not in the mirror (llmgw ctl weights add {source})"
    weights, path = found
    files, _ = _named(list(weights.files.all()), path)
    failed = next((f for f in files if f.state == "failed"), None)
    if failed is not None:
        return (
            f"fetching {failed.path} failed: {failed.detail}; llmgw ctl weights retry {weights.pk}"
        )
    if files and all(f.state == READY and f.sha256 for f in files):
        return "ready"
    sizes = [f.size for f in files]
    total = sum(s for s in sizes if s) if files and all(sizes) else None
    done = sum((f.size or 0) if f.state == READY else f.bytes_done for f in files)
    return fetched_said(done, total)


def weights_waiting(sources: Mapping[str, str]) -> dict[str, str]:
    """For models (name → source) whose weights are in the mirror but cannot be served yet,
    why: what the reconciler says instead of placing them. Two queries, whatever the count."""
    named = {name: src for name, src in sources.items() if src}
    if not named:
        return {}
    index = _index()
    if not index:
        return {}
    out = {}
    for name, src in named.items():
        ref = _ref(src, index)
        if isinstance(ref, str):
            out[name] = ref
    return out


def digests_by_source(sources: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """For models (name → source) on mirror weights that are ready, the digests of the files
    they run on: one for a GGUF, every file's for a folder."""
    index = _index() if sources else []
    out = {}
    for name, src in sources.items():
        ref = _ref(src, index) if index else None
        if isinstance(ref, WeightsRef | FolderRef):
            out[name] = ref.digests
    return out


def source_reads(sources: list[str], sha256: str) -> bool:
    """Whether a model on one of ``sources`` runs on the mirror file ``sha256``: the file it
    names, or a file of the folder it names, and no other file of the same weights."""
    holding = list(
        Weights.objects.filter(files__sha256=sha256, files__state=READY)
        .distinct()
        .prefetch_related("files")
    )
    for source in sources:
        ref = _ref(source, holding) if source else None
        if isinstance(ref, WeightsRef | FolderRef) and sha256 in ref.digests:
            return True
    return False


def _index() -> list[Weights]:
    return list(Weights.objects.prefetch_related("files").all())


def _ref(source: str, index: list[Weights]) -> WeightsRef | FolderRef | str | None:
    found = _match(source, index)
    if found is None:
        return None
    weights, path = found
    files, folder = _named(list(weights.files.all()), path)
    if not files:
        return f"weights {weights.pk} ({weights.source}) hold no file {path or 'yet'}"
    unready = [f for f in files if f.state != READY or not f.sha256]
    if unready:
        f = min(unready, key=lambda f: f.state != "failed")
        return f"waiting for weights {weights.pk} ({f.path}): {_progress_said(f)}"
    base = settings.LLMGW.mirror.url or ""
    refs = tuple(
        WeightsRef(
            sha256=f.sha256,
            size=f.size or 0,
            url=f"{base}/api/v1/mirror/files/{f.sha256}",
            file=f.path[len(folder) :] if folder is not None else f.path,
        )
        for f in files
    )
    if folder is None:
        return refs[0]
    return FolderRef(files=tuple(sorted(refs, key=lambda r: r.file)), name=source)


def _named(every: list[WeightFile], path: str | None) -> tuple[list[WeightFile], str | None]:
    """The files a source names among its weights' files, and the folder they are named
    from (None: one file, not a folder). The whole weights: its GGUF where it holds one, its
    only file, else the folder of all of them. A path: that file, else the folder under it."""
    if path is None:
        ggufs = [f for f in every if f.path.endswith(".gguf")]
        if ggufs:
            return ggufs[:1], None
        return every, ("" if len(every) > 1 else None)
    exact = [f for f in every if f.path == path]
    if exact:
        return exact, None
    folder = path.rstrip("/") + "/"
    return [f for f in every if f.path.startswith(folder)], folder


def _progress_said(f: WeightFile) -> str:
    if f.state == "failed":
        return f"failed: {f.detail}; llmgw ctl weights retry {f.weights_id}"
    if f.size:
        return f"{f.state}, {f.bytes_done / f.size:.0%} of {f.size / 1e9:.2f} GB"
    return f.state


def _match(source: str, index: list[Weights]) -> tuple[Weights, str | None] | None:
    for w in index:
        if w.source == source:
            return w, None
    # A file of weights added as a repository or a folder: SOURCE/PATH.
    for w in index:
        prefix = w.source.rstrip("/") + "/"
        if source.startswith(prefix):
            return w, source[len(prefix) :]
    return None


def file_known(sha256: str) -> bool:
    """Whether a ready file of some weights has this digest (what the mirror may serve)."""
    return WeightFile.objects.filter(sha256=sha256, state=READY).exists()


def file_sources(sha256: str) -> tuple[str, ...] | None:
    """Who may read the mirror file with this digest: () for an engine build (any node), the
    sources of the weights it is a file of (nodes running a model on them), None when the
    mirror holds no such file."""
    if EngineBuild.objects.filter(sha256=sha256).exists():
        return ()
    sources = tuple(
        WeightFile.objects.filter(sha256=sha256, state=READY)
        .values_list("weights__source", flat=True)
        .distinct()
    )
    return sources or None


@dataclass(frozen=True)
class EngineBuildRef:
    """What an agent needs to install a build: ``start_shard``'s ``engine_build``."""

    engine: str
    version: str
    sha256: str
    size: int
    url: str

    def message(self) -> dict:
        return {
            "engine": self.engine,
            "version": self.version,
            "sha256": self.sha256,
            "size": self.size,
            "url": self.url,
        }


def builds_offered() -> dict[str, dict[str, EngineBuildRef]]:
    """Per platform, per engine, the build a node lacking it installs: the newest added.

    One query, whatever the count.
    """
    base = settings.LLMGW.mirror.url or ""
    out: dict[str, dict[str, EngineBuildRef]] = {}
    rows = EngineBuild.objects.order_by("added_at", "pk").values_list(
        "platform", "engine", "version", "sha256", "size"
    )
    for platform, engine, version, digest, size in rows:
        # Later rows are newer and replace earlier ones.
        out.setdefault(platform, {})[engine] = EngineBuildRef(
            engine=engine,
            version=version,
            sha256=digest,
            size=size,
            url=f"{base}/api/v1/mirror/files/{digest}",
        )
    return out


def build_for(*, engine: str, platform: str) -> EngineBuildRef | None:
    """The build a node of ``platform`` lacking ``engine`` installs; None when there is none."""
    if not platform or engine not in BINARY_ENGINES:
        return None
    return builds_offered().get(platform, {}).get(engine)


def release_view(build: EngineBuild) -> dict:
    return {"version": build.version, "sha256": build.sha256, "size": build.size}


def release_get(version: str) -> EngineBuild:
    """The release `version` in the mirror; NotFound saying how to add it."""
    build = EngineBuild.objects.filter(
        engine=RELEASE, platform=RELEASE_PLATFORM, version=version
    ).first()
    if build is None:
        raise NotFound(
            f"The mirror holds no llmgw {version}: add its wheel with llmgw ctl engines add "
            f"--engine llmgw --version {version} --file llmgw-{version}-py3-none-any.whl."
        )
    return build


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


def weights_gguf_architecture(path: Path) -> str | None:
    """The architecture a GGUF file on this machine says it is (general.architecture), read
    from its header alone; None when it is not a readable GGUF (the catalog's adapter
    checks, catalog.adapter_files)."""
    return gguf_architecture(path)
