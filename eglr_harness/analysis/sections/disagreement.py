"""Sections "Pairwise disagreement" and "Exclusive contribution and marginal over greedy": which configurations
solve which problems, as disagreement, exclusive and marginal counts.

- disagreement(a, b) = |solved(a) △ solved(b)| (symmetric difference of solved sets), rollout against rollout:
  the report's slices are over the grid's rollout slots
  (:func:`~eglr_harness.analysis.metrics.accuracy.rollout_solved_sets`), so a sampled cell under several seeds
  contributes each seed's rollout as a row and column of its own, never the oracle of its seeds (which would set
  ten samples against one rollout);
- slices: ``L-vs-L`` over the L pool (T=0, L>0), ``T-vs-T`` over the T pool (L=0, T>0),
  ``T-vs-L`` with T-pool rows against L-pool columns;
- mean and max of a square slice are over unordered pairs of distinct rollouts (cells, where keyed by cell); of
  ``T-vs-L`` over all its entries;
- exclusive(c) = documents that only cell c solves (among all cells of the grid);
- marginal(c) = documents c solves that greedy (0, 0) does not.

The counts are pure functions of solved sets; :class:`Disagreement` and :class:`Exclusive` write the tables,
heatmaps and Markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean

from eglr_harness.analysis.load import GREEDY
from eglr_harness.analysis.metrics.accuracy import RolloutSlot, pool_cells, rollout_solved_sets
from eglr_harness.analysis.render import heatmap, markdown_table, num
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, image, register_section
from eglr_harness.core.cell import Cell

__all__ = [
    "DisagreementMatrix",
    "disagreement_matrix",
    "disagreement_slices",
    "exclusive_counts",
    "marginal_over_greedy",
    "SLICES",
]

SLICES = ("L-vs-L", "T-vs-T", "T-vs-L")


@dataclass(frozen=True)
class DisagreementMatrix:
    """``values[i][j]`` = disagreement between ``rows[i]`` and ``cols[j]`` (rollout slots, or cells)."""

    name: str
    rows: tuple[RolloutSlot | Cell, ...]
    cols: tuple[RolloutSlot | Cell, ...]
    values: tuple[tuple[int, ...], ...]
    mean: float | None
    max: int | None
    pairs: int


def disagreement_matrix(
    solved: Mapping[RolloutSlot | Cell, frozenset[int]], rows: Sequence[RolloutSlot | Cell],
    cols: Sequence[RolloutSlot | Cell], *, name: str, square: bool
) -> DisagreementMatrix:
    """Pairwise disagreement of ``rows`` × ``cols``; ``square`` says rows and cols are one set."""
    empty: frozenset[int] = frozenset()
    values = tuple(tuple(len(solved.get(r, empty) ^ solved.get(c, empty)) for c in cols) for r in rows)
    if square:
        pooled = [values[i][j] for i in range(len(rows)) for j in range(i + 1, len(cols))]
    else:
        pooled = [v for row in values for v in row]
    return DisagreementMatrix(
        name=name,
        rows=tuple(rows),
        cols=tuple(cols),
        values=values,
        mean=mean(pooled) if pooled else None,
        max=max(pooled) if pooled else None,
        pairs=len(pooled),
    )


def disagreement_slices(solved: Mapping[RolloutSlot | Cell, frozenset[int]]) -> dict[str, DisagreementMatrix]:
    """The three slices of the paper (see the module docstring) over the keys of ``solved``: rollout slots
    (:func:`~eglr_harness.analysis.metrics.accuracy.rollout_solved_sets`, rollout against rollout, as the report
    compares them) or cells (:func:`~eglr_harness.analysis.metrics.accuracy.solved_sets`: a cell's solved set is
    the oracle of its rollouts)."""

    def cell(key: RolloutSlot | Cell) -> Cell:
        return key.cell if isinstance(key, RolloutSlot) else Cell._make(key)

    def pool(name: str) -> list[RolloutSlot | Cell]:
        cells = set(pool_cells([cell(k) for k in solved], name))
        # L-major; a cell's slots keep their order in ``solved`` (seed, then cycle)
        return sorted((k for k in solved if cell(k) in cells), key=cell)

    L_pool, T_pool = pool("L"), pool("T")
    return {
        "L-vs-L": disagreement_matrix(solved, L_pool, L_pool, name="L-vs-L", square=True),
        "T-vs-T": disagreement_matrix(solved, T_pool, T_pool, name="T-vs-T", square=True),
        "T-vs-L": disagreement_matrix(solved, T_pool, L_pool, name="T-vs-L", square=False),
    }


def exclusive_counts(solved: Mapping[Cell, frozenset[int]]) -> dict[Cell, int]:
    """cell -> documents solved by that cell and by no other cell."""
    times: dict[int, int] = {}
    for docs in solved.values():
        for d in docs:
            times[d] = times.get(d, 0) + 1
    return {cell: sum(1 for d in docs if times[d] == 1) for cell, docs in solved.items()}


def marginal_over_greedy(solved: Mapping[Cell, frozenset[int]], greedy: Cell = GREEDY) -> dict[Cell, int] | None:
    """cell -> documents it solves that ``greedy`` misses; None when the grid has no greedy cell."""
    if greedy not in solved:
        return None
    base = solved[greedy]
    return {cell: len(docs - base) for cell, docs in solved.items()}


@register_section("disagreement")
class Disagreement(Section):
    DEFINITIONS = """\
