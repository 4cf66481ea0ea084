"""The catalog pages: the models list with its add form, and each model's page with its forms.

One view per page: `models` serves /models and its fragments and takes the add
form; `model` serves /models/<name> and takes the scale, class, owner, resources,
restart and retry forms. Every change goes through catalog.services (or
fleet.services), and a refusal is shown beside the field its sentence is about.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import cached_property

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from fleet import services as fleet_services
from fleet.domain.pages import answering_fallback, fallback_shown
from fleet.selectors import (
    charts as fleet_charts,
    dry_runs as fleet_dry_runs,
    events as fleet_events,
    listings as fleet_listings,
)
from llmgw.core import clock, reads
from llmgw.core.charts import Chart, charts_context
from llmgw.core.errors import NotFound, ServiceError
from llmgw.core.pages import fragment_asked, page, page_actor, staff_required
from llmgw.core.permissions import needs, require
from llmgw.core.traffic import model_charts
from mirror.domain.progress import fetched_said
from tenancy.selectors import scope_named, scope_tree

from . import services
from .forms import (
    MAX_PROFILES,
    ClassForm,
    ModelAddForm,
    OwnerForm,
    ProfileForm,
    ProfileFormSet,
    ResourcesForm,
    ScaleForm,
)
from .selectors import catalog_load, listings, measurements_list

LIST = "catalog/model_list.html"
DETAIL = "catalog/model_detail.html"
LIST_FRAGMENTS = ("models-main", "model-table", "profile-added")
DETAIL_FRAGMENTS = ("model-main", "replicas", "charts", "analysis", "record")
DECLARED_REASON = "declared in the catalog file; edit that file and restart llmgw serve"
# Headroom is worked out by placing replicas one by one: ten says "plenty" without the cost.
HEADROOM_LIMIT = 10
PROFILES = "profile"  # the formset's prefix: profile-0-name, profile-TOTAL_FORMS


def _beside(form: forms.Form, sentence: str, words: dict[str, str | None]) -> None:
    """Add a service's sentence to the field it is about: the first of `words` (sentence word →
    field) that the sentence opens with once its "model M, profile P:" is taken off, else the
    first it mentions; at the top of the form when it names none."""
    rest = re.sub(r"^model \S+?(, profile \S+?)?: ", "", sentence)
    field = next((f for w, f in words.items() if rest.startswith(w)), None)
    if field is None:
        field = next(
            (f for w, f in words.items() if re.search(rf"(?<!\w){re.escape(w)}(?!\w)", rest)),
            None,
        )
    form.add_error(field, sentence)


@staff_required
@needs("catalog.view_model")
@require_http_methods(["GET", "POST"])
def models(request: HttpRequest) -> HttpResponse:
    """Every model, and the form adding a runtime model with its profiles."""
    form, profiles = ModelAddForm(), ProfileFormSet(prefix=PROFILES)
    notice = ""
    if request.method == "POST":
        require(request, "catalog.add_model")
        form = ModelAddForm(request.POST)
        profiles = ProfileFormSet(request.POST, prefix=PROFILES)
        added = _add(request, form, profiles)
        if added:
            notice = f"model {added} added"
            if not request.htmx:
                messages.success(request, notice)
                return redirect("model", name=added)
            form, profiles = ModelAddForm(), ProfileFormSet(prefix=PROFILES)
        fragment = "models-main" if request.htmx else None
    else:
        fragment = fragment_asked(request, LIST_FRAGMENTS, main=LIST_FRAGMENTS[0])
        if fragment == "profile-added":
            return page(request, LIST, _profile_row(request), fragment=fragment)
    failed = bool(form.errors or profiles.total_error_count()) if form.is_bound else False
    return page(
        request,
        LIST,
        {
            "section": "models",
            "rows": ModelRows(),
            "form": form,
            "profiles": profiles,
            "notice": notice,
            "declared_reason": DECLARED_REASON,
        },
        fragment=fragment,
        status=400 if failed else 200,
    )


def _profile_row(request: HttpRequest) -> dict:
    """One more profile row for the add form, numbered after those it has (htmx sends its
    profile-TOTAL_FORMS), and that count raised by one."""
    try:
        index = int(request.GET.get(f"{PROFILES}-TOTAL_FORMS", "1"))
    except ValueError:
        index = 1
    index = max(index, 0)
    if index >= MAX_PROFILES:
        return {"profile_form": None, "total": index, "most": MAX_PROFILES}
    form = ProfileForm(prefix=f"{PROFILES}-{index}", use_required_attribute=False)
    return {"profile_form": form, "total": index + 1, "most": MAX_PROFILES}


def _add(request: HttpRequest, form: ModelAddForm, profiles) -> str:
    """Add the model the form describes; its name, or "" with the errors on the forms."""
    form_ok, profiles_ok = form.is_valid(), profiles.is_valid()
    if not (form_ok and profiles_ok):
        return ""
    rows = [(f, f.cleaned_data) for f in profiles.forms if f.cleaned_data]
    data = _model_data(form.cleaned_data, [given for _, given in rows])
    try:
        spec = services.model_add(data=data, actor=page_actor(request))
    except ServiceError as exc:
        _place_add(form, profiles, rows, str(exc), data["name"])
        return ""
    return spec.name


def _model_data(given: dict, profiles: list[dict]) -> dict:
    """The form's fields as model_add takes them (domain.md's names); empty ones left out."""
    data: dict = {
        "name": given["name"],
        "profiles": [{k: v for k, v in p.items() if v not in (None, "")} for p in profiles],
    }
    for field in ("source", "description", "owner"):
        if given[field]:
            data[field] = given[field]
    if given["capacity_class"]:
        data["class"] = given["capacity_class"]
    scaling = {k: given[k] for k in ("min", "max") if given[k] is not None}
    if scaling:
        data["scaling"] = scaling
    return data


_MODEL_WORDS = {
    "owner": "owner",
    "A model's name": "name",
    "A model named": "name",
    "max": "max",
    "min": "min",
    "class": "capacity_class",
    "source": "source",
    "description": "description",
}
_PROFILE_WORDS = {
    "engine": "engine",
    "gpu_class": "gpu_class",
    "min_memory_gb": "min_memory_gb",
    "cpu_cores": "cpu_cores",
    "tp": "tp",
    "args": "args",
    "name": "name",
}


def _place_add(form, profiles, rows: list[tuple], sentence: str, name: str) -> None:
    """Put the catalog's refusal beside the field of the model, or of the profile row, it is
    about; at the top of the form when it is about neither."""
    if m := re.match(r"model \S+?, profile (\S+?): ", sentence):
        row = next((f for f, given in rows if given.get("name") == m[1]), None)
        if row is not None:
            _beside(row, sentence, _PROFILE_WORDS)
            return
    if m := re.match(r"model \S+?: two profiles are named (\S+?)\.$", sentence):
        named = [f for f, given in rows if given.get("name") == m[1]]
        if named:
            named[-1].add_error("name", sentence)
            return
    if re.match(r"model \S+?: a profile needs a name", sentence):
        for f, given in rows:
            if f"not {given.get('name') or None!r}" in sentence:
                f.add_error("name", sentence)
                return
    if re.match(r"model \S+?: at least one profile", sentence):
        profiles.non_form_errors().append(sentence)
        return
    if name and re.match(rf"model {re.escape(name)}: {re.escape(name)} is already", sentence):
        form.add_error("name", sentence)
        return
    _beside(form, sentence, _MODEL_WORDS)


class ModelRows:
    """The models table, read when the template first asks for it (not for other fragments)."""

    @cached_property
    def all(self) -> list[dict]:
        tree = scope_tree()
        views = listings.model_views()
        ready_of = {view["name"]: _serving(view) for view in views}
        return [
            {
                **view,
                "owner_name": tree.names.get(view["owner"], view["owner"]) if view["owner"] else "",
                "profile_lines": [_profile_line(p) for p in view["profiles"]],
            }
            | _shown_status(view, ready_of)
            for view in views
        ]


def _serving(view: dict) -> int:
    """Its replicas that answer requests: the ready, and the retiring ones still serving."""
    return view["ready"] + view.get("retiring", 0)


def _shown_status(view: dict, ready_of: dict[str, int]) -> dict:
    """Its status as the table shows it: "fallback" while a fallback answers for it."""
    args = (view["status"], _serving(view), view["fallbacks"], ready_of)
    status, reason = fallback_shown(args[0], view["reason"], *args[1:])
    return {"status": status, "reason": reason, "answered_by": answering_fallback(*args)}


def _profile_line(p: dict) -> str:
    """`gpu: sim on h100-80g ×2` or `cpu: llamacpp on CPU`."""
    where = f"{p['gpu_class']} ×{p['tp'] * p['pp']}" if p["gpu_class"] else "CPU"
    return f"{p['name']}: {p['engine']} on {where}"


class ModelDetail:
    """What one model's page shows, each part read when the template first asks for it."""

    def __init__(self, name: str):
        self.name = name

    @cached_property
    def view(self) -> dict:
        try:
            return listings.model_views(name=self.name)[0]
        except NotFound:
            raise Http404(f"There is no model {self.name!r}.") from None

    @cached_property
    def spec(self):
        return catalog_load()[self.name]

    @cached_property
    def owner_name(self) -> str:
        owner = self.view["owner"]
        return scope_named(owner) if owner else ""

    @cached_property
    def replicas(self) -> list[dict]:
        return [
            {
                **r,
                "nodes": list(dict.fromkeys(s["node"] for s in r["shards"])),
                "gpus": [
                    f"{s['node']}:{','.join(map(str, s['gpu_indices']))}"
                    for s in r["shards"]
                    if s["gpu_indices"]
                ],
                "ready_since": datetime.fromisoformat(r["ready_at"]) if r["ready_at"] else None,
                # While its agent fetches the weights (or an engine) from the mirror.
                "fetching_said": (
                    fetched_said(r["fetching"]["done"], r["fetching"]["total"])
                    if r.get("fetching")
                    else ""
                ),
            }
            for r in fleet_listings.replicas_list(model=self.name)
        ]

    @cached_property
    def explain(self) -> dict:
        return listings.model_explain(name=self.name, view=self.view)

    @cached_property
    def adapters(self) -> list[dict]:
        """The LoRA adapters served on it, with the replicas holding each."""
        return listings.adapter_views(base=self.name)

    @cached_property
    def headroom(self) -> dict:
        return fleet_dry_runs.model_headroom(name=self.name, limit=HEADROOM_LIMIT)

    @cached_property
    def measurements(self) -> list[dict]:
        return [m for m in measurements_list() if m["model"] == self.name]

    @cached_property
    def events(self) -> list[dict]:
        return fleet_events.recent(model=self.name)

    @cached_property
    def preemption(self) -> dict:
        return fleet_dry_runs.model_preemption(name=self.name)

    @property
    def default_class(self) -> str:
        return "opportunistic" if self.view["on_demand"] else "standard"

    def forms(self) -> dict[str, forms.Form]:
        """Each form unbound, filled with what the model has now."""
        view, first = self.view, self.spec.profiles[0]
        return {
            "scale": ScaleForm(
                initial={
                    "min": view["min"],
                    "max": view["max"],
                    "idle_timeout": view["idle_timeout"],
                }
            ),
            "class": ClassForm(initial={"capacity_class": self.spec.capacity_class or "default"}),
            "owner": OwnerForm(initial={"owner": self.owner_name}),
            "resources": ResourcesForm(
                initial={"memory_gb": first.min_memory_gb, "cpu_cores": first.cpu_cores},
                profiles=[p["name"] for p in view["profiles"]],
            ),
            "actions": forms.Form(),
        }


