"""Section "Exit rules at equal compute": accuracy against the measured FLOP ratio per exit rule (a
figure and a table), and each rule against kl at the nearest FLOP ratio, paired over problems
(``analysis/metrics/rules.py``). Silent unless the runs hold kl and another rule (``eglr-sweep --rules``)."""

from __future__ import annotations

from eglr_harness.analysis.metrics.rules import compare_rules
from eglr_harness.analysis.render import markdown_table, num, pct, rules_plot
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section

_POINTS = ["rule", "threshold", "run", "docs", "rollouts", "correct", "accuracy", "mean_iterations", "flop_ratio",
           "flop_ratio_with_head"]
_MATCHED = ["rule", "threshold", "run", "kl_tau_kl", "kl_run", "cost", "kl_cost", "cost_gap", "problems", "diff",
            "diff_low", "diff_high", "better_rule", "better_kl", "sign_test_p", "wilcoxon_p", "n_effective"]


def _threshold(value) -> str:
    return "—" if value is None else f"{value:g}"


@register_section("rules")
class RulesSection(Section):
    DEFINITIONS = """\
- Exit rules at equal compute: each run is one exit rule at one threshold (`config.eglr.settings`). Accuracy =
  correct rollouts / rollouts; the cost is the run's FLOP ratio with the LM-head projections its rule made
  (`flop_ratio_with_head`, eglr-method.md §4: `kl`, `margin`, `entropy` project at every iteration, `latent`
  and `accel` once at the exit), or the paper's `flop_ratio` where a run predates that count. "Matched": each
  point of another rule is paired with the `kl` point of the nearest cost (the gap is stated; the pairs are
  only as close as the threshold grids allow) and compared on the same problems: the mean per-problem accuracy
  difference (rule − kl) with a paired bootstrap 95 % interval, the problems each does better on and the exact
  sign test on them, and the Wilcoxon signed-rank test over the per-problem differences with its effective n
  (the problems whose accuracy differs: problems, not rollouts).
"""

    def compute(self, ctx: ReportContext):
        return compare_rules(ctx.grid.parts)

    def definitions(self, ctx: ReportContext) -> str:
        return self.DEFINITIONS if ctx.results.get(self.name) is not None else ""

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        if result is None:
            return []
        points = [[p.rule, p.threshold, p.run, p.docs, p.rollouts, p.correct, round(p.accuracy, 6),
                   p.mean_iterations, p.flop_ratio, p.flop_ratio_with_head] for p in result.points]
        matched = []
        for m in result.matched:
            d = m.difference
            matched.append([m.point.rule, m.point.threshold, m.point.run, m.kl.threshold, m.kl.run, m.point.cost,
                            m.kl.cost, None if m.cost_gap is None else round(m.cost_gap, 6),
                            *((d.problems, round(d.mean, 6), round(d.low, 6), round(d.high, 6), d.better_a,
                               d.better_b, d.sign_p, d.wilcoxon_p, d.n_effective) if d else (None,) * 9)])
        return [Table("rules.csv", _POINTS, points), Table("rules_matched.csv", _MATCHED, matched)]

    def figures(self, ctx: ReportContext, result, out):
        if result is None:
            return {}
        series: dict[str, list] = {}
        for p in result.points:
            cost = p.flop_ratio_with_head if result.cost_name == "flop_ratio_with_head" else p.flop_ratio
            if cost is not None:
                series.setdefault(p.rule, []).append((cost, p.accuracy, _threshold(p.threshold)))
        if not series:
            return {}
        docs = max(p.docs for p in result.points)
        return {"rules_flop": rules_plot(out / "rules_flop.png", series, xlabel=f"FLOP ratio ({result.cost_name})",
                                         title=f"{ctx.grid.task}: accuracy vs compute per exit rule (n={docs})")}

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if result is None:
            return []
        rows = [[p.rule, _threshold(p.threshold), f"{p.correct}/{p.rollouts}", pct(p.accuracy),
                 num(p.mean_iterations, 2), num(p.flop_ratio, 4), num(p.flop_ratio_with_head, 4)]
                for p in result.points]
        matched = []
        for m in result.matched:
            d = m.difference
            matched.append([
                f"{m.point.rule} {_threshold(m.point.threshold)}", f"kl {_threshold(m.kl.threshold)}",
                None if m.cost_gap is None else f"{m.cost_gap:+.4f}",
                None if d is None else f"{100 * d.mean:+.1f} ({100 * d.low:+.1f} … {100 * d.high:+.1f})",
                None if d is None else f"{d.better_a} / {d.better_b}", None if d is None else f"{d.sign_p:.3g}",
                None if d is None else f"{d.wilcoxon_p:.3g} (n = {d.n_effective} of {d.problems})"])
        return [
            "\n## Exit rules at equal compute\n",
            "Accuracy against the measured FLOP ratio of every run, one line per exit rule (points labelled with "
            "their threshold). Tables: `rules.csv`, `rules_matched.csv`.\n",
            image(figs, "rules_flop", "accuracy vs FLOP ratio per exit rule"),
            markdown_table(["rule", "threshold", "correct", "accuracy %", "k̄", "FLOP ratio", "with LM head"], rows),
            f"\n\nEach rule against `kl` at the nearest FLOP ratio ({result.cost_name}), paired over problems:\n",
            markdown_table(["rule", "kl point", "cost gap", "rule − kl, points (95 % CI)", "better: rule / kl",
                            "sign test p", "Wilcoxon p (effective n)"], matched),
        ]
