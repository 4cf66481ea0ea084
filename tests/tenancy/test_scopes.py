"""Scope names: by path or ID, compared without case or stray spaces, and never guessed."""

from __future__ import annotations

import pytest

from tenancy.scopes import ScopeError, scope_resolve

# Acme with teams ml and web, Scania with another ml, and one project under Acme's ml.
PATHS = {
    "org:1": "Acme",
    "org:2": "Scania",
    "team:11": "Acme/ml",
    "team:12": "Acme/web",
    "team:21": "Scania/ml",
    "project:111": "Acme/ml/training",
}


class TestAScopeIsNamedByPathOrIDAndNeverGuessed:
    @pytest.mark.parametrize(
        "text, key",
        [
            ("org:Acme", "org:1"),
            ("org:1", "org:1"),
            ("team:Acme/ml", "team:11"),
            ("team: acme / ML ", "team:11"),
            ("team:Scania/ml", "team:21"),
            ("team:web", "team:12"),
            ("project:Acme/ml/training", "project:111"),
            ("project:training", "project:111"),
            ("  Team:ACME/Web  ", "team:12"),
        ],
    )
    def test_a_path_or_an_id_names_one_scope(self, text, key):
        assert scope_resolve(text, PATHS) == key

    def test_an_ambiguous_team_name_is_refused_with_the_count(self):
        with pytest.raises(ScopeError) as refused:
            scope_resolve("team:ml", PATHS)
        assert str(refused.value) == '"ml" could be any of 2 teams; give its ID'

    def test_a_path_that_names_nothing_says_so(self):
        with pytest.raises(ScopeError) as refused:
            scope_resolve("team:Acme/nope", PATHS)
        assert str(refused.value) == 'there is no team "Acme/nope"'

    @pytest.mark.parametrize("text", ["group:Acme", "Acme", "org:", "org: / ", ":Acme", ""])
    def test_what_is_not_a_scope_name_is_refused_with_the_forms_it_may_take(self, text):
        with pytest.raises(ScopeError) as refused:
            scope_resolve(text, PATHS)
        assert str(refused.value) == (
            f'"{text}" is not org:NAME, team:ORG/TEAM or project:ORG/TEAM/PROJECT'
        )


def test_an_exact_id_wins_over_a_name_that_reads_the_same():
    paths = {"org:1": "Acme", "org:2": "1"}
    assert scope_resolve("org:1", paths) == "org:1"


def test_a_path_of_another_kind_is_not_taken():
    with pytest.raises(ScopeError, match='there is no org "Acme/ml"'):
        scope_resolve("org:Acme/ml", PATHS)
    with pytest.raises(ScopeError, match='there is no project "ml"'):
        scope_resolve("project:ml", PATHS)


def test_the_full_path_wins_over_a_last_segment_that_is_ambiguous():
    paths = {"team:1": "ml/x", "team:2": "Acme/ml"}
    # "ml" is the org of one and the team of the other: no full path is "ml".
    assert scope_resolve("team:Acme/ml", paths) == "team:2"


def test_names_differing_only_in_case_are_ambiguous_not_guessed():
    paths = {"org:1": "Acme", "org:2": "ACME"}
    with pytest.raises(ScopeError, match="could be any of 2 organizations"):
        scope_resolve("org:acme", paths)


def test_a_very_long_name_is_refused_before_it_is_compared():
    with pytest.raises(ScopeError, match="at most 400 characters"):
        scope_resolve("team:" + "x" * 1000, PATHS)