def _refused(form: forms.Form, exc: ServiceError, name: str, words: dict[str, str | None]):
    """Show a refusal: an unknown or declared model at the top, anything else beside its field."""
    sentence = str(exc)
    if isinstance(exc, NotFound) or sentence == services.DECLARED.format(name=name):
        form.add_error(None, sentence)
    else:
        _beside(form, sentence, words)
    return form, ""


def _scale(request: HttpRequest, m: ModelDetail):
    form = ScaleForm(request.POST)
    if not form.is_valid():
        return form, ""
    given = {k: v for k, v in form.cleaned_data.items() if v is not None}
    if not given:
        form.add_error(None, "Give min, max or idle timeout.")
        return form, ""
    try:
        spec = services.model_scale(name=m.name, actor=page_actor(request), scaling=given)
    except ServiceError as exc:
        words = {"min": "min", "max": "max", "idle_timeout": "idle_timeout"}
        return _refused(form, exc, m.name, words)
    return form, (
        f"model {m.name} scaled: min {spec.min_replicas}, max {spec.max_replicas}, "
        f"idle timeout {spec.idle_timeout_s} s"
    )


def _class(request: HttpRequest, m: ModelDetail):
    form = ClassForm(request.POST)
    if not form.is_valid():
        return form, ""
    wanted = form.cleaned_data["capacity_class"]
    try:
        spec = services.model_class_set(
            name=m.name,
            capacity_class="" if wanted == "default" else wanted,
            actor=page_actor(request),
        )
    except ServiceError as exc:
        return _refused(form, exc, m.name, {"": "capacity_class"})
    return form, f"model {m.name} is {spec.effective_class}"


