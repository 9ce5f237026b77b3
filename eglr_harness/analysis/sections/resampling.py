"""Section "Re-sampling check" and the check it reports. Silent unless the runs hold a seed pool (``seeds=``)
beside an L pool.

At an equal number of rollouts per problem, does depth diversity (the L pool) or temperature diversity (the T
pool) reach or vote better than seed diversity alone (the seed pool)?

The training-free looped-transformer study (arXiv 2605.23872) found its loop's gain "mostly re-sampling";
this asks the same of EGLR, problem by problem. The pools, from the grid's rollouts:

- **L pool**: the cells L > 0 at T = 0 (the paper's EGLR-SC_L), one rollout each (deterministic);
- **T pool**: the cells L = 0 at T > 0, the rollout of each cell's first seed and cycle;
- **seed pool**: one sampled cell under several seeds (``seeds=``, e.g. ``L=0,T=0.7,seeds=10``): the sampled
  cell with the most distinct seeds among its rollouts, one rollout per seed (seed order); at least two.

A grid with fewer than two T cells has no T pool (its one sampled cell is the seed pool's own): the check then
compares the L pool with the seed pool alone, the peer's question itself.

Each pool is cut to the same number B of rollouts per problem (the smallest pool's; its first B in pool
order), on the problems where every pool has B. Per problem and pool: *oracle* (any of the B correct),
*vote* (the majority vote over the B is correct, as :func:`~eglr_harness.analysis.metrics.accuracy.vote_is_correct`)
and *accuracy* (correct / B). Each pair of pools (L − seed, T − seed, L − T) is compared on each of the
three with :func:`~eglr_harness.analysis.metrics.intervals.paired_difference`: the mean per-problem
difference with a paired bootstrap 95 % interval, the problems each does better on with the exact sign test,
and Wilcoxon's signed-rank p with its effective n (problems, not rollouts).

Where the grid holds greedy (L = 0, T = 0), each pool is also set against it by *accuracy* (``GREEDY_PAIRS``): the
pool's right / B against greedy's right / 1 on each compared problem greedy holds. Greedy is the one rollout that
decodes as the L pool does (T = 0), so "L pool − greedy" says what depth does to a single answer at the same
temperature, which "L pool − seed pool" (T = 0 against T > 0) cannot.

:func:`resampling_check` computes the check; :class:`ResamplingSection` writes ``resampling.csv`` and its
Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import GREEDY, Grid, RolloutRow
from eglr_harness.analysis.metrics.accuracy import pool_cells, vote_is_correct
from eglr_harness.analysis.metrics.intervals import PairedDifference, paired_difference
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section
from eglr_harness.core.cell import Cell

__all__ = ["RESAMPLING_PAIRS", "GREEDY_PAIRS", "PoolScore", "Resampling", "resampling_pools", "resampling_check"]

RESAMPLING_PAIRS = (("L", "seed"), ("T", "seed"), ("L", "T"))
# by accuracy only: greedy's oracle and vote are its one answer, and "SC − greedy" is the intervals section's
GREEDY_PAIRS = (("L", "greedy"), ("T", "greedy"), ("seed", "greedy"))
MEASURES = ("oracle", "vote", "accuracy")


@dataclass(frozen=True)
class PoolScore:
    """One pool cut to B rollouts: what it is, and per measure the problems it solves (oracle, vote) or its
    mean accuracy, over the compared problems."""

    name: str
    description: str
    oracle: int
    vote: int
    accuracy: float


@dataclass(frozen=True)
class Resampling:
    """B rollouts per problem on ``problems`` problems; each pool's scores; per (pair, measure) the paired
    difference A − B (pool B ``"greedy"``: accuracy only, over the compared problems greedy holds). ``greedy``:
    greedy's scores (one rollout per problem) over those problems, None where the grid has no greedy cell."""

    B: int
    problems: int
    pools: dict[str, PoolScore]
    differences: dict[tuple[str, str, str], PairedDifference]
    seed_cell: Cell
    seeds: tuple[int, ...]
    greedy: PoolScore | None = None


