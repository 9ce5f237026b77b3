"""Section "Majority vote and oracle vs budget": per pool, stated order and the mean of random orders."""

from __future__ import annotations

from eglr_harness.analysis.metrics.accuracy import POOL_TITLES, POOLS, pool_cells
from eglr_harness.analysis.metrics.budget import budget_curve, random_order_curve
from eglr_harness.analysis.render import budget_plot, markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section


@register_section("budget")
class Budget(Section):
    DEFINITIONS = """\
- Budget curves: after adding the first b configurations of the pool; stated order = pool order; random = mean
  over seeded random orders.
"""

    def compute(self, ctx: ReportContext):
        curves = {}
        for pool in POOLS:
            cells = pool_cells(ctx.grid.cells, pool)
            if cells:
                rand = random_order_curve(ctx.grid, cells, ctx.n_orders, ctx.seed)
                curves[pool] = (budget_curve(ctx.grid, cells), rand)
        return curves

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["budget", "added_config_stated_order", "sc_stated", "oracle_stated", "sc_random_mean"]
        header += ["oracle_random_mean"]
        return [
            Table(
                f"budget_{pool}.csv",
                header,
                [
                    [b, stated.cells[b - 1].label, round(stated.sc[b - 1], 6), round(stated.oracle[b - 1], 6),
                     round(rand.sc[b - 1], 6), round(rand.oracle[b - 1], 6)]  # fmt: skip
                    for b in stated.budgets
                ],
            )
            for pool, (stated, rand) in result.items()
        ]

    def figures(self, ctx: ReportContext, result, out):
        if not ctx.grid.L_values:
            return {}
        return {
            f"budget_{pool}": budget_plot(
                out / f"budget_{pool}.png",
                [
                    ("SC, stated order (L-major)", stated.sc, "-", "C0"),
                    ("SC, random orders (mean)", rand.sc, "--", "C0"),
                    ("oracle, stated order (L-major)", stated.oracle, "-", "C2"),
                    ("oracle, random orders (mean)", rand.oracle, "--", "C2"),
                ],
                title=f"{ctx.grid.task}: {POOL_TITLES[pool]} — majority vote and oracle vs budget",
            )
            for pool, (stated, rand) in result.items()
        }

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        rows = []
        for pool, (stated, rand) in result.items():
            for b in sorted({1, min(4, len(stated.sc)), len(stated.sc) // 2 or 1, len(stated.sc)}):
                rows.append(
                    [POOL_TITLES[pool], b, pct(stated.sc[b - 1]), pct(rand.sc[b - 1]), pct(stated.oracle[b - 1]),
                     pct(rand.oracle[b - 1])]  # fmt: skip
                )
        header = ["pool", "budget b", "SC stated", "SC random", "oracle stated", "oracle random"]
        return [
            "\n## Majority vote and oracle vs budget\nTables: `budget_<pool>.csv`.\n",
            markdown_table(header, rows),
            "",
            *(image(figs, f"budget_{k}", f"budget {k}") for k in result),
        ]
