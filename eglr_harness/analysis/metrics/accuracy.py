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
from dataclasses import dataclass, field

from eglr_harness.analysis.load import Grid, RolloutRow, RunPart, beam_count, first_rollouts
from eglr_harness.core.cell import Cell
from eglr_harness.analysis.metrics.ties import pool_vote
from eglr_harness.core.votes import best_cell, vote_outcome

__all__ = [
    "CellAccuracy",
    "cell_accuracy",
    "solved_sets",
    "RolloutSlot",
    "rollout_solved_sets",
    "POOLS",
    "POOL_TITLES",
    "POOL_NAMES",
    "pool_cells",
    "best_in_pool",
    "vote_is_correct",
    "sc_solved",
    "oracle_solved",
    "rollouts_per_problem",
    "OtherRun",
    "other_runs",
    "baselines",
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


@dataclass(frozen=True)
class RolloutSlot:
    """One rollout of a cell on every problem: the cell's rollouts of one ``seed`` and ``cycle`` (``seed`` None: a
    deterministic cell, the same text under any seed). A cell holds one slot per (seed, cycle) among its rollouts, so
    a sampled cell under ten seeds (``seeds=10``) holds ten and a grid of one rollout per cell one slot per cell.
    ``label``: the cell's where the cell holds one slot, else the cell's with what tells its slots apart
    (``L=0,T=0.7,seed=1334``)."""

    cell: Cell
    seed: int | None
    cycle: int
    label: str = field(compare=False)


def rollout_solved_sets(grid: Grid) -> dict[RolloutSlot, frozenset[int]]:
    """slot -> the documents whose rollout of that slot is right: :func:`solved_sets` rollout by rollout, the unit
    of any comparison at equal budget (a cell under several seeds is several rollouts, not one). L-major, then seed
    and cycle (the grid's order); a slot's missing rollout on a document solves nothing."""
    out: dict[RolloutSlot, frozenset[int]] = {}
    for cell, docs in sorted(grid.by_cell.items()):
        solved: dict[tuple[int | None, int], set[int]] = {}
        for d, rows in docs.items():
            for r in rows:  # keyed as the grid keys a rollout (load.grid.rollout_key): seed, then cycle or repeat
                slot = solved.setdefault((r.seed, r.cycle if r.cycle is not None else r.repeat), set())
                if r.correct:
                    slot.add(d)
        keys = sorted(solved, key=lambda k: (k[0] is not None, k[0] or 0, k[1]))
        seeds, cycles = len({k[0] for k in keys}) > 1, len({k[1] for k in keys}) > 1
        for seed, cycle in keys:
            label = cell.label + (f",seed={seed}" if seeds else "") + (f",cycle={cycle}" if cycles else "")
            out[RolloutSlot(cell, seed, cycle, label)] = frozenset(solved[(seed, cycle)])
    return out


def pool_cells(cells: Sequence[Cell], pool: str) -> list[Cell]:
    """The cells of ``pool`` among ``cells``, L-major."""
    if pool not in _POOL_RULES:
        raise ValueError(f"pool {pool!r} is unknown; allowed: {list(POOLS)}.")
    return sorted(c for c in map(Cell._make, cells) if _POOL_RULES[pool](c))


def best_in_pool(accuracy: Mapping[Cell, CellAccuracy], cells: Sequence[Cell]) -> Cell | None:
    """The best single configuration among ``cells`` (ties: first in L-major order)."""
    return best_cell({c: accuracy[c].accuracy for c in cells if c in accuracy})


def vote_is_correct(rollouts: Sequence[RolloutRow]) -> bool:
    """Whether the majority vote over ``rollouts`` (in pool order) is correct (module docstring): the first-seen
    outcome of :func:`eglr_harness.core.votes.vote_outcome`, the one rule of a vote."""
    return vote_outcome([r.vote for r in rollouts], [r.correct for r in rollouts]).first_seen


def sc_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents whose majority vote over ``cells`` (in the given order) is correct: the vote of
    :func:`~eglr_harness.analysis.metrics.ties.pool_vote` (a :class:`~eglr_harness.analysis.metrics.ties.PoolVote`,
    which carries its ties too)."""
    return pool_vote(grid, cells)


def oracle_solved(grid: Grid, cells: Sequence[Cell]) -> frozenset[int]:
    """Documents with at least one correct rollout over ``cells``."""
    return frozenset(d for d in grid.docs if any(r.correct for r in grid.rollouts_in(cells, d)))


def rollouts_per_problem(grid: Grid, cells: Sequence[Cell]) -> float:
    """Rollouts per problem that ``cells`` hold together (each cell's rollouts over the problems it holds): the
    pool's budget B. Equal to ``len(cells)`` when each cell holds one rollout per problem; more where a cell holds
    several (seeds, cycles of a sampled cell)."""
    return sum(sum(len(rows) for rows in grid.by_cell[c].values()) / len(grid.by_cell[c]) for c in cells)


@dataclass(frozen=True)
class OtherRun:
    """A run of a model other than EGLR's merged into the grid (lm-eval's ``hf`` or ``eglr-baseline``: greedy or
    beam search), over the grid's problems it holds.

    ``first_correct``: problem -> whether the run's first rollout on it is right (it decodes one per problem;
    repeats of a deterministic run are copies). ``num_beams``: its ``num_beams`` gen kwarg as an int (None when not
    given or no beam count: :func:`~eglr_harness.analysis.load.baselines.beam_count`). ``refused``: why it is no
    baseline (:attr:`~eglr_harness.analysis.load.RunPart.baseline_refusal`), None when it is one; a refused run is
    in no comparison of any section, which names it with this reason. ``search_tokens``: problem -> the tokens its
    decoding evaluated for the first rollout (eglr-baseline records them), None unless every first rollout has them.
    """

    name: str
    source: str
    first_correct: Mapping[int, int]
    num_beams: int | None
    refused: str | None = None
    search_tokens: Mapping[int, int] | None = None

    @property
    def label(self) -> str:
        return f"Beam-{self.num_beams} ({self.source})" if self.num_beams and self.num_beams > 1 \
            else f"{self.source}, no beams"

    @property
    def solved(self) -> frozenset[int]:
        return frozenset(d for d, right in self.first_correct.items() if right)


def _other_run(part: RunPart) -> OtherRun | None:
    if part.is_eglr:
        return None
    first = first_rollouts(part.rollouts)
    tokens = {doc: row.search_tokens for doc, row in first.items()}
    return OtherRun(part.info.name, part.info.model_source or "other model",
                    {doc: row.correct for doc, row in first.items()}, beam_count(part.info.gen_kwargs)[0],
                    part.baseline_refusal, tokens if None not in tokens.values() else None)


def other_runs(grid: Grid) -> list[OtherRun]:
    """The grid's runs of models other than EGLR's, in the order given, refused ones too (:attr:`OtherRun.refused`:
    each section names them with the reason)."""
    return [run for run in map(_other_run, grid.parts) if run is not None]


def baselines(grid: Grid) -> list[OtherRun]:
    """:func:`other_runs` that are baselines (not refused): the only ones any section compares or draws."""
    return [run for run in other_runs(grid) if run.refused is None]
