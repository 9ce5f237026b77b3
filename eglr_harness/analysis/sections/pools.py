"""Section "Pools (Table 5 layout)": greedy / best single config / SC / oracle per pool, beside the
oracle of as many random grid cells."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eglr_harness.analysis.load import GREEDY, VOTE_STRINGS, Grid
from eglr_harness.analysis.metrics.accuracy import (
    POOL_TITLES, POOLS, CellAccuracy, best_in_pool, one_rollout_per_cell, oracle_solved, pool_cells, sc_solved,
    solved_sets,
)
from eglr_harness.analysis.metrics.oracle import expected_random_oracle
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section
from eglr_harness.core.cell import Cell

__all__ = ["PoolSummary", "summarize_pool", "Pools"]


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
    """Greedy, best single config, SC and oracle of one pool.

    ``solved`` is :func:`solved_sets` of ``grid``, passed by callers that summarize several pools.
    """
    cells = pool_cells(grid.cells, pool)
    greedy = accuracy[GREEDY].accuracy if GREEDY in accuracy else None
    if not cells or not grid.n_docs:
        return PoolSummary(pool, 0, grid.n_docs, greedy, None, None, None, None)
    best = best_in_pool(accuracy, cells)
    sc = sc_solved(grid, cells)
    oracle = oracle_solved(grid, cells)
    random_oracle = None  # as many random cells are not the same budget where the pool's cells hold several rollouts
    if one_rollout_per_cell(grid, cells):
        random_oracle = expected_random_oracle(solved_sets(grid) if solved is None else solved, grid.cells,
                                               len(cells))
    return PoolSummary(
        pool=pool,
        configs=len(cells),
        docs=grid.n_docs,
        greedy=greedy,
        best_cell=best,
        best=accuracy[best].accuracy,
        sc=len(sc) / grid.n_docs,
        oracle=len(oracle) / grid.n_docs,
        sc_solved=len(sc),
        oracle_solved=len(oracle),
        random_oracle=None if random_oracle is None else random_oracle / grid.n_docs,
    )


@register_section("pools")
class Pools(Section):
    def compute(self, ctx: ReportContext) -> dict[str, PoolSummary]:
        return {pool: summarize_pool(ctx.grid, pool, ctx.accuracy, ctx.solved) for pool in POOLS}

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["pool", "configs", "docs", "greedy", "best_config", "best", "sc", "sc_solved", "oracle"]
        header += ["oracle_solved", "random_oracle"]
        rows = [
            [p.pool, p.configs, p.docs, p.greedy, p.best_cell and p.best_cell.label, p.best, p.sc, p.sc_solved,
             p.oracle, p.oracle_solved, p.random_oracle]  # fmt: skip
            for p in result.values()
        ]
        return [Table("pools.csv", header, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        p = result
        rows = [
            ["Greedy (L=0, T=0)"] + [pct(p[k].greedy) for k in POOLS],
            ["Best single config"]
            + [(f"{pct(p[k].best)} ({p[k].best_cell.label})" if p[k].best_cell else None) for k in POOLS],
            ["SC (majority vote)"]
            + [(f"{pct(p[k].sc)} ({p[k].sc_solved})" if p[k].sc is not None else None) for k in POOLS],
            ["Oracle"]
            + [(f"{pct(p[k].oracle)} ({p[k].oracle_solved})" if p[k].oracle is not None else None) for k in POOLS],
            ["Oracle of B random grid cells (expected)"]
            + [(pct(p[k].random_oracle) if p[k].random_oracle is not None else None) for k in POOLS],
            ["configs in pool (B)"] + [p[k].configs for k in POOLS],
        ]
        return [
            "\n## Pools (Table 5 layout)\nAccuracy % (problems). Table: `pools.csv`.\n",
            markdown_table(["method", *(POOL_TITLES[k] for k in POOLS)], rows),
        ]

    def definitions(self, ctx: ReportContext) -> str:
        if ctx.grid.vote_rule == VOTE_STRINGS:
            votes = """\
- Majority vote: answers (the tasks' canonical strings) cluster by exact string equality, as these runs log no
  equivalence cluster ids (the tasks' own `maj@B` clusters by mathematical equivalence and can differ slightly);
"""
        else:
            votes = f"""\
- Majority vote: rollouts vote with their {ctx.grid.vote_rule}, as the tasks' `maj@B` does;
  across merged runs two clusters are one when they share an answer string;
"""
        return f"""\
- Pools: T = {{L=0, T>0}}; L = {{T=0, L>0}}; L ∪ T = both of them; L×T = all cells. Pool order is L-major (L, then
  T, then cycle).
- Oracle of B random grid cells: the expected oracle of B cells drawn uniformly without replacement from every
  cell of the grid, B = the pool's size (exact, not sampled). A pool's oracle above it is what its axis adds beyond
  the budget; at or below it, the pool's gain is the budget. Left out (—) for a pool whose cells hold several
  rollouts per problem (seeds, cycles): B cells are then not its budget. "configs in pool" counts cells, not
  rollouts (the section "Confidence intervals" gives B in rollouts per problem).
{votes}  a null answer never votes; ties go to the cluster whose first rollout is earliest in pool order. The vote is
  correct when the winning cluster's first rollout is correct.
- Best single config: highest cell accuracy in the pool (first in pool order on ties), chosen on the same problems.
"""
