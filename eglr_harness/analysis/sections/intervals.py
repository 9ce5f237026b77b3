"""Section "Confidence intervals": 95 % intervals over problems for the pools' SC and oracle, the
grid corners, and the comparisons that say whether the L axis adds beyond budget (L pool vs T pool
at equal budget, each pool vs as many random grid cells, the joint corner vs the one-axis corners), and
each pool's SC against other models' runs merged into the report (greedy, beam search)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from eglr_harness.analysis.metrics.accuracy import (
    POOL_NAMES, POOLS, OtherRun, one_rollout_per_cell, oracle_solved, other_runs, pool_cells, rollouts_per_problem,
    sc_solved,
)
from eglr_harness.analysis.metrics.intervals import N_RESAMPLES, bootstrap_intervals, sign_test_p, wilson_interval
from eglr_harness.analysis.load import GREEDY, Grid
from eglr_harness.analysis.metrics.oracle import random_oracle_per_doc
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

    @property
    def share(self) -> float:
        return self.estimate / self.docs


def paired_other_runs(grid: Grid) -> list[OtherRun]:
    """The other models' runs merged into ``grid`` that hold every problem of it: only those pair with its pools (a
    run of fewer problems has no pairing for the rest)."""
    return [run for run in other_runs(grid) if set(grid.docs) <= set(run.first_correct)]


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
    yardsticks: list[tuple[str, frozenset[int], dict[int, float]]] = []  # pool − its random cells

    greedy = solved.get(GREEDY)
    if greedy is not None:
        shares.append(("greedy (L=0, T=0)", greedy))
    cells = {p: pool_cells(grid.cells, p) for p in POOLS}
    oracle = {p: oracle_solved(grid, c) for p, c in cells.items() if c}
    sc = {p: sc_solved(grid, c) for p, c in cells.items() if c}
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
        if p in oracle and len(cells[p]) < len(grid.cells) and one_rollout_per_cell(grid, cells[p]):
            per_doc = random_oracle_per_doc(solved, grid.cells, len(cells[p]))
            yardsticks.append((f"oracle: {POOL_NAMES[p]} − {len(cells[p])} random grid cells", oracle[p], per_doc))
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
        rows.append(IntervalRow(name, WILSON, len(s), n, lo, hi))
    for name, sa, sb in diffs:
        mean, lo, hi = boot[name]
        only_a, only_b = len(sa - sb), len(sb - sa)
        p = sign_test_p(only_a, only_b)
        rows.append(IntervalRow(name, BOOTSTRAP, len(sa) - len(sb), n, lo, hi, only_a, only_b, p))
    for name, _, _ in yardsticks:
        mean, lo, hi = boot[name]
        rows.append(IntervalRow(name, BOOTSTRAP, mean * n, n, lo, hi))
    return rows


@register_section("intervals")
class Intervals(Section):
    def compute(self, ctx: ReportContext) -> list[IntervalRow]:
        return interval_rows(ctx)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        header = ["quantity", "method", "estimate", "docs", "share", "ci_low", "ci_high", "only_a", "only_b", "sign_p"]
        rows = [
            [r.quantity, r.method, round(r.estimate, 6), r.docs, round(r.share, 6), round(r.low, 6), round(r.high, 6),
             r.only_a, r.only_b, None if r.sign_p is None else round(r.sign_p, 6)]  # fmt: skip
            for r in result
        ]
        return [Table("intervals.csv", header, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        if not result:
            return []
        rows = [
            [r.quantity, f"{r.estimate:g}" if r.method == WILSON or r.only_a is not None else num(r.estimate, 2),
             pct(r.share), f"[{pct(r.low)}, {pct(r.high)}]", r.method,
             None if r.only_a is None else f"{r.only_a} / {r.only_b}", num(r.sign_p)]  # fmt: skip
            for r in result
        ]
        header = ["quantity", f"problems (of {ctx.grid.n_docs})", "%", "95 % CI (%)", "method", "only A / only B",
                  "sign test p"]
        return [
            "\n## Confidence intervals\n95 % intervals over problems; differences in percentage points. "
            "Table: `intervals.csv`.\n",
            markdown_table(header, rows),
        ]

    def definitions(self, ctx: ReportContext) -> str:
        return f"""\
- Confidence intervals: shares (greedy, each pool's SC and oracle, the corners) have 95 % Wilson score intervals
  over the problems. Differences A − B are means of per-problem differences with 95 % percentile intervals of a
  paired bootstrap ({N_RESAMPLES:,} resamples of the problems, seed {ctx.seed}, the same draws for every row);
  "only A / only B" are the discordant problems and "sign test p" the exact two-sided sign (McNemar) test on them.
  "pool − B random grid cells" is the pool's oracle minus the expected oracle of as many cells drawn at random from
  the grid, per problem (its exact probability of being solved), so its interval says whether the pool's axis adds
  beyond the budget; the yardstick itself is treated as fixed (the grid's cells are all there is to draw). It is
  left out for a pool whose cells hold several rollouts per problem (seeds, cycles). B is rollouts per problem.
""" + (_OTHER_RUNS_DEFINITION if paired_other_runs(ctx.grid) else "")


_OTHER_RUNS_DEFINITION = """\
- Other models' runs merged into the report (lm-eval's `hf`: greedy, Beam-n) count a problem solved when their one
  rollout on it is right; each is paired with greedy and with each pool's SC over the same problems, where it holds
  every problem of the grid (a run of fewer problems is only a point of "Accuracy against compute").
"""
