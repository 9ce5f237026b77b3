"""The project's two tie rules, as pure functions: the majority vote and the best cell.

A leaf module (standard library only) so that the tasks' metrics and the analysis pick winners
the same way:

- :func:`majority` — the largest group of equal labels wins; among equally large groups the one
  whose first member came first wins (first-seen); ``None`` labels (no answer) never vote. The tasks
  label an answer by its equivalence cluster, the analysis by the cluster id the task logged. Every
  labelled answer votes, whatever it is: a non-numeric answer on GSM8K (``L - 8``) is a group like any
  other and may win (tasks/README.md, Majority rule).
- :func:`best_cell` — the highest score wins; ties go to the cell that comes first in L-major order
  (smallest L, then smallest T), which is also the pool order.

A *tie*: two or more groups share the largest count (:func:`top_groups` returns them all). First-seen
decides them, so the order of the labels (the pool order) decides a tied vote; :func:`vote_outcome`
says what the vote would be if its ties broke the other ways (worst and best case).

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
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["majority", "top_groups", "VoteOutcome", "vote_outcome", "best_cell", "weighted_majority", "top_fraction",
           "best_scored"]

K = TypeVar("K")

DEEPCONF_ETA = 0.1  # DeepConf's aggressive filter: vote among the 10 % most confident rollouts (top_fraction)


def top_groups(labels: Sequence[Hashable | None]) -> list[int]:
    """Index of the first member of every group of ``labels`` that has the largest count, in first-seen order;
    ``None`` labels never vote; empty when every label is None. More than one index is a tie; the first is
    :func:`majority`'s winner."""
    counts: dict[Hashable, list[int]] = {}  # label -> [count, first index]; dicts keep first-seen order
    for index, label in enumerate(labels):
        if label is not None:
            counts.setdefault(label, [0, index])[0] += 1
    top = max((count for count, _ in counts.values()), default=0)
    return [first for count, first in counts.values() if count == top]


def majority(labels: Sequence[Hashable | None]) -> int | None:
    """Index of the first member of the winning group of ``labels``; None when every label is None."""
    top = top_groups(labels)
    return top[0] if top else None  # a tie goes to the group seen first


@dataclass(frozen=True)
class VoteOutcome:
    """Whether one problem's majority vote is right, under three ways of breaking its ties.

    ``first_seen``: the project's rule (:func:`majority`); ``worst``: right only if every tied top group is (the
    ties broken against the vote); ``best``: right if any tied top group is (broken for it); ``tied``: more than
    one group has the largest count. Without a tie the three agree; with no vote at all they are all False.
    """

    first_seen: bool
    worst: bool
    best: bool
    tied: bool


def vote_outcome(labels: Sequence[Hashable | None], correct: Sequence[object]) -> VoteOutcome:
    """The :class:`VoteOutcome` of ``labels``; a group is right when its first member's ``correct`` is truthy
    (the tasks' rule: the winner is correct iff its first member is). One ``correct`` per label."""
    if len(labels) != len(correct):
        raise ValueError(f"{len(labels)} labels but {len(correct)} verdicts; allowed: one verdict per label.")
    right = [bool(correct[first]) for first in top_groups(labels)]
    if not right:
        return VoteOutcome(False, False, False, False)
    return VoteOutcome(right[0], all(right), any(right), len(right) > 1)


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
