"""The oracle (eglr-method.md §5): documents solved by at least one rollout, over sub-grids and pools.

Oracle counts are sizes of unions of solved sets; their denominator is every document of the grid.
The cumulative oracle at ``(L, T)`` covers the rectangle ``[0..L]×[0..T]``, so its named corners
are the pools of :mod:`~eglr_harness.analysis.metrics.accuracy` with greedy added (the rectangle
``[0..0]×[0..T_max]`` holds the greedy cell): greedy = (0, 0); T-only = T pool ∪ greedy; L-only =
L pool ∪ greedy; joint = every cell. These are the paper's 11×11 grid corners (§7).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from math import comb

from eglr_harness.analysis.load import GREEDY, Grid
from eglr_harness.analysis.metrics.accuracy import pool_cells, rollout_solved_sets
from eglr_harness.core.cell import Cell

__all__ = [
    "CORNERS",
    "union_size",
    "cumulative_oracle",
    "oracle_corners",
    "corner_cells",
    "random_oracle_per_doc",
    "expected_random_oracle",
    "random_rollouts_yardstick",
]

# The four named corners of the cumulative oracle and the pool each adds greedy to.
CORNERS = {"greedy": None, "T-only": "T", "L-only": "L", "joint": "LxT"}


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
        Cell(L, T): union_size(solved, [c for c in solved if c[0] <= L and c[1] <= T])
        for L in L_values
        for T in T_values
    }


def oracle_corners(solved: Mapping[Cell, frozenset[int]]) -> dict[str, int | None]:
    """Documents solved at the four named corners (module docstring); None when a corner has no cell."""
    greedy = [GREEDY] if GREEDY in solved else []
    out = {}
    for name, pool in CORNERS.items():
        cells = sorted({*greedy, *(pool_cells(list(solved), pool) if pool else [])})
        out[name] = union_size(solved, cells) if cells else None
    return out


def corner_cells(grid: Grid) -> dict[Cell, str]:
    """Rectangle positions of the named corners of the cumulative oracle."""
    Ls, Ts = grid.L_values, grid.T_values
    if not Ls:
        return {}
    names = {Cell(Ls[-1], Ts[-1]): "joint"}
    if Ls[0] == 0 and Ts[0] == 0.0:
        names.update({Cell(0, Ts[-1]): "T-only", Cell(Ls[-1], 0.0): "L-only", GREEDY: "greedy"})
    return names


def random_oracle_per_doc(solved: Mapping[Hashable, frozenset[int]], cells: Sequence[Hashable],
                          budget: int) -> dict[int, float]:
    """doc -> probability that ``budget`` cells drawn uniformly without replacement from ``cells`` solve it.

    Exact: a document solved by ``s`` of the ``n`` cells is missed with probability
    C(n - s, budget) / C(n, budget). Documents no cell solves are left out (probability 0). The units drawn are
    the keys of ``solved``: cells, or the rollout slots of :func:`random_rollouts_yardstick`.
    """
    n = len(cells)
    if not 0 <= budget <= n:
        raise ValueError(f"`budget`={budget} is not allowed; allowed: an int in [0, {n}] (the number of cells).")
    per_doc: dict[int, int] = {}
    for cell in cells:
        for doc in solved.get(cell, frozenset()):
            per_doc[doc] = per_doc.get(doc, 0) + 1
    total = comb(n, budget)
    return {doc: 1 - comb(n - s, budget) / total for doc, s in per_doc.items()}


def expected_random_oracle(solved: Mapping[Hashable, frozenset[int]], cells: Sequence[Hashable],
                           budget: int) -> float:
    """Expected number of documents solved by ``budget`` cells drawn uniformly without replacement from ``cells``.

    Exact, not sampled (the sum of :func:`random_oracle_per_doc`). Over the grid's rollouts
    (:func:`random_rollouts_yardstick`) it is the equal-budget yardstick for a pool: an oracle gain that as many
    random rollouts also reach is budget, not complementarity.
    """
    return sum(random_oracle_per_doc(solved, cells, budget).values())


def random_rollouts_yardstick(grid: Grid, cells: Sequence[Cell]) -> tuple[int, dict[int, float]]:
    """The equal-budget yardstick of the pool of ``cells``: ``(B, doc -> probability)``, B the rollouts per problem
    the pool holds and the probability that B rollouts drawn uniformly without replacement from all the grid's
    rollouts solve the document (exact, :func:`random_oracle_per_doc` over the grid's rollout slots,
    :func:`~eglr_harness.analysis.metrics.accuracy.rollout_solved_sets`).

    Rollouts, not cells, are drawn so that the yardstick's budget is the pool's whatever the cells hold: a sampled
    cell under ten seeds is ten rollouts of the draw, as it is ten of the pool's. On a grid of one rollout per cell
    it is the oracle of as many random cells.
    """
    slots = rollout_solved_sets(grid)
    wanted = set(cells)
    budget = sum(1 for slot in slots if slot.cell in wanted)
    return budget, random_oracle_per_doc(slots, list(slots), budget)
