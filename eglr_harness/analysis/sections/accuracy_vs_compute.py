"""Section "Accuracy against compute" and its figure: one point per method the runs support (greedy, the best
single config, each pool's majority vote, other models' runs such as beam search), each with its compute per
problem relative to greedy and its accuracy with a 95 % Wilson interval, and each pool's oracle beside them as
an upper bound.

The methods: greedy (the L=0, T=0 cell); the best single configuration of the grid other than greedy; the majority
vote (SC) of each pool of :data:`~eglr_harness.analysis.metrics.accuracy.POOLS` that has cells (a pool with the same
cells as an earlier one is that point, named once); each run of a model other than eglr-hf (lm-eval's ``hf``:
greedy or beam search) merged into the report. Each pool's oracle is a point too, of kind :data:`UPPER_BOUND`: it
picks the correct rollout with the answer key, so it bounds what a selection could reach and is no method.

Compute of a method, per problem, relative to greedy::

    compute(method) = Σ_{c ∈ cells(method)} cost(c) / cost(greedy)
    cost(c)         = (tokens_c · flop_ratio_c / generated_c) · (rollouts_c / docs_c)

``tokens_c · flop_ratio_c`` is the cell's layer evaluations over the model's N layers, ``(N·tokens + Σ L·k) / N``,
from the runs' accounting (``config.eglr.stats.cells``, summed over the runs that decoded the cell: the merge of
:func:`~eglr_harness.analysis.metrics.compute.combine_compute` multiplied back by its tokens); ``generated_c`` the
rollouts of the cell those runs decoded themselves (each run's rollouts of the cell, each once, less those it took
from the rollout store, whose compute its accounting leaves out; a run's cell that only repeats an earlier run's
rollouts is left out, as in the compute tables: :func:`~eglr_harness.analysis.metrics.compute.grid_compute`), so
the first factor is the mean cost of one rollout; ``rollouts_c / docs_c`` the cell's rollouts per problem in the
grid (one, or the seeds and cycles of a sampled cell). A cell no run accounts for has no cost, and a method using it
no compute (it is left out, with the reason). A run that evaluated other tasks too is not read for costs: its
accounting is not split by task.

Compute of another model's run (:func:`other_run_compute`), per problem, relative to greedy: measured where every
first rollout records ``search_tokens`` (eglr-baseline: the tokens its decoding evaluated, summed over beams), the
mean of them over its problems divided by ``cost(greedy)`` (greedy's tokens per rollout); otherwise nominal,
:func:`~eglr_harness.analysis.metrics.compute.beam_flop_ratio` (``num_beams`` × greedy: lm-eval's ``hf`` counts no
tokens), marked so (:attr:`ComputePoint.basis`). A run refused as a baseline (:attr:`OtherRun.refused`) has no
point: it is left out with the reason.

Without a greedy cell (L=0, T=0) there is no unit to be relative to: where some cells have costs, compute is then
per problem in full-model token evaluations, ``Σ cost(c)`` itself (:data:`TOKENS_UNIT`; another model's run by its
mean ``search_tokens``, and left out where it records none: its nominal compute is a multiple of greedy's), so what
the accounting supports is still drawn; the unit is :attr:`AccuracyVsCompute.unit`.

Accuracies follow the pools table: greedy and the best configuration are their cell's correct rollouts over its
rollouts; SC and oracle the problems they solve over every problem of the grid; another run its first rollout per
problem over its problems. Nothing here reads files.

:func:`accuracy_vs_compute` computes the points; :class:`AccuracyVsComputeSection` writes their table
(``accuracy_vs_compute.csv``), figure and Markdown.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from eglr_harness.analysis.load import GREEDY, Grid
from eglr_harness.analysis.metrics.accuracy import (
    POOL_NAMES, POOLS, CellAccuracy, OtherRun, baselines, best_in_pool, oracle_solved, other_runs, pool_cells,
    rollouts_per_problem, sc_solved,
)
from eglr_harness.analysis.metrics.compute import beam_flop_ratio, cell_compute, reused_by_cell
from eglr_harness.analysis.metrics.intervals import wilson_interval
from eglr_harness.analysis.render import accuracy_compute_plot, markdown_table, num, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section
from eglr_harness.core.cell import Cell

__all__ = ["GREEDY_KIND", "METHOD", "OTHER_RUN", "UPPER_BOUND", "MEASURED", "NOMINAL", "GREEDY_UNIT", "TOKENS_UNIT",
           "ComputePoint",
           "AccuracyVsCompute", "cell_costs", "other_run_compute", "accuracy_vs_compute"]

# The kinds of point (the figure draws each kind in its own style).
GREEDY_KIND = "greedy"
METHOD = "EGLR method"
OTHER_RUN = "other run"
UPPER_BOUND = "upper bound"

# What a point's compute rests on: tokens the runs recorded, or num_beams × greedy's (no token counted)
MEASURED = "measured"
NOMINAL = "nominal"

# The unit of compute: greedy's cost per problem, or (a grid without a greedy cell) one full-model token evaluation
GREEDY_UNIT = "greedy"
TOKENS_UNIT = "token evaluations"


@dataclass(frozen=True)
class ComputePoint:
    """One point: ``correct`` of ``n`` (problems, or rollouts for a single cell) with the 95 % Wilson interval
    ``[low, high]`` (fractions); ``compute`` per problem relative to greedy; ``rollouts`` per problem; ``basis``
    :data:`MEASURED` (the runs' token accounting, or greedy, the unit) or :data:`NOMINAL` (another run's
    ``num_beams`` × greedy)."""

    label: str
    kind: str
    rollouts: float
    compute: float
    correct: int
    n: int
    low: float
    high: float
    basis: str = MEASURED

    @property
    def accuracy(self) -> float:
        return self.correct / self.n


@dataclass(frozen=True)
class AccuracyVsCompute:
    """The points, in report order; the methods left out for want of compute, ``(label, why)``; the other models'
    runs refused as baselines, ``(label, why)`` (:attr:`OtherRun.refused`); the unit of every point's ``compute``
    (:data:`GREEDY_UNIT`: relative to greedy; :data:`TOKENS_UNIT`: full-model token evaluations per problem, in a
    grid without a greedy cell)."""

    points: tuple[ComputePoint, ...]
    left_out: tuple[tuple[str, str], ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    unit: str = GREEDY_UNIT


def cell_costs(grid: Grid) -> dict[Cell, float]:
    """cell -> ``cost(c)`` of the module docstring: layer evaluations per problem over N, i.e. tokens per problem
    weighted by the FLOP ratio. Cells without accounting are absent."""
    flops: Counter[Cell] = Counter()
    generated: Counter[Cell] = Counter()
    for index, part in enumerate(grid.parts):
        if set(part.info.tasks) - {grid.task}:  # its accounting mixes the tasks' rollouts
            continue
        counts = Counter(row.cell for row in part.rollouts if row.cell is not None)
        reused = reused_by_cell(part.info)
        left_out, _ = grid.counted_cells(index)  # an earlier run's rollouts again: counted once, as the grid does
        for cell, compute in cell_compute([part.info]).items():
            if cell in left_out:
                continue
            made = counts[cell] - reused.get(cell, 0)
            if compute.tokens is None or compute.flop_ratio is None or made <= 0:
                continue
            flops[cell] += compute.tokens * compute.flop_ratio
            generated[cell] += made
    return {cell: flops[cell] / generated[cell] * rollouts_per_problem(grid, [cell])
            for cell, docs in grid.by_cell.items() if generated[cell] and docs}


def other_run_compute(run: OtherRun, greedy_cost: float | None) -> tuple[float, str]:
    """``(compute per problem relative to greedy, basis)`` of another model's run (module docstring): its mean
    ``search_tokens`` over ``greedy_cost`` (``cell_costs(grid)[GREEDY]``), :data:`MEASURED`, where every first rollout
    records them and greedy has a cost; else ``beam_flop_ratio(num_beams)``, :data:`NOMINAL`."""
    if run.search_tokens and greedy_cost:
        return sum(run.search_tokens.values()) / len(run.search_tokens) / greedy_cost, MEASURED
    return beam_flop_ratio(run.num_beams), NOMINAL


def _other_run_point(run: OtherRun, greedy_cost: float | None) -> ComputePoint:
    """The point of another model's run (a baseline: not refused)."""
    correct, n = len(run.solved), len(run.first_correct)
    compute, basis = other_run_compute(run, greedy_cost)
    return ComputePoint(run.label, OTHER_RUN, 1, compute, correct, n, *wilson_interval(correct, n), basis)