def _owner(request: HttpRequest, m: ModelDetail):
    form = OwnerForm(request.POST)
    if not form.is_valid():
        return form, ""
    try:
        spec = services.model_owner_set(
            name=m.name, owner=form.cleaned_data["owner"], actor=page_actor(request)
        )
    except ServiceError as exc:
        return _refused(form, exc, m.name, {"": "owner"})
    if not spec.owner:
        return form, f"model {m.name} is shared: it counts against no quota"
    return form, f"model {m.name} counts against {scope_tree().names.get(spec.owner, spec.owner)}"


def _resources(request: HttpRequest, m: ModelDetail):
    form = ResourcesForm(request.POST, profiles=[p["name"] for p in m.view["profiles"]])
    if not form.is_valid():
        return form, ""
    given = form.cleaned_data
    try:
        spec = services.model_resources_set(
            name=m.name,
            profile=given["profile"] or None,
            memory_gb=given["memory_gb"],
            cpu_cores=given["cpu_cores"],
            actor=page_actor(request),
        )
    except ServiceError as exc:
        if "negative" in str(exc):
            negative = [f for f in ("memory_gb", "cpu_cores") if (given[f] or 0) < 0]
            for f in negative or [None]:
                form.add_error(f, str(exc))
            return form, ""
        words = {
            "memory": "memory_gb",
            "min_memory_gb": "memory_gb",
            "memory_gb": "memory_gb",
            "cpu_cores": "cpu_cores",
            "cores": "cpu_cores",
            "profile": "profile",
            f"model {m.name} has no profile": "profile",
        }
        return _refused(form, exc, m.name, words)
    changed = [p for p in spec.profiles if not given["profile"] or p.name == given["profile"]]
    return form, f"model {m.name} reserves " + "; ".join(
        f"{p.name}: {p.min_memory_gb:g} GB, {p.cpu_cores or 0} cores" for p in changed
    ) + " (running replicas keep their figures until restarted)"


