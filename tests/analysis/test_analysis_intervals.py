"""Confidence intervals: Wilson, paired bootstrap, sign test on literal inputs, and the report section
on the hand-made 3×3 grid of lmeval_fakes.GRID (solved sets worked out in test_analysis_metrics.py):

    A(0,0){0}  B(0,.5){0,1}  C(0,1){1,2}
    D(1,0){0,2} E(1,.5){1}   F(1,1){0,3}
    G(2,0){2}  H(2,.5){}     I(2,1){}

greedy = A {0}; T pool [B, C]: oracle {0,1,2}, SC {0,1,2}; L pool [D, G]: oracle {0,2}, SC {0,2};
L ∪ T: oracle {0,1,2}, SC {0,1,2}; L×T: oracle {0,1,2,3}, SC {0,2,3}.
"""

from __future__ import annotations

import dataclasses

import pytest

from eglr_harness.analysis import load_grid, pool_cells, summarize_pool
from eglr_harness.analysis.metrics.accuracy import rollouts_per_problem
from eglr_harness.analysis.metrics.intervals import bootstrap_intervals, sign_test_p, wilson_interval
from eglr_harness.analysis.metrics.oracle import random_oracle_per_doc
from eglr_harness.analysis.report import build_report, compute_report
from eglr_harness.analysis.sections.intervals import interval_rows

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)


