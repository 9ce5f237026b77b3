"""The paper's Table 5: greedy / best single config / SC / oracle for the T, L and L×T pools.

Pools (cells in L-major order, which is also the pool order for votes and budgets):
- ``T``: L = 0, T > 0 (the T-only sweep);
- ``L``: T = 0, L > 0 (the L-only sweep, EGLR-SC_L);
- ``LuT``: the T pool and the L pool together (the cross of the grid without greedy): what the two
  one-axis sweeps reach side by side, at their summed budget;
- ``LxT``: every cell of the grid (the 11×11 grid with L = 0 and T = 0 included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.accuracy import CellAccuracy, expected_random_oracle, solved_sets
from eglr_harness.analysis.grid import GREEDY, Grid
from eglr_harness.analysis.rollouts import Cell
from eglr_harness.analysis.votes import vote_is_correct

__all__ = ["POOLS", "POOL_TITLES", "pool_cells", "PoolSummary", "sc_solved", "oracle_solved", "summarize_pool"]

POOLS = ("T", "L", "LuT", "LxT")
POOL_TITLES = {
    "T": "T pool (L=0, T>0)",
    "L": "L pool (T=0, L>0)",
    "LuT": "L ∪ T pool (T pool + L pool)",
    "LxT": "L×T pool (all cells)",
}


def pool_cells(cells: Sequence[Cell], pool: str) -> list[Cell]:
    """The cells of ``pool`` among ``cells``, L-major."""
    rules = {
        "T": lambda c: c[0] == 0 and c[1] > 0,
        "L": lambda c: c[1] == 0 and c[0] > 0,
        "LuT": lambda c: (c[0] == 0) != (c[1] == 0),
        "LxT": lambda c: True,
    }
    if pool not in rules:
        raise ValueError(f"pool {pool!r} is unknown; allowed: {list(POOLS)}.")
    return sorted(c for c in cells if rules[pool](c))


def sc_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents whose majority answer over ``cells`` (in the given order) is correct."""
    return frozenset(d for d in grid.docs if vote_is_correct(grid.rollouts_in(cells, d)))


def oracle_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents with at least one correct rollout over ``cells``."""
    return frozenset(d for d in grid.docs if any(r.correct for r in grid.rollouts_in(cells, d)))


@dataclass(frozen=True)
class PoolSummary:
    """One column of Table 5. Fractions are over ``docs``; None when the pool is empty.

    ``random_oracle`` is the expected oracle of ``configs`` cells drawn at random from the whole
    grid: the same budget without the pool's structure, so that ``oracle - random_oracle`` is what
    the choice of axis adds beyond the number of configurations.
    """

    pool: str
    configs: int
    docs: int
    greedy: float | None
    best_cell: Cell | None
    best: float | None
    sc: float | None
    oracle: float | None
    sc_solved: int | None = None
    oracle_solved: int | None = None
    random_oracle: float | None = None


def summarize_pool(
    grid: Grid,
    pool: str,
    accuracy: Mapping[Cell, CellAccuracy],
    solved: Mapping[Cell, frozenset[int]] | None = None,
) -> PoolSummary:
    """Greedy, best single config (first in pool order on ties), SC and oracle of one pool.

    ``solved`` is :func:`solved_sets` of ``grid``, passed by callers that summarize several pools.
    """
    cells = pool_cells(grid.cells, pool)
    greedy = accuracy[GREEDY].accuracy if GREEDY in accuracy else None
    if not cells or not grid.n_docs:
        return PoolSummary(pool, 0, grid.n_docs, greedy, None, None, None, None)
    best_cell = max(cells, key=lambda c: (accuracy[c].accuracy, -cells.index(c)))
    sc = sc_solved(grid, cells)
    oracle = oracle_solved(grid, cells)
    random_oracle = expected_random_oracle(solved_sets(grid) if solved is None else solved, grid.cells, len(cells))
    return PoolSummary(
        pool=pool,
        configs=len(cells),
        docs=grid.n_docs,
        greedy=greedy,
        best_cell=best_cell,
        best=accuracy[best_cell].accuracy,
        sc=len(sc) / grid.n_docs,
        oracle=len(oracle) / grid.n_docs,
        sc_solved=len(sc),
        oracle_solved=len(oracle),
        random_oracle=random_oracle / grid.n_docs,
    )
