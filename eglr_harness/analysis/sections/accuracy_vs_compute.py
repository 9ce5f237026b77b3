"""Section "Accuracy against compute": one point per method the runs support (greedy, the best single config, each
pool's majority vote, other models' runs such as beam search) with its 95 % interval, each pool's oracle beside
them as an upper bound; the figure and its table (:mod:`~eglr_harness.analysis.metrics.accuracy_vs_compute`)."""

from __future__ import annotations

from eglr_harness.analysis.metrics.accuracy_vs_compute import (
    GREEDY_KIND, GREEDY_UNIT, METHOD, NOMINAL, OTHER_RUN, UPPER_BOUND, AccuracyVsCompute, accuracy_vs_compute,
)
from eglr_harness.analysis.render import accuracy_compute_plot, markdown_table, num, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section

FIGURE = "accuracy_vs_compute"
# kind -> (legend entry, marker, colour, filled); an upper bound is hollow: it is no method
_STYLES = {
    GREEDY_KIND: ("greedy (L=0, T=0)", "s", "black", True),
    METHOD: ("EGLR: best config, majority vote (SC)", "o", "tab:blue", True),
    OTHER_RUN: ("other runs (beam search, ...)", "^", "tab:green", True),
    UPPER_BOUND: ("oracle: upper bound, not a method (uses the answer key)", "D", "tab:red", False),
}


@register_section("accuracy_vs_compute")
class AccuracyVsComputeSection(Section):
    DEFINITIONS = """\
- Accuracy against compute: x = compute per problem relative to greedy = Σ over the cells the method decodes of
  (the cell's tokens × FLOP ratio ÷ the rollouts its runs decoded) × (its rollouts per problem), over the same for
  greedy: the layer evaluations N·tokens + Σ L·k of the B rollouts the method uses per problem, over N·greedy's
  tokens per problem, so longer answers cost more too. A rollout its runs reused (the rollout store) costs the
  mean of the cell's decoded ones; a cell no run accounts for leaves its methods out (named under the table).
  Best single config = the grid's best cell other than greedy, costed as that cell alone (it was chosen on the
  same problems after decoding every cell). Other models' runs: measured where each answer records the tokens its
  decoding evaluated, summed over beams (eglr-baseline's `search_tokens`): their mean per problem over greedy's
  tokens per rollout; else (lm-eval `hf`) nominal, num_beams × greedy (outputs taken as long as greedy's: such runs
  count no tokens), marked "nominal" (CSV `compute_basis`). A run refused as a baseline is named under the table
  with the reason, never drawn. y = accuracy with its 95 % Wilson interval: over rollouts for
  a single cell, over problems for SC, oracle and other runs. The oracle counts a problem solved when any rollout
  is correct, which needs the answer key: an upper bound on any selection from the pool, not a method.
"""

    def compute(self, ctx: ReportContext) -> AccuracyVsCompute:
        return accuracy_vs_compute(ctx.grid, ctx.accuracy)

    def tables(self, ctx: ReportContext, result: AccuracyVsCompute) -> list[Table]:
        compute = "compute_vs_greedy" if result.unit == GREEDY_UNIT else "compute_token_evals_per_problem"
        header = ["method", "kind", "rollouts_per_problem", compute, "correct", "n", "accuracy", "ci_low",
                  "ci_high", "compute_basis"]
        rows = [
            [p.label, p.kind, round(p.rollouts, 6), round(p.compute, 6), p.correct, p.n, round(p.accuracy, 6),
             round(p.low, 6), round(p.high, 6), p.basis]  # fmt: skip
            for p in result.points
        ]
        return [Table(f"{FIGURE}.csv", header, rows)]

    def figures(self, ctx: ReportContext, result: AccuracyVsCompute, out):
        if len(result.points) < 2:  # greedy alone, at 1 by definition: nothing to compare
            return {}
        points = [(p.label, _STYLES[p.kind][0], p.compute, p.accuracy, p.low, p.high) for p in result.points]
        styles = {legend: (marker, color, filled) for legend, marker, color, filled in _STYLES.values()}
        title = f"{ctx.grid.task} ({ctx.grid.n_docs} problems): accuracy against compute, 95 % intervals"
        xlabel = (None if result.unit == GREEDY_UNIT else
                  "compute per problem (full-model token evaluations; no greedy cell)")
        return {FIGURE: accuracy_compute_plot(out / f"{FIGURE}.png", points, styles, title=title, xlabel=xlabel)}

    def markdown(self, ctx: ReportContext, result: AccuracyVsCompute, figs) -> list[str]:
        if not result.points and not result.left_out and not result.refused:
            return []
        rows = [
            [p.label, "upper bound" if p.kind == UPPER_BOUND else "method", f"{p.rollouts:g}",
             num(p.compute, 2) + (" (nominal)" if p.basis == NOMINAL else ""), f"{p.correct}/{p.n}", pct(p.accuracy),
             f"[{pct(p.low)}, {pct(p.high)}]"]  # fmt: skip
            for p in result.points
        ]
        reasons: dict[str, list[str]] = {}  # one line per reason: every method of a grid may share one
        for label, why in result.left_out:
            reasons.setdefault(why, []).append(label)
        greedy = result.unit == GREEDY_UNIT
        header = ["method", "kind", "rollouts per problem (B)",
                  "compute vs greedy" if greedy else "compute per problem (token evaluations)", "correct",
                  "accuracy %", "95 % CI (%)"]
        unit = ("Compute per problem relative to greedy (FLOPs; Definitions)" if greedy else
                "These runs have no greedy cell (L=0, T=0), the unit of compute elsewhere: compute is per problem in "
                "full-model token evaluations, (N·tokens + Σ L·k) / N of the rollouts a method uses, from the runs' "
                "accounting")
        parts = [
            "\n## Accuracy against compute\nOne point per method, with its 95 % interval; each pool's oracle beside "
            f"its vote, hollow: an upper bound, not a method. {unit}. Table: `{FIGURE}.csv`.\n",
            image(figs, FIGURE, "accuracy against compute"),
            markdown_table(header, rows) if rows else
            f"No method of these runs can be placed: {'; '.join(reasons) or 'no method has its compute accounted'}.",
        ]
        if reasons:
            parts.append("\nLeft out (no compute to place them by):\n")
            parts += [f"- {', '.join(labels)}: {why}." for why, labels in reasons.items()]
        if result.refused:
            parts.append("\nRefused as baselines (not drawn):\n")
            parts += [f"- {label}: {why}." for label, why in result.refused]
        return parts
