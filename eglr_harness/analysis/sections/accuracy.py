"""Section "Accuracy per cell": the L×T table and heatmap of per-cell accuracy."""

from __future__ import annotations

from eglr_harness.analysis.render import lxt_heatmap, markdown_table, pct, t_label
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section


@register_section("accuracy")
class Accuracy(Section):
    DEFINITIONS = """\
- Cell accuracy = correct rollouts / rollouts of the cell. A cell *solves* a problem when any of its rollouts on it
  is correct. Oracle, SC and disagreement use every problem of the grid as denominator; a problem missing from a
  cell counts as unsolved there.
"""

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["L", "T", "correct", "rollouts", "accuracy", "solved_docs", "docs"]
        rows = [
            [a.cell.L, a.cell.T, a.correct, a.rollouts, round(a.accuracy, 6), a.solved, a.docs]
            for a in ctx.accuracy.values()
        ]
        return [Table("cell_accuracy.csv", header, rows)]

    def figures(self, ctx: ReportContext, result, out):
        grid, acc = ctx.grid, ctx.accuracy
        if not grid.L_values:
            return {}
        path = lxt_heatmap(
            out / "accuracy_heatmap.png",
            grid.L_values,
            grid.T_values,
            lambda L, T: acc[(L, T)].accuracy * 100 if (L, T) in acc else None,
            lambda L, T: f"{acc[(L, T)].correct}\n{acc[(L, T)].accuracy * 100:.0f}%" if (L, T) in acc else "missing",
            title=f"{grid.task}: accuracy per cell (correct rollouts, %; n={grid.n_docs})",
            xlabel="T",
            ylabel="L",
            colorbar_label="accuracy (%)",
        )
        return {"accuracy": path}

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        Ts = ctx.grid.T_values
        rows = [
            [f"L={L}"]
            + [f"{a.correct}/{a.rollouts} ({pct(a.accuracy)})" if (a := ctx.accuracy.get((L, T))) else None for T in Ts]
            for L in ctx.grid.L_values
        ]
        return [
            "\n## Accuracy per cell\nRows L, columns T; correct/rollouts (%). Table: `cell_accuracy.csv`.\n",
            image(figs, "accuracy", "accuracy heatmap"),
            markdown_table(["L \\ T"] + [t_label(T) for T in Ts], rows),
        ]