- Disagreement slices, rollout against rollout: L-vs-L over the L pool, T-vs-T over the T pool (mean/max over
  unordered pairs of distinct rollouts), T-vs-L = T pool rows × L pool columns (mean/max over all entries). A row or
  column is one rollout per problem: a sampled cell under several seeds (or cycles) gives each seed's rollout a row
  and column of its own (`L=0,T=0.7,seed=1334`), so that no side is the oracle of several samples.
"""

    def compute(self, ctx: ReportContext):
        return disagreement_slices(rollout_solved_sets(ctx.grid))

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        return [
            Table(
                f"disagreement_{name.replace('-', '_')}.csv",
                ["row \\ col"] + [c.label for c in m.cols],
                [[r.label] + list(values) for r, values in zip(m.rows, m.values)],
            )
            for name, m in result.items()
        ]

    def figures(self, ctx: ReportContext, result, out):
        if not ctx.grid.L_values:
            return {}
        return {
            f"disagreement_{name}": heatmap(
                out / f"disagreement_{name.replace('-', '_')}.png",
                m.values,
                [c.label for c in m.rows],
                [c.label for c in m.cols],
                annotations=[[str(v) for v in row] for row in m.values],
                cmap="cividis",
                title=f"{ctx.grid.task}: disagreement {name} (|solved △ solved|; mean {num(m.mean, 1)}, max {m.max})",
                xlabel="",
                ylabel="",
                colorbar_label="problems",
            )
            for name, m in result.items()
            if m.rows and m.cols
        }

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        rows = [[name, f"{len(m.rows)}×{len(m.cols)}", m.pairs, num(m.mean, 1), m.max] for name, m in result.items()]
        return [
            "\n## Pairwise disagreement\n|solved(a) △ solved(b)| in problems, rollout against rollout. Tables: "
            "`disagreement_*.csv`.\n",
            markdown_table(["slice", "matrix", "pairs", "mean", "max"], rows),
            "",
            *(image(figs, f"disagreement_{k}", f"disagreement {k}") for k in result),
        ]


@register_section("exclusive")
class Exclusive(Section):
    DEFINITIONS = """\
- Exclusive = problems solved by that cell and no other cell of the grid; marginal = problems it solves that
  greedy misses.
"""
    TOP = 10

    def compute(self, ctx: ReportContext):
        return exclusive_counts(ctx.solved), marginal_over_greedy(ctx.solved)

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        exclusive, marginal = result
        rows = [
            [c.L, c.T, len(docs), exclusive[c], None if marginal is None else marginal[c]]
            for c, docs in ctx.solved.items()
        ]
        return [Table("exclusive_marginal.csv", ["L", "T", "solved", "exclusive", "marginal_over_greedy"], rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        exclusive, marginal = result
        top = sorted(ctx.solved, key=lambda c: (-exclusive[c], -(marginal or {}).get(c, 0), c))[: self.TOP]
        rows = [
            [c.label, len(ctx.solved[c]), exclusive[c], None if marginal is None else marginal[c]] for c in top
        ]
        return [
            "\n## Exclusive contribution and marginal over greedy\nTop cells by exclusive count; all cells in "
            "`exclusive_marginal.csv`.\n",
            markdown_table(["cell", "solved", "exclusive", "marginal over greedy"], rows),
            f"\n\nProblems solved by exactly one cell: {sum(exclusive.values())}.\n",
        ]
