"""Compute accounting of eglr-hf runs (``config.eglr.stats``, docs/run-format.md).

``flop_ratio`` is the paper's per-row accounting ``(N·tokens + Σ L·k) / (N·tokens)``; when runs
are merged, ratios are combined weighted by tokens (same model, so the same N): ``1 + Σ(r−1)·t
/ Σ t``; ρ = gated tokens / tokens; mean iterations is weighted by gated tokens.
``flop_ratio_with_head`` adds the LM-head projections each exit rule made (eglr-method.md §4), the
ratio to compare exit rules on; combined as ``flop_ratio``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import RunInfo
from eglr_harness.core.cell import Cell

__all__ = [
    "Compute",
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
