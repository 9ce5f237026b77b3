"""Section "Pools (Table 5 layout)": greedy / best single config / SC / oracle per pool, beside the
oracle of as many rollouts drawn at random from the grid."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from eglr_harness.analysis.load import GREEDY, VOTE_STRINGS, Grid
from eglr_harness.analysis.metrics.accuracy import (
    POOL_TITLES, POOLS, CellAccuracy, best_in_pool, oracle_solved, pool_cells,
)
from eglr_harness.analysis.metrics.oracle import random_rollouts_yardstick
from eglr_harness.analysis.metrics.ties import pool_vote
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section
from eglr_harness.core.cell import Cell

__all__ = ["PoolSummary", "summarize_pool", "Pools"]


@dataclass(frozen=True)
class PoolSummary:
    """One column of Table 5. Fractions are over ``docs``; None when the pool is empty.

    ``random_oracle`` is the expected oracle of as many rollouts as the pool holds per problem, drawn at random
    from the whole grid's (:func:`~eglr_harness.analysis.metrics.oracle.random_rollouts_yardstick`): the same
    budget without the pool's structure, so that ``oracle - random_oracle`` is what the choice of axis adds beyond
    the number of rollouts.

    ``sc_ties``: the problems whose vote is a tie (two answer groups or more share the largest count);
    ``sc_worst`` / ``sc_best``: the problems the vote solves with every tie broken against / for it
    (:mod:`~eglr_harness.analysis.metrics.ties`); ``sc_solved`` breaks them first-seen, in pool order.
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
    sc_ties: int | None = None
    sc_worst: int | None = None
    sc_best: int | None = None


def summarize_pool(
    grid: Grid,
    pool: str,
    accuracy: Mapping[Cell, CellAccuracy],
) -> PoolSummary:
    """Greedy, best single config, SC and oracle of one pool, and the oracle of as many random rollouts."""
    cells = pool_cells(grid.cells, pool)
    greedy = accuracy[GREEDY].accuracy if GREEDY in accuracy else None
    if not cells or not grid.n_docs:
        return PoolSummary(pool, 0, grid.n_docs, greedy, None, None, None, None)
    best = best_in_pool(accuracy, cells)
    sc = pool_vote(grid, cells)
    oracle = oracle_solved(grid, cells)
    random_oracle = sum(random_rollouts_yardstick(grid, cells)[1].values())
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
        random_oracle=random_oracle / grid.n_docs,
        sc_ties=len(sc.tied),
        sc_worst=len(sc.worst),
        sc_best=len(sc.best),
    )


@register_section("pools")
class Pools(Section):
    def compute(self, ctx: ReportContext) -> dict[str, PoolSummary]:
        return {pool: summarize_pool(ctx.grid, pool, ctx.accuracy) for pool in POOLS}

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["pool", "configs", "docs", "greedy", "best_config", "best", "sc", "sc_solved", "oracle"]
        header += ["oracle_solved", "random_oracle", "sc_ties", "sc_worst_solved", "sc_best_solved"]
        rows = [
            [p.pool, p.configs, p.docs, p.greedy, p.best_cell and p.best_cell.label, p.best, p.sc, p.sc_solved,
             p.oracle, p.oracle_solved, p.random_oracle, p.sc_ties, p.sc_worst, p.sc_best]  # fmt: skip
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
            ["SC ties: tied problems (SC with ties against … for it)"]
            + [(f"{p[k].sc_ties} ({p[k].sc_worst} … {p[k].sc_best})" if p[k].sc is not None else None)
               for k in POOLS],  # fmt: skip
            ["Oracle"]
            + [(f"{pct(p[k].oracle)} ({p[k].oracle_solved})" if p[k].oracle is not None else None) for k in POOLS],
            ["Oracle of B random grid rollouts (expected)"]
            + [(pct(p[k].random_oracle) if p[k].random_oracle is not None else None) for k in POOLS],
            ["configs in pool (cells)"] + [p[k].configs for k in POOLS],
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
  T, then seed and cycle): in L ∪ T the T pool's rollouts (L = 0) come before the L pool's.
- Oracle of B random grid rollouts: the expected oracle of B rollouts drawn uniformly without replacement from all
  the grid's rollouts of a problem, B = the pool's rollouts per problem (exact, not sampled). Each seed and cycle of
  a cell is a rollout of its own, so a sampled cell under ten seeds is ten rollouts of the draw as it is ten of its
  pool's: the yardstick's budget is the pool's (on a grid of one rollout per cell it is as many random cells). A
  pool's oracle above it is what its axis adds beyond the budget; at or below it, the pool's gain is the budget.
  "configs in pool" counts cells, not rollouts (the section "Confidence intervals" gives B in rollouts per problem).
{votes}  a null answer never votes; ties go to the cluster whose first rollout is earliest in pool order. The vote is
  correct when the winning cluster's first rollout is correct.
- SC ties: the problems whose vote is a tie (two clusters or more share the largest count), and in brackets the
  problems the vote solves if every tie goes against it (a tied problem counts only when all its tied clusters are
  right) … for it (when any is). Pool order decides the ties; any other way of breaking them gives an SC in that range.
- Best single config: highest cell accuracy in the pool (first in pool order on ties), chosen on the same problems.
"""