def accuracy_vs_compute(grid: Grid, accuracy: Mapping[Cell, CellAccuracy]) -> AccuracyVsCompute:
    """The points of ``grid`` (module docstring); ``accuracy`` = :func:`cell_accuracy` of ``grid``."""
    costs = cell_costs(grid)
    greedy_cost = costs.get(GREEDY)
    # no greedy cell: compute in token evaluations per problem, where the accounting gives any cell a cost
    unit, per_unit = (TOKENS_UNIT, 1.0) if GREEDY not in grid.by_cell and costs else (GREEDY_UNIT, greedy_cost)
    points: list[ComputePoint] = []
    left_out: list[tuple[str, str]] = []

    def relative(cells) -> float | None:
        """compute(cells) in the unit (cost(greedy), or one token evaluation), or None (the reason in ``left_out``)."""
        missing = [c.label for c in cells if c not in costs]
        if per_unit is None or missing:
            return None
        return sum(costs[c] for c in cells) / per_unit

    def why(cells) -> str:
        if GREEDY not in grid.by_cell and not costs:
            return "no greedy cell (L=0, T=0), the unit of compute, and no cell with compute accounting"
        if greedy_cost is None and unit == GREEDY_UNIT:
            return "greedy's cell (the unit of compute) has no compute accounting"
        missing = [c.label for c in cells if c not in costs]
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        return f"no compute accounting for {len(missing)} of its {len(cells)} cells ({shown})"

    if GREEDY in accuracy:
        cell = accuracy[GREEDY]
        points.append(ComputePoint("greedy", GREEDY_KIND, rollouts_per_problem(grid, [GREEDY]), 1.0, cell.correct,
                                   cell.rollouts, *wilson_interval(cell.correct, cell.rollouts)))
    best = best_in_pool(accuracy, [c for c in grid.cells if c != GREEDY])
    if best is not None:
        cell, label = accuracy[best], f"best single config ({best.label})"
        x = relative([best])
        if x is None:
            left_out.append((label, why([best])))
        else:
            points.append(ComputePoint(label, METHOD, rollouts_per_problem(grid, [best]), x, cell.correct,
                                       cell.rollouts, *wilson_interval(cell.correct, cell.rollouts)))
    named: dict[tuple[Cell, ...], list[str]] = {}  # a pool's cells -> the pools with exactly those cells
    for pool in POOLS:
        cells = pool_cells(grid.cells, pool)
        if cells and grid.n_docs:
            named.setdefault(tuple(cells), []).append(POOL_NAMES[pool])
    for cells, names in named.items():
        rollouts = rollouts_per_problem(grid, cells)
        pool = names[0] + "".join(f" = {n}" for n in names[1:])
        x = relative(cells)
        for kind, method, solved in ((METHOD, "SC", sc_solved(grid, cells)),
                                     (UPPER_BOUND, "oracle", oracle_solved(grid, cells))):
            label = f"{method} {pool} (B={rollouts:g})"
            if x is None:
                left_out.append((label, why(cells)))
                continue
            points.append(ComputePoint(label, kind, rollouts, x, len(solved), grid.n_docs,
                                       *wilson_interval(len(solved), grid.n_docs)))
    refused = [(f"{run.source} run {run.name}", run.refused) for run in other_runs(grid) if run.refused]
    for run in baselines(grid):
        if unit == TOKENS_UNIT and not run.search_tokens:  # nominal compute is num_beams × greedy's: no greedy here
            left_out.append((run.label, "no greedy cell (L=0, T=0): its nominal compute is num_beams × greedy's, and "
                                        "its answers record no search_tokens"))
            continue
        points.append(_other_run_point(run, greedy_cost if unit == GREEDY_UNIT else 1.0))
    return AccuracyVsCompute(tuple(points), tuple(left_out), tuple(refused), unit)


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
