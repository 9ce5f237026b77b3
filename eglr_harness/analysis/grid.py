"""The L×T grid of one task and one model, merged from one or more lm-eval runs.

Merging rules (stated in every report):
- one task and one model per grid; anything else is a ``ValueError`` naming what was found;
- documents are matched by ``doc_id``; the same ``doc_id`` with a different ``doc_hash`` in two
  runs is an error (different data or order);
- a rollout is keyed by ``(doc_id, L, T, cycle)``; when two runs hold the same key, the run
  given first wins and the duplicate is counted; within one run the same key is a deterministic
  (T = 0) cell that the task repeats (eglr-hf decodes it once): kept once and counted apart;
- rollouts without ``(L, T)`` (runs of a model other than eglr-hf) cannot be placed and are
  counted as ``unplaced``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eglr_harness.analysis.files import find_runs, read_results
from eglr_harness.analysis.rollouts import Cell, Rollout, TaskSamples, read_task_samples
from eglr_harness.analysis.runinfo import RunInfo, run_info

__all__ = ["Grid", "RunPart", "build_grid", "load_grid", "load_parts", "GREEDY"]

logger = logging.getLogger(__name__)

GREEDY: Cell = (0, 0.0)


@dataclass(frozen=True)
class RunPart:
    """One task's samples from one run, with that run's facts."""

    info: RunInfo
    samples: TaskSamples


@dataclass(frozen=True)
class Grid:
    """Rollouts of one task arranged by cell and document.

    Attributes:
        task, model: what the grid is of.
        docs: every document id seen in any run (sorted); the denominator of oracle and SC.
        by_cell: cell -> doc_id -> rollouts of that cell on that document, by cycle.
        parts: the merged runs, in the order given.
        unplaced: rollouts without (L, T) metadata (ignored).
        duplicates: rollouts dropped because an earlier run had the same (doc, L, T, cycle).
        repeated: rollouts dropped because their own run already had that (doc, L, T, cycle).
    """

    task: str
    model: str
    docs: tuple[int, ...]
    by_cell: dict[Cell, dict[int, tuple[Rollout, ...]]]
    parts: tuple[RunPart, ...] = ()
    unplaced: int = 0
    duplicates: int = 0
    repeated: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def L_values(self) -> tuple[int, ...]:
        return tuple(sorted({L for L, _ in self.by_cell}))

    @property
    def T_values(self) -> tuple[float, ...]:
        return tuple(sorted({T for _, T in self.by_cell}))

    @property
    def cells(self) -> tuple[Cell, ...]:
        """Cells that have rollouts, L-major (L ascending, then T ascending)."""
        return tuple(sorted(self.by_cell))

    @property
    def n_docs(self) -> int:
        return len(self.docs)

    @property
    def n_rollouts(self) -> int:
        return sum(len(rs) for docs in self.by_cell.values() for rs in docs.values())

    def missing_cells(self) -> list[Cell]:
        """Cells of the rectangle ``L_values × T_values`` without any rollout."""
        return [(L, T) for L in self.L_values for T in self.T_values if (L, T) not in self.by_cell]

    def incomplete_cells(self) -> dict[Cell, int]:
        """Present cells that lack some documents: cell -> number of documents missing."""
        return {c: self.n_docs - len(d) for c, d in sorted(self.by_cell.items()) if len(d) < self.n_docs}

    def rollouts_in(self, cells: Iterable[Cell], doc_id: int) -> list[Rollout]:
        """The rollouts of ``doc_id`` over ``cells``, in the order of ``cells`` then cycle."""
        out: list[Rollout] = []
        for cell in cells:
            out.extend(self.by_cell.get(cell, {}).get(doc_id, ()))
        return out


def build_grid(task: str, parts: Sequence[RunPart]) -> Grid:
    """Merge the runs' rollouts of ``task`` into one grid (rules in the module docstring)."""
    if not parts:
        raise ValueError(f"no run holds samples of task {task!r}; nothing to analyse.")
    models = {}
    for part in parts:
        models.setdefault(part.info.model, []).append(str(part.info.path))
    if len(models) > 1:
        listing = "; ".join(f"{m!r} in {paths}" for m, paths in models.items())
        raise ValueError(f"runs of different models cannot share one grid: {listing}. Pass runs of one model.")

    doc_hashes: dict[int, tuple[str, Path]] = {}
    seen: dict[tuple[int, int, float, int], int] = {}  # key -> index of the part it was first read from
    cells: dict[Cell, dict[int, list[Rollout]]] = {}
    unplaced = duplicates = repeated = 0
    for index, part in enumerate(parts):
        for doc_id, doc_hash in part.samples.doc_hashes.items():
            first = doc_hashes.setdefault(doc_id, (doc_hash, part.samples.path))
            if doc_hash and first[0] and first[0] != doc_hash:
                raise ValueError(
                    f"doc {doc_id} differs between {first[1]} and {part.samples.path} (doc_hash "
                    f"{first[0]} vs {doc_hash}); merge only runs over the same data."
                )
        for row in part.samples.rollouts:
            if row.cell is None:
                unplaced += 1
                continue
            key = (row.doc_id, row.L, row.T, row.cycle if row.cycle is not None else row.repeat)
            if key in seen:
                if seen[key] == index:
                    repeated += 1
                else:
                    duplicates += 1
                continue
            seen[key] = index
            cells.setdefault(row.cell, {}).setdefault(row.doc_id, []).append(row)

    notes = []
    if unplaced:
        notes.append(f"{unplaced} rollouts carry no (L, T) (a model other than eglr-hf) and are ignored.")
        logger.warning("%s: %s", task, notes[-1])
    if duplicates:
        notes.append(
            f"{duplicates} rollouts repeat a (doc, L, T, cycle) of an earlier run; the earlier run's are kept."
        )
        logger.warning("%s: %s", task, notes[-1])
    if repeated:
        notes.append(
            f"{repeated} rollouts repeat a deterministic (doc, L, T) within their own run (the task repeats "
            "the cell, eglr-hf decodes it once); each is counted once."
        )
        logger.info("%s: %s", task, notes[-1])
    by_cell = {
        cell: {d: tuple(sorted(rs, key=lambda r: (r.cycle or 0, r.repeat))) for d, rs in sorted(docs.items())}
        for cell, docs in sorted(cells.items())
    }
    return Grid(
        task=task,
        model=parts[0].info.model,
        docs=tuple(sorted(doc_hashes)),
        by_cell=by_cell,
        parts=tuple(parts),
        unplaced=unplaced,
        duplicates=duplicates,
        repeated=repeated,
        notes=tuple(notes),
    )


