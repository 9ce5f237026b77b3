"""The vote's ties (issue 68): which groups tie for the largest count, and what the vote is when its ties break
first-seen, against it or for it (eglr_harness/core/votes.py)."""

from __future__ import annotations

import pytest

from eglr_harness.core.votes import VoteOutcome, majority, top_groups, vote_outcome

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)


@pytest.mark.parametrize(
    ("labels", "top"),
    [
        (["a", "b", "b", "a", "c"], [0, 1]),  # a and b both twice: a tie, in first-seen order
        (["c", "a", "b", "b", "a"], [1, 2]),  # c (once) is no top group
        (["a", "b", "b"], [1]),  # no tie
        ([None, "a", None, "b"], [1, 3]),  # no answer never votes: a and b tie at one each
        ([None, None], []),
        ([], []),
    ],
)
def test_top_groups_are_the_first_members_of_every_largest_group(labels, top):
    assert top_groups(labels) == top
    assert majority(labels) == (top[0] if top else None)  # the vote is the first of them: first-seen


@pytest.mark.parametrize(
    ("labels", "correct", "outcome"),
    [
        # x and y tie 2-2; x (seen first) is wrong, y right: first-seen and worst lose, best wins
        (["x", "y", "y", "x"], [0, 1, 1, 0], VoteOutcome(False, False, True, True)),
        # the same tie seen the other way round: first-seen wins now, worst still loses
        (["y", "x", "x", "y"], [1, 0, 0, 1], VoteOutcome(True, False, True, True)),
        # every tied group right: all three win
        (["x", "y"], [1, 1], VoteOutcome(True, True, True, True)),
        # no tie: the three agree
        (["x", "x", "y"], [1, 1, 0], VoteOutcome(True, True, True, False)),
        # a group is right when its first member is (the tasks' rule), whatever its later members say
        (["x", "x", "y"], [0, 1, 1], VoteOutcome(False, False, False, False)),
        # no vote at all
        ([None, None], [0, 0], VoteOutcome(False, False, False, False)),
    ],
)
def test_vote_outcome_under_the_three_tie_rules(labels, correct, outcome):
    assert vote_outcome(labels, correct) == outcome


def test_vote_outcome_wants_one_verdict_per_label():
    with pytest.raises(ValueError, match="2 labels but 1 verdicts"):
        vote_outcome(["x", "y"], [1])
