"""Section "Cumulative oracle over [0..L]×[0..T]": the rectangle's oracle and its named corners."""

from __future__ import annotations

from eglr_harness.analysis.metrics.oracle import corner_cells, cumulative_oracle, oracle_corners
from eglr_harness.analysis.render import lxt_heatmap, markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section


@register_section("cumulative_oracle")
class CumulativeOracle(Section):
    def compute(self, ctx: ReportContext):
        grid = ctx.grid
        return cumulative_oracle(ctx.solved, grid.L_values, grid.T_values), oracle_corners(ctx.solved)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        cumulative, _ = result
        n, corners = ctx.grid.n_docs, corner_cells(ctx.grid)
        rows = [[c.L, c.T, v, n, round(v / n, 6) if n else None, corners.get(c)] for c, v in cumulative.items()]
        return [Table("cumulative_oracle.csv", ["L_max", "T_max", "solved", "docs", "oracle", "corner"], rows)]

    def figures(self, ctx: ReportContext, result, out):
        cumulative, _ = result
        grid, n = ctx.grid, ctx.grid.n_docs
        if not grid.L_values:
            return {}
        corners = corner_cells(grid)
        path = lxt_heatmap(
            out / "cumulative_oracle.png",
            grid.L_values,
            grid.T_values,
            lambda L, T: cumulative[(L, T)] / n * 100 if n else None,
            lambda L, T: f"{cumulative[(L, T)]}" + (f"\n{corners[(L, T)]}" if (L, T) in corners else ""),
            cmap="magma",
            title=f"{grid.task}: cumulative oracle over [0..L]×[0..T] (solved of {n})",
            xlabel="T max",
            ylabel="L max",
            colorbar_label="oracle (%)",
        )
        return {"cumulative_oracle": path}

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        _, corners = result
        n = ctx.grid.n_docs
        rows = [[name, v, pct(v / n) if v is not None and n else None] for name, v in corners.items()]
        return [
            "\n## Cumulative oracle over [0..L]×[0..T]\nProblems solved by at least one cell of the sub-grid. "
            "Table: `cumulative_oracle.csv`.\n",
            image(figs, "cumulative_oracle", "cumulative oracle"),
            markdown_table(["corner", "solved", "%"], rows),
        ]
