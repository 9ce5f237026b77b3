"""Metrics on the hand-made 3×3 grid of lmeval_fakes.GRID; every expected number is worked out
by hand in the comments (documents 0..3, gold of doc d = "g{d}").

Solved sets:  A(0,0){0}  B(0,.5){0,1}  C(0,1){1,2}
              D(1,0){0,2} E(1,.5){1}   F(1,1){0,3}
              G(2,0){2}  H(2,.5){}     I(2,1){}
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from eglr_harness.analysis import (

    budget_curve, cell_accuracy, cumulative_oracle, disagreement_slices, exclusive_counts, expected_random_oracle,

    load_grid, marginal_over_greedy, oracle_corners, pool_cells, random_order_curve, sc_solved, solved_sets,

    summarize_pool, vote_is_correct,

)
from eglr_harness.analysis.load import RolloutRow
from eglr_harness.analysis.metrics.accuracy import rollout_solved_sets
from eglr_harness.analysis.report import compute_report
from eglr_harness.core.votes import majority

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

# the cells A..I of the 3x3 grid, row by row (I is a cell's name, not an ambiguous l/I/1)
A, B, C, D, E, F, G, H, I = (  # noqa: E741
    (0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0), (1, 0.5), (1, 1.0), (2, 0.0), (2, 0.5), (2, 1.0))


@pytest.fixture
def grid(full_run):
    return load_grid([full_run])


def test_cell_accuracy_counts_per_cell(grid):
    acc = cell_accuracy(grid)
    # correct rollouts of 4: A1 B2 C2 D2 E1 F2 G1 H0 I0
    assert {c: a.correct for c, a in acc.items()} == {A: 1, B: 2, C: 2, D: 2, E: 1, F: 2, G: 1, H: 0, I: 0}
    assert all(a.rollouts == 4 and a.docs == 4 for a in acc.values())
    assert acc[B].accuracy == 0.5 and acc[H].accuracy == 0.0


def test_solved_sets(grid):
    assert solved_sets(grid) == {A: {0}, B: {0, 1}, C: {1, 2}, D: {0, 2}, E: {1}, F: {0, 3}, G: {2}, H: set(), I: set()}


def test_cumulative_oracle_and_corners(grid):
    solved = solved_sets(grid)
    cum = cumulative_oracle(solved, grid.L_values, grid.T_values)
    # (0,0)=|A|=1; (0,.5)=|A∪B|=2; (0,1)=|A∪B∪C|=3; (1,0)=|A∪D|=2; (1,.5)=|{0,1,2}|=3; (1,1)=4;
    # (2,0)=|A∪D∪G|=2; (2,.5)=3; (2,1)=4
    assert cum == {A: 1, B: 2, C: 3, D: 2, E: 3, F: 4, G: 2, H: 3, I: 4}
    # greedy=A; T-only = row L=0 = A∪B∪C; L-only = column T=0 = A∪D∪G; joint = all
    assert oracle_corners(solved) == {"greedy": 1, "T-only": 3, "L-only": 2, "joint": 4}


def test_pools_table5(grid):
    acc = cell_accuracy(grid)
    assert pool_cells(grid.cells, "T") == [B, C]
    assert pool_cells(grid.cells, "L") == [D, G]
    T, L, LxT = (summarize_pool(grid, p, acc) for p in ("T", "L", "LxT"))
    # T pool [B, C]: best B (tie with C, first in pool order) 2/4. SC: d0 g0|w1 tie -> g0 ok; d1 g1,g1 ok;
    # d2 None,g2 ok; d3 no vote -> 3/4. Oracle B∪C = {0,1,2} -> 3/4.
    assert (T.best_cell, T.best, T.sc, T.oracle, T.greedy) == (B, 0.5, 0.75, 0.75, 0.25)
    # L pool [D, G]: best D 2/4; SC d0 g0|w1 tie -> g0 ok, d1 z,z wrong, d2 g2,g2 ok -> 2/4; oracle {0,2}.
    assert (L.best_cell, L.best, L.sc, L.oracle) == (D, 0.5, 0.5, 0.5)
    # L×T (9 cells, L-major): d0 g0×4 vs w1×4 tie -> g0 (first at A) ok; d1 z×4 beats g1×3; d2 g2×3 beats q×2;
    # d3 g3 vs "7" tie -> g3 (F before H) ok -> SC {0,2,3} = 3/4; oracle 4/4.
    assert (LxT.configs, LxT.best_cell, LxT.sc, LxT.oracle, LxT.sc_solved, LxT.oracle_solved) == (9, B, 0.75, 1.0, 3, 4)


def test_union_pool_is_the_t_and_l_pools_together(grid):
    acc = cell_accuracy(grid)
    assert pool_cells(grid.cells, "LuT") == [B, C, D, G]
    LuT = summarize_pool(grid, "LuT", acc)
    # d0 g0(B) w1(C) g0(D) w1(G): 2-2 tie -> g0 (B first) ok; d1 g1,g1 vs z,z tie -> g1 ok; d2 None,g2,g2,g2 ok;
    # d3 no vote. SC 3/4; oracle {0,1} ∪ {1,2} ∪ {0,2} ∪ {2} = 3/4; best B (first of the 2/4 cells).
    assert (LuT.configs, LuT.best_cell, LuT.sc, LuT.oracle) == (4, B, 0.75, 0.75)


def test_expected_random_oracle_by_hand(grid):
    solved = solved_sets(grid)
    cells = list(grid.cells)
    # cells solving each doc: d0 A,B,D,F (4); d1 B,C,E (3); d2 C,D,G (3); d3 F (1); n = 9.
    # b=2: misses C(5,2)/36 + C(6,2)/36 + C(6,2)/36 + C(8,2)/36 = 68/36 -> 4 - 68/36.
    assert expected_random_oracle(solved, cells, 2) == pytest.approx(4 - 68 / 36)
    # b=4: C(5,4)+C(6,4)+C(6,4)+C(8,4) = 5+15+15+70 = 105 of C(9,4) = 126.
    assert expected_random_oracle(solved, cells, 4) == pytest.approx(4 - 105 / 126)
    assert expected_random_oracle(solved, cells, 9) == 4 and expected_random_oracle(solved, cells, 0) == 0
    # the T pool (B=2) against 2 random cells of the grid, as a fraction of the 4 documents
    assert summarize_pool(grid, "T", cell_accuracy(grid)).random_oracle == pytest.approx((4 - 68 / 36) / 4)


def test_expected_random_oracle_equals_the_mean_over_every_subset(grid):
    solved = solved_sets(grid)
    cells = list(grid.cells)
    for b in range(len(cells) + 1):
        subsets = list(itertools.combinations(cells, b))
        mean = sum(len(set().union(*(solved[c] for c in s))) for s in subsets) / len(subsets)
        assert expected_random_oracle(solved, cells, b) == pytest.approx(mean)


def test_expected_random_oracle_rejects_a_budget_beyond_the_cells(grid):
    with pytest.raises(ValueError, match=r"`budget`=10 .*\[0, 9\]"):
        expected_random_oracle(solved_sets(grid), list(grid.cells), 10)


def test_sc_tie_break_is_earliest_first_occurrence(grid):
    # L pool: doc 0 is a 1-1 tie g0 (D, first) vs w1 (G). Earliest-first keeps doc 0; a last-first rule would not.
    assert sc_solved(grid, [D, G]) == {0, 2}
    assert sc_solved(grid, [G, D]) == {2}


def test_disagreement_slices(grid):
    slices = disagreement_slices(solved_sets(grid))
    # L-vs-L over [D, G]: |{0,2} △ {2}| = 1
    assert slices["L-vs-L"].values == ((0, 1), (1, 0))
    assert (slices["L-vs-L"].mean, slices["L-vs-L"].max, slices["L-vs-L"].pairs) == (1, 1, 1)
    # T-vs-T over [B, C]: |{0,1} △ {1,2}| = 2
    assert (slices["T-vs-T"].mean, slices["T-vs-T"].max) == (2, 2)
    # T-vs-L rows [B, C], cols [D, G]: B-D {1,2}=2, B-G {0,1,2}=3, C-D {0,1}=2, C-G {1}=1 -> mean 8/4, max 3
    tl = slices["T-vs-L"]
    assert (tl.rows, tl.cols, tl.values) == ((B, C), (D, G), ((2, 3), (2, 1)))
    assert (tl.mean, tl.max, tl.pairs) == (2.0, 3, 4)


def test_exclusive_and_marginal(grid):
    solved = solved_sets(grid)
    # doc 3 is solved only by F; docs 0,1,2 by 4, 3 and 3 cells.
    assert exclusive_counts(solved) == {A: 0, B: 0, C: 0, D: 0, E: 0, F: 1, G: 0, H: 0, I: 0}
    # minus greedy's {0}: B{1} C{1,2} D{2} E{1} F{3} G{2}
    assert marginal_over_greedy(solved) == {A: 0, B: 1, C: 2, D: 1, E: 1, F: 1, G: 1, H: 0, I: 0}
    assert marginal_over_greedy({k: v for k, v in solved.items() if k != A}) is None


def test_budget_curve_stated_order(grid):
    curve = budget_curve(grid, pool_cells(grid.cells, "LxT"))
    # b=1 A: d0. b=2 +B: d0,d1. b=3 +C: d2 too. b=6 +F: d3 (g3). b=8 +H: ties all resolve to gold.
    # b=9 +I: d1 z×4 > g1×3 -> 3/4.
    assert [round(4 * x) for x in curve.sc] == [1, 2, 3, 3, 3, 4, 4, 4, 3]
    assert [round(4 * x) for x in curve.oracle] == [1, 2, 3, 3, 3, 4, 4, 4, 4]
    assert curve.budgets == tuple(range(1, 10))


def test_budget_curve_at_full_budget_equals_pool_sc(grid):
    acc = cell_accuracy(grid)
    for pool in ("T", "L", "LuT", "LxT"):
        cells = pool_cells(grid.cells, pool)
        summary = summarize_pool(grid, pool, acc)
        curve = budget_curve(grid, cells)
        assert (curve.sc[-1], curve.oracle[-1]) == (summary.sc, summary.oracle)


def test_random_order_curve_is_the_mean_of_seeded_shuffles(grid):
    cells = pool_cells(grid.cells, "LxT")
    rng = random.Random(7)
    orders = []
    for _ in range(3):
        order = list(cells)
        rng.shuffle(order)
        orders.append(order)
    expected = [sum(budget_curve(grid, o).sc[b] for o in orders) / 3 for b in range(9)]
    got = random_order_curve(grid, cells, n_orders=3, seed=7)
    assert got.sc == pytest.approx(expected)
    assert got.oracle[-1] == 1.0  # every order ends with all cells
    with pytest.raises(ValueError, match="n_orders"):
        random_order_curve(grid, cells, n_orders=0)


@pytest.mark.parametrize(
    ("answers", "winner"),
    [
        (["3", "4", "4"], "4"),
        (["3", "4"], "3"),  # tie: earliest first occurrence
        (["4", "3", "3", "4"], "4"),  # tie 2-2: "4" seen first
        ([None, None, "5"], "5"),  # null never votes
        ([None, None], None),
        ([], None),
    ],
)
def test_majority(answers, winner):
    index = majority(answers)
    assert (None if index is None else answers[index]) == winner


def test_vote_correct_uses_winner_and_null_never_wins():
    rows = [RolloutRow(0, i, 1, 0.0, 0, a, c) for i, (a, c) in enumerate([(None, 0), (None, 0), ("7", 1)])]
    assert vote_is_correct(rows)
    assert not vote_is_correct(rows[:2])


def test_exclusive_counts_on_literal_sets():
    # doc 2 is shared by a and b, so it is nobody's exclusive; docs 1, 3, 4 are.
    solved = {(1, 0.0): frozenset({1, 2}), (2, 0.0): frozenset({2, 3}), (3, 0.0): frozenset({4}), (4, 0.0): frozenset()}
    assert exclusive_counts(solved) == {(1, 0.0): 1, (2, 0.0): 1, (3, 0.0): 1, (4, 0.0): 0}


def test_pools_exclude_greedy_and_corners_add_it():
    # eglr-method.md §5: T-only = L=0, T in 0.1..1.0; the grid's corners are cumulative, so they hold (0, 0).
    solved = {(0, 0.0): frozenset({5}), (0, 0.5): frozenset({1}), (1, 0.0): frozenset({2}), (1, 0.5): frozenset({3})}
    assert pool_cells(list(solved), "T") == [(0, 0.5)] and pool_cells(list(solved), "L") == [(1, 0.0)]
    assert pool_cells(list(solved), "LuT") == [(0, 0.5), (1, 0.0)]
    assert oracle_corners(solved) == {"greedy": 1, "T-only": 2, "L-only": 2, "joint": 4}
    assert oracle_corners({(0, 0.5): frozenset({1})}) == {"greedy": None, "T-only": 1, "L-only": None, "joint": 1}


def test_disagreement_is_rollout_against_rollout_where_a_cell_holds_several_seeds(grid):
    """A sampled cell under two seeds is two rows and columns of the slices, not the oracle of its seeds (issue 68:
    the Qwen report set ten T = 0.7 samples' oracle against single L rollouts). B = (0, .5) gets a second seed whose
    rollouts solve {2, 3} (the first seed's: {0, 1}, as before)."""
    by_cell = dict(grid.by_cell)
    by_cell[B] = {d: rows + tuple(dataclasses.replace(r, seed=7, correct=int(d in {2, 3})) for r in rows)
                  for d, rows in grid.by_cell[B].items()}
    seeded = dataclasses.replace(grid, by_cell=by_cell)
    slots = rollout_solved_sets(seeded)
    first, second = [s for s in slots if s.cell == B]
    assert (slots[first], slots[second]) == ({2, 3}, {0, 1})  # seed 7 sorts before the run's own seed
    assert first.label == "L=0,T=0.5,seed=7" and second.label == f"L=0,T=0.5,seed={second.seed}"
    slices = disagreement_slices(slots)
    tl = slices["T-vs-L"]
    # rows B(seed 7){2,3}, B{0,1}, C{1,2} x cols D{0,2}, G{2}: {0,3} {3} / {1,2} {0,1,2} / {0,1} {1}
    assert (tl.rows, tl.cols, tl.values) == ((first, second, *[s for s in slots if s.cell == C]),
                                             tuple(s for s in slots if s.cell in (D, G)), ((2, 1), (2, 3), (2, 1)))
    assert (tl.mean, tl.max, tl.pairs) == (pytest.approx(11 / 6), 3, 6)
    # T-vs-T over three rollouts: B' vs B {0,1,2,3}, B' vs C {1,3}, B vs C {0,2}
    assert (slices["T-vs-T"].mean, slices["T-vs-T"].max, slices["T-vs-T"].pairs) == (pytest.approx(8 / 3), 4, 3)
    # by cell, B's two seeds would be one oracle {0,1,2,3}: T-vs-L B-D 2, B-G 3, C-D 2, C-G 1 -> 2.0, not 11/6
    assert disagreement_slices(solved_sets(seeded))["T-vs-L"].mean == 2.0
    # and the report's section compares rollouts
    report = compute_report(seeded, sections=("disagreement",)).results["disagreement"]
    assert (report["T-vs-L"].mean, report["T-vs-T"].pairs) == (pytest.approx(11 / 6), 3)


def test_a_grid_of_one_rollout_per_cell_has_one_slot_per_cell_labelled_as_the_cell(grid):
    slots = rollout_solved_sets(grid)
    assert [(s.cell, s.label) for s in slots] == [(c, c.label) for c in grid.cells]
    assert dict(zip(grid.cells, slots.values())) == solved_sets(grid)
