"""The mirror page (`/mirror`) through the Django client: a tab per state, a card per
weights and file, the plan and serve form of a ready GGUF file, adding, retrying and
removing weights, to staff only, with every refusal a sentence and nothing stored; its
queries are counted at 3 and at 30 weights."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from catalog.models import Model
from fleet.nodes.registration import node_register
from fleet.protocol import Register
from llmgw.core import clock
from mirror import services, store
from mirror.models import WeightFile, Weights
from mirror.worker import work_until_idle
from tests.fleet.builders import agent_credential, register_frame
from tests.mirror.ggufs import write_gguf
from tests.mirror.test_weights import mirror_dir  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
# The page at any count of weights: the session and user, the weights, their files and
# the models naming them; and, when a ready GGUF file is shown, one read of the fleet's
# free room for every plan (fleet.selectors.dry_runs.node_rooms, counted on its own below).
PAGE_QUERIES = 5


def cpu_node(node_id: str, *, memory_gb: int, cpus: int) -> None:
    """A CPU node with llama.cpp, registered as its agent would."""
    frame = register_frame(node_id, gpus=(), memory_total_mb=memory_gb * 1024, cpu_count=cpus)
    frame["engines"] = {"llamacpp": "b6000"}
    node_register(
        msg=Register.model_validate(frame),
        session=f"s-{node_id}",
        now=clock.now(),
        credential=agent_credential(node_id),
        seen_addr="10.0.0.7",
    )


def added(path, *, sha256: str = "") -> Weights:
    weights, _ = services.weights_add(source=str(path), sha256=sha256, actor="ops", now=clock.now())
    return weights


def gguf(mirror_dir, name: str = "model.gguf", **figures):  # noqa: F811
    # 32 layers, 8 KV heads of 128: at the default context of 8,192 the KV cache is 1 GiB,
    # which with 1 GiB of overhead and a few KB of weights is 3 GB.
    return write_gguf(mirror_dir / "allowed" / name, name="Tiny", context_length=8192, **figures)


@pytest.fixture
def ready(mirror_dir) -> Weights:  # noqa: F811
    weights = added(gguf(mirror_dir))
    work_until_idle()
    return weights


def card(body: str, weights_id: int) -> str:
    """The card of these weights on the page."""
    found = re.search(rf'<article [^>]*data-weights="{weights_id}".*?</article>', body, re.S)
    assert found, f"no card for weights {weights_id}"
    return found.group(0)


def cards(body: str) -> list[int]:
    return [int(i) for i in re.findall(r'<article [^>]*data-weights="(\d+)"', body)]


def tab_count(body: str, state: str) -> int:
    return int(
        re.search(rf'data-tab="{state}"[^>]*>{state} <span class="count">(\d+)</span>', body)[1]
    )


def field_error(body: str, field: str) -> str:
    found = re.search(rf'data-field="{field}">.*?<ul class="errorlist[^"]*"[^>]*>(.*?)</ul>', body)
    return re.sub(r"<[^>]+>", "", found[1]) if found else ""


def text(html: str) -> str:
    """The page's words, with entities read back (Django escapes quotes)."""
    import html as html_module

    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


# Staff only, and CSRF on every form


def test_someone_not_logged_in_is_sent_to_log_in(client):
    response = client.get("/mirror?state=failed")
    assert response.status_code == 302
    assert response.url.startswith("/login/?next=/mirror")
    response = client.get("/mirror", **HX)
    assert response.status_code == 204 and response["HX-Redirect"].startswith("/login/")


def test_a_user_who_is_not_staff_can_neither_see_nor_change_the_mirror(
    client, django_user_model, ready
):
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    assert client.get("/mirror").status_code == 403
    assert client.get("/mirror?fragment=weights-list", **HX).status_code == 403
    posts = [
        {"form": "add", "source": "/nowhere"},
        {"form": "remove", "weights": ready.pk},
        {"form": "retry", "weights": ready.pk},
        {"form": "serve", "weights": ready.pk, "file": "model.gguf", "name": "tiny"},
    ]
    for post in posts:
        assert client.post("/mirror", post).status_code == 403
    assert list(Weights.objects.values_list("pk", flat=True)) == [ready.pk]
    assert not Model.objects.exists()


