"""Ties of the majority vote (EGLR-SC) over a grid's problems, and what they can move.

A problem's vote is a *tie* when two or more answer groups share the largest count among the rollouts that vote
(:func:`eglr_harness.core.votes.top_groups`). The project breaks it first-seen: the group whose first rollout comes
earliest in pool order wins (L-major: L ascending, then T, then seed and cycle; in the L ∪ T pool the T pool's
rollouts, at L = 0, come before the L pool's), so the pool order decides every tie. What it could decide instead:

- *worst case* (ties broken against the vote): a tied problem is solved only if every tied top group is right;
- *best case* (ties broken for it): a tied problem is solved if any tied top group is right.

Without a tie the three agree. :class:`PoolVote` is the first-seen solved set (the same as
:func:`~eglr_harness.analysis.metrics.accuracy.sc_solved`) carrying the two others and the tied problems;
:func:`tie_bounds` reads them off any solved set (one that is no vote has no ties: it is its own worst and best
case), and :func:`difference_under_ties` gives a paired difference A − B with every tie broken against A (A's
worst case against B's best) and for A (A's best against B's worst): the range over every way of breaking them.
Pure: no files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eglr_harness.analysis.load import Grid
from eglr_harness.analysis.metrics.intervals import N_RESAMPLES, PairedDifference, paired_difference
from eglr_harness.core.cell import Cell
from eglr_harness.core.votes import vote_outcome

__all__ = ["PoolVote", "pool_vote", "tie_bounds", "difference_under_ties"]


class PoolVote(frozenset):
    """The problems a pool's majority vote solves with first-seen ties (a frozenset of doc ids, equal to
    ``sc_solved``), with the same vote's ``worst`` and ``best`` solved sets and its ``tied`` problems.

    Set operations on it return plain frozensets: a set made from a vote is no vote, so it has no ties of its
    own (:func:`tie_bounds`).
    """

    worst: frozenset[int]
    best: frozenset[int]
    tied: frozenset[int]

    def __new__(cls, solved: Iterable[int], *, worst: Iterable[int], best: Iterable[int], tied: Iterable[int]):
        vote = super().__new__(cls, solved)
        vote.worst, vote.best, vote.tied = frozenset(worst), frozenset(best), frozenset(tied)
        return vote

    def __reduce__(self):  # copy and pickle: frozenset's own would drop the keywords
        return _pool_vote, (frozenset(self), self.worst, self.best, self.tied)

    def __repr__(self) -> str:
        sets = ", ".join(f"{k}={sorted(getattr(self, k))}" for k in ("worst", "best", "tied"))
        return f"PoolVote({sorted(self)}, {sets})"


def _pool_vote(solved, worst, best, tied) -> PoolVote:
    return PoolVote(solved, worst=worst, best=best, tied=tied)


def pool_vote(grid: Grid, cells: Sequence[Cell]) -> PoolVote:
    """The majority vote over ``cells`` (in the given order, which decides first-seen ties) on every problem of
    ``grid``, under the three tie rules (module docstring)."""
    solved, worst, best, tied = set(), set(), set(), set()
    for d in grid.docs:
        rows = grid.rollouts_in(cells, d)
        outcome = vote_outcome([r.vote for r in rows], [r.correct for r in rows])
        for kept, flag in ((solved, outcome.first_seen), (worst, outcome.worst), (best, outcome.best),
                           (tied, outcome.tied)):  # fmt: skip
            if flag:
                kept.add(d)
    return PoolVote(solved, worst=worst, best=best, tied=tied)


def tie_bounds(solved: frozenset[int]) -> tuple[frozenset[int], frozenset[int], frozenset[int]] | None:
    """``(worst, best, tied)`` of a :class:`PoolVote`; None for a solved set that is no vote (no ties)."""
    if isinstance(solved, PoolVote):
        return solved.worst, solved.best, solved.tied
    return None


def difference_under_ties(
    a: frozenset[int], b: frozenset[int], docs: Sequence[int], *, seed: int = 0, n_resamples: int = N_RESAMPLES
) -> tuple[PairedDifference, PairedDifference] | None:
    """A − B over ``docs`` with every tie broken against A (A's worst case − B's best) and for A (A's best − B's
    worst), each a :class:`PairedDifference` (bootstrap interval with ``seed``'s draws, sign test); None when
    neither side is a vote."""
    bounds_a, bounds_b = tie_bounds(a), tie_bounds(b)
    if bounds_a is None and bounds_b is None:
        return None
    worst_a, best_a = bounds_a[:2] if bounds_a else (a, a)
    worst_b, best_b = bounds_b[:2] if bounds_b else (b, b)

    def per_doc(s: frozenset[int]) -> dict[int, float]:
        return {d: float(d in s) for d in docs}

    against, for_a = (paired_difference(per_doc(x), per_doc(y), seed=seed, n_resamples=n_resamples)
                      for x, y in ((worst_a, best_b), (best_a, worst_b)))  # fmt: skip
    return against, for_a
