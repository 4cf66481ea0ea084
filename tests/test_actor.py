"""Who acts: the name an X-Llmgw-Actor header claims (the seed's TestAClaimedActorIsOneShortName)."""

import pytest

from llmgw.core.api import ACTOR_LONGEST, claimed_actor


@pytest.mark.parametrize(
    ("header", "actor"),
    [
        ("ops", "ops"),
        ("  jane doe  ", "jane doe"),
        ("alice\nbob", "alice"),
        ("mallory\r\nX-Other: 1", "mallory"),
        ("tab\there", "tab here"),
        ("bell\x07ringer", "bellringer"),
        ("", ""),
        ("   \n  ", ""),
        ("x" * 500, "x" * ACTOR_LONGEST),
    ],
)
def test_a_claimed_actor_is_one_short_name(header, actor):
    assert claimed_actor(header) == actor
