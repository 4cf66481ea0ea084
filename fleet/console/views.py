"""The cluster and node pages (staff only): one view per page, serving its fragments too.

htmx polls each table every five seconds for its fragment (`?fragment=nodes`,
`?fragment=models`, `?fragment=live`), and the counters and the attention strip
come along out of band, so a table refreshes in place without the page.
"""

from __future__ import annotations

from urllib.parse import urlencode

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods

from catalog.selectors import catalog_load
from llmgw.core import clock
from llmgw.core.charts import charts_context, newest
from llmgw.core.errors import Invalid, NotFound, ServiceError
from llmgw.core.pages import fragment_asked, page, staff_required
from llmgw.core.permissions import needs, require
from llmgw.core.traffic import requests_chart

from .. import services
from ..domain.pages import gpu_charts_said, installs_shown, labels_shown, schedule_actions
from ..domain.types import HOLDING
from ..nodes import identity, logs
from ..nodes.dispatch import dispatch, node_disconnect
from ..protocol import LOG_LINES
from ..selectors import events
from ..selectors.conditions import rack_condition, rack_conditions
from ..selectors.facility import facility_domains, held_shards
from ..selectors.listings import nodes_list, reading_out
from ..selectors.passes import drains_stuck, reconciler_status
from ..selectors.state import node_views, replica_views
from . import reads as ps
from .fabric import fabric_page, node_fabric_shown
from .forms import NodeActionForm, NodeFilterForm
from .samples import GPU_SERIES, cluster_charts, node_charts

PER_PAGE = 100
# The fragments htmx may ask for, by the `fragment` parameter, and the partial each is.
CLUSTER_FRAGMENTS = {"nodes": "nodes-refresh", "models": "models-refresh", "charts": "charts"}
NODE_FRAGMENTS = {"live": "live-refresh", "charts": "charts"}
# Of a node's GPUs' readings (fleet/protocol.py, GpuLoad), those that get a column when measured.
GPU_SENSORS = ("temp_c", "memory_temp_c", "power_w", "utilization", "memory_used_mb")
# A node's own readings (fleet/protocol.py, Load) its page shows, each only when reported.
LOAD_FIGURES = (
    "cpu_percent",
    "load1",
    "load5",
    "load15",
    "memory_used_bytes",
    "memory_available_bytes",
    "cpu_temp_c",
    "cpu_power_w",
    "inlet_temp_c",
    "node_power_w",
)
# Attention items shown by name before the rest are only counted.
ATTENTION_NAMED = 10


def _query(**params) -> str:
    return urlencode({k: v for k, v in params.items() if v not in ("", None)})


@staff_required
@needs("fleet.view_node", "catalog.view_model")
@require_GET
def cluster(request: HttpRequest) -> HttpResponse:
    """The cluster page: counters, what needs attention, the nodes and the models."""
    fragment = fragment_asked(request, CLUSTER_FRAGMENTS)
    context: dict = {"section": "cluster"}
    if fragment in (None, "charts"):
        context |= charts_context(request, (*cluster_charts(), requests_chart()))
        if fragment == "charts":
            return page(request, "fleet/node_list.html", context, fragment=fragment)
    replicas = replica_views()
    down = None
    catalog = None
    if fragment in (None, "nodes-refresh"):
        context |= _nodes_context(request, replicas)
        down = context.pop("down")
        facility = context.pop("facility")
        context["fabric"] = context.pop("fabric") and fragment is None
        if fragment is None and facility and request.user.has_perm("fleet.view_powerbudget"):
            # Only when a node says where it is or a budget exists (the nodes' query says):
            # one query more then, none otherwise.
            # Each with its condition and hold (None: never read nor held), one query more;
            # the catalog read once, for the profiles' declared draws and the models below.
            conditions = rack_conditions()
            catalog = catalog_load()
            context["racks"] = [
                (d, rack_condition(conditions, d.kind, d.name))
                for d in facility_domains(held_shards(replicas, catalog), now=clock.now())
            ]
    if fragment in (None, "models-refresh"):
        catalog = catalog if catalog is not None else catalog_load()
        models = ps.model_rows(catalog, replicas, clock.now())
        # Paged like the nodes: a page of 500 models is most of a refresh's cost.
        shown = Paginator(models, PER_PAGE).get_page(request.GET.get("models_page"))
        rest = {k: v for k, v in request.GET.items() if k not in ("models_page", "fragment")}

        def models_link(number: int) -> str:
            return "?" + _query(**rest, models_page=number if number > 1 else "")

        context |= {
            "models": shown,
            "models_shown": len(models),
            "models_refresh": "?" + _query(fragment="models", **rest, models_page=shown.number),
            "models_prev": models_link(shown.number - 1) if shown.has_previous() else None,
            "models_next": models_link(shown.number + 1) if shown.has_next() else None,
            "any_fallbacks": any(m["fallbacks"] for m in shown),
            "attention": _attention(
                models,
                ps.nodes_down() if down is None else down,
                ps.quotas_at_limit(catalog, replicas),
                reconciler=reconciler_status(now=clock.now())["warning"],
                stuck=sorted(drains_stuck(replicas=replicas).items()),
            ),
        }
    return page(request, "fleet/node_list.html", context, fragment=fragment)