def test_a_post_without_the_csrf_token_is_refused_and_one_with_it_is_done(
    django_user_model,
    mirror_dir,  # noqa: F811
):
    path = gguf(mirror_dir)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(
        django_user_model.objects.create_user("ops", password="x", is_staff=True, is_superuser=True)
    )
    page = browser.get("/mirror")
    assert b'name="csrfmiddlewaretoken"' in page.content

    assert browser.post("/mirror", {"form": "add", "source": str(path)}, **HX).status_code == 403
    assert not Weights.objects.exists()

    token = re.search(rb'"X-CSRFToken": "([^"]+)"', page.content).group(1).decode()
    response = browser.post(
        "/mirror", {"form": "add", "source": str(path)}, HTTP_X_CSRFTOKEN=token, **HX
    )
    assert response.status_code == 200
    assert Weights.objects.get().source == str(path)


# The tabs


def test_the_page_is_in_the_nav_opens_on_ready_and_varies_on_htmx(staff, ready):
    response = staff.get("/mirror")
    body = response.content.decode()
    assert response.status_code == 200 and body.startswith("<!doctype html>")
    assert '<a href="/mirror" aria-current="page">Mirror</a>' in body
    assert re.search(r'<section id="weights-list" data-tab="ready"', body)
    assert cards(body) == [ready.pk]
    assert "HX-Request" in response["Vary"]


def test_each_tab_shows_the_weights_in_its_state_with_every_tabs_count(staff, mirror_dir):  # noqa: F811
    done = added(gguf(mirror_dir, "done.gguf"))
    work_until_idle()
    wrong = added(gguf(mirror_dir, "wrong.gguf"), sha256="0" * 64)
    work_until_idle()
    fetching = added(gguf(mirror_dir, "fetching.gguf"))
    claimed = services.file_claim(now=clock.now())
    services.file_progress(file_id=claimed.pk, done=1000, total=None, now=clock.now())
    waiting = added(gguf(mirror_dir, "waiting.gguf"))

    expected = {"ready": done, "failed": wrong, "downloading": fetching, "queued": waiting}
    for state, weights in expected.items():
        body = staff.get(f"/mirror?state={state}").content.decode()
        assert cards(body) == [weights.pk], state
        assert card(body, weights.pk).count(f'data-state="{state}"') == 1
        assert re.search(rf'data-tab="{state}"[^>]*aria-current="page"', body)
        assert {s: tab_count(body, s) for s in expected} == dict.fromkeys(expected, 1)


def test_a_tab_is_switched_by_htmx_with_the_list_alone(staff, ready, mirror_dir):  # noqa: F811
    waiting = added(gguf(mirror_dir, "waiting.gguf"))

    response = staff.get("/mirror?state=queued&fragment=weights-list", **HX)
    body = response.content.decode()
    assert "<html" not in body and "<h1>" not in body
    assert body.lstrip().startswith('<section id="weights-list" data-tab="queued"')
    assert cards(body) == [waiting.pk]
    assert 'id="weights-add-form"' not in body
    # Each tab asks for its own list and puts its own address in the bar.
    assert 'hx-get="/mirror?state=ready&amp;fragment=weights-list"' in body
    assert 'hx-push-url="/mirror?state=ready"' in body
    # Without htmx the same address is the whole page.
    assert "<html" in staff.get("/mirror?state=queued&fragment=weights-list").content.decode()


def test_an_unknown_state_shows_the_ready_tab(staff, ready):
    body = staff.get("/mirror?state=everything").content.decode()
    assert cards(body) == [ready.pk]


def test_no_weights_in_a_state_says_so(staff):
    body = staff.get("/mirror?state=failed").content.decode()
    assert '<p class="muted" id="no-weights">No weights are failed.</p>' in body


# A card in each state


