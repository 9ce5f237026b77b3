"""Per-cell compute accounting of a run, and the count of rollouts that were reused instead of decoded.

Rollouts repeated within the run (and rollouts stored before the store kept accounting) carry no
accounting, so the results say per cell how many there were (``reused_rollouts``): the compute
figures cover the rest. A rollout the store keeps with its accounting counts as decoded
(``harness/decode.py``), so a resumed run reports the figures of an uninterrupted one.
tau_h calibration (a greedy run on the task's first prompts) is accounted apart, per task, with
the number of prompts and token entropies the threshold came from: it is not part of the pool, so
it is in neither the cells nor the total; the pool's greedy rollouts that it decoded count as reused.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from eglr_harness.core.cell import Cell
from eglr_harness.core.distributed import Gather, local_gather
from eglr_harness.decoding.stats import EglrStats


class RunAccounts:
    """``Cell -> EglrStats`` plus ``Cell -> reused rollouts``, mergeable across ranks."""

    def __init__(self, num_layers: int, head_layers: float = 0.0):
        """head_layers: one LM-head projection in decoder layers (``ModelParts.head_layers``; 0: not counted)."""
        self.num_layers, self.head_layers = num_layers, head_layers

        def new_stats() -> EglrStats:
            return EglrStats(num_layers=num_layers, head_layers=head_layers)

        self.stats: dict[Cell, EglrStats] = defaultdict(new_stats)
        self.reused: Counter = Counter()
        self.calibration: dict[str, EglrStats] = defaultdict(new_stats)
        self.calibration_source: dict[str, dict] = {}  # task -> {"prompts", "entropy_tokens", "cached"}

    def stats_for(self, cell: Cell) -> EglrStats:
        return self.stats[cell]

    def calibration_for(self, task: str) -> EglrStats:
        return self.calibration[task]

    def gathered(self, gather: Gather = local_gather) -> "RunAccounts":
        """The accounts of all ranks together (call on every rank: it is a collective step)."""
        merged = RunAccounts(self.num_layers, self.head_layers)
        for stats, reused, calibration in gather((dict(self.stats), dict(self.reused), dict(self.calibration))):
            for cell, part in stats.items():
                merged.stats[cell].merge(part)
            merged.reused.update(reused)
            for task, part in calibration.items():
                merged.calibration[task].merge(part)
        merged.calibration_source = dict(self.calibration_source)  # the same on every rank
        return merged

    def summary(self) -> dict:
        """``config.eglr.stats`` of the results JSON (docs/run-format.md)."""
        total = EglrStats(num_layers=self.num_layers, head_layers=self.head_layers)
        for part in self.stats.values():
            total.merge(part)
        return {
            "total": total.summary(),
            "cells": {cell.label: part.summary() for cell, part in sorted(self.stats.items())},
            "reused_rollouts": {
                "total": sum(self.reused.values()),
                "cells": {cell.label: n for cell, n in sorted(self.reused.items())},
            },
            "calibration": {
                str(task): {**source, "compute": self.calibration[task].summary() if task in self.calibration else None}
                for task, source in sorted(self.calibration_source.items(), key=lambda item: str(item[0]))
            },
        }
