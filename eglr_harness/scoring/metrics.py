"""Per-problem scores over the repeats of one request, and the run-level aggregations.

The per-document keys (docs/run-format.md) come from :func:`score_document`:

- ``rollouts``: one record per repeat, in repeat order: ``{"repeat", "L", "T", "cycle",
  "answer", "correct", "cluster"}`` (``answer`` = extracted answer or ``None``; ``L``/``T``/``cycle``
  are ``None`` for responses that carry no :class:`~eglr_harness.rollout.Rollout` metadata;
  ``cluster`` = index of the answer's equivalence cluster among the document's rollouts, clusters
  numbered in order of first appearance, ``None`` for no answer — so a reader can redo the vote
  without any equivalence check).
- ``acc``: the accuracy of one rollout, averaged over the document's ``B`` rollouts (correct / B).
  The same meaning in every task: for a one-rollout task it is that rollout's correctness; for a
  pool it is the expected accuracy of a rollout drawn from the pool at random (no cell favoured).
- ``maj@B``: correctness of the majority answer over the ``B`` repeats (rule: :func:`majority_index`).
- ``oracle@B``: 1 if any repeat is correct.
- ``pass@1``, ``pass@B``: the unbiased pass@k estimator (:func:`pass_at_k`) over the ``B``
  rollouts. With all ``B`` rollouts scored, ``pass@1`` equals ``acc`` and ``pass@B`` equals
  ``oracle@B`` (the estimator is exact there); they are reported under the names other
  harnesses use.
- ``best_cfg_acc``: the ``rollouts`` list again; :func:`best_cfg_acc` aggregates it.

Aggregations return numbers only, so that lm-eval's console table stays readable: ``rollouts``
-> :func:`rollout_count` (the number of rollouts scored; it logs the per-cell accuracies), and
``best_cfg_acc`` -> :func:`best_cfg_acc`. Per-cell accuracies are computed from the samples
(``eglr-report``'s ``cell_accuracy.csv``, :func:`cell_accuracies`).

Majority rule. Answers are clustered by equivalence (each answer joins the first earlier cluster
whose representative — its first member — it is equivalent to). Invalid answers (``None``) are
never voted for. The largest cluster wins; among equally large clusters the one whose first
member came earliest (lowest repeat index) wins. The winner is correct iff its representative is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eglr_harness.rollout import rollout_meta
from eglr_harness.scoring.equivalence import DEFAULT_TIMEOUT_S, is_equivalent

logger = logging.getLogger(__name__)

UNKNOWN_CELL = "unknown"  # cell key of rollouts without (L, T) metadata

Equivalence = Callable[[str, str], bool]


def answer_or_none(value: Any) -> str | None:
    """Filter outputs carry the invalid answer as ``""`` (so it can keep Rollout metadata)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def cluster_answers(answers: Sequence[str | None], equivalent: Equivalence | None = None) -> list[list[int]]:
    """Group the indices of valid answers into equivalence clusters, in order of first appearance."""
    equivalent = equivalent or (lambda a, b: is_equivalent(a, b))
    clusters: list[list[int]] = []
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        for cluster in clusters:
            if equivalent(answers[cluster[0]], answer):
                cluster.append(i)
                break
        else:
            clusters.append([i])
    return clusters


def majority_cluster(clusters: Sequence[Sequence[int]]) -> int | None:
    """Position in ``clusters`` of the winner: the largest; ties -> the one that appeared first."""
    best: int | None = None
    for k, cluster in enumerate(clusters):
        if best is None or len(cluster) > len(clusters[best]):  # strict: ties keep the earlier cluster
            best = k
    return best


def majority_index(answers: Sequence[str | None], equivalent: Equivalence | None = None) -> int | None:
    """Index of the representative of the winning cluster (module docstring), ``None`` if no valid answer."""
    clusters = cluster_answers(answers, equivalent)
    winner = majority_cluster(clusters)
    return None if winner is None else clusters[winner][0]


def cluster_ids(clusters: Sequence[Sequence[int]], n: int) -> list[int | None]:
    """Per answer index, the position of its cluster (clusters in order of first appearance); ``None`` if invalid."""
    ids: list[int | None] = [None] * n
    for k, cluster in enumerate(clusters):
        for i in cluster:
            ids[i] = k
    return ids


def cell_key(L: int | None, T: float | None) -> str:
    """``"L=4,T=0.0"`` — the key format shared with the model's stats (docs/run-format.md)."""
    if L is None or T is None:
        return UNKNOWN_CELL
    return f"L={int(L)},T={float(T)}"