def test_a_queued_card_says_it_waits_and_the_list_refreshes_itself(staff, mirror_dir):  # noqa: F811
    path = gguf(mirror_dir)
    weights = added(path)

    body = staff.get("/mirror?state=queued").content.decode()
    c = card(body, weights.pk)
    assert str(path) in c and "waiting for the mirror&#x27;s worker" in c
    assert "no digest yet" in c
    assert f"{path.stat().st_size:,} bytes" in c
    assert re.search(r'id="weights-list"[^>]*hx-trigger="every 3s"', body)


def test_a_downloading_card_has_a_bar_with_its_bytes_and_refreshes_while_it_lasts(
    staff,
    mirror_dir,  # noqa: F811
):
    big = mirror_dir / "allowed" / "big.gguf"
    big.write_bytes(b"GGUF" + b"\0" * 2_499_996)
    weights = added(big)
    f = services.file_claim(now=clock.now())
    services.file_progress(file_id=f.pk, done=1_000_000, total=2_500_000, now=clock.now())

    body = staff.get("/mirror?state=downloading").content.decode()
    c = card(body, weights.pk)
    assert 'aria-valuenow="40.0"' in c and 'data-width="40.0"' in c
    assert "1.0 MB of 2.5 MB" in c
    assert re.search(r'id="weights-list"[^>]*hx-trigger="every 3s"', body)
    # On another tab only the counts refresh, so a serve form being typed in is left alone.
    ready_tab = staff.get("/mirror?state=ready").content.decode()
    assert not re.search(r'id="weights-list"[^>]*hx-trigger', ready_tab)
    assert re.search(r'id="weights-tabs"[^>]*hx-trigger="every 3s"', ready_tab)
    tabs = staff.get("/mirror?state=ready&fragment=weights-tabs", **HX).content.decode()
    assert (
        tabs.lstrip().startswith('<nav id="weights-tabs"') and tab_count(tabs, "downloading") == 1
    )

    services.file_done(
        file_id=f.pk, sha256=hashlib.sha256(big.read_bytes()).hexdigest(), size=2_500_000
    )
    body = staff.get("/mirror?state=downloading&fragment=weights-list", **HX).content.decode()
    assert "hx-trigger" not in body  # nothing left to fetch: the polling stops
    assert tab_count(body, "ready") == 1


def test_a_size_not_known_is_a_dash_never_zero_bytes(staff, mirror_dir):  # noqa: F811
    weights = added(gguf(mirror_dir))
    WeightFile.objects.update(size=None)
    assert services.file_claim(now=clock.now()) is not None

    body = staff.get("/mirror?state=downloading").content.decode()
    c = card(body, weights.pk)
    assert '<dd data-size title="size not known yet">–</dd>' in c
    assert "data-file-size>–</span>" in c
    assert "its size is not known yet" in c
    assert "0 B" not in c and "aria-valuenow" not in c


def test_a_failed_card_says_why_and_retry_queues_it_again(staff, mirror_dir):  # noqa: F811
    weights = added(gguf(mirror_dir), sha256="0" * 64)
    work_until_idle()

    c = card(staff.get("/mirror?state=failed").content.decode(), weights.pk)
    failure = re.search(r'<p class="error failure" data-failure>(.*?)</p>', c, re.S)[1]
    assert "does not match its digest" in failure and "nothing was kept" in failure
    assert f'data-retry="{weights.pk}"' in c

    response = staff.post("/mirror?state=failed", {"form": "retry", "weights": weights.pk})

    assert response.status_code == 302 and response.url == "/mirror?state=queued"
    assert list(WeightFile.objects.values_list("state", "attempts")) == [("queued", 0)]
    body = staff.get(response.url).content.decode()
    assert f"Weights {weights.pk}: 1 file queued again." in body
    assert cards(body) == [weights.pk]


def test_retrying_weights_that_did_not_fail_is_a_sentence(staff, ready):
    response = staff.post("/mirror", {"form": "retry", "weights": ready.pk}, **HX)
    assert response.status_code == 400
    assert f"Weights {ready.pk} have no failed file to retry." in card(
        response.content.decode(), ready.pk
    )
    assert staff.post("/mirror", {"form": "retry", "weights": "x"}).status_code == 400


