"""Section "Selection": trajectory selection by the model's own signals (which rollout of a pool to answer
with), per pool, against the majority vote (paired bootstrap) and the oracle gap.

Per problem, every aggregator picks one answer from the pool's rollouts (those with an answer);
its score is the share of problems where that answer is right. The aggregators:

- ``majority vote`` — :func:`eglr_harness.core.votes.majority` (the tasks' ``maj@B``); its note says how many
  problems were ties and what it solves with every tie broken against and for it
  (:func:`eglr_harness.core.votes.vote_outcome`);
- ``DeepConf weighted vote`` — :func:`~eglr_harness.core.votes.weighted_majority` with the weight
  :func:`eglr_harness.core.signals.confidence` (``exp(mean_logprob)``); ``DeepConf top-10 %`` votes the
  same way among the 10 % most confident rollouts (:func:`~eglr_harness.core.votes.top_fraction`);
- ``best by <signal>`` — the single rollout with the best value of one signal, in the direction
  of :data:`eglr_harness.core.signals.HIGHER_IS_BETTER` (a prior, not fitted);
- ``best single signal (fit half)`` — the signal whose ``best by`` is most accurate on one half of
  the problems, scored on the other half (and the other way round: two folds);
- ``fitted combination`` — a logistic regression of a rollout's correctness on its standardized
  signals, fitted on one half and used on the other (two folds): ``best rollout`` answers with the
  highest predicted probability, ``weighted vote`` weights the vote by it.

The halves are fixed by the document hash (:func:`half_of`), so no choice is made on the problems
it is scored on. ``l_agreement`` (:func:`l_agreement`) is derived from the answers and needs no
recorded signal. Each aggregator is compared with the majority vote by a paired bootstrap over
problems, and with the oracle gap: (acc − greedy) / (oracle − greedy).

:func:`selection` computes the aggregators of one pool; :class:`SelectionSection` writes them per pool.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import GREEDY, Grid, RolloutRow
from eglr_harness.analysis.metrics.accuracy import POOL_TITLES, POOLS, pool_cells
from eglr_harness.analysis.metrics.intervals import bootstrap_intervals, sign_test_p
from eglr_harness.analysis.render import markdown_table, pct
from eglr_harness.analysis.sections.section import ReportContext, Section, Table, register_section
from eglr_harness.core.cell import Cell
from eglr_harness.core.signals import HIGHER_IS_BETTER, RECORDED_SIGNALS, confidence
from eglr_harness.core.votes import DEEPCONF_ETA, best_scored, majority, top_fraction, vote_outcome, weighted_majority

__all__ = [
    "Aggregator",
    "Selection",
    "half_of",
    "l_agreement",
    "rollout_features",
    "selection",
]



def half_of(doc_hash: str) -> int:
    """0 or 1: the fixed half of a problem (the first byte of the SHA-256 of its lm-eval doc hash)."""
    return hashlib.sha256(str(doc_hash).encode("utf-8")).digest()[0] % 2


def l_agreement(rows: Sequence[RolloutRow]) -> list[float | None]:
    """Per rollout of one problem: the share of the problem's rollouts at the same T and another L
    whose vote label equals its own (None: no answer, or no rollout at another L at that T)."""
    out: list[float | None] = []
    for row in rows:
        others = [r for r in rows if r.T == row.T and r.L != row.L]
        if row.vote is None or not others:
            out.append(None)
        else:
            out.append(sum(r.vote == row.vote for r in others) / len(others))
    return out


def rollout_features(rows: Sequence[RolloutRow]) -> list[dict[str, float | None]]:
    """Per rollout: its recorded signals (None where absent) plus ``l_agreement``."""
    agree = l_agreement(rows)
    feats = []
    for row, a in zip(rows, agree):
        signals = row.signals or {}
        f = {name: (None if signals.get(name) is None else float(signals[name])) for name in RECORDED_SIGNALS}
        f["l_agreement"] = a
        feats.append(f)
    return feats


@dataclass(frozen=True)
class Aggregator:
    """One aggregator's result over a pool: per-problem correctness (in ``Selection.docs`` order)."""

    name: str
    solved: tuple[int, ...]
    note: str = ""

    @property
    def accuracy(self) -> float:
        return sum(self.solved) / len(self.solved) if self.solved else 0.0


