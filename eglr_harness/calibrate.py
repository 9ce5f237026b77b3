"""tau_h calibration (eglr-method.md §3): the 95th percentile of the per-token entropies of a greedy
(L=0) run on a task's prompts, capped at 2.5 nats.

The prompts are the task's first ``calib_limit`` documents in document order, whatever the number
of processes: under data parallel every rank proposes its own first documents, the union picks
the global first ones, each rank decodes those it owns, and the entropies of all ranks are
pooled. Every cross-rank step takes the gather as an argument (:data:`Gather`), so the same code
runs in one process (``distributed.local_gather``) and under ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eglr_harness.config import TAU_H_CAP
from eglr_harness.distributed import Gather, local_gather

CALIBRATION_QUANTILE = 0.95
DEFAULT_CALIB_LIMIT = 64


def calibrated_threshold(entropies: torch.Tensor, quantile: float = CALIBRATION_QUANTILE, cap: float = TAU_H_CAP) -> float:
    """min(quantile of per-token entropies, cap).  entropies: (n_tokens,) nats."""
    if entropies.numel() == 0:
        raise ValueError("tau_h calibration saw no generated tokens; raise max_gen_toks or calib_limit.")
    return min(float(torch.quantile(entropies.float(), quantile)), cap)


def calibration_prompts(local: Sequence[tuple[int, str]], limit: int,
                        gather: Gather = local_gather) -> list[tuple[int, str]]:
    """The task's first ``limit`` distinct prompts in document order, from every rank's documents.

    local: this rank's ``(doc_id, context)`` pairs. Returns ``(doc_id, context)`` pairs, the same list
    on every rank; a prompt shared by several documents is kept once, with its first document.
    """

    def first_distinct(pairs) -> list[tuple[int, str]]:
        chosen: dict[str, int] = {}
        for doc_id, context in sorted({tuple(pair) for pair in pairs}):
            if len(chosen) == limit:
                break
            chosen.setdefault(context, doc_id)
        return [(doc_id, context) for context, doc_id in chosen.items()]

    # The global first `limit` are among each rank's own first `limit`.
    return first_distinct(pair for part in gather(first_distinct(local)) for pair in part)


def pooled_threshold(local_entropies: Sequence[float], gather: Gather = local_gather) -> tuple[float, int]:
    """``(tau_h, number of tokens)`` from the entropies of all ranks (same value on every rank)."""
    values = [e for part in gather(list(map(float, local_entropies))) for e in part]
    return calibrated_threshold(torch.tensor(values, dtype=torch.float64)), len(values)


def first_reported(local_value, gather: Gather = local_gather):
    """The first non-None value any rank reports (rank order decides), or None: all ranks agree."""
    return next((value for value in gather(local_value) if value is not None), None)
