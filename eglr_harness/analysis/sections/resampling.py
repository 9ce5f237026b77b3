"""Section "Re-sampling check": the L pool, the T pool and a seed-only pool at an equal number of
rollouts per problem, paired per problem (``analysis/metrics/resampling.py``): does depth diversity add
anything over seed diversity? And, where the grid holds greedy, each pool's accuracy per rollout against greedy's.
Silent unless the runs hold a seed pool (``seeds=``) beside an L pool."""

from __future__ import annotations

from eglr_harness.analysis.metrics.resampling import GREEDY_PAIRS, MEASURES, RESAMPLING_PAIRS, resampling_check
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section

_HEADER = ["pool_a", "pool_b", "measure", "B", "problems", "a", "b", "diff", "diff_low", "diff_high", "better_a",
           "better_b", "sign_test_p", "wilcoxon_p", "n_effective"]
_NAMES = {"L": "L pool", "T": "T pool", "seed": "seed pool", "greedy": "greedy"}


def verdict(result, a: str = "L", b: str = "seed", measure: str = "oracle") -> str:
    """One sentence on pool ``a`` against pool ``b`` (default: depth against seed diversity, by the oracle):
    more or fewer problems only when the paired bootstrap interval excludes 0, else "not distinguishable"."""
    d = result.differences.get((a, b, measure))
    if d is None:
        return ""
    what = {"oracle": "reaches", "vote": "votes right on", "accuracy": "is right per rollout on"}[measure]
    by = {"oracle": "oracle", "vote": "majority vote", "accuracy": "accuracy per rollout"}[measure]
    shown = (f"{d.mean * d.problems:+.1f} problems of {d.problems} (95 % CI {d.low * d.problems:+.1f} … "
             f"{d.high * d.problems:+.1f}; better on {d.better_a} / {d.better_b}, sign test p = {d.sign_p:.3g})")
    if d.low > 0:
        return f"The {_NAMES[a]} {what} more problems than the {_NAMES[b]} at B = {result.B}: {shown}."
    if d.high < 0:
        return f"The {_NAMES[a]} {what} fewer problems than the {_NAMES[b]} at B = {result.B}: {shown}."
    return f"By the {by}, the {_NAMES[a]} and the {_NAMES[b]} are not distinguishable at B = {result.B}: {shown}."


@register_section("resampling")
class ResamplingSection(Section):
    DEFINITIONS = """\
- Re-sampling check: three pools at the same number B of rollouts per problem (the smallest pool's; each
  pool's first B in pool order, on the problems where every pool has B): the L pool (L > 0 at T = 0, one
  rollout per cell: depth diversity only), the T pool (L = 0 at T > 0, one rollout per cell) and the seed
  pool (one sampled cell under B seeds, `seeds=`: seed diversity only; where the runs hold one sampled
  temperature only, that cell is the seed pool's and there is no T pool). Per problem: oracle (any of the B
  right), vote (the majority vote right) and accuracy (right / B). Each pair is compared per problem: the
  mean difference A − B (here in problems: the mean times the problems) with a paired bootstrap 95 % interval,
  the problems each does better on with the exact sign test, and the Wilcoxon signed-rank p over the
  per-problem differences with its effective n (problems, not rollouts). "Depth adds over seeds" needs the
  L pool − seed pool interval above 0.
"""
    GREEDY_DEFINITION = """\
- Re-sampling check against greedy (the grid's L = 0, T = 0 cell, one rollout per problem): each pool's accuracy
  per rollout (right / B) minus greedy's (right / 1) on each compared problem, paired as above. Greedy decodes at
  T = 0 as the L pool does, so "L pool − greedy" is what depth does to a single answer at the same temperature;
  "L pool − seed pool" also moves the temperature (T = 0 against T > 0).
"""

    def compute(self, ctx: ReportContext):
        return resampling_check(ctx.grid, seed=ctx.seed)

    def definitions(self, ctx: ReportContext) -> str:
        result = ctx.results.get(self.name)
        if result is None:
            return ""
        return self.DEFINITIONS + (self.GREEDY_DEFINITION if result.greedy is not None else "")

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        if result is None:
            return []
        pools = {**result.pools, **({"greedy": result.greedy} if result.greedy is not None else {})}
        rows = []
        for (a, b, measure), d in result.differences.items():
            value = {"oracle": lambda p: p.oracle, "vote": lambda p: p.vote,
                     "accuracy": lambda p: round(p.accuracy, 6)}[measure]
            rows.append([a, b, measure, result.B, d.problems, value(pools[a]), value(pools[b]),
                         round(d.mean, 6), round(d.low, 6), round(d.high, 6), d.better_a, d.better_b, d.sign_p,
                         d.wilcoxon_p, d.n_effective])
        return [Table("resampling.csv", _HEADER, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if result is None:
            return []
        scored = [*result.pools.values(), *([result.greedy] if result.greedy is not None else [])]
        pools = [[p.description, f"{p.oracle}", f"{p.vote}", pct(p.accuracy)] for p in scored]
        diffs = []
        for a, b, measures in [*((a, b, MEASURES) for a, b in RESAMPLING_PAIRS),
                               *((a, b, ("accuracy",)) for a, b in GREEDY_PAIRS)]:
            for measure in measures:
                d = result.differences.get((a, b, measure))
                if d is None:
                    continue
                n = d.problems
                diffs.append([f"{_NAMES[a]} − {_NAMES[b]}", measure,
                              f"{d.mean * n:+.1f} ({d.low * n:+.1f} … {d.high * n:+.1f})",
                              f"{d.better_a} / {d.better_b}", f"{d.sign_p:.3g}",
                              f"{d.wilcoxon_p:.3g} (n = {d.n_effective})"])
        return [
            "\n## Re-sampling check: depth diversity against seed diversity\n",
            f"B = {result.B} rollouts per problem in every pool"
            + (" (greedy: its one)" if result.greedy is not None else "")
            + f", on {result.problems} problems. Table: `resampling.csv`.\n",
            markdown_table(["pool", "oracle (problems)", "vote right (problems)", "accuracy per rollout %"], pools),
            "\n\nPaired per problem (A − B, in problems; bootstrap 95 % CI; problems better: A / B):\n",
            markdown_table(["pools", "measure", "difference (95 % CI)", "better: A / B", "sign test p",
                            "Wilcoxon p (effective n)"], diffs),
            "\n\n" + " ".join(s for s in (verdict(result, "L", "seed", "oracle"), verdict(result, "L", "seed", "vote"),
                                           verdict(result, "T", "seed", "oracle")) if s) + "\n",
        ]
