"""Confidence intervals over problems: Wilson intervals for shares, a paired bootstrap for
differences, and the exact sign test on the discordant problems of two solved sets.

The problems are the unit of sampling: a grid's cells all ran on the same problems, so a
difference between two pools (or a pool and its random-cell yardstick) is a mean of per-problem
differences, and resampling problems keeps the pairing. Every quantity of one call is resampled
with the same draws, so their intervals are jointly consistent. Nothing here reads files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import comb, sqrt

__all__ = ["Z95", "N_RESAMPLES", "wilson_interval", "bootstrap_intervals", "sign_test_p"]

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
    return max(0.0, center - half), min(1.0, center + half)


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