def test_a_ready_card_shows_its_file_digest_models_and_who_added_it(staff, ready, mirror_dir):  # noqa: F811
    digest = hashlib.sha256((mirror_dir / "allowed" / "model.gguf").read_bytes()).hexdigest()
    Model.objects.create(name="tiny", source=ready.source)

    c = card(staff.get("/mirror").content.decode(), ready.pk)
    assert (
        f'<code class="digest" title="sha256 {digest}" data-digest="{digest}">{digest[:12]}…</code>'
        in c
    )
    assert f'data-copy="{digest}"' in c
    assert '<a href="/models/tiny">tiny</a>' in c
    assert "by ops," in c
    assert "<dd data-last-used>never</dd>" in c


# The plan and the serve form


def test_a_ready_gguf_file_says_what_it_needs_where_it_fits_and_why_not(staff, ready):
    cpu_node("big", memory_gb=64, cpus=16)
    cpu_node("small", memory_gb=1, cpus=4)

    c = card(staff.get("/mirror").content.decode(), ready.pk)
    plan = re.search(r'<div class="plan" data-plan>.*?</form>', c, re.S)[0]
    assert "<dd data-memory>3 GB memory</dd>" in plan
    assert "<dd data-cores>8</dd>" in plan  # half the smallest node it fits on
    assert '<dd data-ctx>8192 <span class="muted">of 8192 trained</span></dd>' in plan
    assert "llama" in plan and "of f16 KV cache" in plan  # the basis sentence
    assert re.search(r'data-fits>Fits now on <a href="/nodes/big">big</a></p>', plan)
    assert "small has 1 GB free of 1 GB; " in plan
    assert 'name="ctx" value="8192"' in plan
    assert f'name="weights" value="{ready.pk}"' in plan and 'name="file" value="model.gguf"' in plan


def test_with_no_node_it_fits_on_the_plan_says_so(staff, ready):
    c = card(staff.get("/mirror").content.decode(), ready.pk)
    assert "<strong>no node</strong>" in c


def serve(client, weights: Weights, headers=None, **fields):
    return client.post(
        "/mirror?state=ready",
        {"form": "serve", "weights": weights.pk, "file": "model.gguf", **fields},
        **(headers or {}),
    )


def test_serving_adds_a_sized_llamacpp_model_and_goes_to_its_page(staff, ready):
    cpu_node("big", memory_gb=64, cpus=16)

    response = serve(staff, ready, name="tiny", ctx="4096", min="1", max="2")

    assert response.status_code == 302 and response.url == "/models/tiny"
    model = Model.objects.get(name="tiny")
    assert model.source == ready.source
    profile = model.profiles.get()
    assert (profile.engine, profile.args, profile.min_memory_gb) == (
        "llamacpp",
        ["--ctx-size", "4096"],
        2,
    )
    assert (model.min_replicas, model.max_replicas) == (1, 2)
    assert "Model tiny added from weights" in staff.get("/models/tiny").content.decode()
    # The card names the model now using it.
    assert '<a href="/models/tiny">tiny</a>' in card(
        staff.get("/mirror").content.decode(), ready.pk
    )


def test_serving_from_htmx_is_sent_to_the_models_page(staff, ready):
    response = staff.post(
        "/mirror",
        {"form": "serve", "weights": ready.pk, "file": "model.gguf", "name": "tiny"},
        **HX,
    )
    assert response.status_code == 204 and response["HX-Redirect"] == "/models/tiny"
    assert Model.objects.get().profiles.get().args == ["--ctx-size", "8192"]


