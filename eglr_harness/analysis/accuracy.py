"""Per-cell accuracy, solved sets and the cumulative oracle over sub-grids ``[0..L]×[0..T]``.

A cell's *accuracy* is correct rollouts / rollouts of that cell (one rollout per document in the
usual grids; with several cycles every rollout counts). A cell *solves* a document when any of
its rollouts on it is correct. Oracle counts are sizes of unions of solved sets; their
denominator is every document of the grid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import comb

from eglr_harness.analysis.grid import GREEDY, Grid
from eglr_harness.analysis.rollouts import Cell

__all__ = [
    "CellAccuracy",
    "cell_accuracy",
    "solved_sets",
    "union_size",
    "cumulative_oracle",
    "oracle_corners",
    "expected_random_oracle",
    "CORNERS",
]

# The four named corners of the cumulative oracle (eglr-method.md §5, §7).
CORNERS = ("greedy", "T-only", "L-only", "joint")


@dataclass(frozen=True)
class CellAccuracy:
    """Accuracy of one cell: ``correct`` of ``rollouts``; ``solved`` of ``docs`` documents."""

    cell: Cell
    correct: int
    rollouts: int
    solved: int
    docs: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.rollouts if self.rollouts else 0.0


def cell_accuracy(grid: Grid) -> dict[Cell, CellAccuracy]:
    """Accuracy of every present cell, L-major."""
    out = {}
    for cell, docs in grid.by_cell.items():
        rows = [r for rs in docs.values() for r in rs]
        out[cell] = CellAccuracy(
            cell=cell,
            correct=sum(r.correct for r in rows),
            rollouts=len(rows),
            solved=sum(any(r.correct for r in rs) for rs in docs.values()),
            docs=len(docs),
        )
    return dict(sorted(out.items()))


def solved_sets(grid: Grid) -> dict[Cell, frozenset[int]]:
    """cell -> the documents it solves (any rollout of the cell correct)."""
    return {
        cell: frozenset(d for d, rs in docs.items() if any(r.correct for r in rs))
        for cell, docs in sorted(grid.by_cell.items())
    }


def union_size(solved: Mapping[Cell, frozenset[int]], cells: Iterable[Cell]) -> int:
    """Number of documents solved by at least one of ``cells`` (absent cells solve nothing)."""
    union: set[int] = set()
    for cell in cells:
        union |= solved.get(cell, frozenset())
    return len(union)


def cumulative_oracle(
    solved: Mapping[Cell, frozenset[int]], L_values: Sequence[int], T_values: Sequence[float]
) -> dict[Cell, int]:
    """For each (L, T) of the rectangle: documents solved by some cell with L' <= L and T' <= T."""
    return {
        (L, T): union_size(solved, [c for c in solved if c[0] <= L and c[1] <= T]) for L in L_values for T in T_values
    }


def oracle_corners(solved: Mapping[Cell, frozenset[int]]) -> dict[str, int | None]:
    """Documents solved by the four named pools; None when the pool has no cell.

    greedy = cell (0, 0); T-only = the L=0 row; L-only = the T=0 column; joint = every cell.
    """
    pools = {
        "greedy": [c for c in solved if c == GREEDY],
        "T-only": [c for c in solved if c[0] == 0],
        "L-only": [c for c in solved if c[1] == 0.0],
        "joint": list(solved),
    }
    return {name: (union_size(solved, cells) if cells else None) for name, cells in pools.items()}


def expected_random_oracle(solved: Mapping[Cell, frozenset[int]], cells: Sequence[Cell], budget: int) -> float:
    """Expected number of documents solved by ``budget`` cells drawn uniformly without replacement from ``cells``.

    Exact, not sampled: a document solved by ``s`` of the ``n`` cells is missed by a random
    ``budget``-subset with probability C(n - s, budget) / C(n, budget). It is the equal-budget
    yardstick for a pool: an oracle gain that random cells of the same number also reach is budget,
    not complementarity.
    """
    n = len(cells)
    if not 0 <= budget <= n:
        raise ValueError(f"`budget`={budget} is not allowed; allowed: an int in [0, {n}] (the number of cells).")
    per_doc: dict[int, int] = {}
    for cell in cells:
        for doc in solved.get(cell, frozenset()):
            per_doc[doc] = per_doc.get(doc, 0) + 1
    total = comb(n, budget)
    return sum(1 - comb(n - s, budget) / total for s in per_doc.values())
