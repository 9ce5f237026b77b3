"""Majority-vote accuracy and oracle against the budget: the first b configurations of a pool.

Two orders: the *stated* order (the pool order, L-major) and the mean over ``n_orders`` random
orders drawn with ``random.Random(seed)``. Adding a configuration adds all its rollouts (cycles
in order) to every document's vote; ties follow :mod:`eglr_harness.analysis.votes`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from eglr_harness.analysis.grid import Grid
from eglr_harness.analysis.rollouts import Cell
from eglr_harness.analysis.votes import RunningVote

__all__ = ["BudgetCurve", "budget_curve", "random_order_curve", "DEFAULT_ORDERS", "DEFAULT_SEED"]

DEFAULT_ORDERS = 20
DEFAULT_SEED = 0


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
