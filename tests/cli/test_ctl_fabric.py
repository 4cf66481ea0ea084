"""``llmgw ctl fabric``, ``ctl gpu cordon|uncordon NODE:INDEX`` and ``ctl model defrag``:
against a fake server for what is printed, and against the real API for the shapes sent
and answered."""

from __future__ import annotations

import pytest

from llmgw.cli import ctl
from tests.cli.helpers import FakeServer, run, table

FABRIC = {
    "domains": [
        {
            "name": "domain c0ffee clique 1",
            "cluster_uuid": "c0ffee",
            "clique": 1,
            "gpus_total": 8,
            "gpus_free": 3,
            "imex_up": 1,
            "replicas": ["wide-1a2b3c"],
            "trays": [
                {"node": "n1", "state": "ready", "gpus_total": 4, "gpus_free": 0, "imex": "up",
                 "replicas": ["wide-1a2b3c"], "problems": []},
                {"node": "n2", "state": "ready", "gpus_total": 4, "gpus_free": 3, "imex": "down",
                 "replicas": [], "problems": ["GPU 2 of node n2 is cordoned"]},
            ],
        }
    ],
    "problems": ["GPU 2 of node n2 is cordoned"],
}  # fmt: skip


def test_fabric_shows_each_domain_then_its_trays_and_what_is_out_of_service(capsys):
    server = FakeServer({("GET", "/api/v1/fabric"): (200, FABRIC)})

    code, out, err = run(capsys, server, "fabric")

    assert (code, err) == (0, "")
    body, legend, problems = out.rstrip("\n").split("\n\n")
    assert table(body) == [
        ["DOMAIN", "TRAY", "STATE", "GPUS FREE", "IMEX", "REPLICAS"],
        ["domain c0ffee clique 1", "2 trays", "-", "3/8", "up on 1", "wide-1a2b3c"],
        ["-", "n1", "ready", "0/4", "up", "wide-1a2b3c"],
        ["-", "n2", "ready", "3/4", "down", "-"],
    ]
    assert legend.startswith("GPUS FREE: ")
    assert problems == "Out of service:\n  GPU 2 of node n2 is cordoned"


def test_fabric_without_any_domain_says_multi_node_replicas_go_by_the_label(capsys):
    server = FakeServer({("GET", "/api/v1/fabric"): (200, {"domains": [], "problems": []})})

    _, out, _ = run(capsys, server, "fabric")

    assert out.strip() == ctl.ctl_fabric.NOTHING


@pytest.mark.parametrize("address", ["n1", "n1:", ":3", "n1:x", "n1:-1"])
def test_gpu_cordon_refuses_what_is_not_node_colon_index_without_asking(capsys, address):
    server = FakeServer()

    code, _, err = run(capsys, server, "gpu", "cordon", address)

    assert code == 2
    assert "is not NODE:INDEX" in err
    assert server.requests == []


def test_gpu_cordon_posts_to_the_gpu_and_prints_the_servers_sentence(capsys):
    said = {"detail": "GPU 3 of node rack1:t2 cordoned: no new replica is placed on it"}
    path = "/api/v1/nodes/rack1:t2/gpus/3/cordon"
    server = FakeServer({("POST", path): (200, said)})

    code, out, _ = run(capsys, server, "gpu", "cordon", "rack1:t2:3")

    assert code == 0
    assert server.last.url.path == path
    assert out.strip() == said["detail"]


@pytest.mark.django_db
def test_a_gpu_is_cordoned_uncordoned_and_shown_in_the_fabric_against_the_api(capsys, server):
    from fleet.models import Gpu
    from tests.fleet.test_fabric_ops import joined, register

    register("n1", [joined(0), joined(1)])

    code = ctl.main(["gpu", "cordon", "n1:1"], transport=server)
    out = capsys.readouterr().out

    assert (code, out) == (0, "GPU 1 of node n1 cordoned: no new replica is placed on it\n")
    assert Gpu.objects.get(node="n1", index=1).cordoned
    ctl.main(["fabric"], transport=server)
    shown = capsys.readouterr().out
    assert "1/2" in table(shown.split("\n\n")[0])[1]
    assert "GPU 1 of node n1 is cordoned" in shown
    code = ctl.main(["gpu", "uncordon", "n1:1"], transport=server)
    assert (code, capsys.readouterr().out) == (0, "GPU 1 of node n1 uncordoned\n")
    code = ctl.main(["gpu", "cordon", "n1:9"], transport=server)
    assert code == 1
    assert capsys.readouterr().err.strip() == "error: Node n1 has no GPU 9."


DEFRAG = {
    "model": "big",
    "done": False,
    "summary": "moving small-1 of small from a0 to b1 would free 4 trays of domain c0ffee "
    "clique 1 for big",
    "domain": "domain c0ffee clique 1",
    "moves": [{"replica": "small-1", "model": "small", "from": ["a0"], "to": ["b1"]}],
    "leaving": ["chat-2"],
    "blocked": [],
}


def test_model_defrag_shows_the_moves_what_it_counts_on_and_that_it_is_only_said(capsys):
    server = FakeServer({("GET", "/api/v1/models/big/defrag"): (200, DEFRAG)})

    code, out, err = run(capsys, server, "model", "defrag", "big")

    assert (code, err) == (0, "")
    summary, moves, leaving, done = out.rstrip("\n").split("\n\n")
    assert summary == DEFRAG["summary"]
    assert table(moves.split("\n", 1)[1]) == [
        ["REPLICA", "MODEL", "FROM", "TO"],
        ["small-1", "small", "a0", "b1"],
    ]
    assert leaving == "Counts on these leaving already: chat-2"
    assert done == ctl.ctl_fabric.DEFRAG_DONE[False]


def test_model_defrag_says_why_no_domain_can_be_freed(capsys):
    blocked = {
        **DEFRAG,
        "summary": "no NVLink domain can be freed for big",
        "moves": [],
        "leaving": [],
        "blocked": ["domain c0ffee clique 1: no room outside it for a replacement of chat-3"],
    }
    server = FakeServer({("GET", "/api/v1/models/big/defrag"): (200, blocked)})

    _, out, _ = run(capsys, server, "model", "defrag", "big")

    assert out.rstrip("\n").split("\n\n") == [blocked["summary"], blocked["blocked"][0]]


@pytest.mark.django_db
def test_model_defrag_against_the_api(capsys, server):
    from tests.fleet.test_fabric_ops import fragmented

    fragmented()
    code = ctl.main(["model", "defrag", "big"], transport=server)
    out = capsys.readouterr().out

    assert code == 0
    assert table(out.split("\n\n")[1].split("\n", 1)[1])[1] == ["small-1", "small", "c1-0", "c2-1"]
    assert ctl.main(["model", "defrag", "nope"], transport=server) == 1
