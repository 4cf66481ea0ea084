"""Writes to the mirror: adding and removing weights, the worker's claims on files, the
model served from weights (added to the catalog through its services, sized by the
weights' plan), and the release `llmgw ctl upgrade` offers (llmgw's own wheel, kept as an
engine build).

A release is kept as an engine build is (engine `llmgw`, platform `python-any`), by its
SHA-256, and any node's credential may read it. The release this control plane runs is
offered without anyone adding it: its wheel is built once from the source it was
installed from (`pip wheel`) and kept. Another release is placed by the operator:
`llmgw ctl engines add --engine llmgw --version V --file llmgw-V-py3-none-any.whl`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from catalog import services as catalog_services
from catalog.domain import AdapterSpec, ModelSpec
from llmgw.core.errors import Conflict, Forbidden, Invalid, NotFound
from llmgw.core.version import installed
from tenancy.selectors import scope_find

from . import selectors, store, wake
from .builds import engine_build_add_file
from .domain.hf_sizing import HfPlan, serve_hf_model
from .domain.platforms import RELEASE
from .domain.progress import ATTEMPTS, DOWNLOADING, FAILED, QUEUED, READY, retry_delay
from .domain.sizing import SizingError, serve_model
from .domain.sources import SourceError, fetched_remotely, parse_source
from .models import EngineBuild, WeightFile, Weights
from .plans import vllm_source, weights_plan
from .resolve import resolve
from .selectors import release_get

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
# How long a worker's claim on a file lasts without word from it; it renews it with
# each progress report, so a worker that died lets the file go this long after.
CLAIM_S = 30.0


def weights_add(
    *, source: str, sha256: str = "", actor: str, now: datetime
) -> tuple[Weights, bool]:
    """Add weights by source, its files queued for the worker; returns (weights, created).

    The same source added again is the same weights, not a second download.
    Raises Invalid for a source that cannot be used, Upstream when the hub or the
    server that holds it cannot be asked.
    """
    try:
        parsed = parse_source(source)
    except SourceError as exc:
        raise Invalid(str(exc)) from None
    digest = (sha256 or "").strip().lower()
    if digest and not _HEX64.match(digest):
        raise Invalid("sha256 must be 64 hexadecimal digits.")
    existing = Weights.objects.filter(source=parsed.text).first()
    if existing is not None:
        return existing, False
    found = resolve(parsed, sha256=digest, roots=settings.LLMGW.mirror.sources)
    try:
        with transaction.atomic():
            weights = Weights.objects.create(
                source=parsed.text,
                sha256=digest,
                revision=found.revision,
                added_by=actor[:64],
                added_at=now,
            )
            WeightFile.objects.bulk_create(
                WeightFile(
                    weights=weights,
                    path=f.path,
                    fetch_url=f.url,
                    size=f.size,
                    expected_sha256=f.sha256,
                )
                for f in found.files
            )
            transaction.on_commit(wake.wake)
    except IntegrityError:
        # Added by another request between the look and the write.
        return Weights.objects.get(source=parsed.text), False
    return weights, True


def adapter_add(
    *, data: Mapping[str, Any], actor: str, now: datetime, mirror_refusal: str = ""
) -> AdapterSpec:
    """Add a LoRA adapter (catalog's adapter_add); one whose source is on the hub or an
    https server has its weights added to the mirror as `weights add` adds them, unless
    the mirror holds them already (its source, or a file or folder of weights it holds).

    The adapter is checked first, so bad input fetches nothing; a source the hub refuses
    is a 400 and one it cannot be asked about a 502, the adapter not stored. Weights this
    add put in the mirror are taken out again when the adapter cannot then be stored
    (its name taken meanwhile). The audit record of the add names the weights.
    `mirror_refusal`, the sentence saying the caller may not add weights, is Forbidden
    when its weights would be added.
    """
    spec = catalog_services.adapter_check(data=data)
    weights_id, created = selectors.weights_holding(spec.source), False
    if weights_id is None and fetched_remotely(spec.source):
        if mirror_refusal:
            raise Forbidden(
                f"{spec.source} is not in the mirror, and adding adapter {spec.name} would add "
                f"it: {mirror_refusal}"
            )
        weights, created = weights_add(source=spec.source, actor=actor, now=now)
        weights_id = weights.pk
    mirrored = None if weights_id is None else {"weights": weights_id, "added": created}
    try:
        return catalog_services.adapter_add(data=data, actor=actor, mirrored=mirrored)
    except Exception:
        if created and weights_id is not None:
            weights_remove(weights_id=weights_id, using=[])
        raise


def weights_remove(*, weights_id: int, using: list[str]) -> None:
    """Delete weights and the files no other weights share; Conflict naming the models using it."""
    weights = Weights.objects.filter(pk=weights_id).first()
    if weights is None:
        raise NotFound(f"There are no weights {weights_id}.")
    if using:
        raise Conflict(
            f"Weights {weights_id} ({weights.source}) are used by {', '.join(sorted(using))}; "
            "remove or change those models first."
        )
    digests = set(weights.files.exclude(sha256="").values_list("sha256", flat=True))
    ids = list(weights.files.values_list("pk", flat=True))
    weights.delete()
    shared = set(WeightFile.objects.filter(sha256__in=digests).values_list("sha256", flat=True))
    # The same bytes may be an engine build's too.
    shared |= set(EngineBuild.objects.filter(sha256__in=digests).values_list("sha256", flat=True))
    for digest in digests - shared:
        store.blob(digest).unlink(missing_ok=True)
    for pk in ids:
        store.part(pk).unlink(missing_ok=True)


def weights_retry(*, weights_id: int) -> int:
    """Queue a failed weights' files again from their first try; returns how many."""
    return WeightFile.objects.filter(weights_id=weights_id, state=FAILED).update(
        state=QUEUED, attempts=0, next_try_at=None, detail="", bytes_done=0
    )


def weights_touch(*, sha256: str, now: datetime) -> None:
    """Note that weights holding this file were used (an agent fetched it)."""
    Weights.objects.filter(files__sha256=sha256).update(last_used_at=now)


def file_claim(*, now: datetime) -> WeightFile | None:
    """Claim the next file due for fetching, compare-and-set, or None when nothing is due."""
    due = (
        WeightFile.objects.filter(state__in=(QUEUED, DOWNLOADING))
        .filter(Q(next_try_at__isnull=True) | Q(next_try_at__lte=now))
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("next_try_at", "pk")
    )
    for f in due[:20]:
        if f.expected_sha256 and _fetching_elsewhere(f, now):
            continue
        won = WeightFile.objects.filter(pk=f.pk, claimed_until=f.claimed_until).update(
            claimed_until=now + timedelta(seconds=CLAIM_S), state=DOWNLOADING
        )
        if won == 1:
            f.refresh_from_db()
            return f
    return None


def _fetching_elsewhere(f: WeightFile, now: datetime) -> bool:
    # One download per file however many weights hold it: another's claim comes first.
    return (
        WeightFile.objects.filter(expected_sha256=f.expected_sha256, claimed_until__gte=now)
        .exclude(pk=f.pk)
        .exists()
    )


def file_progress(*, file_id: int, done: int, total: int | None, now: datetime) -> None:
    """Record bytes fetched so far, and renew the claim."""
    fields = {"bytes_done": done, "claimed_until": now + timedelta(seconds=CLAIM_S)}
    if total is not None:
        fields["size"] = total
    WeightFile.objects.filter(pk=file_id).update(**fields)


def file_done(*, file_id: int, sha256: str, size: int) -> None:
    """A file fetched and verified: ready, its digest naming the blob served."""
    WeightFile.objects.filter(pk=file_id).update(
        state=READY, sha256=sha256, size=size, bytes_done=size, detail="", claimed_until=None
    )


def file_failed(*, file_id: int, detail: str, retry: bool, now: datetime) -> str:
    """Record a failed try: queued again after a backoff, or failed for good; returns the state."""
    f = WeightFile.objects.get(pk=file_id)
    attempts = f.attempts + 1
    if retry and attempts < ATTEMPTS:
        at = now + timedelta(seconds=retry_delay(attempts))
        text = f"try {attempts} of {ATTEMPTS} failed, next at {at:%H:%M:%S} UTC: {detail}"
        state = QUEUED
    else:
        at, text, state = (
            None,
            detail if not retry else f"gave up after {attempts} tries: {detail}",
            FAILED,
        )
    WeightFile.objects.filter(pk=file_id).update(
        state=state, attempts=attempts, next_try_at=at, detail=text[:2000], claimed_until=None
    )
    return state


def file_from_blob(*, file: WeightFile) -> bool:
    """Take a file whose digest the mirror already holds as ready, without fetching it."""
    if not file.expected_sha256:
        return False
    path = store.blob(file.expected_sha256)
    if not path.exists() or (file.size is not None and path.stat().st_size != file.size):
        return False
    file_done(file_id=file.pk, sha256=file.expected_sha256, size=path.stat().st_size)
    return True


def claims_release() -> int:
    """Let go of every claim (the embedded worker at start: none of them is alive)."""
    return WeightFile.objects.filter(claimed_until__isnull=False).update(claimed_until=None)


def wake_worker() -> None:
    """Have the worker look for due files once this transaction commits."""
    transaction.on_commit(wake.wake)


# How long building this control plane's own wheel may take.
BUILD_TIMEOUT_S = 300


def release_offer(*, version: str | None, actor: str, now: datetime) -> EngineBuild:
    """The release to upgrade to: `version` as the mirror holds it, or, without one, the
    release this control plane runs, its wheel built and kept on first asking."""
    own = installed()
    wanted = (version or "").strip() or own
    try:
        return release_get(wanted)
    except NotFound:
        if wanted != own:
            raise
    with tempfile.TemporaryDirectory(prefix="llmgw-release-") as folder:
        wheel = _own_wheel(Path(folder), own)
        build, _ = engine_build_add_file(
            path=wheel, engine=RELEASE, version=own, actor=actor, now=now
        )
    return build


def _own_wheel(folder: Path, version: str) -> Path:
    """This llmgw's wheel (release `version`), built from the source it runs from."""
    import llmgw

    source = Path(llmgw.__file__).resolve().parents[1]
    if not (source / "pyproject.toml").is_file():
        raise Invalid(
            f"This control plane runs llmgw {version} from an installed wheel, not from its "
            f"source, and cannot build that wheel: add it with llmgw ctl engines add --engine "
            f"llmgw --version {version} --file llmgw-{version}-py3-none-any.whl."
        )
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps"]
    try:
        done = subprocess.run(
            [*argv, "--quiet", "-w", str(folder), str(source)],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise Invalid(
            f"Building llmgw {version}'s wheel took more than {BUILD_TIMEOUT_S} s."
        ) from None
    wheels = sorted(folder.glob("llmgw-*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was made"]
        raise Invalid(f"Building llmgw {version}'s wheel failed: {last[0][:300]}")
    return wheels[0]


# What the serve body may set beside ModelIn's own fields (which override the model).
_NOT_OVERRIDES = (
    "weights",
    "name",
    "ctx",
    "file",
    "gpu_class",
    "gpu_memory_utilization",
    "cores",
    "memory_gb",
    "node_selector",
    "kv_cache_dtype",
)


def _figure(data: Mapping[str, Any], key: str, kinds: tuple[type, ...], said: str) -> Any:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
        raise Invalid(f"{key} must be {said}.")
    return value


def model_serve(*, data: Mapping[str, Any], actor: str) -> tuple[ModelSpec, str]:
    """Add a model sized by the plan of its weights (POST /models/serve): llama.cpp for a
    GGUF file, vLLM for a safetensors model. `cores`, `memory_gb` and `node_selector` go on
    every profile; ModelIn's own fields replace what they name. Returns the model and, for
    an `owner` whose capacity limit stops the replica the plan fits, the sentence saying so
    ("" otherwise): the model is added all the same, to run once the limit allows."""
    if not isinstance(data, Mapping):
        raise Invalid("The body must be an object with weights and name.")
    weights_id, name = data.get("weights"), data.get("name")
    if isinstance(weights_id, bool) or not isinstance(weights_id, int):
        raise Invalid("weights must be the id of weights in the mirror (llmgw ctl weights list).")
    if not isinstance(name, str) or not name.strip():
        raise Invalid("name is needed: what the model is called in the catalog and the gateway.")
    ctx = _figure(data, "ctx", (int,), "a whole number of tokens")
    file = _figure(data, "file", (str,), "a path within the weights")
    gpu_class = _figure(data, "gpu_class", (str,), "a GPU class (llmgw ctl nodes)")
    util = _figure(data, "gpu_memory_utilization", (int, float), "a fraction such as 0.9")
    cores = _figure(data, "cores", (int,), "a whole number of cores")
    memory = _figure(data, "memory_gb", (int, float), "a number of GB")
    selector = _figure(data, "node_selector", (dict,), "an object of label: value")
    cache = _figure(data, "kv_cache_dtype", (str,), "auto or fp8")
    if selector and not all(isinstance(v, str) for v in selector.values()):
        raise Invalid("node_selector must be an object of label: value, each a string.")
    owner = data.get("owner") if isinstance(data.get("owner"), str) else ""
    if owner:
        try:
            owner = scope_find(owner)
        except Invalid as exc:
            raise Invalid(f"owner: {exc}") from None
    p, weights, f = weights_plan(
        weights_id=weights_id,
        ctx=ctx,
        file=file,
        utilization=util,
        node_selector=selector,
        owner=owner,
        kv_cache_dtype=cache,
    )
    profile: dict[str, Any] = {}
    if cores is not None:
        profile["cpu_cores"] = cores
    if memory is not None:
        profile["min_memory_gb"] = memory
    if selector:
        profile["node_selector"] = selector
    overrides = {k: v for k, v in data.items() if k not in _NOT_OVERRIDES}
    try:
        if isinstance(p, HfPlan):
            model = serve_hf_model(
                p,
                name=name.strip(),
                source=vllm_source(weights),
                gpu_class=gpu_class,
                profile_overrides=profile,
                overrides=overrides,
            )
        else:
            single = len(weights.files.all()) == 1
            source = weights.source if single else f"{weights.source.rstrip('/')}/{f.path}"
            model = serve_model(
                p,
                name=name.strip(),
                source=source,
                gpu_class=gpu_class,
                profile_overrides=profile,
                overrides=overrides,
            )
    except SizingError as exc:
        raise Invalid(str(exc)) from None
    spec = catalog_services.model_add(data=model, actor=actor)
    if gpu_class:
        return spec, next((o.quota for o in p.gpus if o.gpu_class == gpu_class), "")
    if isinstance(p, HfPlan):
        return spec, next((o.quota for o in p.fitting[:1]), "")
    return spec, p.quota
