"""Confidence intervals over problems: Wilson intervals for shares, a paired bootstrap for
differences, the exact sign test on the discordant problems of two solved sets, and the Wilcoxon
signed-rank test on per-problem differences (which, unlike the sign test, weighs a problem by how
much its accuracy moved: per-problem accuracies over several rollouts or seeds are fractions).

The problems are the unit of sampling: a grid's cells all ran on the same problems, so a
difference between two pools (or a pool and its random-cell yardstick) is a mean of per-problem
differences, and resampling problems keeps the pairing. Every quantity of one call is resampled
with the same draws, so their intervals are jointly consistent. Nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb, erfc, sqrt

__all__ = ["Z95", "N_RESAMPLES", "EXACT_WILCOXON_MAX_N", "Wilcoxon", "wilson_interval", "bootstrap_intervals",
           "sign_test_p", "wilcoxon_signed_rank", "PairedDifference", "paired_difference"]

Z95 = 1.959963984540054  # the standard normal's 97.5th percentile (a two-sided 95 % interval)
N_RESAMPLES = 10_000


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the share ``successes / n`` (default: 95 %)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n`={n!r} is not allowed; allowed: a positive int (the number of problems).")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"`successes`={successes!r} is not allowed; allowed: an int in [0, {n}].")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # at 0 of n (n of n) the bound is exactly 0 (1); computed, it can land a rounding error inside (3.5e-18 at 0 of
    # 100), above the share itself, and a plot's error bar below it would be negative
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def bootstrap_intervals(
    values: Mapping[str, Sequence[float]],
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, tuple[float, float, float]]:
    """name -> (mean, lower, upper): percentile bootstrap intervals of the means of per-problem values.

    Every sequence holds one value per problem, in the same problem order. Each resample draws
    the problems with replacement once, and every quantity is averaged over that same draw (a
    paired bootstrap). ``seed`` fixes the draws, so a report is reproducible.
    """
    import numpy as np

    if not 0 < level < 1:
        raise ValueError(f"`level`={level!r} is not allowed; allowed: a float in (0, 1), e.g. 0.95.")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"`n_resamples`={n_resamples!r} is not allowed; allowed: a positive int.")
    lengths = {name: len(v) for name, v in values.items()}
    if len(set(lengths.values())) > 1 or 0 in lengths.values():
        raise ValueError(f"per-problem values of unequal or zero length {lengths}; allowed: one value per problem "
                         "each.")
    if not values:
        return {}
    n = next(iter(lengths.values()))
    draws = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    tail = (1 - level) / 2
    out = {}
    for name, v in values.items():
        arr = np.asarray(v, dtype=float)
        means = arr[draws].mean(axis=1)
        lo, hi = np.quantile(means, [tail, 1 - tail])
        out[name] = (float(arr.mean()), float(lo), float(hi))
    return out


def sign_test_p(only_a: int, only_b: int) -> float:
    """Exact two-sided sign test (McNemar's exact test) on the discordant problems.

    ``only_a``: problems that A solves and B does not; ``only_b``: the reverse. Under "A and B are
    equally good" each discordant problem falls either way with probability 1/2.
    """
    for name, v in (("only_a", only_a), ("only_b", only_b)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"`{name}`={v!r} is not allowed; allowed: an int >= 0 (a number of problems).")
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


EXACT_WILCOXON_MAX_N = 200  # up to this many non-zero differences the p-value is exact (a count over sign flips)


@dataclass(frozen=True)
class Wilcoxon:
    """A Wilcoxon signed-rank test of paired per-problem differences.

    w_plus, w_minus: the rank sums of the positive and negative differences (average ranks of |d| for
    ties); n_effective: the problems whose difference is not zero (the test's n: a problem both sides
    score the same tells nothing about the sign, Wilcoxon's own convention); p: two-sided; exact: p
    counts all 2^n sign flips of the ranks (given the ties), else the normal approximation with the
    tie and continuity corrections.
    """

    w_plus: float
    w_minus: float
    n_effective: int
    p: float
    exact: bool


def wilcoxon_signed_rank(differences: Sequence[float], *, exact_max_n: int = EXACT_WILCOXON_MAX_N,
                         tolerance: float = 1e-12) -> Wilcoxon:
    """Two-sided Wilcoxon signed-rank test of ``differences`` (one per problem, A minus B).

    Differences within ``tolerance`` of zero are dropped (n_effective counts the rest); equal |d| share
    their average rank. With n_effective <= ``exact_max_n`` the p-value is exact under the null that each
    difference's sign is a fair coin given its rank (valid with ties: the ranks are counted in halves);
    above it, the normal approximation with the tie-corrected variance and a continuity correction of
    1/2 (scipy's ``wilcoxon(..., method="approx", correction=True)``).
    """
    values = [float(d) for d in differences]
    if any(v != v for v in values):
        raise ValueError("`differences` holds NaN; allowed: finite per-problem differences.")
    nonzero = [v for v in values if abs(v) > tolerance]
    n = len(nonzero)
    if n == 0:
        return Wilcoxon(0.0, 0.0, 0, 1.0, True)
    order = sorted(range(n), key=lambda i: abs(nonzero[i]))
    ranks = [0.0] * n
    ties = []  # sizes of the groups of equal |d|
    start = 0
    while start < n:
        end = start
        while end + 1 < n and abs(abs(nonzero[order[end + 1]]) - abs(nonzero[order[start]])) <= tolerance:
            end += 1
        for j in range(start, end + 1):
            ranks[order[j]] = (start + end) / 2 + 1
        ties.append(end - start + 1)
        start = end + 1
    w_plus = sum(r for r, v in zip(ranks, nonzero) if v > 0)
    total = n * (n + 1) / 2
    w_minus = total - w_plus
    if n <= exact_max_n:
        return Wilcoxon(w_plus, w_minus, n, _exact_signed_rank_p(ranks, w_plus), True)
    mean = total / 2
    variance = n * (n + 1) * (2 * n + 1) / 24 - sum(t ** 3 - t for t in ties) / 48
    if variance <= 0:
        return Wilcoxon(w_plus, w_minus, n, 1.0, False)
    z = max(abs(w_plus - mean) - 0.5, 0.0) / sqrt(variance)
    return Wilcoxon(w_plus, w_minus, n, min(1.0, erfc(z / sqrt(2))), False)


def _exact_signed_rank_p(ranks: list[float], w_plus: float) -> float:
    """P(W+ as extreme as ``w_plus``) over the 2^n equally likely sign patterns, two-sided (twice the
    smaller tail, capped at 1). Ranks are whole or half numbers: counted in halves, as integers."""
    import numpy as np

    doubled = [round(2 * r) for r in ranks]
    counts = np.zeros(sum(doubled) + 1, dtype=float)  # counts[s]: sign patterns with 2·W+ = s
    counts[0] = 1.0
    for r in doubled:
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r] if r else counts
        counts = counts + shifted
    observed = round(2 * w_plus)
    total = counts.sum()
    lower, upper = counts[:observed + 1].sum() / total, counts[observed:].sum() / total
    return float(min(1.0, 2 * min(lower, upper)))


@dataclass(frozen=True)
class PairedDifference:
    """A − B over the problems both hold: mean per-problem difference (fractions) with its bootstrap 95 %
    interval, problems only A / only B does better on, the sign test on them, Wilcoxon's p and effective n."""

    problems: int
    mean: float
    low: float
    high: float
    better_a: int
    better_b: int
    sign_p: float
    wilcoxon_p: float
    n_effective: int


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], *, seed: int = 0,
                      n_resamples: int = N_RESAMPLES) -> PairedDifference | None:
    """A − B over the problems in both (doc_id -> per-problem accuracy); None when they share none. The bootstrap
    draws depend on ``seed``, ``n_resamples`` and the number of problems only, so differences over the same
    problems with the same seed are resampled jointly (as :func:`bootstrap_intervals` does within one call)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    diff = [a[d] - b[d] for d in shared]
    mean, low, high = bootstrap_intervals({"d": diff}, n_resamples=n_resamples, seed=seed)["d"]
    better_a, better_b = sum(x > 0 for x in diff), sum(x < 0 for x in diff)
    wilcoxon = wilcoxon_signed_rank(diff)
    return PairedDifference(len(shared), mean, low, high, better_a, better_b, sign_test_p(better_a, better_b),
                            wilcoxon.p, wilcoxon.n_effective)