def _restart(request: HttpRequest, m: ModelDetail):
    form = forms.Form(request.POST)
    try:
        return form, fleet_services.model_restart(
            name=m.name, actor=page_actor(request), now=clock.now()
        )
    except ServiceError as exc:
        return _refused(form, exc, m.name, {})


def _retry(request: HttpRequest, m: ModelDetail):
    form = forms.Form(request.POST)
    try:
        return form, fleet_services.model_retry(name=m.name, actor=page_actor(request))
    except ServiceError as exc:
        return _refused(form, exc, m.name, {})


# The `form` field of a post → (the form it fills on the page, what it does).
ACTIONS = {
    "scale": ("scale", _scale),
    "class": ("class", _class),
    "owner": ("owner", _owner),
    "resources": ("resources", _resources),
    "restart": ("actions", _restart),
    "retry": ("actions", _retry),
}
# What each form needs of the user: restart and retry act on the model's replicas.
NEEDS = {
    "scale": "catalog.change_model",
    "class": "catalog.change_model",
    "owner": "catalog.change_model",
    "resources": "catalog.change_model",
    "restart": "fleet.change_replica",
    "retry": "fleet.change_replica",
}


@staff_required
@needs("catalog.view_model")
@require_http_methods(["GET", "POST"])
def model(request: HttpRequest, name: str) -> HttpResponse:
    """One model: its replicas, why it is not placed, headroom, measurements, the preemption
    dry run, and the forms changing it (disabled, with the reason, for a declared model).

    Its parts (the view, replicas, explanation, headroom, the dry run) read each of the
    catalog, the models' states, the replicas and the fleet once (llmgw.core.reads): a
    page is one moment's. A form's change is made first, and the page read after it."""
    if request.method != "POST":
        with reads.once_each():
            m = ModelDetail(name)
            m.view  # noqa: B018 — an unknown model is a 404 before anything else is read
            fragment = fragment_asked(request, DETAIL_FRAGMENTS, main=DETAIL_FRAGMENTS[0])
            return _model_page(request, m, m.forms(), fragment=fragment)
    m = ModelDetail(name)
    m.view  # noqa: B018
    shown = m.forms()
    action = ACTIONS.get(request.POST.get("form", ""))
    if action is None:
        return HttpResponseBadRequest("Post one of the page's forms.")
    require(request, NEEDS[request.POST["form"]])
    key, handle = action
    form, notice = handle(request, m)
    fragment = "model-main" if request.htmx else None
    if not notice:
        shown[key] = form
        with reads.once_each():
            return _model_page(request, m, shown, fragment=fragment, failed=True)
    if not request.htmx:
        messages.success(request, notice)
        return redirect("model", name=name)
    with reads.once_each():
        m = ModelDetail(name)  # read again: the change shows everywhere on the page
        return _model_page(request, m, m.forms(), fragment=fragment, notice=notice)


def _model_page(
    request: HttpRequest,
    m: ModelDetail,
    shown: dict,
    *,
    fragment: str | None,
    notice: str = "",
    failed: bool = False,
) -> HttpResponse:
    charts = _model_charts(request, m.name) if fragment in (None, "model-main", "charts") else {}
    # The last placement, headroom and the dry run, and the events and measurements, come
    # as fragments of their own after the page; ?all=1 (no scripts) has them inline.
    lazy = fragment not in ("analysis", "record") and request.GET.get("all") != "1"
    return page(
        request,
        DETAIL,
        {
            "section": "models",
            "m": m,
            "forms": shown,
            "notice": notice,
            "declared_reason": DECLARED_REASON,
            "lazy": lazy,
        }
        | charts,
        fragment=fragment,
        status=400 if failed else 200,
    )


def _model_charts(request: HttpRequest, name: str) -> dict:
    """Its traffic (what the gateway measured) and its replicas over time."""
    replicas = Chart(
        "replicas", "Replicas", "", f"replicas:{name}", fleet_charts.replica_lines(name)
    )
    return charts_context(request, (*model_charts(name), replicas))
