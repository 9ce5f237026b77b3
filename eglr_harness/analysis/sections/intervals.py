"""Section "Confidence intervals": 95 % intervals over problems for the pools' SC and oracle, the
grid corners, and the comparisons that say whether the L axis adds beyond budget (L pool vs T pool
at equal budget, each pool vs as many random grid rollouts, the joint corner vs the one-axis corners), and
each pool's SC against other models' runs merged into the report (greedy, beam search)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from eglr_harness.analysis.metrics.accuracy import (
    POOL_NAMES, POOLS, OtherRun, baselines, oracle_solved, other_runs, pool_cells, rollouts_per_problem,
)
from eglr_harness.analysis.metrics.intervals import N_RESAMPLES, bootstrap_intervals, sign_test_p, wilson_interval
from eglr_harness.analysis.metrics.ties import difference_under_ties, pool_vote, tie_bounds
from eglr_harness.analysis.load import GREEDY, Grid
from eglr_harness.analysis.metrics.oracle import random_rollouts_yardstick
from eglr_harness.analysis.render import markdown_table, num, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section

__all__ = ["IntervalRow", "paired_other_runs", "interval_rows", "Intervals"]

WILSON = "Wilson"
BOOTSTRAP = "paired bootstrap"


@dataclass(frozen=True)
class IntervalRow:
    """One quantity with its 95 % interval; fractions of ``docs`` (differences may be negative).

    ``only_a`` / ``only_b`` / ``sign_p``: for a difference of two solved sets A − B, the problems
    only A solves, only B solves, and the exact sign test's two-sided p; None for other rows.

    ``ties_a`` / ``ties_b``: the problems whose majority vote is a tie on A's side / B's side (a share is A; None:
    that side is no vote). ``against_a`` / ``for_a``: the same quantity with every tie broken against A (A's worst
    case, B's best) and for A (A's best, B's worst), as rows of their own (:mod:`~eglr_harness.analysis.metrics.ties`);
    None when neither side is a vote.
    """

    quantity: str
    method: str
    estimate: float  # problems (a difference of problems; an expected count for the random yardstick)
    docs: int
    low: float
    high: float
    only_a: int | None = None
    only_b: int | None = None
    sign_p: float | None = None
    ties_a: int | None = None
    ties_b: int | None = None
    against_a: IntervalRow | None = None
    for_a: IntervalRow | None = None

    @property
    def share(self) -> float:
        return self.estimate / self.docs


def paired_other_runs(grid: Grid) -> list[OtherRun]:
    """The other models' runs merged into ``grid`` that are baselines (:func:`baselines`: not refused) and hold every
    problem of it: only those pair with its pools (a run of fewer problems has no pairing for the rest)."""
    return [run for run in baselines(grid) if set(grid.docs) <= set(run.first_correct)]


def interval_rows(ctx: ReportContext, *, n_resamples: int = N_RESAMPLES) -> list[IntervalRow]:
    """The section's rows for ``ctx.grid`` (empty pools and a missing greedy cell are skipped)."""
    grid, solved = ctx.grid, ctx.solved
    docs, n = grid.docs, grid.n_docs
    if not n:
        return []

    def indicator(s: Iterable[int]) -> list[float]:
        s = frozenset(s)
        return [1.0 if d in s else 0.0 for d in docs]

    shares: list[tuple[str, frozenset[int]]] = []
    diffs: list[tuple[str, frozenset[int], frozenset[int]]] = []  # A − B of two solved sets
    yardsticks: list[tuple[str, frozenset[int], dict[int, float]]] = []  # pool − as many random rollouts

    greedy = solved.get(GREEDY)
    if greedy is not None:
        shares.append(("greedy (L=0, T=0)", greedy))
    cells = {p: pool_cells(grid.cells, p) for p in POOLS}
    oracle = {p: oracle_solved(grid, c) for p, c in cells.items() if c}
    sc = {p: pool_vote(grid, c) for p, c in cells.items() if c}  # first-seen solved sets, with their ties
    for p in oracle:
        budget = rollouts_per_problem(grid, cells[p])  # B: rollouts per problem (a seed pool's one cell holds several)
        shares.append((f"SC {POOL_NAMES[p]} (B={budget:g})", sc[p]))
        shares.append((f"oracle {POOL_NAMES[p]} (B={budget:g})", oracle[p]))
    corner_pools = (("T-only", "T"), ("L-only", "L"), ("joint", "LxT"))
    corners = {name: oracle[p] | (greedy or frozenset()) for name, p in corner_pools if p in oracle}
    for name, s in corners.items():
        shares.append((f"corner {name} (pool + greedy)", s))

    if "L" in oracle and "T" in oracle:
        diffs.append(("oracle: L pool − T pool (equal budget)", oracle["L"], oracle["T"]))
    for p in ("T", "L", "LuT"):
        if p in oracle and len(cells[p]) < len(grid.cells):
            budget, per_doc = random_rollouts_yardstick(grid, cells[p])
            yardsticks.append((f"oracle: {POOL_NAMES[p]} − {budget} random grid rollouts", oracle[p], per_doc))
    for name in ("T-only", "L-only"):
        if "joint" in corners and name in corners:
            diffs.append((f"corner: joint − {name}", corners["joint"], corners[name]))
    if "L" in sc and "T" in sc:
        diffs.append(("SC: L pool − T pool (equal budget)", sc["L"], sc["T"]))
    if greedy is not None:
        for p in sc:
            diffs.append((f"SC: {POOL_NAMES[p]} − greedy", sc[p], greedy))
    # other models' runs (greedy, beam search: the paper's FLOP-matched baseline)
    others = paired_other_runs(grid)
    labels = Counter(run.label for run in others)
    for run in others:
        label = run.label if labels[run.label] == 1 else f"{run.label} [{run.name}]"  # rows are keyed by name
        other = run.solved & frozenset(docs)
        shares.append((label, other))
        if greedy is not None:
            diffs.append((f"{label} − greedy", other, greedy))
        for p in sc:
            diffs.append((f"SC: {POOL_NAMES[p]} − {label}", sc[p], other))

    values = {name: [a - b for a, b in zip(indicator(sa), indicator(sb))] for name, sa, sb in diffs}
    for name, s, per_doc in yardsticks:
        values[name] = [a - per_doc.get(d, 0.0) for a, d in zip(indicator(s), docs)]
    boot = bootstrap_intervals(values, n_resamples=n_resamples, seed=ctx.seed)

    rows = []
    for name, s in shares:
        lo, hi = wilson_interval(len(s), n)
        rows.append(IntervalRow(name, WILSON, len(s), n, lo, hi, **_share_ties(name, s, n)))
    for name, sa, sb in diffs:
        mean, lo, hi = boot[name]
        only_a, only_b = len(sa - sb), len(sb - sa)
        p = sign_test_p(only_a, only_b)
        rows.append(IntervalRow(name, BOOTSTRAP, len(sa) - len(sb), n, lo, hi, only_a, only_b, p,
                                **_difference_ties(name, sa, sb, docs, seed=ctx.seed, n_resamples=n_resamples)))
    for name, _, _ in yardsticks:
        mean, lo, hi = boot[name]
        rows.append(IntervalRow(name, BOOTSTRAP, mean * n, n, lo, hi))
    return rows


def _share_ties(name: str, s: frozenset[int], n: int) -> dict:
    """The tie fields of a share's row: a vote's tied problems and its worst / best case with Wilson intervals."""
    bounds = tie_bounds(s)
    if bounds is None:
        return {}
    worst, best, tied = bounds
    cases = [IntervalRow(name, WILSON, len(x), n, *wilson_interval(len(x), n)) for x in (worst, best)]
    return {"ties_a": len(tied), "against_a": cases[0], "for_a": cases[1]}


def _difference_ties(name: str, sa: frozenset[int], sb: frozenset[int], docs, *, seed: int, n_resamples: int) -> dict:
    """The tie fields of a difference's row A − B (:func:`~eglr_harness.analysis.metrics.ties.difference_under_ties`:
    the same bootstrap draws as the row's own interval)."""
    cases = difference_under_ties(sa, sb, docs, seed=seed, n_resamples=n_resamples)
    if cases is None:
        return {}
    bounds_a, bounds_b = tie_bounds(sa), tie_bounds(sb)
    rows = [IntervalRow(name, BOOTSTRAP, round(d.mean * d.problems), d.problems, d.low, d.high, d.better_a, d.better_b,
                        d.sign_p) for d in cases]  # fmt: skip
    return {"ties_a": None if bounds_a is None else len(bounds_a[2]),
            "ties_b": None if bounds_b is None else len(bounds_b[2]), "against_a": rows[0], "for_a": rows[1]}


_TIE_CASES = ("estimate", "ci_low", "ci_high", "only_a", "only_b", "sign_p")


def _case_cells(case: IntervalRow | None) -> list:
    if case is None:
        return [None] * len(_TIE_CASES)
    return [round(case.estimate, 6), round(case.low, 6), round(case.high, 6), case.only_a, case.only_b,
            None if case.sign_p is None else round(case.sign_p, 6)]


def _ties_text(row: IntervalRow) -> str | None:
    """Tied problems: a share's, or a difference's on each side ("—": that side is no vote)."""
    if row.ties_a is None and row.ties_b is None:
        return None
    if row.method == WILSON:
        return f"{row.ties_a}"
    return " / ".join("—" if t is None else f"{t}" for t in (row.ties_a, row.ties_b))


def _case_text(row: IntervalRow, case: IntervalRow | None) -> str | None:
    """A tie case in the Markdown table: problems and CI (and the sign test's p for a difference); "—" where the
    row's votes hold no tie (the case is the row itself)."""
    if case is None:
        return None
    if not (row.ties_a or row.ties_b):
        return "—"
    if case.sign_p is None:
        return f"{case.estimate:g} [{pct(case.low)}, {pct(case.high)}]"
    return f"{case.estimate:+g} [{pct(case.low)}, {pct(case.high)}], p {num(case.sign_p)}"


@register_section("intervals")
class Intervals(Section):
    def compute(self, ctx: ReportContext) -> list[IntervalRow]:
        return interval_rows(ctx)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["quantity", "method", "estimate", "docs", "share", "ci_low", "ci_high", "only_a", "only_b", "sign_p"]
        header += ["ties_a", "ties_b", *(f"{case}_{col}" for case in ("against_a", "for_a") for col in _TIE_CASES)]
        rows = [
            [r.quantity, r.method, round(r.estimate, 6), r.docs, round(r.share, 6), round(r.low, 6), round(r.high, 6),
             r.only_a, r.only_b, None if r.sign_p is None else round(r.sign_p, 6),
             r.ties_a, r.ties_b, *_case_cells(r.against_a), *_case_cells(r.for_a)]  # fmt: skip
            for r in result
        ]
        return [Table("intervals.csv", header, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if not result:
            return []
        rows = [
            [r.quantity, f"{r.estimate:g}" if r.method == WILSON or r.only_a is not None else num(r.estimate, 2),
             pct(r.share), f"[{pct(r.low)}, {pct(r.high)}]", r.method,
             None if r.only_a is None else f"{r.only_a} / {r.only_b}", num(r.sign_p),
             _ties_text(r), _case_text(r, r.against_a), _case_text(r, r.for_a)]  # fmt: skip
            for r in result
        ]
        header = ["quantity", f"problems (of {ctx.grid.n_docs})", "%", "95 % CI (%)", "method", "only A / only B",
                  "sign test p", "ties (A / B)", "ties against A", "ties for A"]
        return [
            "\n## Confidence intervals\n95 % intervals over problems; differences in percentage points. A vote's "
            "ties (two answer groups or more share the largest count) go to the group seen first in pool order; "
            "\"ties against A\" / \"ties for A\" are the same figure with every tie broken the other ways "
            "(Definitions). Table: `intervals.csv`.\n",
            markdown_table(header, rows),
            *_refused_lines(ctx.grid),
        ]

    def definitions(self, ctx: ReportContext) -> str:
        return f"""\
- Confidence intervals: shares (greedy, each pool's SC and oracle, the corners) have 95 % Wilson score intervals
  over the problems. Differences A − B are means of per-problem differences with 95 % percentile intervals of a
  paired bootstrap ({N_RESAMPLES:,} resamples of the problems, seed {ctx.seed}, the same draws for every row);
  "only A / only B" are the discordant problems and "sign test p" the exact two-sided sign (McNemar) test on them.
  "pool − B random grid rollouts" is the pool's oracle minus the expected oracle of as many rollouts (B, the pool's
  rollouts per problem) drawn at random from all the grid's rollouts, per problem (its exact probability of being
  solved), so its interval says whether the pool's axis adds beyond the budget; each seed and cycle of a cell is a
  rollout of the draw, so the yardstick's budget is the pool's (on a grid of one rollout per cell, B random cells).
  The yardstick itself is treated as fixed (the grid's rollouts are all there is to draw). B is rollouts per
  problem.
- Ties: a problem's vote is a tie when two or more answer groups share the largest count among the rollouts that
  vote; the project's rule gives it to the group whose first rollout comes first in pool order (L-major: in the
  L ∪ T pool the T pool's rollouts come first), so that order decides it. "ties (A / B)" counts the tied problems
  of each side's vote (— : that side is no vote). "ties against A" recomputes the row with every tie broken against
  A: a tied problem of A's vote counts as solved only if all its tied top groups are right, one of B's if any is;
  "ties for A" the reverse. Between them lies every way of breaking the ties: a difference or p-value that changes
  side between them rests on how ties are broken.
""" + (_OTHER_RUNS_DEFINITION if paired_other_runs(ctx.grid) else "")


def _refused_lines(grid: Grid) -> list[str]:
    """The other models' runs refused as baselines, each with the reason (:attr:`OtherRun.refused`): never paired."""
    refused = [run for run in other_runs(grid) if run.refused]
    if not refused:
        return []
    return ["\nNot paired (refused as baselines):\n", *(f"- {run.source} run {run.name}: {run.refused}."
                                                        for run in refused)]


_OTHER_RUNS_DEFINITION = """\
- Other models' runs merged into the report (lm-eval's `hf` or `eglr-baseline`: greedy, Beam-n) count a problem
  solved when their one rollout on it is right; each is paired with greedy and with each pool's SC over the same
  problems, where it holds every problem of the grid (a run of fewer problems is only a point of "Accuracy against
  compute"; the problems of the grid are the EGLR runs'). A run refused as a baseline (docs/analyses.md) is named
  under the table with the reason, never paired.
"""