@pytest.mark.parametrize(
    ("fields", "where", "said"),
    [
        ({"name": ""}, "name", "This field is required."),
        ({"name": "Bad Name"}, "name", "A model's name must be lowercase letters"),
        ({"name": "serve"}, "name", "'serve' names an action of the API"),
        ({"name": "tiny", "ctx": "100000"}, "ctx", "was trained on 8,192 tokens of context"),
        ({"name": "tiny", "ctx": "0"}, "ctx", "The context must be a positive number"),
        ({"name": "tiny", "ctx": "big"}, "ctx", "Enter a whole number."),
        ({"name": "tiny", "min": "-1"}, "min", "min must be at least 0, not -1."),
        ({"name": "tiny", "min": "3", "max": "1"}, "max", "max (1) is below min (3)."),
    ],
)
def test_a_serve_that_cannot_be_made_is_refused_beside_its_field_and_adds_nothing(
    staff, ready, fields, where, said
):
    response = serve(staff, ready, **fields)

    assert response.status_code == 400
    body = response.content.decode()
    assert said in text(field_error(body, where))
    assert not Model.objects.exists()
    # The figures stay as typed, on the card they were typed on.
    c = card(body, ready.pk)
    for name, value in fields.items():
        if value:
            assert f'name="{name}" value="{value}"' in text(c) or f'value="{value}"' in c


def test_a_name_already_taken_is_refused_and_the_first_model_is_kept(staff, ready):
    assert serve(staff, ready, name="tiny", ctx="2048").status_code == 302

    response = serve(staff, ready, name="tiny", ctx="4096")

    assert response.status_code == 400
    assert "A model named tiny already exists." in field_error(response.content.decode(), "name")
    assert Model.objects.get().profiles.get().args == ["--ctx-size", "2048"]


def test_serving_weights_removed_meanwhile_is_a_sentence(staff, ready):
    services.weights_remove(weights_id=ready.pk, using=[])
    response = serve(staff, ready, name="tiny", headers=HX)
    assert response.status_code == 400
    assert f"There are no weights {ready.pk}." in response.content.decode()
    assert not Model.objects.exists()


def test_a_file_that_is_not_gguf_shows_the_plans_sentence_instead_of_the_form(
    staff,
    mirror_dir,  # noqa: F811
):
    path = mirror_dir / "allowed" / "model.bin"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    weights = added(path)
    work_until_idle()

    c = card(staff.get("/mirror").content.decode(), weights.pk)
    said = re.search(r"<p class=\"reason\" data-plan-said>(.*?)</p>", c)[1]
    assert text(said).startswith("model.bin is not a GGUF file: it starts with 'PK")
    assert '<form class="serve"' not in c


# Adding weights


def test_weights_added_by_a_path_are_queued_and_shown_on_their_tab(staff, mirror_dir):  # noqa: F811
    path = gguf(mirror_dir)

    response = staff.post("/mirror?state=ready", {"form": "add", "source": str(path)})

    weights = Weights.objects.get()
    assert (weights.source, weights.added_by) == (str(path), "ops")
    assert response.status_code == 302 and response.url == "/mirror?state=queued"
    body = staff.get(response.url).content.decode()
    assert f"Weights {weights.pk} added from {path}: 1 file queued" in body
    assert cards(body) == [weights.pk]

    work_until_idle()
    assert cards(staff.get("/mirror?state=ready").content.decode()) == [weights.pk]


def test_adding_from_htmx_answers_with_the_page_on_the_new_weights_tab(staff, mirror_dir):  # noqa: F811
    path = gguf(mirror_dir)
    response = staff.post("/mirror", {"form": "add", "source": str(path)}, **HX)
    body = response.content.decode()
    assert response.status_code == 200 and response["HX-Push-Url"] == "/mirror?state=queued"
    assert body.lstrip().startswith('<div id="mirror-main">')
    assert cards(body) == [Weights.objects.get().pk]

    again = staff.post("/mirror", {"form": "add", "source": str(path)}, **HX)
    assert "was already added, as weights" in again.content.decode()
    assert Weights.objects.count() == 1


