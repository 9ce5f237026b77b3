"""Which configurations solve which problems: disagreement, exclusive and marginal counts.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean

from eglr_harness.analysis.load import GREEDY
from eglr_harness.analysis.metrics.accuracy import RolloutSlot, pool_cells
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