def test_wilson_interval_by_hand():
    # 1 of 4: centre (1/4 + z²/8) / (1 + z²/4) = 0.372465, half-width 0.326886 (z = 1.959964)
    assert wilson_interval(1, 4) == pytest.approx((0.045580, 0.699350), abs=1e-5)
    # 0 of 4: lower 0, upper z² / (n + z²) = 3.841459 / 7.841459
    assert wilson_interval(0, 4) == pytest.approx((0.0, 3.841459 / 7.841459), abs=1e-6)
    # 50 of 100: symmetric around 0.5, half-width z·sqrt(0.0025 + z²/40000) / (1 + z²/100) = 0.096170
    assert wilson_interval(50, 100) == pytest.approx((0.403830, 0.596170), abs=1e-5)
    # none or all of them: the bound at the share is the share itself, not a rounding error past it (3.5e-18 above
    # 0 of 100 made a plot's error bar negative)
    assert [wilson_interval(0, n)[0] for n in (4, 10, 100)] == [0.0, 0.0, 0.0]
    assert [wilson_interval(n, n)[1] for n in (4, 10, 100)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("successes, n, bad", [(5, 4, "`successes`=5"), (-1, 4, "`successes`=-1"), (1, 0, "`n`=0"),
                                               (1.0, 4, "`successes`=1.0")])
def test_wilson_interval_rejects_bad_counts(successes, n, bad):
    with pytest.raises(ValueError, match=bad):
        wilson_interval(successes, n)


def test_sign_test_by_hand():
    assert sign_test_p(0, 5) == pytest.approx(2 / 32)  # 2 · P(X <= 0), X ~ Bin(5, 1/2)
    assert sign_test_p(9, 1) == pytest.approx(2 * 11 / 1024)  # 2 · (1 + 10) / 2^10
    assert sign_test_p(3, 3) == 1.0 and sign_test_p(0, 0) == 1.0 and sign_test_p(0, 1) == 1.0
    with pytest.raises(ValueError, match="`only_b`=-2"):
        sign_test_p(1, -2)


def test_bootstrap_intervals_by_hand():
    assert bootstrap_intervals({"const": [0.5] * 5}, seed=3) == {"const": (0.5, 0.5, 0.5)}
    # two problems: a resample's mean is 0 or 1 with probability 1/4 each, so the 2.5 % / 97.5 % points are 0 and 1
    assert bootstrap_intervals({"pm": [1.0, 0.0]}, seed=3) == {"pm": (0.5, 0.0, 1.0)}
    # one of four problems is -1: P(all four draws hit it) = 1/256 < 2.5 % < P(three or more) = 13/256
    out = bootstrap_intervals({"rare": [0.0, -1.0, 0.0, 0.0], "up": [0.0, 0.0, 0.0, 1.0]}, seed=3)
    assert out["rare"] == (-0.25, -0.75, 0.0) and out["up"] == (0.25, 0.0, 0.75)


def test_bootstrap_is_paired_and_seeded():
    a = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    out = bootstrap_intervals({"a": a, "same": list(a)}, seed=1)
    assert out["a"] == out["same"]  # the same draws of problems for every quantity
    assert bootstrap_intervals({"a": a}, seed=1) == {"a": out["a"]}
    with pytest.raises(ValueError, match="unequal or zero length"):
        bootstrap_intervals({"a": [1.0, 0.0], "b": [1.0]})
    with pytest.raises(ValueError, match="`level`=1.5"):
        bootstrap_intervals({"a": a}, level=1.5)


def test_random_oracle_per_doc_by_hand(full_run):
    grid = load_grid([full_run])
    ctx = compute_report(grid)
    # cells solving each doc: d0 4, d1 3, d2 3, d3 1 of 9; two cells miss d with C(9 - s, 2) / C(9, 2)
    assert random_oracle_per_doc(ctx.solved, grid.cells, 2) == pytest.approx(
        {0: 1 - 10 / 36, 1: 1 - 15 / 36, 2: 1 - 15 / 36, 3: 1 - 28 / 36})


def test_interval_rows_on_the_toy_grid(full_run):
    ctx = compute_report(load_grid([full_run]))
    rows = {r.quantity: r for r in interval_rows(ctx)}
    shares = {q: r.estimate for q, r in rows.items() if r.method == "Wilson"}
    assert shares == {
        "greedy (L=0, T=0)": 1, "SC T pool (B=2)": 3, "oracle T pool (B=2)": 3, "SC L pool (B=2)": 2,
        "oracle L pool (B=2)": 2, "SC L ∪ T pool (B=4)": 3, "oracle L ∪ T pool (B=4)": 3, "SC L×T pool (B=9)": 3,
        "oracle L×T pool (B=9)": 4, "corner T-only (pool + greedy)": 3, "corner L-only (pool + greedy)": 2,
        "corner joint (pool + greedy)": 4,
    }  # fmt: skip
    assert (rows["greedy (L=0, T=0)"].low, rows["greedy (L=0, T=0)"].high) == pytest.approx((0.045580, 0.699350),
                                                                                            abs=1e-5)
    diffs = {q: (r.estimate, r.only_a, r.only_b, r.sign_p) for q, r in rows.items() if r.only_a is not None}
    assert diffs == {
        "oracle: L pool − T pool (equal budget)": (-1, 0, 1, 1.0),  # T alone solves d1
        "corner: joint − T-only": (1, 1, 0, 1.0),  # d3 (F)
        "corner: joint − L-only": (2, 2, 0, 0.5),  # d1, d3
        "SC: L pool − T pool (equal budget)": (-1, 0, 1, 1.0),
        "SC: T pool − greedy": (2, 2, 0, 0.5),
        "SC: L pool − greedy": (1, 1, 0, 1.0),
        "SC: L ∪ T pool − greedy": (2, 2, 0, 0.5),
        "SC: L×T pool − greedy": (2, 2, 0, 0.5),  # {0,2,3} vs {0}
    }
    # per-problem L − T oracle: [0, -1, 0, 0] -> the "rare" case of test_bootstrap_intervals_by_hand, in shares
    L_T = rows["oracle: L pool − T pool (equal budget)"]
    assert (L_T.low, L_T.high) == (-0.75, 0.0)
    assert (rows["corner: joint − T-only"].low, rows["corner: joint − T-only"].high) == (0.0, 0.75)
    # yardsticks: pool oracle minus the expected oracle of as many random rollouts, here one per cell: as many random
    # cells (test_analysis_metrics)
    yard = {q: r.estimate for q, r in rows.items() if r.method != "Wilson" and r.only_a is None}
    assert yard == pytest.approx({
        "oracle: T pool − 2 random grid rollouts": 3 - (4 - 68 / 36),
        "oracle: L pool − 2 random grid rollouts": 2 - (4 - 68 / 36),
        "oracle: L ∪ T pool − 4 random grid rollouts": 3 - (4 - 105 / 126),
    })  # fmt: skip
    # L pool per problem: 1 - 26/36, -21/36, 1 - 21/36, -8/36; the mean lies inside its interval
    L_rand = rows["oracle: L pool − 2 random grid rollouts"]
    assert L_rand.low <= L_rand.share <= L_rand.high and L_rand.low < 0 < L_rand.high


def test_intervals_section_in_the_report(full_run, tmp_path):
    out = build_report([full_run], tmp_path / "rep")
    lines = (out / "intervals.csv").read_text().splitlines()
    ties = ",".join(["ties_a", "ties_b"] + [f"{c}_{k}" for c in ("against_a", "for_a")
                                            for k in ("estimate", "ci_low", "ci_high", "only_a", "only_b", "sign_p")])
    assert lines[0] == "quantity,method,estimate,docs,share,ci_low,ci_high,only_a,only_b,sign_p," + ties
    assert "oracle: L pool − T pool (equal budget),paired bootstrap,-1,4,-0.25,-0.75,0.0,0,1,1.0" + "," * 14 in lines
    md = (out / "report.md").read_text()
    assert "## Confidence intervals" in md
    assert ("| oracle: L pool − T pool (equal budget) | -1 | -25.0 | [-75.0, 0.0] | paired bootstrap | 0 / 1 | 1.000 "
            "| — | — | — |" in md)  # an oracle has no ties (test_ties.py: the votes' ties)


# ---------------------------------------------------------------- Wilcoxon signed-rank
def test_wilcoxon_by_hand():
    from eglr_harness.analysis.metrics.intervals import wilcoxon_signed_rank

    # d = 1, -2, 3 (and two zeros, which carry no sign): ranks 1, 2, 3; W+ = 1 + 3 = 4, W- = 2.
    # The 8 sign patterns give W+ = 0, 1, 2, 3, 3, 4, 5, 6: P(W+ >= 4) = 3/8, two-sided p = 3/4.
    result = wilcoxon_signed_rank([1, 0, -2, 3, 0.0])
    assert (result.w_plus, result.w_minus, result.n_effective, result.exact) == (4.0, 2.0, 3, True)
    assert result.p == pytest.approx(0.75)
    # ties share their average rank: |d| = 0.5, 0.5, 1 -> ranks 1.5, 1.5, 3; all positive: W+ = 6, the
    # one pattern of 8 as high (and the one as low): p = 2/8
    tied = wilcoxon_signed_rank([0.5, 0.5, 1.0])
    assert (tied.w_plus, tied.p) == (6.0, pytest.approx(0.25))
    assert wilcoxon_signed_rank([0.0, 0.0]).p == 1.0 and wilcoxon_signed_rank([0.0]).n_effective == 0
    with pytest.raises(ValueError, match="NaN"):
        wilcoxon_signed_rank([float("nan"), 1.0])


def test_wilcoxon_agrees_with_scipy():
    np = pytest.importorskip("numpy")
    stats = pytest.importorskip("scipy.stats")
    from eglr_harness.analysis.metrics.intervals import wilcoxon_signed_rank

    rng = np.random.default_rng(0)
    for n in (5, 12, 25):  # no ties: scipy's exact distribution
        d = rng.normal(0.3, 1.0, n)
        assert wilcoxon_signed_rank(d).p == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, rel=1e-9)
    # per-problem accuracy differences of 4 rollouts a problem: many ties and zeros; above the exact
    # limit the normal approximation with scipy's corrections
    d = rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5], size=400, p=[0.15, 0.2, 0.3, 0.2, 0.15])
    ours = wilcoxon_signed_rank(d, exact_max_n=0)
    theirs = stats.wilcoxon(d, zero_method="wilcox", method="approx", correction=True)
    assert not ours.exact and ours.p == pytest.approx(theirs.pvalue, rel=1e-9)
    assert min(ours.w_plus, ours.w_minus) == pytest.approx(theirs.statistic)
    # exact with ties (counting sign flips) is close to the approximation at this n (p about 0.04)
    assert 0.01 < theirs.pvalue < 0.1
    assert wilcoxon_signed_rank(d, exact_max_n=10_000).p == pytest.approx(theirs.pvalue, rel=0.01)


