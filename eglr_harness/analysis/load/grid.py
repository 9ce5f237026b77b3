"""Merging runs' rollouts of one task into the L×T :class:`Grid` (rules: the
:mod:`eglr_harness.analysis.load` docstring), and loading it from run folders."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from eglr_harness.analysis.load.baselines import baseline_refusal
from eglr_harness.analysis.load.files import distinct_runs, find_runs, read_results
from eglr_harness.analysis.load.rollouts import RolloutRow, TaskSamples, doc_ranges, read_task_samples
from eglr_harness.analysis.load.runs import RunInfo, run_info
from eglr_harness.core.benchmark_names import benchmark_of
from eglr_harness.core.cell import Cell

__all__ = ["GREEDY", "VOTE_CLUSTERS", "VOTE_STRINGS", "VOTE_MIXED", "RunPart", "Grid", "vote_labels", "build_grid",
           "load_parts", "load_grid"]

logger = logging.getLogger(__name__)

GREEDY = Cell(0, 0.0)

# How a grid's votes were labelled (said in every report).
VOTE_CLUSTERS = "equivalence clusters (logged by the task)"
VOTE_STRINGS = "exact answer strings (the runs log no cluster ids)"
VOTE_MIXED = "equivalence clusters where the runs log them (exact answer strings elsewhere)"


def rollout_key(row: RolloutRow, base_seed: int | None) -> tuple:
    """What makes a rollout one rollout: ``(doc, L, T, seed, cycle)`` (the module docstring). A sampled rollout of
    another seed (``seeds=``) is another rollout, an unlabelled one ran under its run's ``base_seed``; a
    deterministic cell's text is the same under every seed (seed None)."""
    seed = (row.seed if row.seed is not None else base_seed) if row.T else None
    return (row.doc_id, row.L, row.T, seed, row.cycle if row.cycle is not None else row.repeat)


@dataclass(frozen=True)
class RunPart:
    """One task's samples from one run, with that run's facts. :attr:`rollouts` is the one view of them that
    every table reads: each rollout once."""

    info: RunInfo
    samples: TaskSamples

    @cached_property
    def _unique(self) -> tuple[tuple[RolloutRow, ...], int]:
        base_seed = ((self.info.eglr or {}).get("settings") or {}).get("seed")
        seen: set[tuple] = set()
        kept: list[RolloutRow] = []
        for row in self.samples.rollouts:
            if row.cell is None:  # a model other than eglr-hf: nothing to key it by (the grid leaves it out)
                kept.append(row)
                continue
            key = rollout_key(row, base_seed)
            if key not in seen:
                seen.add(key)
                kept.append(replace(row, seed=key[3]) if row.T else row)
        return tuple(kept), len(self.samples.rollouts) - len(kept)

    @property
    def rollouts(self) -> tuple[RolloutRow, ...]:
        """The run's rollouts, each ``(doc, L, T, seed, cycle)`` (:func:`rollout_key`) once, in file order: a
        deterministic cell the task repeats (eglr-hf decodes it once), or a copy, counts once (a sampled
        rollout's ``seed`` filled in: its label, else the run's base seed). The grid, the runs, exit-rules and
        ablation tables all read these."""
        return self._unique[0]

    @property
    def repeated(self) -> int:
        """The rollouts of the file that :attr:`rollouts` leaves out (they repeat one of it)."""
        return self._unique[1]

    @cached_property
    def is_eglr(self) -> bool:
        """Whether the run's rollouts carry cells (L, T): a run of eglr-hf or eglr-vllm, whose problems are the grid's.
        Any other (lm-eval's ``hf``, ``eglr-baseline``, a model not EGLR's) is a baseline of its own
        (:mod:`~eglr_harness.analysis.load.baselines`)."""
        return any(row.cell is not None for row in self.samples.rollouts)

    @cached_property
    def baseline_refusal(self) -> str | None:
        """Why this run of another model is no baseline (:func:`~eglr_harness.analysis.load.baselines.baseline_refusal`
        of its rollouts), or None; None for an EGLR run."""
        return None if self.is_eglr else baseline_refusal(self.info, self.rollouts)