def _nodes_context(request: HttpRequest, replicas) -> dict:
    """The nodes table's page of rows, its filters, order and links, and the fleet's counters
    (with `down`, the nodes that cannot be reached, for the attention strip)."""
    # The filters first, the class aside: which classes there are comes with the nodes.
    asked = NodeFilterForm(request.GET, classes=[])
    asked.is_valid()
    got = asked.cleaned_data
    state, label = got.get("state", ""), got.get("label")
    sort = got.get("sort") or "id"
    table = ps.nodes_table(
        state=state,
        label=label,
        gpu_class=request.GET.get("gpu_class", ""),
        sort=sort.lstrip("-"),
        descending=sort.startswith("-"),
    )
    form = NodeFilterForm(request.GET, classes=table.classes)
    form.is_valid()
    gpu_class = form.cleaned_data.get("gpu_class", "")
    paged = Paginator(table.shown(of_class=bool(gpu_class)), PER_PAGE).get_page(got.get("page"))
    paged.object_list = [ps.node_row(r) for r in paged.object_list]
    filters = {
        "state": state,
        "label": "=".join(label) if label else "",
        "gpu_class": gpu_class,
    }
    ordered = filters | {"sort": sort if sort != "id" else ""}
    here = _query(**ordered, page=paged.number if paged.number > 1 else "")

    def link(**changes) -> dict:
        q = _query(**(ordered | changes))
        return {"href": f"?{q}", "fragment": f"?{_query(fragment='nodes')}&{q}".rstrip("&")}

    columns = {}
    for key in ps.SORTS:
        # A second click on a column reverses it; the first sorts it up.
        then = f"-{key}" if sort == key else key
        columns[key] = {
            "arrow": {key: "▲", f"-{key}": "▼"}.get(sort, ""),
            **link(sort="" if then == "id" else then),
        }
    return {
        "filter_form": form,
        "nodes_page": paged,
        "sorts": columns,
        "sensors": table.sensors,
        "nodes_refresh": f"?{_query(fragment='nodes')}&{here}".rstrip("&"),
        "page_prev": (
            link(page=paged.number - 1 if paged.number > 2 else "")
            if paged.has_previous()
            else None
        ),
        "page_next": link(page=paged.next_page_number()) if paged.has_next() else None,
        "nodes_shown": paged.paginator.count,
        "filtered": bool(state or label or gpu_class),
        "counters": table.counters
        | {
            "replicas_ready": sum(1 for r in replicas if r.state == "ready"),
            "replicas": sum(1 for r in replicas if r.state in HOLDING),
        },
        "down": table.down,
        "facility": table.facility,
        "fabric": table.fabric,
    }


def _attention(
    models: list[ps.ModelRow],
    down: list[tuple[str, str]],
    quotas: list[dict],
    *,
    reconciler: str | None = None,
    stuck: list[tuple[str, str]] | None = None,
) -> dict:
    """What an operator should look at, worst first: a reconciler that stopped running
    passes, models that cannot run (parked, backing off after failures, each with its
    engine's last words, or unplaceable), drains stuck for lack of room, nodes that cannot
    be reached, scopes at a limit.
    Each kind names its first few and counts the rest."""
    parked = [m for m in models if m["status"] == "parked"]
    # Failing to start and trying again later: each with what its engine said last.
    backing_off = [m for m in models if m["failing"] and m["status"] != "parked"]
    unplaceable = [m for m in models if m["status"] == "unplaceable"]
    kinds = {
        "parked": parked,
        "backing_off": backing_off,
        "unplaceable": unplaceable,
        "stuck": list(stuck or ()),
        "down": down,
        "quotas": quotas,
    }
    return {
        "any": any(kinds.values()) or reconciler is not None,
        "reconciler": reconciler,
        **{k: v[:ATTENTION_NAMED] for k, v in kinds.items()},
        **{f"{k}_more": max(len(v) - ATTENTION_NAMED, 0) for k, v in kinds.items()},
    }


