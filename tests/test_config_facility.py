"""LLMGW_FACILITY_SOURCES and LLMGW_FACILITY_ENFORCE (docs/settings.md)."""

from __future__ import annotations

import pytest

from llmgw.core.config import SettingError, load


@pytest.fixture
def env(tmp_path):
    return {"LLMGW_HOME": str(tmp_path / "home")}


def test_conditions_are_observed_with_the_agents_sensors_only_by_default(env):
    cfg = load(env)

    assert (cfg.facility_sources, cfg.facility_enforce) == (None, False)


def test_a_sources_file_is_named_and_enforcement_turned_on(env, tmp_path):
    sources = tmp_path / "facility.yml"
    sources.write_text("facility: {}\n")

    cfg = load({**env, "LLMGW_FACILITY_SOURCES": str(sources), "LLMGW_FACILITY_ENFORCE": "on"})

    assert (cfg.facility_sources, cfg.facility_enforce) == (sources.resolve(), True)


def test_a_sources_file_that_is_not_there_stops_the_start_in_a_sentence(env, tmp_path):
    with pytest.raises(
        SettingError, match="LLMGW_FACILITY_SOURCES names '.*nowhere.yml', which is not a file"
    ):
        load({**env, "LLMGW_FACILITY_SOURCES": str(tmp_path / "nowhere.yml")})
    with pytest.raises(SettingError, match="LLMGW_FACILITY_ENFORCE"):
        load({**env, "LLMGW_FACILITY_ENFORCE": "perhaps"})
