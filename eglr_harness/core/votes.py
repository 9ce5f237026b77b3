"""The project's two tie rules, as pure functions: the majority vote and the best cell.

A leaf module (standard library only) so that the tasks' metrics and the analysis pick winners
the same way:

- :func:`majority` — the largest group of equal labels wins; among equally large groups the one
  whose first member came first wins; ``None`` labels (no answer) never vote. The tasks label an
  answer by its equivalence cluster, the analysis by the cluster id the task logged.
- :func:`best_cell` — the highest score wins; ties go to the cell that comes first in L-major order
  (smallest L, then smallest T), which is also the pool order.

The aggregators beside the vote, over one problem's rollouts (labels and per-rollout scores such
as :func:`eglr_harness.core.signals.confidence`), follow the same tie rule (earliest first):

- :func:`weighted_majority` — the label with the largest total weight wins (DeepConf's
  confidence-weighted vote); equal weights give :func:`majority`'s winner;
- :func:`top_fraction` — the indices of the ``eta`` most confident rollouts (DeepConf's filter);
- :func:`best_scored` — the single rollout with the highest score (best-of-N by one signal).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

__all__ = ["majority", "best_cell", "weighted_majority", "top_fraction", "best_scored"]

K = TypeVar("K")

DEEPCONF_ETA = 0.1  # DeepConf's aggressive filter: vote among the 10 % most confident rollouts (top_fraction)


def majority(labels: Sequence[Hashable | None]) -> int | None:
    """Index of the first member of the winning group of ``labels``; None when every label is None."""
    counts: dict[Hashable, list[int]] = {}  # label -> [count, first index]; dicts keep first-seen order
    for index, label in enumerate(labels):
        if label is not None:
            counts.setdefault(label, [0, index])[0] += 1
    best: list[int] | None = None
    for count_first in counts.values():
        if best is None or count_first[0] > best[0]:  # strict: ties keep the earlier group
            best = count_first
    return None if best is None else best[1]


def best_cell(scores: Mapping[K, float]) -> K | None:
    """The key with the highest score; ties -> the smallest key (L-major for cells); None if empty."""
    if not scores:
        return None
    return min(scores, key=lambda key: (-scores[key], key))


def weighted_majority(labels: Sequence[Hashable | None], weights: Sequence[float]) -> int | None:
    """Index of the first member of the label with the largest total weight; ties -> the label whose
    first member came first; ``None`` labels never vote; None when none votes. Weights must be finite and >= 0."""
    if len(labels) != len(weights):
        raise ValueError(f"{len(labels)} labels but {len(weights)} weights; allowed: one weight per label.")
    totals: dict[Hashable, list] = {}  # label -> [total weight, first index]
    for index, (label, weight) in enumerate(zip(labels, weights)):
        # NaN compares false both ways and +inf swallows every other vote (inf + inf, inf - inf = nan)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weight {weight!r} of label #{index} is not allowed; allowed: finite numbers >= 0.")
        if label is not None:
            totals.setdefault(label, [0.0, index])[0] += weight
    best = None
    for total_first in totals.values():
        if best is None or total_first[0] > best[0]:  # strict: ties keep the earlier label
            best = total_first
    return None if best is None else best[1]


def top_fraction(scores: Sequence[float], eta: float) -> list[int]:
    """Indices (ascending) of the ``ceil(eta * n)`` highest scores (at least one); ties -> earlier first."""
    if not 0 < eta <= 1:
        raise ValueError(f"`eta`={eta!r} is not allowed; allowed: a share in (0, 1], e.g. 0.1 (keep the top 10 %).")
    if not scores:
        return []
    keep = max(1, -int(-eta * len(scores) // 1))
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(ranked[:keep])


def best_scored(scores: Sequence[float | None]) -> int | None:
    """Index of the highest score (None scores are skipped); ties -> the earliest; None if no score."""
    best = None
    for index, score in enumerate(scores):
        if score is not None and (best is None or score > scores[best]):
            best = index
    return best
