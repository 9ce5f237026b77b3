"""Compute accounting of eglr-hf runs (``config.eglr.stats``, docs/run-format.md).

``flop_ratio`` is the paper's per-row accounting ``(N·tokens + Σ L·k) / (N·tokens)``; when runs
are merged, ratios are combined weighted by tokens (same model, so the same N): ``1 + Σ(r−1)·t
/ Σ t``; ρ = gated tokens / tokens; mean iterations is weighted by gated tokens.
``flop_ratio_with_head`` adds the LM-head projections each exit rule made (eglr-method.md §4), the
ratio to compare exit rules on; combined as ``flop_ratio``.

The compute of a grid's runs (:func:`grid_compute`) counts each rollout once, as the grid does: a run's cell whose
rollouts all repeat an earlier run's (:meth:`~eglr_harness.analysis.load.Grid.counted_cells`; a resumed copy of a
run, the same run in another folder) is left out of that run's figures and of the totals, a run left with no cell
is left out, and each is named; a cell only partly repeated is counted whole, and named (accounting is per cell).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import Grid, RunInfo
from eglr_harness.core.cell import Cell

__all__ = [
    "Compute",
    "GridCompute",
    "grid_compute",
    "stats_compute",
    "run_compute",
    "cell_compute",
    "combine_compute",
    "reused_rollouts",
    "reused_by_cell",
    "beam_flop_ratio",
]
logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Compute:
    """Compute of a run or a cell. Missing numbers are None."""

    label: str
    tokens: int | None
    gated_tokens: int | None
    rho: float | None
    mean_iterations: float | None
    flop_ratio: float | None
    batched_flop_ratio: float | None
    wall_time_s: float | None
    flop_ratio_with_head: float | None = None  # with the LM-head projections (runs since 2026-11-26)


def _num(stats: Mapping, key: str, kind=float):
    value = stats.get(key)
    return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stats_compute(label: str, stats: Mapping) -> Compute:
    """A :class:`Compute` from one ``stats`` dict (``total`` or a cell)."""
    return Compute(
        label=label,
        tokens=_num(stats, "tokens", int),
        gated_tokens=_num(stats, "gated_tokens", int),
        rho=_num(stats, "rho"),
        mean_iterations=_num(stats, "mean_iterations"),
        flop_ratio=_num(stats, "flop_ratio"),
        batched_flop_ratio=_num(stats, "batched_flop_ratio"),
        wall_time_s=_num(stats, "wall_time_s"),
        flop_ratio_with_head=_num(stats, "flop_ratio_with_head"),
    )


def run_compute(info: RunInfo) -> Compute | None:
    """The run's ``stats.total``; None for runs without EGLR accounting."""
    stats = ((info.eglr or {}).get("stats") or {}).get("total")
    return stats_compute(info.name or info.path.name, stats) if isinstance(stats, Mapping) else None


def cell_compute(infos: Sequence[RunInfo]) -> dict[Cell, Compute]:
    """Per-cell compute over runs (cells found in several runs are combined)."""
    found: dict[Cell, list[Compute]] = {}
    for info in infos:
        cells = ((info.eglr or {}).get("stats") or {}).get("cells") or {}
        for key, stats in cells.items():
            cell = Cell.parse(key)
            found.setdefault(cell, []).append(stats_compute(key, stats))
    return {cell: combine_compute(cell.label, parts) for cell, parts in sorted(found.items())}


@dataclass(frozen=True)
class GridCompute:
    """The compute of a grid's runs, each rollout once (module docstring).

    Attributes:
        runs: one :class:`Compute` per run with accounting that the grid counts, in the grid's order (a run with a
            cell left out: the combination of its other cells, under its name).
        cells: cell -> the combination of the counted runs' figures of that cell.
        reused: rollouts of the counted cells taken from the rollout store (:func:`reused_rollouts`); None when no
            counted run records reuse.
        notes: one line per run or cell left out or partly repeated.
    """

    runs: tuple[Compute, ...]
    cells: dict[Cell, Compute]
    reused: int | None
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> Compute | None:
        """The counted runs combined (``all runs``); None when none has accounting."""
        return combine_compute("all runs", self.runs) if self.runs else None