@dataclass(frozen=True)
class Selection:
    """The aggregators of one pool and their comparison with the majority vote and the oracle gap.

    Attributes:
        pool: the pool's name; cells: its cells; docs: the problems (the grid's).
        signals: recorded signal names present on every rollout of the pool (empty: none recorded).
        greedy, oracle: per-problem correctness of greedy (None without a greedy cell) and oracle.
        aggregators: in report order, majority vote first.
        vs_majority: name -> (mean difference, low, high) of the paired bootstrap (problems).
    """

    pool: str
    cells: tuple[Cell, ...]
    docs: tuple[int, ...]
    signals: tuple[str, ...]
    greedy: tuple[int, ...] | None
    oracle: tuple[int, ...]
    aggregators: tuple[Aggregator, ...]
    vs_majority: dict[str, tuple[float, float, float]]

    def gap_recovered(self, agg: Aggregator) -> float | None:
        """(acc − greedy) / (oracle − greedy); None without greedy or when oracle equals greedy."""
        if self.greedy is None:
            return None
        g, o = sum(self.greedy), sum(self.oracle)
        return None if o == g else (sum(agg.solved) - g) / (o - g)


def _pick_correct(rows: Sequence[RolloutRow], index: int | None) -> int:
    return 0 if index is None else int(rows[index].correct)


def _best_by(rows, feats, name: str) -> int:
    sign = HIGHER_IS_BETTER[name]
    scores = [None if r.vote is None or f[name] is None else sign * f[name] for r, f in zip(rows, feats)]
    if all(s is None for s in scores):  # no rollout has the signal: fall back to the vote
        return _pick_correct(rows, majority([r.vote for r in rows]))
    return _pick_correct(rows, best_scored(scores))


def _fit_logistic(X, y, l2: float = 1e-2, steps: int = 500, lr: float = 0.5):
    """Weights (with bias last) of an L2-regularised logistic regression by gradient descent on
    standardized features; returns (mean, std, w). Deterministic."""
    import numpy as np

    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    mean, std = X.mean(axis=0), X.std(axis=0)
    std[std == 0] = 1.0
    Z = np.hstack([(X - mean) / std, np.ones((len(X), 1))])
    w = np.zeros(Z.shape[1])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ w))
        grad = Z.T @ (p - y) / len(y) + l2 * np.r_[w[:-1], 0.0]
        w -= lr * grad
    return mean, std, w


def _predict(model, X):
    import numpy as np

    mean, std, w = model
    Z = np.hstack([(np.asarray(X, dtype=float) - mean) / std, np.ones((len(X), 1))])
    return 1 / (1 + np.exp(-Z @ w))


