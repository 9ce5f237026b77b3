"""Majority-vote accuracy and oracle against the budget: the first b configurations of a pool.

Two orders: the *stated* order (the pool order, L-major) and the mean over ``n_orders`` random
orders drawn with ``random.Random(seed)``. Adding a configuration adds all its rollouts (cycles
in order) to every document's vote; the vote is :func:`eglr_harness.analysis.metrics.accuracy.vote_is_correct`'s.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import Grid, RolloutRow
from eglr_harness.core.cell import Cell

__all__ = ["BudgetCurve", "RunningVote", "budget_curve", "random_order_curve", "DEFAULT_ORDERS", "DEFAULT_SEED"]

DEFAULT_ORDERS = 20
DEFAULT_SEED = 0


class RunningVote:
    """A majority vote that grows one rollout at a time (for budget curves).

    Equivalent to :func:`~eglr_harness.analysis.metrics.accuracy.vote_is_correct` over the rollouts added
    so far: a vote only raises the key ``(count, -first_index)`` of its own label, so the winner is
    the old winner or that label (the rule of :func:`eglr_harness.core.votes.majority`).
    """

    def __init__(self) -> None:
        self._counts: dict[object, int] = {}
        self._first: dict[object, int] = {}
        self._correct: dict[object, int] = {}
        self._seen = 0
        self.winner: object = None
        self.any_correct = False

    def add(self, rollout: RolloutRow) -> None:
        self.any_correct = self.any_correct or bool(rollout.correct)
        label = rollout.vote
        index, self._seen = self._seen, self._seen + 1
        if label is None:
            return
        if label not in self._counts:
            self._counts[label], self._first[label], self._correct[label] = 0, index, rollout.correct
        self._counts[label] += 1
        w = self.winner
        if w is None or (self._counts[label], -self._first[label]) > (self._counts[w], -self._first[w]):
            self.winner = label

    @property
    def correct(self) -> bool:
        return self.winner is not None and bool(self._correct[self.winner])


@dataclass(frozen=True)
class BudgetCurve:
    """``sc[b-1]`` and ``oracle[b-1]``: accuracies (fractions of all documents) at budget b."""

    order: str
    cells: tuple[Cell, ...]
    sc: tuple[float, ...]
    oracle: tuple[float, ...]

    @property
    def budgets(self) -> tuple[int, ...]:
        return tuple(range(1, len(self.sc) + 1))


def budget_curve(grid: Grid, cells: Sequence[Cell], order: str = "stated") -> BudgetCurve:
    """SC and oracle accuracy after each of ``cells`` is added, in the given order."""
    if not grid.n_docs:
        return BudgetCurve(order, tuple(cells), (), ())
    votes = {d: RunningVote() for d in grid.docs}
    sc, oracle = [], []
    for cell in cells:
        for doc_id, rollouts in grid.by_cell.get(cell, {}).items():
            for rollout in rollouts:
                votes[doc_id].add(rollout)
        sc.append(sum(v.correct for v in votes.values()) / grid.n_docs)
        oracle.append(sum(v.any_correct for v in votes.values()) / grid.n_docs)
    return BudgetCurve(order, tuple(cells), tuple(sc), tuple(oracle))


def random_order_curve(
    grid: Grid, cells: Sequence[Cell], n_orders: int = DEFAULT_ORDERS, seed: int = DEFAULT_SEED
) -> BudgetCurve:
    """Mean of :func:`budget_curve` over ``n_orders`` seeded random permutations of ``cells``."""
    if n_orders < 1:
        raise ValueError(f"`n_orders`={n_orders} is not allowed; allowed: an int >= 1.")
    rng = random.Random(seed)
    curves = []
    for _ in range(n_orders):
        order = list(cells)
        rng.shuffle(order)
        curves.append(budget_curve(grid, order))
    n = len(cells) if grid.n_docs else 0
    return BudgetCurve(
        order=f"mean of {n_orders} random orders (seed {seed})",
        cells=tuple(cells),
        sc=tuple(sum(c.sc[i] for c in curves) / n_orders for i in range(n)),
        oracle=tuple(sum(c.oracle[i] for c in curves) / n_orders for i in range(n)),
    )