@dataclass(frozen=True)
class Grid:
    """Rollouts of one task arranged by cell and document.

    Attributes:
        task, model: what the grid is of.
        docs: every document id of the EGLR runs (sorted; of every run when none is one): the denominator of oracle
            and SC. A run of another model never adds one (:func:`build_grid`).
        by_cell: cell -> doc_id -> rollouts of that cell on that document, by seed then cycle (a sampled
            rollout's ``seed`` is filled in: its label, else its run's base seed; deterministic ones keep None).
        parts: the merged runs, in the order given.
        unplaced: rollouts without (L, T) metadata (ignored).
        duplicates: rollouts dropped because an earlier run had the same (doc, L, T, cycle).
        repeated: rollouts dropped because their own run already had that (doc, L, T, cycle).
        vote_rule: how votes were labelled (:data:`VOTE_CLUSTERS`, :data:`VOTE_STRINGS`, ...).
        overlap: one dict per part (in the order of :attr:`parts`): cell -> ``(repeating, held)``, of the part's
            rollouts of that cell (:attr:`RunPart.rollouts`) the number that repeat an earlier part's (the grid
            keeps the earlier one: :attr:`duplicates`) and the number it holds; only cells with a repeat. The one
            record of the de-duplication that every table reads (the compute tables through
            :meth:`counted_cells`).
        run_notes: what the report must say about the runs themselves, one line each: runs given but left out (another
            task or benchmark, no samples, the same file again), other models' problems outside the grid, runs refused
            as baselines and why (the section "Runs" prints them; each is logged when the grid is built).
    """

    task: str
    model: str
    docs: tuple[int, ...]
    by_cell: dict[Cell, dict[int, tuple[RolloutRow, ...]]]
    parts: tuple[RunPart, ...] = ()
    unplaced: int = 0
    duplicates: int = 0
    repeated: int = 0
    notes: tuple[str, ...] = field(default=())
    vote_rule: str = VOTE_STRINGS
    run_notes: tuple[str, ...] = field(default=())
    overlap: tuple[dict[Cell, tuple[int, int]], ...] = field(default=())

    @property
    def L_values(self) -> tuple[int, ...]:
        return tuple(sorted({c.L for c in self.by_cell}))

    @property
    def T_values(self) -> tuple[float, ...]:
        return tuple(sorted({c.T for c in self.by_cell}))

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
        return [Cell(L, T) for L in self.L_values for T in self.T_values if (L, T) not in self.by_cell]

    def incomplete_cells(self) -> dict[Cell, int]:
        """Present cells that lack some documents: cell -> number of documents missing."""
        return {c: self.n_docs - len(d) for c, d in sorted(self.by_cell.items()) if len(d) < self.n_docs}

    def counted_cells(self, index: int) -> tuple[frozenset[Cell], dict[Cell, tuple[int, int]]]:
        """Which cells of part ``index`` the grid counts, as the compute tables read it: ``(left out, partly
        repeated)``. A cell every one of whose rollouts repeats an earlier part's is left out (its rollouts are the
        earlier part's; a resumed copy of a run repeats all of them); a cell some of whose rollouts do is counted,
        with its ``(repeating, held)`` (the accounting is per cell, not per rollout, so it cannot be split). Every
        other cell of the part counts."""
        overlap = self.overlap[index] if index < len(self.overlap) else {}
        left_out = frozenset(cell for cell, (repeating, held) in overlap.items() if repeating == held)
        return left_out, {cell: pair for cell, pair in overlap.items() if cell not in left_out}

    def rollouts_in(self, cells: Iterable[Cell], doc_id: int) -> list[RolloutRow]:
        """The rollouts of ``doc_id`` over ``cells``, in the order of ``cells`` then cycle."""
        out: list[RolloutRow] = []
        for cell in cells:
            out.extend(self.by_cell.get(cell, {}).get(doc_id, ()))
        return out


def vote_labels(rows: Sequence[tuple[int, RolloutRow]]) -> list[int | None]:
    """Vote labels of one document's rollouts, given as ``(part index, row)``: rollouts in one cluster
    of one run, or with equal answer strings, get one label (the module docstring); None = no answer."""
    parent: dict[object, object] = {}  # union-find over answer strings and (run, cluster id) pairs

    def root(node):
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    for part, row in rows:
        if row.answer is not None and row.cluster is not None:
            parent[root(("cluster", part, row.cluster))] = root(("answer", row.answer))
    numbers: dict[object, int] = {}
    return [
        None if row.answer is None else numbers.setdefault(root(("answer", row.answer)), len(numbers))
        for _, row in rows
    ]