def grid_compute(grid: Grid) -> GridCompute:
    """The compute of ``grid``'s runs, each rollout once (module docstring)."""
    runs: list[Compute] = []
    cells: dict[Cell, list[Compute]] = {}
    reused: list[int] = []
    notes: list[str] = []
    for index, part in enumerate(grid.parts):
        info = part.info
        left_out, partly = grid.counted_cells(index)
        own = {Cell.parse(key): stats_compute(key, stats)
               for key, stats in (((info.eglr or {}).get("stats") or {}).get("cells") or {}).items()}
        counted = {cell: compute for cell, compute in own.items() if cell not in left_out}
        dropped = sorted(cell for cell in own if cell in left_out)
        name = info.name or info.path.name
        if dropped and not counted:
            notes.append(f"{name} repeats an earlier run's rollouts in every cell it accounts for (a resumed copy, "
                         "the same run again, or the same cells under other settings, which the ablation section "
                         "compares): as in the grid, its compute is not counted again.")
            continue
        total = run_compute(info)
        if dropped:
            notes.append(f"{name}: its cells {', '.join(c.label for c in dropped)} repeat an earlier run's rollouts: "
                         "left out of its figures and the totals.")
            total = combine_compute(name, list(counted.values()))
        for cell, (repeating, held) in partly.items():
            if cell in counted:
                notes.append(f"{name}: {repeating} of its {held} rollouts of {cell.label} repeat an earlier run's; "
                             "the cell's figures count them too (a run's accounting is per cell).")
        if total is not None:
            runs.append(total)
        for cell, compute in counted.items():
            cells.setdefault(cell, []).append(compute)
        recorded = ((info.eglr or {}).get("stats") or {}).get("reused_rollouts", {}).get("total")
        if isinstance(recorded, int):
            reused.append(recorded - sum(n for cell, n in reused_by_cell(info).items() if cell in left_out))
    for note in notes:
        logger.info("%s: %s", grid.task, note)
    return GridCompute(
        runs=tuple(runs),
        cells={cell: combine_compute(cell.label, parts) for cell, parts in sorted(cells.items())},
        reused=sum(reused) if reused else None,
        notes=tuple(notes),
    )


def reused_rollouts(infos: Sequence[RunInfo]) -> int | None:
    """Rollouts the runs took from the rollout store instead of generating (no compute counted for
    them); None when no run records it (runs made before eglr-hf counted reuse)."""
    counts = [
        ((info.eglr or {}).get("stats") or {}).get("reused_rollouts", {}).get("total")
        for info in infos
    ]
    counts = [c for c in counts if isinstance(c, int)]
    return sum(counts) if counts else None


def reused_by_cell(info: RunInfo) -> dict[Cell, int]:
    """cell -> the run's rollouts of that cell taken from the rollout store (``stats.reused_rollouts.cells``): their
    compute is not in the run's accounting. Empty for runs that record no reuse."""
    cells = (((info.eglr or {}).get("stats") or {}).get("reused_rollouts") or {}).get("cells") or {}
    return {Cell.parse(key): count for key, count in cells.items() if isinstance(count, int) and count}


def beam_flop_ratio(num_beams: int | None) -> float:
    """FLOP ratio vs greedy, per problem, of beam search with ``num_beams`` hypotheses (None: 1, greedy): the n
    hypotheses are each decoded at every step; prompt processing and early stops are ignored and the outputs are
    taken as long as greedy's (lm-eval's ``hf`` runs count no tokens)."""
    if num_beams is None:
        return 1.0
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"`num_beams`={num_beams!r} is not allowed; allowed: an int >= 1.")
    return float(num_beams)


def _weighted(values, weights) -> float | None:
    """The ``weights``-weighted mean of ``values``; None unless every part with a weight has a value
    (a mean over some runs only would be printed as the mean of all)."""
    if any(v is None and w for v, w in zip(values, weights)) or any(w is None for w in weights):
        return None
    pairs = [(v, w) for v, w in zip(values, weights) if w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def _sum_of_all(values) -> float | None:
    """The sum of ``values``, or None when one is missing: a sum over some runs only is no total."""
    return None if any(v is None for v in values) else sum(values)


def combine_compute(label: str, parts: Sequence[Compute]) -> Compute:
    """Combine several runs' (or cells') compute as stated in the module docstring. A figure that
    one part lacks (a run older than that figure) is None in the combination, and every figure
    computed from it too: merged figures always cover the same runs (``rho`` is never the gated
    tokens of all runs over the tokens of some)."""
    if len(parts) == 1:
        return Compute(label, *[getattr(parts[0], f) for f in Compute.__dataclass_fields__ if f != "label"])
    tokens = [p.tokens for p in parts]
    gated = [p.gated_tokens for p in parts]
    total_tokens = _sum_of_all(tokens)
    total_gated = _sum_of_all(gated)
    # a figure every part lacks (all runs older than it) is simply absent; one some parts lack is worth a warning
    lacking = sorted({f for f in Compute.__dataclass_fields__
                      if any(getattr(p, f) is None for p in parts) and any(getattr(p, f) is not None for p in parts)})
    if lacking:
        logger.warning("%s: %s missing from some of the merged runs (%s): left out of the merged figures, not "
                       "summed over the others.", label, ", ".join(lacking),
                       ", ".join(p.label for p in parts if any(getattr(p, f) is None for f in lacking)))

    def ratio(field: str) -> float | None:
        excess = _weighted([None if getattr(p, field) is None else getattr(p, field) - 1 for p in parts], tokens)
        return None if excess is None else 1.0 + excess

    return Compute(
        label=label,
        tokens=total_tokens,
        gated_tokens=total_gated,
        rho=(total_gated / total_tokens) if total_tokens and total_gated is not None else None,
        mean_iterations=_weighted([p.mean_iterations for p in parts], gated),
        flop_ratio=ratio("flop_ratio"),
        batched_flop_ratio=ratio("batched_flop_ratio"),
        wall_time_s=_sum_of_all([p.wall_time_s for p in parts]),
        flop_ratio_with_head=ratio("flop_ratio_with_head"),
    )