def _seed_cell(grid: Grid) -> tuple[Cell, tuple[int, ...]] | None:
    """The sampled cell with the most distinct labelled seeds (ties: the first, L-major), with its seeds."""
    best = None
    for cell, docs in grid.by_cell.items():
        if not cell.T:
            continue
        seeds = tuple(sorted({r.seed for rs in docs.values() for r in rs if r.seed is not None}))
        if len(seeds) >= 2 and (best is None or len(seeds) > len(best[1])):
            best = (cell, seeds)
    return best


def _first_per_seed(rows: Sequence[RolloutRow]) -> list[RolloutRow]:
    out, seen = [], set()
    for r in rows:  # the grid orders a cell's rollouts by seed, then cycle
        if r.seed not in seen:
            seen.add(r.seed)
            out.append(r)
    return out


def resampling_pools(grid: Grid) -> tuple[dict[str, dict[int, list[RolloutRow]]], Cell, tuple[int, ...]] | None:
    """pool -> doc -> its rollouts in pool order (uncut), the seed pool's cell and seeds; None without a
    seed pool or without an L pool. No "T" pool where the grid has fewer than two T cells."""
    found = _seed_cell(grid)
    L_cells, T_cells = pool_cells(grid.cells, "L"), pool_cells(grid.cells, "T")
    if found is None or not L_cells:
        return None
    cell, seeds = found
    pools: dict[str, dict[int, list[RolloutRow]]] = {"L": {}, **({"T": {}} if len(T_cells) >= 2 else {}), "seed": {}}
    for d in grid.docs:
        pools["L"][d] = [rs[0] for c in L_cells if (rs := grid.by_cell[c].get(d))]
        if "T" in pools:
            pools["T"][d] = [rs[0] for c in T_cells if (rs := grid.by_cell[c].get(d))]
        pools["seed"][d] = [r for r in _first_per_seed(grid.by_cell[cell].get(d, ())) if r.seed is not None]
    return pools, cell, seeds


def resampling_check(grid: Grid, *, seed: int = 0) -> Resampling | None:
    """The check (module docstring); None when the grid lacks a pool or B < 2."""
    found = resampling_pools(grid)
    if found is None:
        return None
    pools, cell, seeds = found
    B = min(max((len(rows) for rows in pool.values()), default=0) for pool in pools.values())  # the smallest pool
    docs = [d for d in grid.docs if all(len(pool.get(d, ())) >= B for pool in pools.values())]
    if B < 2 or not docs:
        return None
    per: dict[str, dict[str, dict[int, float]]] = {m: {} for m in MEASURES}
    for name, pool in pools.items():
        cut = {d: pool[d][:B] for d in docs}
        per["oracle"][name] = {d: float(any(r.correct for r in rows)) for d, rows in cut.items()}
        per["vote"][name] = {d: float(vote_is_correct(rows)) for d, rows in cut.items()}
        per["accuracy"][name] = {d: sum(r.correct for r in rows) / B for d, rows in cut.items()}
    descriptions = {"L": f"L pool (T=0, L>0): {len(pool_cells(grid.cells, 'L'))} cells",
                    "T": f"T pool (L=0, T>0): {len(pool_cells(grid.cells, 'T'))} cells",
                    "seed": f"seed pool ({cell.label}): {len(seeds)} seeds {seeds[0]}..{seeds[-1]}"}
    scores = {name: PoolScore(name, descriptions[name], int(sum(per["oracle"][name].values())),
                              int(sum(per["vote"][name].values())),
                              sum(per["accuracy"][name].values()) / len(docs)) for name in pools}
    differences = {}
    for a, b in (pair for pair in RESAMPLING_PAIRS if set(pair) <= set(pools)):
        for measure in MEASURES:
            diff = paired_difference(per[measure][a], per[measure][b], seed=seed)
            if diff is not None:
                differences[(a, b, measure)] = diff
    greedy_rows = grid.by_cell.get(GREEDY, {})
    right = {d: float(greedy_rows[d][0].correct) for d in docs if greedy_rows.get(d)}  # its one rollout
    greedy = None
    if right:
        greedy = PoolScore("greedy", "greedy (L=0, T=0): 1 rollout", int(sum(right.values())),
                           int(sum(right.values())), sum(right.values()) / len(right))
        for a in (name for name, _ in GREEDY_PAIRS if name in pools):
            differences[(a, "greedy", "accuracy")] = paired_difference(per["accuracy"][a], right, seed=seed)
    return Resampling(B, len(docs), scores, differences, cell, seeds, greedy)


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
