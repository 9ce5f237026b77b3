"""Sections "Pairwise disagreement" and "Exclusive contribution and marginal over greedy"."""

from __future__ import annotations

from eglr_harness.analysis.metrics.accuracy import rollout_solved_sets
from eglr_harness.analysis.metrics.disagreement import disagreement_slices, exclusive_counts, marginal_over_greedy
from eglr_harness.analysis.render import heatmap, markdown_table, num
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section


@register_section("disagreement")
class Disagreement(Section):
    DEFINITIONS = """\
- Disagreement slices, rollout against rollout: L-vs-L over the L pool, T-vs-T over the T pool (mean/max over
  unordered pairs of distinct rollouts), T-vs-L = T pool rows × L pool columns (mean/max over all entries). A row or
  column is one rollout per problem: a sampled cell under several seeds (or cycles) gives each seed's rollout a row
  and column of its own (`L=0,T=0.7,seed=1334`), so that no side is the oracle of several samples.
"""

    def compute(self, ctx: ReportContext):
        return disagreement_slices(rollout_solved_sets(ctx.grid))

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        return [
            Table(
                f"disagreement_{name.replace('-', '_')}.csv",
                ["row \\ col"] + [c.label for c in m.cols],
                [[r.label] + list(values) for r, values in zip(m.rows, m.values)],
            )
            for name, m in result.items()
        ]

    def figures(self, ctx: ReportContext, result, out):
        if not ctx.grid.L_values:
            return {}
        return {
            f"disagreement_{name}": heatmap(
                out / f"disagreement_{name.replace('-', '_')}.png",
                m.values,
                [c.label for c in m.rows],
                [c.label for c in m.cols],
                annotations=[[str(v) for v in row] for row in m.values],
                cmap="cividis",
                title=f"{ctx.grid.task}: disagreement {name} (|solved △ solved|; mean {num(m.mean, 1)}, max {m.max})",
                xlabel="",
                ylabel="",
                colorbar_label="problems",
            )
            for name, m in result.items()
            if m.rows and m.cols
        }

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        rows = [[name, f"{len(m.rows)}×{len(m.cols)}", m.pairs, num(m.mean, 1), m.max] for name, m in result.items()]
        return [
            "\n## Pairwise disagreement\n|solved(a) △ solved(b)| in problems, rollout against rollout. Tables: "
            "`disagreement_*.csv`.\n",
            markdown_table(["slice", "matrix", "pairs", "mean", "max"], rows),
            "",
            *(image(figs, f"disagreement_{k}", f"disagreement {k}") for k in result),
        ]


@register_section("exclusive")
class Exclusive(Section):
    DEFINITIONS = """\
- Exclusive = problems solved by that cell and no other cell of the grid; marginal = problems it solves that
  greedy misses.
"""
    TOP = 10

    def compute(self, ctx: ReportContext):
        return exclusive_counts(ctx.solved), marginal_over_greedy(ctx.solved)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        exclusive, marginal = result
        rows = [
            [c.L, c.T, len(docs), exclusive[c], None if marginal is None else marginal[c]]
            for c, docs in ctx.solved.items()
        ]
        return [Table("exclusive_marginal.csv", ["L", "T", "solved", "exclusive", "marginal_over_greedy"], rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        exclusive, marginal = result
        top = sorted(ctx.solved, key=lambda c: (-exclusive[c], -(marginal or {}).get(c, 0), c))[: self.TOP]
        rows = [
            [c.label, len(ctx.solved[c]), exclusive[c], None if marginal is None else marginal[c]] for c in top
        ]
        return [
            "\n## Exclusive contribution and marginal over greedy\nTop cells by exclusive count; all cells in "
            "`exclusive_marginal.csv`.\n",
            markdown_table(["cell", "solved", "exclusive", "marginal over greedy"], rows),
            f"\n\nProblems solved by exactly one cell: {sum(exclusive.values())}.\n",
        ]