def _vote_rule(parts: Sequence[RunPart]) -> str:
    flags = {p.samples.has_clusters for p in parts if any(r.answer is not None for r in p.samples.rollouts)}
    if flags == {True}:
        return VOTE_CLUSTERS
    return VOTE_MIXED if True in flags else VOTE_STRINGS


def _decoding_settings(part: RunPart, task: str) -> dict:
    """The EGLR settings a run decoded with (``config.eglr``: alpha, k_max, tau_kl, top_k, top_p and the
    task's tau_h), which make two runs' rollouts of one cell different rollouts."""
    eglr = part.info.eglr or {}
    decoded = {k: v for k, v in (eglr.get("settings") or {}).items() if k in ("alpha", "k_max", "tau_kl", "top_k",
                                                                              "top_p")}
    tau_h = eglr.get("tau_h")
    if isinstance(tau_h, dict) and task in tau_h:
        decoded["tau_h"] = tau_h[task]
    return decoded


def _within(part: RunPart, docs: frozenset[int]) -> RunPart:
    """``part`` with only the problems of ``docs`` (its rollouts and document hashes)."""
    samples = part.samples
    return RunPart(part.info, replace(samples, rollouts=tuple(r for r in samples.rollouts if r.doc_id in docs),
                                      doc_hashes={d: h for d, h in samples.doc_hashes.items() if d in docs}))


def _on_grid_problems(parts: Sequence[RunPart]) -> tuple[list[RunPart], frozenset[int] | None, list[str]]:
    """The parts with every run of another model restricted to the EGLR runs' problems (left out when it holds none
    of them), those problems (None when no part is an EGLR run: then every run's problems are the grid's), and a
    note per run cut down or left out."""
    if not any(part.is_eglr for part in parts):
        return list(parts), None, []
    docs = frozenset(d for part in parts if part.is_eglr for d in part.samples.doc_hashes)
    kept, notes = [], []
    for part in parts:
        outside = sorted(set(part.samples.doc_hashes) - docs)
        if part.is_eglr or not outside:
            kept.append(part)
            continue
        held, run = len(part.samples.doc_hashes), f"{part.info.name} ({part.info.model_source or 'other model'})"
        if len(outside) == held:
            notes.append(f"{run}: none of its {held} problems is among the EGLR runs' {len(docs)}: left out.")
        else:
            notes.append(f"{run}: {len(outside)} of its {held} problems are not among the EGLR runs' {len(docs)}: "
                         f"left out of every comparison (docs {doc_ranges(outside)}).")
            kept.append(_within(part, docs))
    return kept, docs, notes