@staff_required
@needs("fleet.view_node")
@require_GET
def fabric(request: HttpRequest) -> HttpResponse:
    """The NVLink page: each NVLink domain drawn as a rack of its trays (fleet/console/
    fabric.py), or a sentence saying no node reports one."""
    context = fabric_page(node_views(), replica_views()) | {"section": "cluster"}
    return page(request, "fleet/fabric.html", context)


@staff_required
@needs("fleet.view_replica")
@require_GET
def replica_log(request: HttpRequest, replica_id: str) -> HttpResponse:
    """A replica's engine log, read from its node; htmx gets the panel alone (the model
    page shows it under its replicas), a browser the page. A node that is away or does
    not answer is said in a sentence in its place."""
    try:
        lines = logs.lines_checked(int(request.GET.get("lines", logs.DEFAULT_LINES)))
    except (ValueError, ServiceError):
        return HttpResponseBadRequest(f"lines must be a whole number from 1 to {LOG_LINES}.")
    context: dict = {"replica_id": replica_id, "lines": lines, "section": "models"}
    try:
        target = logs.log_target(replica_id=replica_id)
        # The channel layer lives on the server's event loop: async_to_sync runs it there.
        context["log"] = async_to_sync(logs.log_ask)(target=target, lines=lines)
        context["text"] = "\n".join(context["log"]["lines"])
    except ServiceError as exc:
        context["refused"] = str(exc)
    return page(
        request, "fleet/replica_log.html", context, fragment="log" if request.htmx else None
    )


@staff_required
@needs("fleet.view_node")
@require_http_methods(["GET", "POST"])
def node(request: HttpRequest, node_id: str) -> HttpResponse:
    """A node's page: its readings, GPUs and replicas; POST cordons, uncordons, drains,
    approves or forgets it (forgetting needs fleet.delete_node, and ends on the cluster page).

    A POST from htmx answers with the node's summary (its state and the result); from a
    plain form it redirects back here with the result as a message.
    """
    done, refused = "", ""
    if request.method == "POST":
        form = NodeActionForm(request.POST)
        action = form.cleaned_data["action"] if form.is_valid() else None
        require(request, "fleet.delete_node" if action == "forget" else "fleet.change_node")
        if action == "forget":
            return _forget(request, node_id)
        try:
            if action == "approve":
                done = identity.node_approve(
                    node_id=node_id,
                    actor=request.user.get_username(),
                    address=form.cleaned_data["address"],
                    now=clock.now(),
                )
            elif action is not None:
                done = services.node_set_schedule(
                    node_id=node_id, action=action, actor=request.user.get_username()
                )
        except NotFound:
            return _node_missing(request, node_id)
        except Invalid as exc:
            refused = str(exc)
        if action is None:
            refused = (
                "A node can be cordoned, uncordoned, drained, approved or forgotten; "
                "nothing else was asked."
            )
        if not request.htmx:
            if done:
                messages.success(request, done)
            else:
                messages.error(request, refused)
            return redirect("node", node_id=node_id)
    try:
        view = nodes_list(node_id=node_id)[0]
    except NotFound:
        return _node_missing(request, node_id)
    fragment = "summary" if request.method == "POST" else fragment_asked(request, NODE_FRAGMENTS)
    if fragment == "charts":
        return page(
            request, "fleet/node_detail.html", _node_charts(request, view), fragment=fragment
        )
    context = _node_context(view) | {"done": done, "refused": refused, "section": "cluster"}
    if fragment is None:
        context |= _node_charts(request, view)
    if fragment is None:  # the whole page: what happened to it, newest first
        context |= {
            "events": events.recent(node=node_id),
            "more": f"llmgw ctl events --node {node_id}",
        }
    return page(request, "fleet/node_detail.html", context, fragment=fragment)


def _forget(request: HttpRequest, node_id: str) -> HttpResponse:
    """Forget the node (fleet.nodes.identity.node_forget) and go to the cluster page, where the
    sentence is shown: the node's own page is gone with it."""
    try:
        done, commands = identity.node_forget(
            node_id=node_id, actor=request.user.get_username(), now=clock.now()
        )
    except NotFound:
        return _node_missing(request, node_id)
    dispatch(commands)
    node_disconnect(node_id)
    messages.success(request, done)
    if request.htmx:
        response = HttpResponse(status=204)
        response["HX-Redirect"] = reverse("cluster")
        return response
    return redirect("cluster")


def _node_missing(request: HttpRequest, node_id: str) -> HttpResponse:
    """The whole 404 page, even to htmx: this page has no fragments to ask for."""
    response = render(
        request, "fleet/node_missing.html", {"node_id": node_id, "section": "cluster"}, status=404
    )
    patch_vary_headers(response, ("HX-Request",))
    return response


