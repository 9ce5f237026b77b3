"""Per-problem scores over the repeats of one request, and the run-level aggregations.

The per-document keys (docs/run-format.md) come from :func:`score_document`:

- ``rollouts``: one record per repeat, in repeat order: ``{"repeat", "L", "T", "cycle",
  "answer", "correct", "cluster", "signals"}`` (``answer`` = extracted answer or ``None``; ``L``/``T``/``cycle``
  are ``None`` for responses that carry no :class:`~eglr_harness.core.rollout.RolloutText` metadata;
  ``cluster`` = index of the answer's equivalence cluster among the document's rollouts, clusters
  numbered in order of first appearance, ``None`` for no answer — so a reader can redo the vote
  without any equivalence check; ``signals`` = the rollout's :mod:`eglr_harness.core.signals` dict, or
  ``None`` when the model recorded none; ``engine`` = ``continuous`` or ``hook``, the engine that decoded it,
  present only when the model recorded it).
- ``acc``: the accuracy of one rollout, averaged over the document's ``B`` rollouts (correct / B).
  The same meaning in every task: for a one-rollout task it is that rollout's correctness; for a
  pool it is the expected accuracy of a rollout drawn from the pool at random (no cell favoured).
- ``maj@B``: correctness of the majority answer over the ``B`` repeats (rule: :func:`majority_index`).
- ``oracle@B``: 1 if any repeat is correct.
- ``pass@1``, ``pass@B``: the unbiased pass@k estimator (:func:`pass_at_k`) over the ``B``
  rollouts. With all ``B`` rollouts scored, ``pass@1`` equals ``acc`` and ``pass@B`` equals
  ``oracle@B`` (the estimator is exact there); they are reported under the names other
  harnesses use.
- ``best_cfg_acc``: the document's correctness per (L, T) cell (:func:`doc_cell_scores`);
  :func:`best_cfg_acc` aggregates it.
- ``wmaj@B``, ``wmaj@B_top10`` (only for pools, B > 1, whose every rollout carries ``signals``): the confidence-weighted
  vote (:func:`eglr_harness.core.votes.weighted_majority`, weight = :func:`eglr_harness.core.signals.confidence`)
  over all ``B`` rollouts, and over the 10 % most confident (DeepConf's filter; :func:`signal_votes`).
- with ``sub_pools`` (the grid tasks): ``acc_<name>``, ``maj@n_<name>``, ``oracle@n_<name>`` per
  named sub-pool, voted from the same clusters (:func:`vote_scores`).

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from eglr_harness.core.cell import Cell
from eglr_harness.core.rollout import rollout_meta
from eglr_harness.core.signals import confidence
from eglr_harness.core.specs import T_DECIMALS, parse_L_spec, parse_T_spec
from eglr_harness.core.votes import DEEPCONF_ETA, best_cell, majority, top_fraction, weighted_majority
from eglr_harness.scoring.equivalence import DEFAULT_TIMEOUT_S, is_equivalent

logger = logging.getLogger(__name__)

UNKNOWN_CELL = "unknown"  # cell key of rollouts without (L, T) metadata

Equivalence = Callable[[str, str], bool]


def answer_or_none(value: Any) -> str | None:
    """Filter outputs carry the invalid answer as ``""`` (so it can keep RolloutText metadata)."""
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


def majority_index(answers: Sequence[str | None], equivalent: Equivalence | None = None) -> int | None:
    """Index of the representative of the winning cluster (module docstring), ``None`` if no valid answer."""
    return majority(cluster_ids(cluster_answers(answers, equivalent), len(answers)))


def cluster_ids(clusters: Sequence[Sequence[int]], n: int) -> list[int | None]:
    """Per answer index, the position of its cluster (clusters in order of first appearance); ``None`` if invalid."""
    ids: list[int | None] = [None] * n
    for k, cluster in enumerate(clusters):
        for i in cluster:
            ids[i] = k
    return ids


class CellSelector:
    """Which rollouts belong to a sub-pool ``L`` x ``T`` (spec syntax of ``eglr_harness.core.specs``).

    Either axis may be left out (= any value). Called with a rollout's metadata (a mapping with
    ``"L"`` and ``"T"``); metadata without (L, T) (models other than eglr-hf) cannot be selected,
    so :meth:`select` keeps every rollout then, with a warning.
    """

    _warned = False

    def __init__(self, L=None, T=None, *, name: str = "sub-pool") -> None:
        if L is None and T is None:
            raise ValueError(f"{name}: give `L`, `T` or both (e.g. L: '1-10', T: 0).")
        self.L = None if L is None else frozenset(parse_L_spec(L, name=f"{name}.L"))
        self.T = None if T is None else frozenset(parse_T_spec(T, name=f"{name}.T"))

    def __call__(self, meta: Mapping) -> bool:
        L_ok = self.L is None or meta["L"] in self.L
        T_ok = self.T is None or round(meta["T"], T_DECIMALS) in self.T
        return L_ok and T_ok

    def select(self, metas: Sequence[Mapping | None]) -> list[int]:
        """Indices of the selected rollouts; all of them when some carry no (L, T)."""
        if any(m is None or m.get("L") is None or m.get("T") is None for m in metas):
            if not CellSelector._warned:
                logger.warning("eglr sub-pool: rollouts carry no (L, T) metadata (not from eglr-hf); keeping all.")
                CellSelector._warned = True
            return list(range(len(metas)))
        return [i for i, m in enumerate(metas) if self(m)]


# The paper's sub-pools of the 11 x 11 grid (the `_eglr_lxt` tasks), scored from the grid's rollouts.
GRID_SUB_POOLS = {
    "L_only": CellSelector(L="1-10", T=0, name="L_only"),  # EGLR-SC_L, Oracle_L
    "T_only": CellSelector(L=0, T="0.1-1.0:0.1", name="T_only"),  # SC_T, Oracle_T
    "joint": CellSelector(L="1-10", T="0.1-1.0:0.1", name="joint"),  # SC_LxT
}


def cell_key(L: int | None, T: float | None) -> str:
    """The cell's label (``Cell.label``, the key format of the model's stats), or ``"unknown"``."""
    return UNKNOWN_CELL if L is None or T is None else Cell.of(L, T).label


def score_document(
    gold: str,
    responses: Iterable[Any],
    *,
    sub_pools: Mapping[str, CellSelector] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """All per-document metrics for the (extracted) answers of one problem's repeats.

    Args:
        gold: the reference answer (``doc["answer"]``).
        responses: extracted answers in repeat order (``str``, :class:`RolloutText`, ``""``/``None``
            for invalid). A single string is treated as one repeat.
        sub_pools: named sub-pools scored from the same rollouts (``acc_<name>``,
            ``maj@n_<name>``, ``oracle@n_<name>``; n = the sub-pool's rollouts), so that a grid
            task needs one lm-eval filter and its samples file stores every response once.
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
            "signals": meta.get("signals"),
            **({"engine": meta["engine"]} if "engine" in meta else {}),
            **({"seed": meta["seed"]} if "seed" in meta else {}),
            # eglr-baseline's answers (greedy, beam search): how each ended and what it cost
            **{key: meta[key] for key in ("finish", "search_tokens") if key in meta},
        })
    B = len(rollouts)
    solved = sum(correct)
    out: dict[str, Any] = {"rollouts": rollouts, **vote_scores(rollouts, range(B))}
    out["pass@1"] = pass_at_k(B, solved, 1) if B else 0.0
    out[f"pass@{B}"] = pass_at_k(B, solved, B) if B else 0.0
    out["best_cfg_acc"] = doc_cell_scores(rollouts)
    out.update(signal_votes(rollouts))
    for name, selector in (sub_pools or {}).items():
        members = selector.select(rollouts)
        out.update({f"{key}_{name}": value for key, value in vote_scores(rollouts, members).items()})
    return out