def build_grid(task: str, parts: Sequence[RunPart], *, run_notes: Sequence[str] = ()) -> Grid:
    """Merge the runs' rollouts of ``task`` into one grid (rules in the module docstring).

    The grid's problems are the EGLR runs' (those whose rollouts carry cells, :attr:`RunPart.is_eglr`): a run of
    another model (greedy or beam search) is restricted to them, a note saying what it left out, and never adds a
    problem (nor, when it holds none of them, a part); with no EGLR run they are every run's. ``run_notes``: the
    loader's notes on the runs (:func:`load_parts`, which logged them), said first in :attr:`Grid.run_notes`; a note
    per run refused as a baseline (:attr:`RunPart.baseline_refusal`) follows. The grid's own notes are logged here.
    """
    if not parts:
        raise ValueError(f"no run holds samples of task {task!r}; nothing to analyse.")
    models: dict[str, list[str]] = {}
    for part in parts:
        models.setdefault(part.info.model, []).append(part.info.name or part.info.path.name)
    if len(models) > 1:
        listing = "; ".join(f"{m!r} in {names}" for m, names in models.items())
        raise ValueError(f"runs of different models cannot share one grid: {listing}. Pass runs of one model.")

    doc_hashes: dict[int, tuple[str, Path]] = {}
    seen: dict[tuple, int] = {}  # (doc, L, T, seed, cycle) -> index of the part it was first read from
    kept: dict[int, list[tuple[int, RolloutRow]]] = {}  # doc -> (part index, row), to label the votes
    unplaced = duplicates = repeated = 0
    other_settings: dict[str, set] = {}  # setting -> values, of rollouts repeated by runs of other settings
    for part in parts:
        for doc_id, doc_hash in part.samples.doc_hashes.items():
            first = doc_hashes.setdefault(doc_id, (doc_hash, part.samples.path))
            if doc_hash and first[0] and first[0] != doc_hash:
                raise ValueError(
                    f"doc {doc_id} differs between {first[1]} and {part.samples.path} (doc_hash "
                    f"{first[0]} vs {doc_hash}); merge only runs over the same data."
                )
    parts, grid_docs, restricted = _on_grid_problems(parts)  # after the check: every doc of every run agrees
    settings = [_decoding_settings(part, task) for part in parts]
    held: list[dict[Cell, int]] = [{} for _ in parts]  # part -> cell -> its rollouts (each once)
    repeating: list[dict[Cell, int]] = [{} for _ in parts]  # part -> cell -> those an earlier part holds
    for index, part in enumerate(parts):
        repeated += part.repeated  # within one run: each rollout once (RunPart.rollouts)
        for row in part.rollouts:
            if row.cell is None:
                unplaced += 1
                continue
            held[index][row.cell] = held[index].get(row.cell, 0) + 1
            key = rollout_key(row, None)  # a sampled row's seed is filled in already
            if key in seen:  # an earlier run's
                duplicates += 1
                repeating[index][row.cell] = repeating[index].get(row.cell, 0) + 1
                first = settings[seen[key]]
                for name in sorted(set(first) | set(settings[index])):
                    if first.get(name) != settings[index].get(name):
                        other_settings.setdefault(name, set()).update({first.get(name), settings[index].get(name)})
                continue
            seen[key] = index
            kept.setdefault(row.doc_id, []).append((index, row))

    cells: dict[Cell, dict[int, list[RolloutRow]]] = {}
    for doc_id, rows in kept.items():
        for (_, row), label in zip(rows, vote_labels(rows)):
            cells.setdefault(row.cell, {}).setdefault(doc_id, []).append(replace(row, vote=label))

    notes = []
    if unplaced:
        notes.append(f"{unplaced} rollouts carry no (L, T) (a model other than eglr-hf): no cell of the grid holds "
                     "them; its runs are points of their own (accuracy against compute, confidence intervals).")
        logger.info("%s: %s", task, notes[-1])
    if duplicates and other_settings:
        # an ablation (eglr-sweep): the same cells decoded with other settings are other rollouts, not repeats
        differ = ", ".join(f"{name} {' vs '.join(map(str, sorted(values, key=str)))}"
                           for name, values in other_settings.items())
        notes.append(
            f"{duplicates} rollouts share a (doc, L, T, seed, cycle) with an earlier run decoded with other EGLR "
            "settings "
            f"({differ}); the L x T grid keeps the earlier run's, the ablation section compares the runs."
        )
        logger.info("%s: %s", task, notes[-1])
    elif duplicates:
        notes.append(
            f"{duplicates} rollouts repeat a (doc, L, T, seed, cycle) of an earlier run; the earlier run's are kept."
        )
        logger.warning("%s: %s", task, notes[-1])
    if repeated:
        notes.append(
            f"{repeated} rollouts repeat a deterministic (doc, L, T) within their own run (the task repeats "
            "the cell, eglr-hf decodes it once); each is counted once."
        )
        logger.info("%s: %s", task, notes[-1])
    by_cell = {
        cell: {d: tuple(sorted(rs, key=lambda r: (r.seed or 0, r.cycle or 0, r.repeat)))
               for d, rs in sorted(docs.items())}
        for cell, docs in sorted(cells.items())
    }
    refused = [f"{part.info.name} ({part.info.model_source or 'other model'}) is no baseline, left out of every "
               f"comparison: {part.baseline_refusal}." for part in parts if part.baseline_refusal]
    for note in [*restricted, *refused]:
        logger.warning("%s: %s", task, note)
    return Grid(
        task=task,
        model=parts[0].info.model,
        docs=tuple(sorted(doc_hashes if grid_docs is None else grid_docs)),
        by_cell=by_cell,
        parts=tuple(parts),
        unplaced=unplaced,
        duplicates=duplicates,
        repeated=repeated,
        notes=tuple(notes),
        vote_rule=_vote_rule(parts),
        run_notes=(*run_notes, *restricted, *refused),
        overlap=tuple({cell: (n, held[i][cell]) for cell, n in sorted(part.items())}
                      for i, part in enumerate(repeating)),
    )


