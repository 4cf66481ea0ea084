"""Settings from the environment: defaults, and a sentence naming the variable for each bad value."""

from __future__ import annotations

import stat

import pytest

from llmgw.core.config import SettingError, Timings, load


@pytest.fixture
def env(tmp_path):
    """An environment with only LLMGW_HOME set, in a fresh directory."""
    return {"LLMGW_HOME": str(tmp_path / "home")}


def test_the_defaults_are_embedded_with_the_documented_timings(env, tmp_path):
    cfg = load(env)

    assert cfg.home == (tmp_path / "home").resolve()
    assert cfg.home.is_dir()
    assert (cfg.database_url, cfg.redis_url, cfg.catalog) == (None, None, None)
    assert cfg.embedded
    assert (cfg.log_format, cfg.debug) == ("text", False)
    t = cfg.timings
    assert (t.reconcile_interval, t.settle, t.unreachable, t.lost) == (5, 30, 15, 60)
    assert (t.min_lifetime, t.preempt_grace, t.preempt_hold) == (300, 30, 300)
    assert (t.drain_grace, t.eviction_grace) == (300, 120)
    assert (t.scale_up_after, t.scale_down_after) == (60, 600)
    assert (t.backoff_base, t.backoff_max, t.park_after) == (10, 300, 5)


def test_each_timing_is_read_from_its_variable(env):
    env |= {
        "LLMGW_SETTLE_SECONDS": "0",
        "LLMGW_UNREACHABLE_SECONDS": "2.5",
        "LLMGW_LOST_SECONDS": "9",
        "LLMGW_PARK_AFTER": "3",
        "LLMGW_RECONCILE_INTERVAL_SECONDS": " 1 ",
    }

    t = load(env).timings

    assert (t.settle, t.unreachable, t.lost, t.park_after, t.reconcile_interval) == (
        0,
        2.5,
        9,
        3,
        1,
    )
    assert t.min_lifetime == Timings.min_lifetime


def test_production_urls_are_taken_as_given(env, tmp_path):
    catalog = tmp_path / "models.yaml"
    catalog.write_text("models: []\n")
    env |= {
        "DATABASE_URL": "postgres://llmgw:pw@db.internal:5432/llmgw",
        "REDIS_URL": "rediss://cache.internal:6380/1",
        "LLMGW_CATALOG": str(catalog),
        "LLMGW_LOG_FORMAT": "json",
        "LLMGW_DEBUG": "1",
    }

    cfg = load(env)

    assert cfg.database_url == "postgres://llmgw:pw@db.internal:5432/llmgw"
    assert cfg.redis_url == "rediss://cache.internal:6380/1"
    assert not cfg.embedded
    assert cfg.catalog == catalog.resolve()
    assert (cfg.log_format, cfg.debug) == ("json", True)


BAD = {
    "a timing that is not a number": ("LLMGW_SETTLE_SECONDS", "soon"),
    "a negative timing": ("LLMGW_DRAIN_GRACE_SECONDS", "-1"),
    "a timing that is NaN": ("LLMGW_PREEMPT_GRACE_SECONDS", "nan"),
    "a timing that is infinite": ("LLMGW_MIN_LIFETIME_SECONDS", "inf"),
    "a timing too large to be a time": ("LLMGW_BACKOFF_MAX_SECONDS", "1e400"),
    "a count that is a fraction": ("LLMGW_PARK_AFTER", "2.5"),
    "a count of zero": ("LLMGW_PARK_AFTER", "0"),
    "an interval of zero": ("LLMGW_RECONCILE_INTERVAL_SECONDS", "0"),
    "a MySQL database": ("DATABASE_URL", "mysql://db/llmgw"),
    "a SQLite URL": ("DATABASE_URL", "sqlite:///var/db.sqlite3"),
    "a database URL that is not a URL": ("DATABASE_URL", "localhost:5432"),
    "a database URL with no host": ("DATABASE_URL", "postgres://"),
    "an HTTP Redis": ("REDIS_URL", "http://cache:6379"),
    "a Redis URL that is a host name": ("REDIS_URL", "cache.internal"),
    "a log format nobody reads": ("LLMGW_LOG_FORMAT", "xml"),
    "a short secret key": ("LLMGW_SECRET_KEY", "hunter2"),
    "an imbalance that is not a number": ("LLMGW_ROUTING_IMBALANCE", "lots"),
    "a negative imbalance": ("LLMGW_ROUTING_IMBALANCE", "-1"),
    "a KV cache fuller than full": ("LLMGW_ROUTING_KV_FULL", "1.5"),
    "a KV cache share of nothing": ("LLMGW_ROUTING_KV_FULL", "0"),
    "a KV cache share that is a word": ("LLMGW_ROUTING_KV_FULL", "most"),
    "a core drawing a word": ("LLMGW_POWER_CORE_WATTS", "some"),
    "a node drawing less than nothing": ("LLMGW_POWER_NODE_WATTS", "-5"),
    "a node drawing a substation": ("LLMGW_POWER_NODE_WATTS", "1000000"),
}


@pytest.mark.parametrize("variable, value", BAD.values(), ids=BAD.keys())
def test_a_bad_value_stops_with_a_sentence_naming_its_variable(env, variable, value):
    with pytest.raises(SettingError) as stopped:
        load(env | {variable: value})

    message = str(stopped.value)
    assert variable in message
    assert message.endswith(".")