def selection(
    grid: Grid, cells: Sequence[Cell], pool: str, *, doc_hashes: Mapping[int, str] | None = None, seed: int = 0
) -> Selection | None:
    """Every aggregator over the rollouts of ``cells`` (module docstring); None for an empty pool."""
    cells = tuple(cells)
    if not cells:
        return None
    docs = grid.docs
    hashes = dict(doc_hashes or {})
    rows_of = {d: [r for r in grid.rollouts_in(cells, d)] for d in docs}
    feats_of = {d: rollout_features(rows_of[d]) for d in docs}
    all_rows = [r for d in docs for r in rows_of[d]]
    recorded = tuple(n for n in RECORDED_SIGNALS if all_rows and all((r.signals or {}).get(n) is not None
                                                                    for r in all_rows))  # fmt: skip
    derived = ("l_agreement",) if any(f["l_agreement"] is not None for d in docs for f in feats_of[d]) else ()
    names = recorded + derived
    half = {d: half_of(hashes.get(d, str(d))) for d in docs}

    def per_doc(pick: Callable[[list, list], int]) -> tuple[int, ...]:
        return tuple(pick(rows_of[d], feats_of[d]) for d in docs)

    aggs = [Aggregator("majority vote", per_doc(lambda rows, f: _pick_correct(rows, majority([r.vote for r in rows]))),
                       _ties_note([vote_outcome([r.vote for r in rows_of[d]], [r.correct for r in rows_of[d]])
                                   for d in docs]))]  # fmt: skip
    if "mean_logprob" in recorded:

        def deepconf(rows, feats, eta=None):
            weights = [confidence(r.signals) for r in rows]
            members = list(range(len(rows))) if eta is None else top_fraction(weights, eta)
            winner = weighted_majority([rows[i].vote for i in members], [weights[i] for i in members])
            return 0 if winner is None else int(rows[members[winner]].correct)

        aggs.append(Aggregator("DeepConf weighted vote", per_doc(deepconf)))
        aggs.append(Aggregator(f"DeepConf top-{DEEPCONF_ETA:.0%} vote",
                               per_doc(lambda r, f: deepconf(r, f, DEEPCONF_ETA))))
    singles = {n: per_doc(lambda rows, f, n=n: _best_by(rows, f, n)) for n in names}
    aggs += [Aggregator(f"best by {n}", s,
                        "higher" if HIGHER_IS_BETTER[n] > 0 else "lower") for n, s in singles.items()]
    if names:
        # best single signal, chosen on the other half
        chosen_solved, chosen = [], {}
        for h in (0, 1):
            fit = [i for i, d in enumerate(docs) if half[d] != h]
            chosen[h] = max(names, key=lambda n: (sum(singles[n][i] for i in fit), -names.index(n)))
        chosen_solved = tuple(singles[chosen[half[d]]][i] for i, d in enumerate(docs))
        aggs.append(Aggregator("best single signal (fit half)", chosen_solved,
                               f"chosen: {chosen[0]} (scored on half 0), {chosen[1]} (half 1)"))
        aggs += _fitted(docs, rows_of, feats_of, half, names)
    oracle = tuple(int(any(r.correct for r in rows_of[d])) for d in docs)
    greedy = None
    if GREEDY in grid.by_cell:
        greedy = tuple(int(any(r.correct for r in grid.by_cell[GREEDY].get(d, ()))) for d in docs)
    base = aggs[0].solved
    diffs = {a.name: [x - y for x, y in zip(a.solved, base)] for a in aggs[1:]}
    vs = bootstrap_intervals(diffs, seed=seed) if diffs and docs else {}
    return Selection(pool, cells, docs, recorded, greedy, oracle, tuple(aggs), vs)


def _ties_note(outcomes) -> str:
    """The majority vote's ties: how many problems, and what it solves with every tie broken against / for it."""
    tied, worst, best = (sum(getattr(o, k) for o in outcomes) for k in ("tied", "worst", "best"))
    return (f"ties: {tied} of {len(outcomes)} problems (first-seen in pool order); solved {worst} … {best} with "
            "every tie against … for the vote")


def _fitted(docs, rows_of, feats_of, half, names) -> list[Aggregator]:
    """The fitted combination, two folds: fit on the half a problem is not in, use it there."""
    best, vote = {}, {}
    for h in (0, 1):
        fit_docs = [d for d in docs if half[d] != h]
        X, y = [], []
        for d in fit_docs:
            for r, f in zip(rows_of[d], feats_of[d]):
                if r.vote is not None:
                    X.append([f[n] for n in names])
                    y.append(int(r.correct))
        fill = _column_means(X, len(names))
        X = [[fill[j] if v is None else v for j, v in enumerate(row)] for row in X]
        model = _fit_logistic(X, y) if X and 0 < sum(y) < len(y) else None
        for d in docs:
            if half[d] != h:
                continue
            rows = rows_of[d]
            answered = [i for i, r in enumerate(rows) if r.vote is not None]
            if model is None or not answered:
                best[d] = vote[d] = _pick_correct(rows, majority([r.vote for r in rows]))
                continue
            Xd = [[fill[j] if feats_of[d][i][n] is None else feats_of[d][i][n] for j, n in enumerate(names)]
                  for i in answered]  # fmt: skip
            p = [float(v) for v in _predict(model, Xd)]
            best[d] = int(rows[answered[best_scored(p)]].correct)
            winner = weighted_majority([rows[i].vote for i in answered], p)
            vote[d] = 0 if winner is None else int(rows[answered[winner]].correct)
    note = "logistic regression on " + ", ".join(names) + "; fitted on the other half"
    return [Aggregator("fitted combination: best rollout", tuple(best[d] for d in docs), note),
            Aggregator("fitted combination: weighted vote", tuple(vote[d] for d in docs), note)]


def _column_means(X, k: int) -> list[float]:
    means = []
    for j in range(k):
        col = [row[j] for row in X if row[j] is not None]
        means.append(sum(col) / len(col) if col else 0.0)
    return means


