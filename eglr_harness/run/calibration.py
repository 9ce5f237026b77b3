"""tau_h calibration (eglr-method.md §3): the 95th percentile of the per-token entropies of a greedy
(L=0) run on a task's prompts, capped at 2.5 nats.

The prompts are the task's first ``calib_limit`` documents in document order, whatever the number
of processes: under data parallel every rank proposes its own first documents, the union picks
the global first ones, each rank decodes those it owns, and the entropies of all ranks are
pooled. Every cross-rank step takes the gather as an argument (:data:`Gather`), so the same code
runs in one process (``distributed.local_gather``) and under ``torch.distributed``.

A task's calibration is four steps, which the caller (``harness/pool_runner.py``) takes in order on every
rank, decoding in between itself: ``calibration_prompts`` (which prompts), ``cached_calibration`` (a cache
hit ends it), ``own_prompts`` (the ones this rank decodes greedily), ``new_calibration`` (the threshold
from everyone's entropies, written to the cache).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eglr_harness.core.config import TAU_H_CAP
from eglr_harness.core.distributed import Gather, local_gather
from eglr_harness.core.model_args import DEFAULT_CALIB_LIMIT  # noqa: F401 -- the model arg's default, read here too

logger = logging.getLogger(__name__)
CALIBRATION_QUANTILE = 0.95
# A 95th percentile from fewer token entropies than this moves a lot with the prompts drawn.
MIN_TRUSTED_TOKENS = 1000


@dataclass(frozen=True)
class Calibration:
    """A task's calibrated tau_h and what it came from (results: ``config.eglr.stats.calibration``).

    entropy_tokens is None for a cache record written before it was kept.
    """

    tau_h: float
    prompts: int
    entropy_tokens: int | None
    cached: bool

    def as_dict(self) -> dict:
        return {"tau_h": self.tau_h, "prompts": self.prompts, "entropy_tokens": self.entropy_tokens,
                "cached": self.cached}

    def warn_if_few(self, label: str) -> None:
        if self.entropy_tokens is not None and self.entropy_tokens < MIN_TRUSTED_TOKENS:
            logger.warning("%s: tau_h = %.4f comes from only %d token entropies of %d prompts (fewer than %d): "
                           "too few to trust. Calibrate on more prompts (a larger --limit, calib_limit, or "
                           "eglr-calibrate) or give tau_h.", label, self.tau_h, self.entropy_tokens, self.prompts,
                           MIN_TRUSTED_TOKENS)


def calibrated_threshold(entropies: torch.Tensor, quantile: float = CALIBRATION_QUANTILE,
                         cap: float = TAU_H_CAP) -> float:
    """min(quantile of per-token entropies, cap).  entropies: (n_tokens,) nats."""
    if entropies.numel() == 0:
        raise ValueError("tau_h calibration saw no generated tokens; raise max_gen_toks or calib_limit.")
    value = float(torch.quantile(entropies.float(), quantile))
    if math.isnan(value):  # min(nan, cap) is nan: a gate that never opens, a plain run labelled EGLR
        raise FloatingPointError("tau_h calibration got NaN token entropies (NaN logits); check the model's dtype "
                                 "and weights, or give tau_h=<nats>.")
    return min(value, cap)


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


def cached_calibration(cache, key: str, gather: Gather = local_gather, label: str = "") -> Calibration | None:
    """The calibration the tau_h cache holds under ``key`` (any rank's hit: all ranks agree), or None.

    The first step of a task's calibration; a collective step (call it on every rank). cache:
    ``get(key) -> record or None`` (``stores.TauHCache``); key: the cache key of the chosen prompts, with the
    model and the greedy settings folded in.
    """
    hit = first_reported(cache.get(key), gather)
    if hit is None:
        return None
    result = Calibration(hit["tau_h"], hit["prompts"], hit.get("tokens"), cached=True)
    logger.info("%s: tau_h = %.4f nats (cached calibration of %d prompts, %s token entropies)", label,
                result.tau_h, result.prompts, result.entropy_tokens if result.entropy_tokens is not None else "?")
    result.warn_if_few(label)
    return result


def own_prompts(chosen: Sequence[tuple[int, str]], local: Sequence[tuple[int, str]], label: str = "") -> list[str]:
    """The contexts among ``chosen`` (``calibration_prompts``) that this rank decodes: those of its own documents."""
    mine = set(local)
    own = [context for doc, context in chosen if (doc, context) in mine]
    logger.info("%s: calibrating tau_h on a greedy run of %d prompts (%d here)", label, len(chosen), len(own))
    return own


def new_calibration(local_entropies: Sequence[float], prompts: int, *, cache, key: str, gather: Gather = local_gather,
                    writer: bool = True, label: str = "") -> Calibration:
    """The calibrated tau_h from this rank's greedy entropies of its ``own_prompts`` (pooled across ranks: a
    collective step), written to the cache under ``key`` by the ``writer`` rank. prompts: how many were chosen."""
    tau, tokens = pooled_threshold(local_entropies, gather)
    if writer:
        cache.put(key, {"tau_h": tau, "label": label, "prompts": prompts, "tokens": tokens})
    logger.info("%s: tau_h = %.4f nats (95th percentile of %d token entropies of %d prompts, cap %.1f)", label, tau,
                tokens, prompts, TAU_H_CAP)
    result = Calibration(tau, prompts, tokens, cached=False)
    result.warn_if_few(label)
    return result