def test_a_catalog_file_that_does_not_exist_stops_the_start(env, tmp_path):
    with pytest.raises(SettingError, match="LLMGW_CATALOG"):
        load(env | {"LLMGW_CATALOG": str(tmp_path / "missing.yaml")})


def test_a_catalog_that_is_a_directory_stops_the_start(env, tmp_path):
    with pytest.raises(SettingError, match="LLMGW_CATALOG"):
        load(env | {"LLMGW_CATALOG": str(tmp_path)})


@pytest.mark.parametrize("lost", ["15", "10"])
def test_lost_must_be_longer_than_unreachable(env, lost):
    with pytest.raises(SettingError) as stopped:
        load(env | {"LLMGW_UNREACHABLE_SECONDS": "15", "LLMGW_LOST_SECONDS": lost})

    assert "LLMGW_LOST_SECONDS" in str(stopped.value)
    assert "LLMGW_UNREACHABLE_SECONDS" in str(stopped.value)


def test_a_home_that_cannot_be_created_stops_with_its_name(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")

    with pytest.raises(SettingError, match="LLMGW_HOME"):
        load({"LLMGW_HOME": str(blocker / "home")})


def test_the_secret_key_is_generated_once_into_home_and_reused(env):
    first = load(env)
    again = load(env)

    path = first.home / "secret_key"
    assert first.secret_key == again.secret_key == path.read_text()
    assert len(first.secret_key) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_each_home_gets_its_own_secret_key(tmp_path):
    a = load({"LLMGW_HOME": str(tmp_path / "a")})
    b = load({"LLMGW_HOME": str(tmp_path / "b")})

    assert a.secret_key != b.secret_key


def test_a_secret_key_given_in_the_environment_wins_and_nothing_is_written(env):
    given = "k" * 40

    cfg = load(env | {"LLMGW_SECRET_KEY": given})

    assert cfg.secret_key == given
    assert not (cfg.home / "secret_key").exists()


def test_an_empty_secret_key_file_stops_with_a_sentence_naming_it(env):
    home = load(env).home
    (home / "secret_key").write_text("\n")

    with pytest.raises(SettingError, match="secret_key"):
        load(env)


def test_a_process_starting_at_the_same_time_uses_the_key_the_first_one_wrote(env, monkeypatch):
    from llmgw.core import config

    home = load(env | {"LLMGW_SECRET_KEY": "k" * 40}).home
    theirs = "t" * 64
    real = config.secrets.token_urlsafe

    def another_process_wins(n):
        (home / "secret_key").write_text(theirs)
        return real(n)

    monkeypatch.setattr(config.secrets, "token_urlsafe", another_process_wins)

    assert load(env).secret_key == theirs
    assert sorted(p.name for p in home.iterdir()) == ["secret_key"]


def test_login_throttling_has_documented_defaults_and_reads_its_variables(env):
    t = load(env).login
    assert (t.failures, t.address_failures, t.window, t.lockout) == (5, 20, 300, 900)

    t = load(
        env
        | {
            "LLMGW_LOGIN_FAILURES": "3",
            "LLMGW_LOGIN_ADDRESS_FAILURES": "7",
            "LLMGW_LOGIN_WINDOW_SECONDS": "60",
            "LLMGW_LOGIN_LOCKOUT_SECONDS": "120",
        }
    ).login
    assert (t.failures, t.address_failures, t.window, t.lockout) == (3, 7, 60, 120)


@pytest.mark.parametrize(
    "variable",
    ["LLMGW_LOGIN_FAILURES", "LLMGW_LOGIN_WINDOW_SECONDS", "LLMGW_LOGIN_LOCKOUT_SECONDS"],
)
def test_a_login_figure_of_zero_or_less_stops_the_start(env, variable):
    with pytest.raises(SettingError, match=variable):
        load(env | {variable: "0"})


def test_routing_is_read_from_its_variables(env):
    assert load(env | {"LLMGW_ROUTING_IMBALANCE": "0"}).routing.imbalance == 0.0
    assert load(env).routing.imbalance == 2.0
    assert load(env | {"LLMGW_ROUTING_KV_FULL": "0.95"}).routing.kv_full == 0.95
    assert load(env).routing.kv_full == 0.9


def test_the_power_figures_are_read_from_their_variables_and_none_unless_set(env):
    assert (load(env).power.core_watts, load(env).power.node_watts) == (None, None)
    power = load(env | {"LLMGW_POWER_CORE_WATTS": "12.5", "LLMGW_POWER_NODE_WATTS": "350"}).power
    assert (power.core_watts, power.node_watts) == (12.5, 350.0)
    assert load(env | {"LLMGW_POWER_CORE_WATTS": "0"}).power.core_watts is None


def test_how_far_an_engine_may_outgrow_its_reservation_is_read_from_its_variables(env):
    agents = load(env).agents
    assert (agents.memory_margin, agents.memory_grace) == (0.25, 5.0)
    agents = load(
        env
        | {"LLMGW_ENGINE_MEMORY_MARGIN_PERCENT": "50", "LLMGW_ENGINE_MEMORY_GRACE_SECONDS": "2.5"}
    ).agents
    assert (agents.memory_margin, agents.memory_grace) == (0.5, 2.5)
    with pytest.raises(
        SettingError, match="LLMGW_ENGINE_MEMORY_MARGIN_PERCENT must be a percentage"
    ):
        load(env | {"LLMGW_ENGINE_MEMORY_MARGIN_PERCENT": "lots"})
