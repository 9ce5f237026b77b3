"""The project's two tie rules, as pure functions: the majority vote and the best cell.

A leaf module (standard library only) so that the tasks' metrics and the analysis pick winners
the same way:

- :func:`majority` — the largest group of equal labels wins; among equally large groups the one
  whose first member came first wins; ``None`` labels (no answer) never vote. The tasks label an
  answer by its equivalence cluster, the analysis by the cluster id the task logged.
- :func:`best_cell` — the highest score wins; ties go to the cell that comes first in L-major order
  (smallest L, then smallest T), which is also the pool order.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

__all__ = ["majority", "best_cell"]

K = TypeVar("K")


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