def load_parts(
    run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None
) -> tuple[str, list[RunPart], list[str]]:
    """Find the runs under ``run_paths`` and read the samples of one task.

    Returns ``(task, parts, notes)``: ``notes`` name, one line each (logged), every run given that is not a part
    (another task, another benchmark, no samples file) and every results file given twice (read once:
    :func:`~eglr_harness.analysis.load.files.distinct_runs`, which also names runs named alike by their paths).
    With ``task=None`` the task is the one the EGLR runs hold (the one every run holds when none is an EGLR run);
    several is a ``ValueError`` naming them. A run of another model (lm-eval's ``hf``:
    greedy, beam search) that does not hold the task joins with its one task of the same benchmark: the
    leaderboard decodes those on ``<b>_eglr`` (one rollout a problem) beside EGLR-SC's ``<b>_eglr_sc``, over the
    same prompts; the grid's document check still holds the problems equal.
    """
    if not run_paths:
        raise ValueError("no run folder given; pass at least one folder written by lm_eval --output_path.")
    runs, notes = distinct_runs([run for path in run_paths for run in find_runs(path)])
    infos = [(run, run_info(read_results(run.results), run.results, run.name)) for run in runs]
    with_samples = sorted({t for run, _ in infos for t in run.samples})
    if not with_samples:
        raise ValueError(
            f"the runs under {[str(p) for p in run_paths]} have no samples files; rerun lm_eval with --log_samples."
        )
    if task is None:
        eglr_tasks = sorted({t for run, info in infos if info.eglr is not None for t in run.samples})
        candidates = eglr_tasks or with_samples
        if len(candidates) > 1:
            raise ValueError(
                f"the runs hold several tasks {candidates}; one grid is one task: pass --task NAME "
                "(or task=...) with one of them."
            )
        task = candidates[0]
    elif task not in with_samples:
        raise ValueError(f"task {task!r} has no samples in these runs; tasks with samples: {with_samples}.")
    parts = []
    for run, info in infos:
        held = task if task in run.samples else _same_benchmark_task(run.samples, info, task)
        if held is not None:
            if held != task:
                logger.info("%s: %s's run of %s joins the %s grid (the same benchmark's problems)",
                            run.name, info.model_source, held, task)
            parts.append(RunPart(info=info, samples=read_task_samples(run.samples[held], filter_name)))
            continue
        if task in info.tasks:
            notes.append(f"{run.name} has results for {task} but no samples file (run without --log_samples?): "
                         "left out.")
        else:
            benchmark = "" if info.eglr is not None else f" nor of another task of its benchmark {benchmark_of(task)}"
            notes.append(f"{run.name} ({info.model_source}) holds no samples of {task}{benchmark} (its samples: "
                         f"{', '.join(sorted(run.samples)) or 'none'}): left out.")
        logger.warning("%s", notes[-1])
    return task, parts, notes


def _same_benchmark_task(held: Iterable[str], info: RunInfo, task: str) -> str | None:
    """The one task of ``held`` of ``task``'s benchmark when ``info`` is a run of a model other than EGLR's (its
    rollouts carry no cell, so the task's pool keys never reached it), else None."""
    if info.eglr is not None:
        return None
    benchmark = benchmark_of(task)
    same = [t for t in held if benchmark_of(t) == benchmark]
    return same[0] if len(same) == 1 else None


def load_grid(run_paths: Sequence[str | Path], task: str | None = None, filter_name: str | None = None) -> Grid:
    """Read and merge the runs under ``run_paths`` into the grid of one task."""
    task, parts, notes = load_parts(run_paths, task, filter_name)
    return build_grid(task, parts, run_notes=notes)