def score_document(
    gold: str,
    responses: Iterable[Any],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """All per-document metrics for the (extracted) answers of one problem's repeats.

    Args:
        gold: the reference answer (``doc["answer"]``).
        responses: extracted answers in repeat order (``str``, :class:`Rollout`, ``""``/``None``
            for invalid). A single string is treated as one repeat.
        timeout_s: hard time limit of each symbolic equivalence check.
    """
    if isinstance(responses, str):
        responses = [responses]
    responses = list(responses)
    answers = [answer_or_none(r) for r in responses]

    def same(a: str, b: str) -> bool:
        return is_equivalent(a, b, timeout_s=timeout_s)

    correct = [int(a is not None and same(gold, a)) for a in answers]
    clusters = cluster_answers(answers, same)
    cluster_of = cluster_ids(clusters, len(answers))
    rollouts = []
    for i, (response, answer, ok) in enumerate(zip(responses, answers, correct)):
        meta = rollout_meta(response) or {}
        rollouts.append({
            "repeat": i,
            "L": meta.get("L"),
            "T": meta.get("T"),
            "cycle": meta.get("cycle"),
            "answer": answer,
            "correct": ok,
            "cluster": cluster_of[i],
        })
    B, solved = len(answers), sum(correct)
    winner = majority_cluster(clusters)
    return {
        "rollouts": rollouts,
        "acc": solved / B if B else 0.0,
        f"maj@{B}": correct[clusters[winner][0]] if winner is not None else 0,
        f"oracle@{B}": int(solved > 0),
        "pass@1": pass_at_k(B, solved, 1) if B else 0.0,
        f"pass@{B}": pass_at_k(B, solved, B) if B else 0.0,
        "best_cfg_acc": rollouts,
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` rollouts of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``.

    The probability that at least one of ``k`` rollouts drawn without replacement from the ``n``
    is correct (Chen et al., 2021, "Evaluating Large Language Models Trained on Code"), computed
    as a product to stay exact for large ``n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    missed = 1.0
    for i in range(n - c + 1, n + 1):
        missed *= 1.0 - k / i
    return 1.0 - missed


# --------------------------------------------------------------------------- aggregations


def cell_accuracies(items: Iterable[Sequence[dict]]) -> dict[str, float]:
    """Accuracy of every (L, T) cell over a run: ``{"L=4,T=0.0": 0.65, ...}``, L-major order.

    ``items`` is the list of per-document ``rollouts`` lists. Within a document the repeats of
    one cell (several cycles) are averaged first, so every document weighs the same; a cell's
    accuracy is the mean over the documents that have it. Rollouts without metadata form one
    cell, ``"unknown"``.
    """
    sums: dict[tuple, list[float]] = {}
    for rollouts in items:
        per_doc: dict[tuple, list[int]] = {}
        for r in rollouts:
            key = (r.get("L"), r.get("T"))
            per_doc.setdefault(key, []).append(int(r.get("correct", 0)))
        for key, values in per_doc.items():
            total = sums.setdefault(key, [0.0, 0])
            total[0] += sum(values) / len(values)
            total[1] += 1

    def order(key: tuple) -> tuple:
        L, T = key
        return (L is None, L if L is not None else 0, T if T is not None else 0.0)

    return {cell_key(*key): sums[key][0] / sums[key][1] for key in sorted(sums, key=order)}


def rollout_count(items: Iterable[Sequence[dict]]) -> int:
    """Number of rollouts scored over the run (aggregation of ``rollouts``); logs the cell accuracies.

    A number, not the per-cell dictionary, so that lm-eval's console table keeps short lines.
    """
    items = list(items)
    accuracies = cell_accuracies(items)
    logger.info("eglr cell accuracies: %s", ", ".join(f"{k}: {v:.4f}" for k, v in accuracies.items()))
    return sum(len(rollouts) for rollouts in items)


def best_cfg_acc(items: Iterable[Sequence[dict]]) -> float:
    """Accuracy of the best single (L, T) cell of the run (the paper's "EGLR (best L)")."""
    accuracies = cell_accuracies(items)
    if not accuracies:
        return 0.0
    best = max(accuracies, key=lambda k: accuracies[k])
    logger.info("eglr best cell %s: %.4f (of %d cells)", best, accuracies[best], len(accuracies))
    return accuracies[best]