_HEADER = ["pool", "aggregator", "solved", "docs", "accuracy", "gap_recovered", "diff_vs_majority", "diff_low",
           "diff_high", "gained", "lost", "sign_test_p", "note"]


def _discordant(a, base) -> tuple[int, int, float]:
    """Problems the aggregator solves and the majority vote misses, the reverse, and the exact sign test."""
    gained = sum(x > y for x, y in zip(a.solved, base.solved))
    lost = sum(x < y for x, y in zip(a.solved, base.solved))
    return gained, lost, sign_test_p(gained, lost)


@register_section("selection")
class SelectionSection(Section):
    DEFINITIONS = """\
- Selection: each aggregator answers a problem with one answer of the pool's rollouts. Gap recovered =
  (acc − greedy) / (oracle − greedy). Difference vs majority vote: paired bootstrap over problems (95 %).
  Halves for fitting: the SHA-256 of lm-eval's doc hash, first byte's parity; fitted on one half, scored on
  the other, both ways. Signals: `eglr_harness/core/signals.py`; `l_agreement` = share of the problem's rollouts
  at the same T and another L in the same answer cluster.
"""

    def compute(self, ctx: ReportContext):
        grid = ctx.grid
        hashes = {}
        for part in grid.parts:
            for d, h in part.samples.doc_hashes.items():
                hashes.setdefault(d, h)
        out = {}
        for pool in POOLS:
            cells = pool_cells(grid.cells, pool)
            if len(cells) >= 2:
                out[pool] = selection(grid, cells, pool, doc_hashes=hashes, seed=ctx.seed)
        return out

    def tables(self, ctx: ReportContext, result) -> list[Table]:
        rows = []
        for pool, sel in result.items():
            for a in sel.aggregators:
                d = sel.vs_majority.get(a.name)
                rows.append([pool, a.name, sum(a.solved), len(a.solved), round(a.accuracy, 6),
                             None if sel.gap_recovered(a) is None else round(sel.gap_recovered(a), 6),
                             *((round(x, 6) for x in d) if d else (None, None, None)),
                             *(_discordant(a, sel.aggregators[0]) if d else (None, None, None)), a.note])  # fmt: skip
        return [Table("selection.csv", _HEADER, rows)]

    def markdown(self, ctx: ReportContext, result, figs) -> list[str]:
        parts = ["\n## Selection\n"]
        if not result:
            return parts + ["No pool of two or more cells: nothing to select from."]
        recorded = {s for sel in result.values() for s in sel.signals}
        if not recorded:
            parts.append(
                "No signals recorded: the runs' rollouts carry no `signals` (docs/run-format.md), so the "
                f"confidence-weighted votes and the recorded signals ({', '.join(RECORDED_SIGNALS)}) are not "
                "available; only the signal derived from the answers, `l_agreement`, is.\n"
            )
        for pool, sel in result.items():
            g = None if sel.greedy is None else sum(sel.greedy)
            head = f"\n### {POOL_TITLES.get(pool, pool)}\n\n{len(sel.docs)} problems; oracle {sum(sel.oracle)}"
            head += "" if g is None else f", greedy {g}"
            head += "; signals: " + (", ".join(sel.signals) if sel.signals else "none recorded") + ".\n"
            rows = []
            for a in sel.aggregators:
                d = sel.vs_majority.get(a.name)
                gap = sel.gap_recovered(a)
                gained, lost, p = _discordant(a, sel.aggregators[0]) if d else (None, None, None)
                rows.append([a.name, sum(a.solved), pct(a.accuracy), None if gap is None else pct(gap, 0),
                             None if d is None else f"{d[0] * len(sel.docs):+.0f} ({d[1] * len(sel.docs):+.1f} … "
                             f"{d[2] * len(sel.docs):+.1f})", None if d is None else f"{gained} / {lost}",
                             None if p is None else f"{p:.3g}", a.note or None])  # fmt: skip
            parts += [head, markdown_table(
                ["aggregator", "solved", "accuracy %", "oracle gap recovered %", "vs majority (problems, 95 % CI)",
                 "gained / lost", "sign test p", "note"], rows)]  # fmt: skip
        parts.append("\nTable: `selection.csv`.")
        return parts
