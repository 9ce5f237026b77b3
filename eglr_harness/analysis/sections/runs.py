"""Sections "Runs" and "Grid coverage": what was merged, and which cells and documents are there."""

from __future__ import annotations

from eglr_harness.analysis.load import GREEDY
from eglr_harness.analysis.render import markdown_table, t_label
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section


@register_section("runs")
class Runs(Section):
    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        rows = [
            [
                p.info.name,
                p.info.model_source,
                p.samples.filter,
                len(p.samples.doc_hashes),
                len(p.rollouts),
                None if p.info.limit is None else f"{p.info.limit:g}",
            ]
            for p in ctx.grid.parts
        ]
        header = ["results file", "model type", "filter", "docs", "rollouts", "limit"]
        notes = [f"- {note}" for note in ctx.grid.run_notes]  # runs left out, cut to the grid's problems, refused
        return ["## Runs\n", markdown_table(header, rows), *(["", *notes] if notes else [])]


@register_section("coverage")
class Coverage(Section):
    def tables(self, ctx: ReportContext, result) -> list[Table]:
        grid = ctx.grid
        rows = [[c.L, c.T, grid.n_docs] for c in grid.missing_cells()]
        rows += [[c.L, c.T, k] for c, k in grid.incomplete_cells().items()]
        return [Table("missing_cells.csv", ["L", "T", "docs_missing"], rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        grid = ctx.grid
        Ls, Ts = grid.L_values, grid.T_values
        lines = [
            f"- Documents: **{grid.n_docs}** (union over runs; the denominator of oracle and SC).",
            f"- L values: {list(Ls)}; T values: {[t_label(T) for T in Ts]}; cells with rollouts: "
            f"**{len(grid.cells)} of {len(Ls) * len(Ts)}** in the {len(Ls)}×{len(Ts)} rectangle.",
        ]
        missing, incomplete = grid.missing_cells(), grid.incomplete_cells()
        if missing:
            lines.append(f"- **Missing cells** (no rollout): {', '.join(c.label for c in missing)}.")
        if incomplete:
            lines.append(
                "- **Incomplete cells** (documents missing; counted unsolved there): "
                + ", ".join(f"{c.label} ({k})" for c, k in incomplete.items())
                + "."
            )
        if not missing and not incomplete:
            lines.append("- The grid is complete: every cell has every document.")
        if GREEDY not in grid.by_cell:
            lines.append(
                "- No greedy cell (L=0, T=0): greedy, marginal-over-greedy and the greedy corner are not available."
            )
        lines += [f"- {note}" for note in grid.notes]
        return ["\n## Grid coverage\n", "\n".join(lines)]