def vote_scores(rollouts: Sequence[Mapping], members: Iterable[int]) -> dict[str, float | int]:
    """``acc``, ``maj@n`` and ``oracle@n`` of the rollouts at ``members`` (n of them).

    The vote uses the logged ``cluster`` ids (module docstring): the largest cluster among the
    members wins, ties -> the cluster whose first member (in repeat order) comes first; the winner
    is correct iff that first member is. For the whole pool this is :func:`majority_index`'s rule.
    """
    members = sorted(members)  # repeat order: a tie goes to the cluster seen first among them
    n = len(members)
    winner = majority([rollouts[i]["cluster"] for i in members])  # the one vote rule (votes.py)
    solved = sum(rollouts[i]["correct"] for i in members)
    return {
        "acc": solved / n if n else 0.0,
        f"maj@{n}": rollouts[members[winner]]["correct"] if winner is not None else 0,
        f"oracle@{n}": int(solved > 0),
    }




def signal_votes(rollouts: Sequence[Mapping]) -> dict[str, int]:
    """``wmaj@B`` and ``wmaj@B_top10`` of one document (module docstring); ``{}`` unless there is a
    pool to vote over (B > 1; one rollout's vote is its ``acc``) and every rollout carries signals
    with a confidence (runs without signals keep their metrics as before)."""
    weights = [confidence(r.get("signals")) for r in rollouts]
    if len(rollouts) < 2 or any(w is None for w in weights):
        return {}
    B = len(rollouts)
    labels = [r["cluster"] for r in rollouts]
    out = {}
    for name, members in ((f"wmaj@{B}", list(range(B))), (f"wmaj@{B}_top10", top_fraction(weights, DEEPCONF_ETA))):
        winner = weighted_majority([labels[i] for i in members], [weights[i] for i in members])
        out[name] = int(rollouts[members[winner]]["correct"]) if winner is not None else 0
    return out


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


