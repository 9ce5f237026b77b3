"""Every number of a report, computed from one grid (pure: no files)."""

from __future__ import annotations

from dataclasses import dataclass

from eglr_harness.analysis.accuracy import CellAccuracy, cell_accuracy, cumulative_oracle, oracle_corners, solved_sets
from eglr_harness.analysis.budget import DEFAULT_ORDERS, DEFAULT_SEED, BudgetCurve, budget_curve, random_order_curve
from eglr_harness.analysis.compute import Compute, cell_compute, combine_compute, reused_rollouts, run_compute
from eglr_harness.analysis.disagreement import (
    DisagreementMatrix,
    disagreement_slices,
    exclusive_counts,
    marginal_over_greedy,
)
from eglr_harness.analysis.grid import GREEDY, Grid
from eglr_harness.analysis.pools import POOLS, PoolSummary, pool_cells, summarize_pool
from eglr_harness.analysis.rollouts import Cell

__all__ = ["ReportData", "compute_report", "corner_cells", "t_label"]


@dataclass(frozen=True)
class ReportData:
    """Every number of a report, computed from one grid."""

    grid: Grid
    accuracy: dict[Cell, CellAccuracy]
    solved: dict[Cell, frozenset[int]]
    cumulative: dict[Cell, int]
    corners: dict[str, int | None]
    pools: dict[str, PoolSummary]
    disagreement: dict[str, DisagreementMatrix]
    exclusive: dict[Cell, int]
    marginal: dict[Cell, int] | None
    budgets: dict[str, tuple[BudgetCurve, BudgetCurve]]
    runs_compute: tuple[Compute, ...]
    total_compute: Compute | None
    cells_compute: dict[Cell, Compute]
    reused_rollouts: int | None = None


def compute_report(grid: Grid, *, n_orders: int = DEFAULT_ORDERS, seed: int = DEFAULT_SEED) -> ReportData:
    """All metrics of the report for ``grid`` (pure; no files written)."""
    accuracy = cell_accuracy(grid)
    solved = solved_sets(grid)
    budgets = {}
    for pool in POOLS:
        cells = pool_cells(grid.cells, pool)
        if cells:
            budgets[pool] = (budget_curve(grid, cells), random_order_curve(grid, cells, n_orders, seed))
    infos = [p.info for p in grid.parts]
    runs = tuple(c for c in (run_compute(i) for i in infos) if c is not None)
    return ReportData(
        grid=grid,
        accuracy=accuracy,
        solved=solved,
        cumulative=cumulative_oracle(solved, grid.L_values, grid.T_values),
        corners=oracle_corners(solved),
        pools={pool: summarize_pool(grid, pool, accuracy, solved) for pool in POOLS},
        disagreement=disagreement_slices(solved),
        exclusive=exclusive_counts(solved),
        marginal=marginal_over_greedy(solved),
        budgets=budgets,
        runs_compute=runs,
        total_compute=combine_compute("all runs", runs) if runs else None,
        cells_compute=cell_compute(infos),
        reused_rollouts=reused_rollouts(infos),
    )


def t_label(T: float) -> str:
    """0.0 -> '0', 0.5 -> '0.5' (axis labels)."""
    return f"{T:g}"


def corner_cells(grid: Grid) -> dict[Cell, str]:
    """Rectangle positions of the named corners of the cumulative oracle."""
    Ls, Ts = grid.L_values, grid.T_values
    if not Ls:
        return {}
    names = {(Ls[-1], Ts[-1]): "joint"}
    if Ls[0] == 0 and Ts[0] == 0.0:
        names.update({(0, Ts[-1]): "T-only", (Ls[-1], 0.0): "L-only", GREEDY: "greedy"})
    return names
