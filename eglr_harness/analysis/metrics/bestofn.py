"""Best-of-N with verifiers: accuracy against N for naive best-of-N, the weighted majority and the plain
majority, per pool, from the scores ``eglr-verify`` wrote (``rollouts[i].verifier_scores``).

**The field.** ``verifier_scores`` is an optional rollout field (docs/run-format.md): verifier spec ->
``{"steps": [...], "last": x, "min": x, "prod": x, "model": NAME}``. This module is its only reader in
the analysis: it reads it from the grid's samples files itself (:func:`read_verifier_scores`), keyed
as the grid keys rollouts (doc, L, T, cycle; the run given first wins), so the loader need not know it.

**Selection** over the rollouts of N configurations of a pool (one rollout each in these grids), among
the rollouts with an answer (one without never answers), ties to the earliest in order:
``naive`` -- the highest-scored rollout (:func:`eglr_harness.core.votes.best_scored`); ``weighted`` -- the
answer whose rollouts' scores sum highest (:func:`~eglr_harness.core.votes.weighted_majority`); ``majority``
-- the plain vote (:func:`~eglr_harness.core.votes.majority`, the tasks' ``maj@B``), which ignores scores.

**Curves.** N = 1, 2, 4, ... and the pool's size B; at each N the first N configurations of
``n_orders`` seeded random orders of the pool (as the budget curves), a problem's value the mean of its
correctness over the orders. Pools: T, L, L ∪ T, L×T (:data:`~eglr_harness.analysis.metrics.accuracy.POOLS`)
and ``random``: N configurations drawn from the whole grid, the equal-budget yardstick of a sub-pool.
Only problems whose every rollout carries the verifier's score count (``eglr-verify --limit`` scores the
first documents). 95 % intervals: paired bootstrap over problems
(:func:`~eglr_harness.analysis.metrics.intervals.bootstrap_intervals`); the tests at full budget add
the exact sign test (:func:`~eglr_harness.analysis.metrics.intervals.sign_test_p`). Pure: no files
written.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eglr_harness.analysis.load import Grid, RolloutRow, read_samples
from eglr_harness.analysis.metrics.accuracy import POOLS, pool_cells
from eglr_harness.analysis.metrics.intervals import bootstrap_intervals, sign_test_p
from eglr_harness.core.cell import T_DECIMALS, Cell
from eglr_harness.core.votes import best_scored, majority, weighted_majority

__all__ = ["SCORES_FIELD", "AGGREGATIONS", "METHODS", "RANDOM", "CurvePoint", "BestOfNTest", "BestOfN",
           "read_verifier_scores", "budgets", "select", "best_of_n"]

SCORES_FIELD = "verifier_scores"
AGGREGATIONS = ("last", "min", "prod")
METHODS = ("naive", "weighted", "majority")
RANDOM = "random"

Key = tuple  # (doc_id, L, T, cycle)


def _key(doc_id, L, T, cycle) -> Key:
    return (int(doc_id), int(L), round(float(T), T_DECIMALS), int(cycle))


def read_verifier_scores(grid: Grid) -> dict[Key, dict[str, dict]]:
    """(doc, L, T, cycle) -> the rollout's ``verifier_scores``, from the grid's samples files (the run
    given first wins, as in the grid). The grid's samples were checked when it loaded (a malformed
    ``verifier_scores`` is refused there, naming FILE:LINE)."""
    out: dict[Key, dict[str, dict]] = {}
    for part in grid.parts:
        path, chosen = part.samples.path, part.samples.filter
        for sample in read_samples(path):
            if sample.get("filter") != chosen or not isinstance(sample.get("rollouts"), list):
                continue
            for index, item in enumerate(sample["rollouts"]):
                scores = item.get(SCORES_FIELD) if isinstance(item, Mapping) else None
                if scores is None or item.get("L") is None or item.get("T") is None:
                    continue
                # its values were checked with the line (core/run_format.py, ROLLOUT_FIELDS)
                cycle = item.get("cycle") if item.get("cycle") is not None else item.get("repeat", index)
                out.setdefault(_key(sample["doc_id"], item["L"], item["T"], cycle), dict(scores))
    return out


def budgets(size: int) -> list[int]:
    """1, 2, 4, ... below ``size``, then ``size``."""
    out, n = [], 1
    while n < size:
        out.append(n)
        n *= 2
    return out + [size] if size else []


def select(rows: Sequence[RolloutRow], scores: Sequence[float], method: str) -> int:
    """1 when ``method`` picks a right answer from ``rows`` (in order) with their ``scores``, else 0."""
    votes = [r.vote for r in rows]
    if method == "majority":
        pick = majority(votes)
    elif method == "naive":
        pick = best_scored([s if v is not None else None for s, v in zip(scores, votes)])
    elif method == "weighted":
        pick = weighted_majority(votes, scores)
    else:
        raise ValueError(f"selection {method!r} is not allowed; allowed: {', '.join(METHODS)}.")
    return 0 if pick is None else int(rows[pick].correct)


@dataclass(frozen=True)
class CurvePoint:
    """Accuracy of ``method`` at budget ``n`` in ``pool`` (fraction of ``docs`` problems) with its 95 % CI."""

    verifier: str
    aggregation: str
    pool: str
    method: str
    n: int
    docs: int
    accuracy: float
    low: float
    high: float


@dataclass(frozen=True)
class BestOfNTest:
    """A − B at full budget in problems (a mean of per-problem differences times ``docs``), its 95 %
    paired-bootstrap interval (fractions), and for two 0/1 sets the discordant problems and sign test."""

    verifier: str
    aggregation: str
    comparison: str
    estimate: float
    docs: int
    low: float
    high: float
    only_a: int | None = None
    only_b: int | None = None
    sign_p: float | None = None


@dataclass(frozen=True)
class BestOfN:
    """Every verifier's curves and tests. ``verifiers``: spec -> (model, aggregations shown, docs);
    ``notes``: what was left out and why."""

    verifiers: dict[str, tuple[str, tuple[str, ...], int]]
    points: tuple[CurvePoint, ...]
    tests: tuple[BestOfNTest, ...]
    pool_sizes: dict[str, int]
    notes: tuple[str, ...] = ()


def _orders(cells: Sequence[Cell], n_orders: int, seed: int) -> list[list[Cell]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_orders):
        order = list(cells)
        rng.shuffle(order)
        out.append(order)
    return out


def best_of_n(grid: Grid, *, n_orders: int = 20, seed: int = 0, n_resamples: int = 10_000) -> BestOfN:
    """Curves and tests of every verifier found in the grid's samples (module docstring)."""
    table = read_verifier_scores(grid)
    specs = sorted({spec for scores in table.values() for spec in scores})
    pools = {p: pool_cells(grid.cells, p) for p in POOLS}
    pools = {p: c for p, c in pools.items() if c}
    sub_sizes = [len(c) for p, c in pools.items() if len(c) < len(grid.cells)]
    if sub_sizes:
        pools[RANDOM] = list(grid.cells)  # drawn N at a time from the whole grid, N up to the largest sub-pool
    sizes = {p: (max(sub_sizes) if p == RANDOM else len(c)) for p, c in pools.items()}
    verifiers, points, tests, notes = {}, [], [], []
    for spec in specs:
        docs = [d for d in grid.docs if all(spec in table.get(_key(d, r.L, r.T, r.cycle or 0), {})
                                            for r in grid.rollouts_in(grid.cells, d))]
        if not docs:
            notes.append(f"{spec}: no problem has every rollout scored; left out.")
            continue
        rows_of = {d: {c: grid.rollouts_in([c], d) for c in grid.cells} for d in docs}

        def value(row: RolloutRow, how: str) -> float:
            return float(table[_key(row.doc_id, row.L, row.T, row.cycle or 0)][spec][how])

        shown = ("last",) + tuple(a for a in AGGREGATIONS[1:] if any(
            value(r, a) != value(r, "last") for d in docs for rs in rows_of[d].values() for r in rs))
        model = next(iter({table[_key(r.doc_id, r.L, r.T, r.cycle or 0)][spec].get("model", "")
                           for r in grid.rollouts_in(grid.cells, docs[0])}), "")
        verifiers[spec] = (str(model), shown, len(docs))
        if any(value(r, a) < 0 for d in docs for rs in rows_of[d].values() for r in rs for a in shown):
            notes.append(f"{spec}: negative scores; the weighted majority needs weights >= 0 and is left out.")
        weighted_ok = not any(value(r, a) < 0 for d in docs for rs in rows_of[d].values() for r in rs for a in shown)
        methods = [m for m in METHODS if m != "weighted" or weighted_ok]
        for how in shown:
            per_doc: dict[tuple, list[float]] = {}  # (pool, method, n) -> value per doc
            full: dict[tuple, list[int]] = {}  # (pool, method) -> 0/1 per doc at full budget, stated order
            for pool, cells in pools.items():
                orders = _orders(cells, n_orders, seed)
                ns = budgets(sizes[pool]) if pool != RANDOM else sorted({*budgets(sizes[pool]), *sub_sizes})
                for n in ns:
                    for method in methods:
                        vals = []
                        for d in docs:
                            hits = 0
                            for order in orders:
                                rows = [r for c in order[:n] for r in rows_of[d][c]]
                                hits += select(rows, [value(r, how) for r in rows], method)
                            vals.append(hits / len(orders))
                        per_doc[(pool, method, n)] = vals
                if pool != RANDOM:
                    for method in methods:
                        rows_d = {d: [r for c in cells for r in rows_of[d][c]] for d in docs}
                        full[(pool, method)] = [select(rows_d[d], [value(r, how) for r in rows_d[d]], method)
                                                for d in docs]
            names = {f"{k}": v for k, v in per_doc.items()}
            diffs = _test_values(full, per_doc, pools, sizes, methods)
            boot = bootstrap_intervals({**names, **{c: v for c, (v, _, _) in diffs.items()}},
                                       n_resamples=n_resamples, seed=seed)
            for (pool, method, n), vals in per_doc.items():
                mean, lo, hi = boot[f"{(pool, method, n)}"]
                points.append(CurvePoint(spec, how, pool, method, n, len(docs), mean, lo, hi))
            for comparison, (vals, a, b) in diffs.items():
                mean, lo, hi = boot[comparison]
                if a is not None:
                    only_a = sum(x > y for x, y in zip(a, b))
                    only_b = sum(x < y for x, y in zip(a, b))
                    tests.append(BestOfNTest(spec, how, comparison, mean * len(docs), len(docs), lo, hi, only_a,
                                             only_b, sign_test_p(only_a, only_b)))
                else:
                    tests.append(BestOfNTest(spec, how, comparison, mean * len(docs), len(docs), lo, hi))
    return BestOfN(verifiers, tuple(points), tuple(tests), sizes, tuple(notes))


def _test_values(full, per_doc, pools, sizes, methods) -> dict[str, tuple[list[float], list[int] | None, list | None]]:
    """comparison -> (per-problem differences, A's 0/1, B's 0/1 or None for the random yardstick)."""
    out = {}
    for pool in (p for p in pools if p != RANDOM):
        for method in methods:
            if method != "majority":
                a, b = full[(pool, method)], full[(pool, "majority")]
                out[f"{pool}: {method} − majority"] = ([x - y for x, y in zip(a, b)], a, b)
    if "L" in pools and "T" in pools and len(pools["L"]) == len(pools["T"]):
        for method in methods:
            a, b = full[("L", method)], full[("T", method)]
            out[f"{method}: L pool − T pool (equal budget)"] = ([x - y for x, y in zip(a, b)], a, b)
    if RANDOM in pools:
        for pool in (p for p in pools if p != RANDOM and sizes[p] < len(pools[RANDOM])):
            for method in methods:
                a, rand = full[(pool, method)], per_doc[(RANDOM, method, sizes[pool])]
                out[f"{method}: {pool} pool − {sizes[pool]} random grid cells"] = (
                    [x - y for x, y in zip(a, rand)], None, None)
    return out