def doc_cell_scores(rollouts: Sequence[Mapping]) -> dict[str, float]:
    """One document's correctness per (L, T) cell, repeats of a cell (cycles) averaged, L-major.

    The per-document value of ``best_cfg_acc``: a small dict, not the ``rollouts`` list again.
    """
    per_cell: dict[tuple, list[int]] = {}
    for r in rollouts:
        per_cell.setdefault((r.get("L"), r.get("T")), []).append(int(r.get("correct", 0)))

    def order(key: tuple) -> tuple:
        L, T = key
        return (L is None, L if L is not None else 0, T if T is not None else 0.0)

    return {cell_key(*key): sum(v) / len(v) for key, v in sorted(per_cell.items(), key=lambda kv: order(kv[0]))}


def _label_order(label: str) -> tuple:
    return (1, 0, 0.0) if label == UNKNOWN_CELL else (0, *Cell.parse(label))


def cell_accuracies(items: Iterable[Sequence[dict] | Mapping[str, float]]) -> dict[str, float]:
    """Accuracy of every (L, T) cell over a run: ``{"L=4,T=0.0": 0.65, ...}``, L-major order.

    ``items`` holds one entry per document: its ``rollouts`` list or its :func:`doc_cell_scores`.
    Within a document the repeats of one cell (several cycles) are averaged first, so every
    document weighs the same; a cell's accuracy is the mean over the documents that have it.
    Rollouts without metadata form one cell, ``"unknown"``.
    """
    sums: dict[str, list[float]] = {}
    for item in items:
        scores = item if isinstance(item, Mapping) else doc_cell_scores(item)
        for label, value in scores.items():
            total = sums.setdefault(label, [0.0, 0])
            total[0] += value
            total[1] += 1
    return {label: sums[label][0] / sums[label][1] for label in sorted(sums, key=_label_order)}


def rollout_count(items: Iterable[Sequence[dict]]) -> int:
    """Number of rollouts scored over the run (aggregation of ``rollouts``); logs the cell accuracies.

    A number, not the per-cell dictionary, so that lm-eval's console table keeps short lines.
    """
    items = list(items)
    accuracies = cell_accuracies(items)
    logger.info("eglr cell accuracies: %s", ", ".join(f"{k}: {v:.4f}" for k, v in accuracies.items()))
    return sum(len(rollouts) for rollouts in items)


def best_cell_label(accuracies: Mapping[str, float]) -> str | None:
    """The best cell's label under the one tie rule (``selection.best_cell``: L-major order)."""
    by_order = {_label_order(label): label for label in accuracies}
    winner = best_cell({order: accuracies[label] for order, label in by_order.items()})
    return None if winner is None else by_order[winner]


def best_cfg_acc(items: Iterable[Sequence[dict] | Mapping[str, float]]) -> float:
    """Accuracy of the best single (L, T) cell of the run (the paper's "EGLR (best L)")."""
    accuracies = cell_accuracies(items)
    if not accuracies:
        return 0.0
    best = best_cell_label(accuracies)
    logger.info("eglr best cell %s: %.4f (of %d cells)", best, accuracies[best], len(accuracies))
    return accuracies[best]