def load_parts(
    run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None
) -> tuple[str, list[RunPart]]:
    """Find the runs under ``run_paths`` and read the samples of one task.

    Returns ``(task, parts)``. With ``task=None`` the runs must hold exactly one task with samples;
    several tasks is a ``ValueError`` naming them.
    """
    if not run_paths:
        raise ValueError("no run folder given; pass at least one folder written by lm_eval --output_path.")
    runs = [run for path in run_paths for run in find_runs(path)]
    infos = [(run, run_info(read_results(run.results), run.results)) for run in runs]
    with_samples = sorted({t for run, _ in infos for t in run.samples})
    if not with_samples:
        raise ValueError(
            f"the runs under {[str(p) for p in run_paths]} have no samples files; rerun lm_eval with --log_samples."
        )
    if task is None:
        if len(with_samples) > 1:
            raise ValueError(
                f"the runs hold several tasks {with_samples}; one grid is one task: pass --task NAME "
                "(or task=...) with one of them."
            )
        task = with_samples[0]
    elif task not in with_samples:
        raise ValueError(f"task {task!r} has no samples in these runs; tasks with samples: {with_samples}.")
    parts = []
    for run, info in infos:
        if task in run.samples:
            parts.append(RunPart(info=info, samples=read_task_samples(run.samples[task], filter_name)))
        elif task in info.tasks:
            logger.warning("%s has results for %s but no samples file (run without --log_samples?)", run.results, task)
    return task, parts


def load_grid(run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None) -> Grid:
    """Read and merge the runs under ``run_paths`` into the grid of one task."""
    task, parts = load_parts(run_paths, task, filter_name)
    return build_grid(task, parts)
