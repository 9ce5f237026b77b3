"""The exit rules at equal compute: accuracy against the measured FLOP ratio per rule, and each rule
against ``kl`` (the paper's) at the nearest FLOP ratio, paired over problems.

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
pair is matched only as closely as the grids of thresholds allow. Pure: no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import RunPart
from eglr_harness.analysis.metrics.ablation import per_doc_accuracy
from eglr_harness.analysis.metrics.compute import run_compute
from eglr_harness.analysis.metrics.intervals import PairedDifference, paired_difference
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