def _node_charts(request: HttpRequest, view: dict) -> dict:
    """Its charts: memory only when it reports its use, GPUs only when some GPU reports a
    reading, and otherwise a line saying why there are none."""
    load = view["load"] if isinstance(view["load"], dict) else {}
    readings = [g for g in load.get("gpus") or () if isinstance(g, dict)]
    indices = tuple(sorted(g["index"] for g in view["gpus"]))
    said = gpu_charts_said(len(indices), readings)
    if said and indices and _gpus_were_read(view["id"], indices):
        said = ""  # silent now, but what they said before is worth its charts
    if said:
        indices = ()
    memory = _reading(load.get("memory_used_bytes")) is not None
    return charts_context(request, node_charts(view["id"], indices, memory=memory)) | {
        "charts_said": said
    }


def _gpus_were_read(node_id: str, indices: tuple[int, ...]) -> bool:
    """Whether the history holds a reading of any of the node's GPUs (in its finest ring)."""
    series = [f"gpu{i}.{name}" for i in indices for name, _ in GPU_SERIES]
    return any(v is not None for v in newest(f"node:{node_id}", series))


def _reading(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _node_context(view: dict) -> dict:
    """The node as its page shows it: each GPU with its readings, and which sensors it has."""
    load = view["load"] if isinstance(view["load"], dict) else {}
    readings = {
        g["index"]: g
        for g in load.get("gpus") or ()
        if isinstance(g, dict) and isinstance(g.get("index"), int)
    }
    replicas = ps.node_replicas(view["id"])
    model_of = {r["id"]: r["model"] for r in replicas}
    gpus = []
    for g in view["gpus"]:
        read = readings.get(g["index"], {})
        figures = {k: _reading(read.get(k)) for k in (*GPU_SENSORS, "power_limit_w")}
        power, cap = figures["power_w"], figures["power_limit_w"]
        gpus.append(
            g
            | figures
            | {
                "throttle": [t for t in read.get("throttle") or () if isinstance(t, str)],
                "power_percent": min(power * 100 / cap, 100) if power and cap else None,
                "over": bool(power and cap and power >= cap),
                "model": model_of.get(g["replica"]) if g["replica"] else None,
                "memory_gb": g["memory_mb"] / 1024 if g["memory_mb"] else None,
                "memory_used_gb": (
                    figures["memory_used_mb"] / 1024
                    if figures["memory_used_mb"] is not None
                    else None
                ),
            }
        )
    measured = {k: any(g[k] is not None for g in gpus) for k in GPU_SENSORS}
    used_by = load.get("shards") if isinstance(load.get("shards"), dict) else {}
    gpu_used = {g["index"]: g["memory_used_gb"] for g in gpus}
    engines = ps.node_engine_readings(view["id"])
    for r in replicas:
        r["engine"] = reading_out(engines.get(r["shard"]))
        use = used_by.get(r["shard"]) if isinstance(used_by.get(r["shard"]), dict) else {}
        on_gpus = [gpu_used.get(i) for i in r["gpus"]]
        r |= {
            "cores_used": _reading(use.get("cpu_cores")),
            "rss_bytes": _reading(use.get("rss_bytes")),
            # Its GPUs' memory in use, when every one of them says.
            "gpu_memory_gb": sum(on_gpus) if on_gpus and None not in on_gpus else None,
        }
    memory_total = view["memory_gb"] * 1024**3 if view["memory_gb"] else None
    used = _reading(load.get("memory_used_bytes"))
    figures = {k: _reading(load.get(k)) for k in LOAD_FIGURES}
    # The CPU tile says what the chart's legend says: the newest reading sampled into the
    # history, not a heartbeat that came in after it.
    (sampled,) = newest(f"node:{view['id']}", ["cpu"])
    if sampled is not None and figures.get("cpu_percent") is not None:
        figures["cpu_percent"] = sampled
    return {
        "node": view,
        "labels": labels_shown(view["labels"] or {}, view["location"]),
        "installs": installs_shown(view["engines"] or {}, view["engine_installs"]),
        "actions": schedule_actions(cordoned=view["cordoned"], draining=view["draining"]),
        "load": figures,
        "memory_total_bytes": memory_total,
        "memory_percent": min(used * 100 / memory_total, 100) if used and memory_total else None,
        "gpus": gpus,
        "gpu_columns": measured | {"throttle": bool(readings)},
        "replicas": replicas,
        "replica_use": {
            k: any(r[k] is not None for r in replicas)
            for k in ("cores_used", "rss_bytes", "gpu_memory_gb", "engine")
        },
        "weights": sorted(view["weights"], key=lambda w: w["source"]),
        "disk": view["disk"],
        "live_refresh": f"?{_query(fragment='live')}",
        "fabric": node_fabric_shown(view),
    }
