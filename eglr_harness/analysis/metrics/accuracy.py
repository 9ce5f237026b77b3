"""Accuracy and pools (eglr-method.md §5): per-cell accuracy, solved sets, the pools, the best single
configuration and the majority vote (EGLR-SC).

A cell's *accuracy* is correct rollouts / rollouts of that cell (one rollout per document in the
usual grids; with several cycles every rollout counts). A cell *solves* a document when any of
its rollouts on it is correct.

Pools (cells in L-major order, which is also the pool order for votes and budgets):
- ``T``: L = 0, T > 0 (the paper's T-only regime, T ∈ 0.1..1.0; greedy is not in it);
- ``L``: T = 0, L > 0 (the L-only regime, EGLR-SC_L);
- ``LuT``: the T pool and the L pool together (the cross of the grid without greedy);
- ``LxT``: every cell of the grid (the 11×11 grid with L = 0 and T = 0 included).

Majority vote: rollouts vote with their label (:attr:`RolloutRow.vote`: the task's equivalence
cluster, or the exact answer); the winner follows :func:`eglr_harness.core.votes.majority` (largest
group, ties to the earliest first member in pool order, no answer never votes) and is correct
when its first rollout is — as the tasks' ``maj@B``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import Grid, RolloutRow, RunPart
from eglr_harness.core.cell import Cell
from eglr_harness.core.votes import best_cell, majority

__all__ = [
    "CellAccuracy",
    "cell_accuracy",
    "solved_sets",
    "POOLS",
    "POOL_TITLES",
    "POOL_NAMES",
    "pool_cells",
    "best_in_pool",
    "vote_is_correct",
    "sc_solved",
    "oracle_solved",
    "rollouts_per_problem",
    "one_rollout_per_cell",
    "OtherRun",
    "other_runs",
]

POOLS = ("T", "L", "LuT", "LxT")
POOL_TITLES = {
    "T": "T pool (L=0, T>0)",
    "L": "L pool (T=0, L>0)",
    "LuT": "L ∪ T pool (T pool + L pool)",
    "LxT": "L×T pool (all cells)",
}
POOL_NAMES = {"T": "T pool", "L": "L pool", "LuT": "L ∪ T pool", "LxT": "L×T pool"}  # short, for row labels
_POOL_RULES = {
    "T": lambda c: c.L == 0 and c.T > 0,
    "L": lambda c: c.T == 0 and c.L > 0,
    "LuT": lambda c: (c.L == 0) != (c.T == 0),
    "LxT": lambda c: True,
}


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


def pool_cells(cells: Sequence[Cell], pool: str) -> list[Cell]:
    """The cells of ``pool`` among ``cells``, L-major."""
    if pool not in _POOL_RULES:
        raise ValueError(f"pool {pool!r} is unknown; allowed: {list(POOLS)}.")
    return sorted(c for c in map(Cell._make, cells) if _POOL_RULES[pool](c))


def best_in_pool(accuracy: Mapping[Cell, CellAccuracy], cells: Sequence[Cell]) -> Cell | None:
    """The best single configuration among ``cells`` (ties: first in L-major order)."""
    return best_cell({c: accuracy[c].accuracy for c in cells if c in accuracy})


def vote_is_correct(rollouts: Sequence[RolloutRow]) -> bool:
    """Whether the majority vote over ``rollouts`` (in pool order) is correct (module docstring)."""
    winner = majority([r.vote for r in rollouts])
    return winner is not None and bool(rollouts[winner].correct)


def sc_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents whose majority vote over ``cells`` (in the given order) is correct."""
    return frozenset(d for d in grid.docs if vote_is_correct(grid.rollouts_in(cells, d)))


def oracle_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents with at least one correct rollout over ``cells``."""
    return frozenset(d for d in grid.docs if any(r.correct for r in grid.rollouts_in(cells, d)))


def rollouts_per_problem(grid: Grid, cells: Sequence[Cell]) -> float:
    """Rollouts per problem that ``cells`` hold together (each cell's rollouts over the problems it holds): the
    pool's budget B. Equal to ``len(cells)`` when each cell holds one rollout per problem; more where a cell holds
    several (seeds, cycles of a sampled cell)."""
    return sum(sum(len(rows) for rows in grid.by_cell[c].values()) / len(grid.by_cell[c]) for c in cells)


def one_rollout_per_cell(grid: Grid, cells: Sequence[Cell]) -> bool:
    """Whether ``cells`` hold one rollout per problem each, so that their budget is their number (what a yardstick
    of as many random grid cells assumes)."""
    return rollouts_per_problem(grid, cells) == len(cells)


@dataclass(frozen=True)
class OtherRun:
    """A run of a model other than eglr-hf merged into the grid (lm-eval's ``hf``: greedy or beam search).

    ``first_correct``: problem -> whether the run's first rollout on it is right (it decodes one per problem;
    repeats of a deterministic run are copies). ``num_beams``: its ``num_beams`` gen kwarg as an int (None when
    not given; a value that is no int is kept in ``beams_text`` and makes :attr:`beams_error`)."""

    name: str
    source: str
    first_correct: Mapping[int, int]
    num_beams: int | None
    beams_text: str | None = None

    @property
    def label(self) -> str:
        return f"Beam-{self.num_beams} ({self.source})" if self.num_beams and self.num_beams > 1 \
            else f"{self.source}, no beams"

    @property
    def beams_error(self) -> str | None:
        """Why the run's beam count cannot be read, or None."""
        if self.beams_text is not None and (self.num_beams is None or self.num_beams < 1):
            return f"num_beams={self.beams_text!r} is not a beam count"
        return None

    @property
    def solved(self) -> frozenset[int]:
        return frozenset(d for d, right in self.first_correct.items() if right)


def _other_run(part: RunPart) -> OtherRun | None:
    rows = part.rollouts
    if not rows or any(row.cell is not None for row in rows):
        return None  # an EGLR run, or no rollout
    first: dict[int, int] = {}
    for row in sorted(rows, key=lambda r: (r.doc_id, r.repeat)):
        first.setdefault(row.doc_id, row.correct)
    beams = part.info.gen_kwargs.get("num_beams")
    try:
        num_beams = None if beams is None else int(str(beams))
    except ValueError:
        num_beams = None
    return OtherRun(part.info.name, part.info.model_source or "other model", first, num_beams,
                    None if beams is None else str(beams))


def other_runs(grid: Grid) -> list[OtherRun]:
    """The grid's runs of models other than eglr-hf, in the order given."""
    return [run for run in map(_other_run, grid.parts) if run is not None]
