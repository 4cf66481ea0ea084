"""The mirror page (`/mirror`, staff only): weights by state, their files, and serving them.

One view serves the page and its fragments and takes its forms: add weights,
retry, remove, and serve a ready GGUF file as a llama.cpp model. A tab per state
(`?state=ready`); htmx swaps the tab's list (`?fragment=weights-list`) and polls
it every few seconds while the mirror has something to fetch. Every change goes
through mirror.services or mirror.plans; a refusal is their sentence, shown beside
the field or on the card it is about, with a 400 and nothing stored.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from llmgw.core import clock
from llmgw.core.errors import ServiceError
from llmgw.core.pages import fragment_asked, page, page_actor, staff_required
from llmgw.core.permissions import needs, require
from llmgw.core.sizes import size_text

from . import page_selectors, plans, selectors, services
from .domain.gpus import size_said
from .domain.hf_sizing import HfPlan
from .domain.progress import DOWNLOADING, FAILED, QUEUED, READY, STATES
from .domain.sizing import Plan
from .forms import ServeForm, WeightsActionForm, WeightsAddForm
from .safetensors import is_hf

TEMPLATE = "mirror/weights_list.html"
FRAGMENTS = ("mirror-main", "weights-list", "weights-tabs")
DEFAULT_TAB = READY
# How often the list asks again while something is queued or downloading.
POLL_S = 3
DIGEST_SHOWN = 12


def _tab(request: HttpRequest) -> str:
    wanted = request.GET.get("state", "")
    return wanted if wanted in STATES else DEFAULT_TAB


def _here(tab: str) -> str:
    return f"{reverse('mirror')}?state={tab}"


class Outcome:
    """What a post did: a notice, the tab to show after (or the weights whose tab to show,
    read with the page: the worker may have moved them on meanwhile), or a response to
    send as it is."""

    def __init__(self, *, notice="", tab=None, follow: int | None = None, response=None):
        self.notice, self.tab, self.follow, self.response = notice, tab, follow, response


@staff_required
@needs("mirror.view_weights")
@require_http_methods(["GET", "POST"])
def weights(request: HttpRequest) -> HttpResponse:
    """Weights by state, a card each with its files, progress, plans and serve forms."""
    tab = _tab(request)
    state: dict = {"add_form": WeightsAddForm(), "serve_forms": {}, "card_errors": {}}
    failed = False
    notice = ""
    follow = None
    if request.method == "POST":
        handle = ACTIONS.get(request.POST.get("form", ""))
        if handle is None:
            return HttpResponseBadRequest("Post one of the page's forms.")
        require(request, NEEDS[request.POST["form"]])
        done = handle(request, state)
        if done.response is not None:
            return done.response
        if done.notice:
            tab = done.tab or tab
            if not request.htmx:
                messages.success(request, done.notice)
                return redirect(_here(tab))
            notice, follow = done.notice, done.follow
        else:
            failed = True
        fragment = "mirror-main" if request.htmx else None
    else:
        fragment = fragment_asked(request, FRAGMENTS, main=FRAGMENTS[0])
    shown = _cards(tab, state["serve_forms"], state["card_errors"], follow=follow)
    context = {
        "section": "mirror",
        "notice": notice,
        "poll_s": POLL_S,
        "add_form": state["add_form"],
        **shown,
    }
    response = page(request, TEMPLATE, context, fragment=fragment, status=400 if failed else 200)
    if request.method == "POST" and request.htmx and not failed:
        # The page a plain form would have been sent to, so a reload shows the same tab.
        response["HX-Push-Url"] = _here(shown["tab"])
    return response


def _add(request: HttpRequest, state: dict) -> Outcome:
    form = WeightsAddForm(request.POST)
    state["add_form"] = form
    if not form.is_valid():
        return Outcome()
    given = form.cleaned_data
    try:
        w, created = services.weights_add(
            source=given["source"].strip(),
            sha256=given["sha256"],
            actor=page_actor(request),
            now=clock.now(),
        )
    except ServiceError as exc:
        sentence = str(exc)
        form.add_error("sha256" if sentence.startswith("sha256") else "source", sentence)
        return Outcome()
    view = selectors.weights_views(weights_id=w.pk)[0]
    state["add_form"] = WeightsAddForm()
    if not created:
        return Outcome(
            notice=f"{w.source} was already added, as weights {w.pk}; it is {view['state']}.",
            tab=view["state"],
            follow=w.pk,
        )
    files = len(view["files"])
    return Outcome(
        notice=f"Weights {w.pk} added from {w.source}: {files} file{'s' if files != 1 else ''} "
        "queued for the mirror's worker.",
        tab=view["state"],
        follow=w.pk,
    )


def _action_form(request: HttpRequest) -> int | None:
    form = WeightsActionForm(request.POST)
    return form.cleaned_data["weights"] if form.is_valid() else None


def _retry(request: HttpRequest, state: dict) -> Outcome:
    weights_id = _action_form(request)
    if weights_id is None:
        return Outcome(response=HttpResponseBadRequest("Say which weights to retry."))
    if not selectors.weights_views(weights_id=weights_id):
        state["card_errors"][weights_id] = f"There are no weights {weights_id}."
        return Outcome()
    queued = services.weights_retry(weights_id=weights_id)
    if not queued:
        state["card_errors"][weights_id] = f"Weights {weights_id} have no failed file to retry."
        return Outcome()
    services.wake_worker()
    return Outcome(
        notice=f"Weights {weights_id}: {queued} file{'s' if queued != 1 else ''} queued again.",
        tab=QUEUED,
    )


def _remove(request: HttpRequest, state: dict) -> Outcome:
    weights_id = _action_form(request)
    if weights_id is None:
        return Outcome(response=HttpResponseBadRequest("Say which weights to remove."))
    found = selectors.weights_views(weights_id=weights_id)
    try:
        services.weights_remove(
            weights_id=weights_id, using=selectors.weights_using(weights_id=weights_id)
        )
    except ServiceError as exc:
        state["card_errors"][weights_id] = str(exc)
        return Outcome()
    return Outcome(
        notice=f"Weights {weights_id} ({found[0]['source']}) removed.", tab=found[0]["state"]
    )


# Where a refusal of a serve goes: the first pattern it matches names the field.
_SERVE_FIELDS: tuple[tuple[str, str], ...] = (
    (r"^model \S+: min\b", "min"),
    (r"^model \S+: max\b", "max"),
    (r"^(name\b|A model's name|A model named|'[^']*' names an action)", "name"),
    (r"^(ctx\b|The context)|was trained on", "ctx"),
    (r"^cores\b", "cores"),
    (r"^memory_gb\b|: it reserves [0-9.]+ GB", "memory_gb"),
    (r"node selector|node_selector", "selector"),
    (r"^gpu_class\b|^The fleet has no \S+ GPUs", "gpu_class"),
    (r"^owner\b", "owner"),
)


def _serve(request: HttpRequest, state: dict) -> Outcome:
    form = ServeForm(request.POST, auto_id=_serve_id(request.POST.get("weights", "x")))
    key = (form.data.get("weights", ""), form.data.get("file", ""))
    if not form.is_valid():
        return _serve_refused(state, form, key)
    given = form.cleaned_data
    data: dict = {"weights": given["weights"], "name": given["name"]}
    for field in ("file", "ctx", "gpu_class", "cores", "memory_gb", "owner"):
        if given[field] not in (None, ""):
            data[field] = given[field]
    try:
        if selector := plans.parse_selector(given["selector"]):
            data["node_selector"] = selector
    except ServiceError as exc:
        form.add_error("selector", str(exc))
        return _serve_refused(state, form, key)
    scaling = {k: given[k] for k in ("min", "max") if given[k] is not None}
    if scaling:
        data["scaling"] = scaling
    try:
        spec, quota = services.model_serve(data=data, actor=page_actor(request))
    except ServiceError as exc:
        sentence = str(exc)
        field = next((f for pattern, f in _SERVE_FIELDS if re.search(pattern, sentence)), None)
        form.add_error(field, sentence)
        return _serve_refused(state, form, key)
    url = reverse("model", kwargs={"name": spec.name})
    said = f"Model {spec.name} added from weights {given['weights']}" + (
        f" ({given['file']})." if given["file"] else "."
    )
    if quota:
        # Added all the same, to run once the limit allows: said where the model shows.
        messages.warning(request, f"Model {spec.name}: {quota}.")
    if request.htmx:
        return Outcome(response=HttpResponse(status=204, headers={"HX-Redirect": url}))
    messages.success(request, said)
    return Outcome(response=redirect(url))


def _serve_refused(state: dict, form: ServeForm, key: tuple) -> Outcome:
    if "weights" in form.errors or "file" in form.errors or not key[0].isdigit():
        # The hidden fields the page writes: only a hand-made post gets them wrong.
        return Outcome(response=HttpResponseBadRequest("Say which weights and file to serve."))
    state["serve_forms"][int(key[0]), key[1]] = form
    return Outcome()


def _serve_id(weights_id: str) -> str:
    # Each card's form has its own ids: several serve forms are on one page.
    return f"id_serve{re.sub(r'[^0-9]', '', str(weights_id))}_%s"


ACTIONS: dict[str, Callable[[HttpRequest, dict], Outcome]] = {
    "add": _add,
    "retry": _retry,
    "remove": _remove,
    "serve": _serve,
}
# What each form needs of the user: serving adds a model to the catalog.
NEEDS = {
    "add": "mirror.add_weights",
    "retry": "mirror.change_weights",
    "remove": "mirror.delete_weights",
    "serve": "catalog.add_model",
}


def _cards(tab: str, serve_forms: dict, card_errors: dict, *, follow: int | None = None) -> dict:
    """The tabs with their counts and the cards of the one shown (the tab of the weights
    `follow` names, when they are there): a fixed number of queries (the weights, their
    files, the models; the fleet once when a ready GGUF file is shown)."""
    views = selectors.weights_views()
    tab = next((v["state"] for v in views if v["id"] == follow), tab)
    counts = {s: 0 for s in STATES}
    for v in views:
        counts[v["state"]] += 1
    shown = [v for v in views if v["state"] == tab]
    wanted = [
        (v["id"], f["path"], f["sha256"])
        for v in shown
        for f in v["files"]
        if f["state"] == READY and f["sha256"] and _servable(v, f)
    ]
    models = [
        (v["id"], plans.title_of(v["source"]), {f["path"]: f["sha256"] for f in v["files"]})
        for v in shown
        if is_hf([f["path"] for f in v["files"]])
        and all(f["state"] == READY and f["sha256"] for f in v["files"])
    ]
    found = page_selectors.file_plans(wanted, models)
    fetching = counts[QUEUED] + counts[DOWNLOADING] > 0
    cards = [_card(v, found, serve_forms, card_errors.get(v["id"], "")) for v in shown]
    # A refusal about weights not on this tab (removed meanwhile, or another state) still shows.
    here = {v["id"] for v in shown}
    elsewhere = [s for wid, s in card_errors.items() if wid not in here]
    placed = {(c["id"], f["path"]) for c in cards for f in c["files"] if f["form"] is not None}
    placed |= {(c["id"], "") for c in cards if c["model"] and c["model"].get("form")}
    for key, form in serve_forms.items():
        if key not in placed:
            elsewhere += [e for errors in form.errors.values() for e in errors]
    return {
        "tab": tab,
        "tabs": [{"state": s, "count": counts[s], "here": s == tab} for s in STATES],
        "cards": cards,
        "refused": elsewhere,
        # While the mirror has something to fetch, its tabs' lists refresh themselves; the
        # other tabs refresh only their counts, so a serve form being filled in stays put.
        "poll_list": fetching and tab in (QUEUED, DOWNLOADING),
        "poll_tabs": fetching and tab not in (QUEUED, DOWNLOADING),
    }


def _servable(view: dict, f: dict) -> bool:
    """A file that gets a plan: a GGUF file, or the one file of its weights (whose plan says
    what it is if it is not GGUF). A README beside a GGUF has nothing to say."""
    return f["path"].lower().endswith(".gguf") or len(view["files"]) == 1


def _model(view: dict, found: dict, serve_forms: dict) -> dict | None:
    """A safetensors model's plan (its weights as a whole: the key's file is ""), with the
    serve form; its sentence when it has none; None for weights that are not one."""
    key = (view["id"], "")
    got = found.get(key)
    if isinstance(got, HfPlan):
        form = serve_forms.get(key) or ServeForm(
            initial={"weights": view["id"], "file": "", "ctx": got.ctx},
            auto_id=_serve_id(view["id"]),
        )
        return {
            "plan": got,
            "parameters": _count(got.model.parameters),
            # In the plan's own units, as its sentences say them beside it.
            "weights": size_said(got.model.weights_bytes),
            "kv": f"{got.model.kv_per_token:,}",
            "form": form,
        }
    if isinstance(got, str):
        return {"plan": None, "said": got}
    return None


def _card(view: dict, found: dict, serve_forms: dict, refused: str) -> dict:
    files = [_file(view, f, found, serve_forms) for f in view["files"]]
    return {
        "model": _model(view, found, serve_forms),
        **view,
        "size": _bytes(view["bytes_total"]),
        "size_exact": _exact(view["bytes_total"]),
        "progress": _progress(view["bytes_done"], view["bytes_total"]),
        "files": files,
        "failed": view["state"] == FAILED,
        "refused": refused,
    }


def _file(view: dict, f: dict, found: dict, serve_forms: dict) -> dict:
    key = (view["id"], f["path"])
    got = found.get(key)
    out = {
        **f,
        "size_text": _bytes(f["size"]),
        "size_exact": _exact(f["size"]),
        "digest_short": f["sha256"][:DIGEST_SHOWN] if f["sha256"] else "",
        "progress": _progress(f["bytes_done"], f["size"]),
        "plan": None,
        "plan_said": "",
        "form": None,
    }
    if isinstance(got, Plan):
        out["plan"] = got
        out["parameters"] = _count(got.parameters)
        out["form"] = serve_forms.get(key) or ServeForm(
            initial={"weights": view["id"], "file": f["path"], "ctx": got.ctx},
            auto_id=_serve_id(view["id"]),
        )
    elif isinstance(got, str):
        out["plan_said"] = got
    return out


def _progress(done: int, total: int | None) -> dict | None:
    """A bar's width and its words; None when the total is not known (no bar to draw)."""
    if not total:
        return None
    return {
        "percent": f"{min(done / total, 1) * 100:.1f}",
        "said": f"{_bytes(done) if done else 'nothing yet'} of {_bytes(total)}",
    }


def _bytes(n: int | None) -> str:
    """A size as every page says it (llmgw/core/sizes.py); a dash when not known."""
    return size_text(n)


def _count(n: int) -> str:
    """A parameter count as one reads it: 268M, 7.2B."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}" if n < 10 * size else f"{n / size:.0f}{unit}"
    return str(n)


def _exact(n: int | None) -> str:
    return f"{n:,} bytes" if n else "size not known yet"
