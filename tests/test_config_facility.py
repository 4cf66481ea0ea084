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


def test_shedding_is_off_by_default_on_for_every_domain_or_for_those_named(env):
    from llmgw.core.config import Shedding

    assert load(env).facility_shed == Shedding()
    assert not load(env).facility_shed.applies(("rack", "r1"))
    every = load({**env, "LLMGW_FACILITY_SHED": "on"}).facility_shed
    assert every.applies(("rack", "r1")) and every.applies(("row", "b"))
    named = load(
        {
            **env,
            "LLMGW_FACILITY_SHED": "rack/r12-07, row/b",
            "LLMGW_FACILITY_SHED_DELAY_SECONDS": "120",
            "LLMGW_FACILITY_SHED_INTERVAL_SECONDS": "60",
        }
    ).facility_shed
    assert named == Shedding(False, frozenset({("rack", "r12-07"), ("row", "b")}), 120, 60)
    assert not named.applies(("rack", "r1"))


@pytest.mark.parametrize("value", ["perhaps", "rack/", "shelf/r1", "rack/r1,"])
def test_a_shedding_setting_that_names_no_domain_stops_the_start_in_a_sentence(env, value):
    with pytest.raises(SettingError, match="LLMGW_FACILITY_SHED: .* is not off, on or a domain"):
        load({**env, "LLMGW_FACILITY_SHED": value})


def test_power_capping_is_off_by_default_or_a_share_of_the_default_limit(env):
    assert load(env).facility_power_cap is None
    assert load({**env, "LLMGW_FACILITY_POWER_CAP": "0.8"}).facility_power_cap == 0.8
    for bad in ("80%", "0.05", "1.5", "on"):
        with pytest.raises(SettingError, match="LLMGW_FACILITY_POWER_CAP must be off or a share"):
            load({**env, "LLMGW_FACILITY_POWER_CAP": bad})


def test_a_capped_replicas_exponent_is_the_models_0_6_unless_set_from_0_to_2(env):
    assert load(env).power_cap_exponent == 0.6
    assert load({**env, "LLMGW_POWER_CAP_EXPONENT": "0.8"}).power_cap_exponent == 0.8
    assert load({**env, "LLMGW_POWER_CAP_EXPONENT": "0"}).power_cap_exponent == 0.0
    for bad in ("2.5", "-1", "-0.1", "half", "nan", "inf"):
        with pytest.raises(SettingError, match="must be a number from 0 to 2 .* not '"):
            load({**env, "LLMGW_POWER_CAP_EXPONENT": bad})
