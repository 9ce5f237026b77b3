"""Section "Ablation" (paper Table 4): one EGLR setting at a time around the defaults, from runs
that differ in their settings (``eglr-sweep``). Silent when the runs share their settings."""

from __future__ import annotations

from eglr_harness.analysis.metrics.ablation import ablation
from eglr_harness.analysis.render import ablation_plot, markdown_table, num, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section

_HEADER = ["axis", "value", "default", "run", "docs", "rollouts", "correct", "accuracy", "ci_low", "ci_high", "rho",
           "mean_iterations", "flop_ratio", "flop_ratio_with_head", "diff_vs_default", "diff_low", "diff_high",
           "gained", "lost", "sign_test_p", "wilcoxon_p", "n_effective"]


def _value(v) -> str:
    return "—" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _paired(p) -> str | None:
    if p.vs_default is None:
        return None
    mean, low, high = (100 * x for x in p.vs_default)
    return (f"{mean:+.1f} ({low:+.1f} … {high:+.1f}); {p.gained} / {p.lost}; p = {p.sign_p:.3g}; "
            f"p = {p.wilcoxon_p:.3g} (n = {p.n_effective})")


@register_section("ablation")
class AblationSection(Section):
    DEFINITIONS = """\
- Ablation: each run is a point; the default point shares, per setting, the value most runs have. A run that
  differs from it in one setting is a point of that axis. Accuracy = correct rollouts / rollouts with a 95 %
  Wilson interval over problems (one rollout per problem; a bootstrap over problems otherwise); ρ, k̄ (mean
  iterations of a gated token), the FLOP ratio (the paper's: decoder layers) and the FLOP ratio with the LM-head
  projections the exit rule made (eglr-method.md §4; "—" for runs made before it was counted) are the run's
  `config.eglr.stats.total`. "vs default": the difference in accuracy from the default point on the same
  problems (paired bootstrap, 95 %), the problems gained and lost, and the exact sign test on them; then the
  Wilcoxon signed-rank test over the per-problem accuracy differences (exact up to 200 problems, else normal
  with tie and continuity corrections), with its effective n: the problems whose accuracy differs (problems,
  not rollouts; a problem scored the same on both sides carries no sign). With one rollout per problem the two
  tests count the same problems; with several rollouts per problem Wilcoxon also weighs how far each problem
  moved. The axis `stop` compares exit rules (with their threshold where it is not the rule's default) to the
  default point's rule; the axis `seed` repeats the default point under other seeds: a difference no larger
  than another seed's is re-sampling, not the setting.
"""

    def compute(self, ctx: ReportContext):
        return ablation(ctx.grid.parts, ctx.grid.task)

    def definitions(self, ctx: ReportContext) -> str:
        return self.DEFINITIONS if ctx.results.get(self.name) is not None else ""

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        if result is None:
            return []
        rows = [
            [p.axis, p.value, int(p.is_default), p.run, p.docs, p.rollouts, p.correct, round(p.accuracy, 6),
             round(p.low, 6), round(p.high, 6), p.rho, p.mean_iterations, p.flop_ratio, p.flop_ratio_with_head,
             *((round(x, 6) for x in p.vs_default) if p.vs_default else (None,) * 3), p.gained, p.lost, p.sign_p,
             p.wilcoxon_p, p.n_effective]
            for points in result.axes.values() for p in points
        ]  # fmt: skip
        return [Table("ablation.csv", _HEADER, rows)]

    def figures(self, ctx: ReportContext, result, out):
        if result is None:
            return {}
        figs = {}
        for axis, points in result.axes.items():
            numeric = [p for p in points if isinstance(p.value, (int, float))]
            if len(numeric) >= 2:
                figs[f"ablation_{axis}"] = ablation_plot(
                    out / f"ablation_{axis}.png",
                    [(p.value, p.accuracy, p.low, p.high, p.is_default) for p in numeric],
                    axis=axis,
                    title=f"{ctx.grid.task}: accuracy vs {axis} (n={numeric[0].docs}; ★ default)",
                )
        return figs

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if result is None:
            return []
        fixed = ", ".join(f"{k}={_value(v)}" for k, v in result.default.items())
        parts = ["\n## Ablation\n",
                 f"One setting at a time around the default point ({fixed}). Table: `ablation.csv`.\n"]
        for axis, points in result.axes.items():
            rows = [
                [_value(p.value) + (" (default)" if p.is_default else ""), f"{p.correct}/{p.rollouts}",
                 f"{pct(p.accuracy)} ({pct(p.low)}–{pct(p.high)})", num(p.rho), num(p.mean_iterations, 2),
                 num(p.flop_ratio), num(p.flop_ratio_with_head), _paired(p)]
                for p in points
            ]  # fmt: skip
            parts += [
                f"\n### {axis}\n",
                image(figs, f"ablation_{axis}", f"accuracy vs {axis}"),
                markdown_table([axis, "correct", "accuracy % (95 % CI)", "ρ", "k̄", "FLOP ratio",
                                "with LM head",
                                "vs default: points (95 % CI); gained / lost; sign test p; "
                                "Wilcoxon p (effective n)"], rows),
            ]
        if result.off_axis:
            parts.append(f"\nRuns that move several settings at once (not on any axis): {', '.join(result.off_axis)}.")
        return parts
