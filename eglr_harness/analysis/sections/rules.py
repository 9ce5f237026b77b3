"""Section "Exit rules at equal compute" and its figure: accuracy against the measured FLOP ratio per exit rule
(a figure and a table), and each rule against ``kl`` (the paper's) at the nearest FLOP ratio, paired over
problems. Silent unless the runs hold kl and another rule (``eglr-sweep --rules``).

Each run (one :class:`~eglr_harness.analysis.load.RunPart`, e.g. a point of ``eglr-sweep --rules``) is a
:class:`RulePoint`: its exit rule and threshold (``config.eglr.settings``: ``stop`` and the rule's threshold;
a run that names no rule used ``kl`` at its ``tau_kl``), its accuracy (correct rollouts / rollouts) and its
FLOP ratios (``stats.total``). The cost the rules are compared at is ``flop_ratio_with_head`` (the LM-head
projections each rule makes counted: eglr-method.md §4), else ``flop_ratio`` where a run predates it.

*Matched FLOP ratio*: every point of another rule is paired with the ``kl`` point whose cost is nearest
(ties: the cheaper kl point), and the two are compared on the problems both ran: the mean per-problem
accuracy difference (rule − kl) with a paired bootstrap 95 % interval, the problems gained and lost with the
exact sign test, and the Wilcoxon signed-rank test over the per-problem differences with its effective n
(problems whose accuracy differs; problems, not rollouts). The cost gap of the pair is stated beside it: a
pair is matched only as closely as the grids of thresholds allow.

:func:`compare_rules` computes the comparison; :class:`RulesSection` writes ``rules.csv``,
``rules_matched.csv``, the figure and the Markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import RunPart
from eglr_harness.analysis.metrics.ablation import per_doc_accuracy
from eglr_harness.analysis.metrics.compute import run_compute
from eglr_harness.analysis.metrics.intervals import PairedDifference, paired_difference
from eglr_harness.analysis.render import markdown_table, num, pct, rules_plot
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section
from eglr_harness.core import config as defaults

__all__ = ["RulePoint", "MatchedPair", "RulesComparison", "rule_point", "compare_rules"]


@dataclass(frozen=True)
class RulePoint:
    """One run: its exit rule, threshold, accuracy and cost (None where the run does not record it)."""

    run: str
    rule: str
    threshold: float | None
    docs: int
    rollouts: int
    correct: int
    flop_ratio: float | None
    flop_ratio_with_head: float | None
    mean_iterations: float | None
    per_doc: Mapping[int, float]

    @property
    def accuracy(self) -> float:
        return self.correct / self.rollouts if self.rollouts else float("nan")

    @property
    def cost(self) -> float | None:
        """The FLOP ratio the rules are compared at: with the LM head where recorded."""
        return self.flop_ratio_with_head if self.flop_ratio_with_head is not None else self.flop_ratio


@dataclass(frozen=True)
class MatchedPair:
    """A point of another rule and the kl point nearest in cost, with their paired difference."""

    point: RulePoint
    kl: RulePoint
    cost_gap: float | None  # point.cost − kl.cost
    difference: PairedDifference | None


@dataclass(frozen=True)
class RulesComparison:
    points: tuple[RulePoint, ...]  # by rule (kl first), then threshold
    matched: tuple[MatchedPair, ...]
    cost_name: str  # "flop_ratio_with_head" or "flop_ratio" (what the pairs were matched on)


def rule_point(part: RunPart) -> RulePoint:
    """The run's rule, threshold, accuracy and cost."""
    settings = (part.info.eglr or {}).get("settings") or {}
    rule = defaults.STOP_RULES.get(settings.get("stop", defaults.DEFAULT_STOP))
    name = rule.name if rule is not None else str(settings.get("stop"))
    threshold = settings.get(rule.threshold_arg) if rule is not None else None
    per_doc = per_doc_accuracy(part)
    compute = run_compute(part.info)
    rows = part.rollouts
    return RulePoint(part.info.name or part.info.path.name, name, None if threshold is None else float(threshold),
                     len(per_doc), len(rows), sum(r.correct for r in rows),
                     compute.flop_ratio if compute else None, compute.flop_ratio_with_head if compute else None,
                     compute.mean_iterations if compute else None, per_doc)


def _order(p: RulePoint) -> tuple:
    names = list(defaults.STOP_RULES)
    return (names.index(p.rule) if p.rule in names else len(names), p.rule,
            p.threshold if p.threshold is not None else float("inf"), p.run)


def compare_rules(parts: Sequence[RunPart]) -> RulesComparison | None:
    """The comparison (module docstring); None unless the runs hold a kl point and a point of another rule."""
    points = tuple(sorted((rule_point(p) for p in parts), key=_order))
    kl = [p for p in points if p.rule == defaults.DEFAULT_STOP]
    others = [p for p in points if p.rule != defaults.DEFAULT_STOP]
    if not kl or not others:
        return None
    with_head = all(p.flop_ratio_with_head is not None for p in points)
    cost_name = "flop_ratio_with_head" if with_head else "flop_ratio"

    def cost(p: RulePoint) -> float | None:
        return p.flop_ratio_with_head if with_head else p.flop_ratio

    matched = []
    for p in others:
        priced = [k for k in kl if cost(k) is not None]
        if cost(p) is None or not priced:
            matched.append(MatchedPair(p, kl[0], None, paired_difference(p.per_doc, kl[0].per_doc)))
            continue
        nearest = min(priced, key=lambda k: (abs(cost(k) - cost(p)), cost(k)))
        matched.append(MatchedPair(p, nearest, cost(p) - cost(nearest), paired_difference(p.per_doc, nearest.per_doc)))
    return RulesComparison(points, tuple(matched), cost_name)


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