def test_wilcoxons_exact_limit_counts_the_nonzero_differences_only():
    """Issue 55 (a surviving mutant): 150 problems that differ among 300 (150 ties at zero) are under the exact limit
    of 200; a limit that counted the zeros took the normal approximation."""
    from eglr_harness.analysis.metrics.intervals import EXACT_WILCOXON_MAX_N, wilcoxon_signed_rank

    differences = [0.0] * 150 + [(-1) ** i * (i % 7 + 1) / 10 + 0.02 for i in range(150)]
    assert len(differences) > EXACT_WILCOXON_MAX_N
    test = wilcoxon_signed_rank(differences)
    assert test.n_effective == 150 and test.exact
    assert test == wilcoxon_signed_rank([d for d in differences if d])  # the zeros change nothing


def test_a_cell_with_several_rollouts_counts_them_in_B_and_in_the_random_rollouts_yardstick(full_run):
    """A seed pool (one sampled cell under ``seeds=``) holds several rollouts per problem in one cell: B counts its
    rollouts, and the yardstick draws as many rollouts from the grid's, each seed one of them (issue 59's T pool of
    ten seeded T = 0.7 rollouts was shown as B = 1 against one random cell; issue 68: the L pool's ten random cells
    were mostly draws holding that cell's ten samples, more than ten rollouts)."""
    grid = load_grid([full_run])
    seeded = (0, 0.5)  # the toy grid's cell B, in the T pool with C = (0, 1.0)
    by_cell = dict(grid.by_cell)
    by_cell[seeded] = {d: rows + tuple(dataclasses.replace(r, seed=7) for r in rows)  # a second seed's rollouts
                       for d, rows in grid.by_cell[seeded].items()}
    grid = dataclasses.replace(grid, by_cell=by_cell)
    ctx = compute_report(grid)
    assert rollouts_per_problem(grid, pool_cells(grid.cells, "T")) == 3  # 2 rollouts of B and 1 of C per problem
    rows = {r.quantity: r for r in interval_rows(ctx)}
    assert "SC T pool (B=3)" in rows and "oracle L pool (B=2)" in rows and "SC L ∪ T pool (B=5)" in rows
    # ten rollouts a problem: the nine cells and B's second seed, right where B is ({0, 1}). Rollouts solving each
    # problem: d0 A B B' D F (5), d1 B B' C E (4), d2 C D G (3), d3 F (1); b random ones miss d with C(10 - s, b) /
    # C(10, b): b = 2: (10 + 15 + 21 + 36) / 45; b = 3: (10 + 20 + 35 + 84) / 120; b = 5: (1 + 6 + 21 + 126) / 252
    yard = {q: r.estimate for q, r in rows.items() if "random grid" in q}
    assert yard == pytest.approx({
        "oracle: T pool − 3 random grid rollouts": 3 - (4 - 149 / 120),
        "oracle: L pool − 2 random grid rollouts": 2 - (4 - 82 / 45),
        "oracle: L ∪ T pool − 5 random grid rollouts": 3 - (4 - 154 / 252),
    })  # fmt: skip
    pools = {p: summarize_pool(grid, p, ctx.accuracy) for p in ("T", "L")}
    assert pools["T"].random_oracle == pytest.approx((4 - 149 / 120) / 4)
    assert pools["L"].random_oracle == pytest.approx((4 - 82 / 45) / 4)
