"""Majority vote over extracted answers (EGLR-SC).

Answers are the tasks' canonical strings, so they are clustered by exact string equality.
``None`` (no parseable answer) never votes. **Ties** go to the answer whose first occurrence is
earliest in pool order (the order the rollouts are given in), which is deterministic. A vote is
correct when the winning answer's first rollout is correct (rollouts with the same canonical
answer are graded alike by the task).
"""

from __future__ import annotations

from collections.abc import Sequence

from eglr_harness.analysis.rollouts import Rollout

__all__ = ["majority_answer", "vote_is_correct", "RunningVote"]


def majority_answer(answers: Sequence[str | None]) -> str | None:
    """The most frequent non-null answer; ties -> earliest first occurrence; None if all null."""
    counts: dict[str, int] = {}
    for answer in answers:
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1  # dict keeps first-occurrence order
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a, n in counts.items() if n == best)


def vote_is_correct(rollouts: Sequence[Rollout]) -> bool:
    """Whether the majority answer over ``rollouts`` (in pool order) is correct."""
    winner = majority_answer([r.answer for r in rollouts])
    if winner is None:
        return False
    return bool(next(r.correct for r in rollouts if r.answer == winner))


class RunningVote:
    """A majority vote that grows one rollout at a time (for budget curves).

    Equivalent to :func:`vote_is_correct` over the rollouts added so far: a vote only raises the
    key ``(count, -first_index)`` of its own answer, so the winner is the old winner or that answer.
    """

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._first: dict[str, int] = {}
        self._correct: dict[str, int] = {}
        self._seen = 0
        self.winner: str | None = None
        self.any_correct = False

    def add(self, rollout: Rollout) -> None:
        self.any_correct = self.any_correct or bool(rollout.correct)
        answer = rollout.answer
        index, self._seen = self._seen, self._seen + 1
        if answer is None:
            return
        if answer not in self._counts:
            self._counts[answer], self._first[answer], self._correct[answer] = 0, index, rollout.correct
        self._counts[answer] += 1
        w = self.winner
        if w is None or (self._counts[answer], -self._first[answer]) > (self._counts[w], -self._first[w]):
            self.winner = answer

    @property
    def correct(self) -> bool:
        return self.winner is not None and bool(self._correct[self.winner])
