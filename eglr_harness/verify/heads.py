"""From verifier outputs to scores: pure tensor functions (shapes in the docstrings).

A solution's score from its step scores (:func:`aggregate`): ``last`` (the last step's), ``min`` (the
weakest step's) or ``prod`` (the product: the probability that every step is right if the steps were
independent), as in HF search-and-learn's ``aggregate_scores``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["two_label_positive", "plus_probability", "sigmoid_values", "orm_probability", "token_probability",
           "self_certainty", "aggregate"]


def two_label_positive(logits):
    """(N, 2) logits of a two-label token head -> (N,) softmax's second entry (the positive label)."""
    return logits.float().softmax(dim=-1)[:, 1]


def plus_probability(logits, plus_id: int, minus_id: int):
    """(N, V) next-token logits -> (N,) P(+) of the softmax over the ``+`` and ``-`` logits only."""
    return logits.float()[:, [plus_id, minus_id]].softmax(dim=-1)[:, 0]


def sigmoid_values(values):
    """(N,) or (N, 1) value-head outputs -> (N,) sigmoid."""
    return values.float().reshape(-1).sigmoid()


def orm_probability(logits):
    """(num_labels,) sequence-classifier logits -> () a probability: sigmoid of a one-label head,
    softmax's second entry of a two-label one (monotone in the model's score: rankings are unchanged,
    and a weighted vote gets non-negative weights)."""
    logits = logits.float().reshape(-1)
    if logits.numel() == 1:
        return logits[0].sigmoid()
    if logits.numel() == 2:
        return logits.softmax(dim=-1)[1]
    raise ValueError(f"orm: the classifier has {logits.numel()} labels; allowed: 1 (a score) or 2 (bad, good).")


def token_probability(logits, token_id: int):
    """(V,) next-token logits -> () the probability of ``token_id`` under the full softmax."""
    return logits.float().softmax(dim=-1)[token_id]


def self_certainty(logits):
    """(T, V) next-token logits at the T rollout tokens -> () mean over tokens of KL(U || p) with U
    uniform over the V tokens: ``-log V - mean_j log p_j`` (0 for a uniform p; larger = more certain)."""
    logp = logits.float().log_softmax(dim=-1)
    return (-math.log(logp.shape[-1]) - logp.mean(dim=-1)).mean()


def aggregate(step_scores: Sequence[float], how: str) -> float:
    """A solution's score from its step scores: ``last``, ``min`` or ``prod``."""
    if not step_scores:
        raise ValueError("no step scores to aggregate; every scored solution has at least one step.")
    if how == "last":
        return float(step_scores[-1])
    if how == "min":
        return float(min(step_scores))
    if how == "prod":
        return float(math.prod(step_scores))
    raise ValueError(f"aggregation {how!r} is not allowed; allowed: last, min, prod.")