@pytest.mark.parametrize(
    ("source", "sha256", "where", "said"),
    [
        ("/etc/passwd", "", "source", "LLMGW_MIRROR_SOURCES"),
        ("ftp://example.com/model.gguf", "", "source", "ftp"),
        ("", "", "source", "This field is required."),
        ("{allowed}/model.gguf", "abc", "sha256", "sha256 must be 64 hexadecimal digits."),
        ("{allowed}/missing.gguf", "", "source", "missing.gguf"),
    ],
)
def test_weights_that_cannot_be_added_are_a_sentence_beside_the_field_and_nothing_is_stored(
    staff,
    mirror_dir,  # noqa: F811
    source,
    sha256,
    where,
    said,
):
    gguf(mirror_dir)
    source = source.format(allowed=mirror_dir / "allowed")

    response = staff.post("/mirror", {"form": "add", "source": source, "sha256": sha256}, **HX)

    assert response.status_code == 400
    body = response.content.decode()
    assert said in text(field_error(body, where))
    assert f'value="{source}"' in body or not source  # kept to be mended
    assert not Weights.objects.exists() and not WeightFile.objects.exists()


def test_a_hub_that_does_not_answer_is_a_sentence_and_nothing_is_stored(
    staff,
    mirror_dir,  # noqa: F811
    monkeypatch,
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")

    response = staff.post("/mirror", {"form": "add", "source": "hf://acme/tiny"}, **HX)

    assert response.status_code == 400
    assert field_error(response.content.decode(), "source")
    assert not Weights.objects.exists()


# Removing weights


def test_removing_weights_a_model_uses_is_refused_naming_it(staff, ready):
    Model.objects.create(name="tiny", source=ready.source)

    response = staff.post("/mirror", {"form": "remove", "weights": ready.pk}, **HX)

    assert response.status_code == 400
    refused = re.search(r"data-refused>(.*?)</p>", card(response.content.decode(), ready.pk))[1]
    assert f"Weights {ready.pk} ({ready.source}) are used by tiny" in refused
    assert Weights.objects.filter(pk=ready.pk).exists()


def test_removing_unused_weights_deletes_them_and_their_file(staff, ready):
    digest = WeightFile.objects.get().sha256
    assert store.blob(digest).exists()

    response = staff.post("/mirror?state=ready", {"form": "remove", "weights": ready.pk})

    assert response.status_code == 302 and response.url == "/mirror?state=ready"
    assert not Weights.objects.exists() and not store.blob(digest).exists()
    assert (
        f"Weights {ready.pk} ({ready.source}) removed." in staff.get(response.url).content.decode()
    )


def test_removing_weights_that_are_not_there_is_a_sentence(staff):
    response = staff.post("/mirror", {"form": "remove", "weights": 999}, **HX)
    assert response.status_code == 400
    assert "There are no weights 999." in response.content.decode()


def test_a_post_that_is_none_of_the_forms_is_a_400(staff):
    assert staff.post("/mirror", {"form": "everything"}).status_code == 400
    assert staff.post("/mirror", {}).status_code == 400


# Queries


def _queries(call) -> int:
    with CaptureQueriesContext(connection) as queries:
        call()
    return len(queries)


@pytest.mark.parametrize("count", [3, 30])
def test_the_page_makes_the_same_queries_whatever_the_count_of_weights(staff, mirror_dir, count):  # noqa: F811
    from fleet.selectors.dry_runs import node_rooms

    cpu_node("big", memory_gb=64, cpus=16)
    for i in range(count):
        added(gguf(mirror_dir, f"m{i}.gguf", block_count=8 + i))
    work_until_idle()
    Model.objects.create(name="tiny", source=str(mirror_dir / "allowed" / "m0.gguf"))
    staff.get("/mirror")  # the fleet's registrations are read once, then kept

    body = staff.get("/mirror").content.decode()
    assert len(cards(body)) == count and body.count("data-plan>") == count
    fleet = _queries(node_rooms)
    assert _queries(lambda: staff.get("/mirror")) == PAGE_QUERIES + fleet
    # A tab with no ready file shown does not read the fleet at all.
    assert _queries(lambda: staff.get("/mirror?state=queued")) == PAGE_QUERIES
