"""Ties of the majority vote (issue 68, item 4): every vote figure says how many of its problems were ties, and every
paired difference with a vote on a side carries its worst and best case (eglr_harness/analysis/metrics/ties.py; the
pools, intervals and selection sections; the leaderboard's notes). On a hand-made grid, then on the committed
Qwen2.5-Coder GSM8K-100 runs, whose recount found the ties."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from helpers import lmeval_fakes

from eglr_harness.analysis import load_grid, pool_cells, sc_solved, vote_is_correct
from eglr_harness.analysis.load import find_runs
from eglr_harness.analysis.sections.selection import selection
from eglr_harness.analysis.metrics.ties import pool_vote
from eglr_harness.analysis.report import build_report
from eglr_harness.analysis.sections.intervals import interval_rows
from eglr_harness.analysis.sections.pools import summarize_pool
from eglr_harness.analysis.sections.section import ReportContext
from eglr_harness.leaderboard.table import cells_from_run, render_markdown

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

# cell -> the answers of docs 0..3 (gold of doc d: "g{d}"; None: no answer). Greedy solves {0, 2}.
# L pool (1,0) (2,0): doc 0 ties w / g0 (w first), doc 1 ties g1 / w (g1 first), doc 2 g2 twice, doc 3 no vote.
# T pool (0,.5) (0,1): doc 0 g0 twice, doc 1 w twice, doc 2 ties q / g2 (q first), doc 3 ties 7 / 8 (both wrong).
TIES = {
    (0, 0.0): ["g0", "x", "g2", None],
    (0, 0.5): ["g0", "w", "q", "7"],
    (0, 1.0): ["g0", "w", "g2", "8"],
    (1, 0.0): ["w", "g1", "g2", None],
    (2, 0.0): ["g0", "w", "g2", None],
}
L_POOL = [(1, 0.0), (2, 0.0)]


@pytest.fixture
def ties_grid(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "run", list(TIES), grid=TIES)
    return load_grid([tmp_path / "run"])


def test_a_pools_vote_under_the_three_tie_rules(ties_grid):
    L, T, LuT = (pool_vote(ties_grid, pool_cells(ties_grid.cells, p)) for p in ("L", "T", "LuT"))
    assert (set(L), set(L.worst), set(L.best), set(L.tied)) == ({1, 2}, {2}, {0, 1, 2}, {0, 1})
    assert (set(T), set(T.worst), set(T.best), set(T.tied)) == ({0}, {0}, {0, 2}, {2, 3})
    # L ∪ T in pool order (T pool first): doc 3's 7 / 8 tie is wrong every way, so it moves nothing
    assert (set(LuT), set(LuT.worst), set(LuT.best), set(LuT.tied)) == ({0, 2}, {0, 2}, {0, 2}, {3})
    for p in ("L", "T", "LuT", "LxT"):  # first-seen is the report's SC, the one rule
        cells = pool_cells(ties_grid.cells, p)
        assert pool_vote(ties_grid, cells) == sc_solved(ties_grid, cells)
        # one problem's vote (budget curves, resampling) is the same rule, problem by problem
        assert {d for d in ties_grid.docs if vote_is_correct(ties_grid.rollouts_in(cells, d))} == set(sc_solved(
            ties_grid, cells))


def test_the_pools_table_counts_the_ties_and_the_range(ties_grid):
    ctx = ReportContext(ties_grid)
    L = summarize_pool(ties_grid, "L", ctx.accuracy)
    assert (L.sc_solved, L.sc_ties, L.sc_worst, L.sc_best) == (2, 2, 1, 3)


def test_paired_differences_carry_their_worst_and_best_case(ties_grid):
    rows = {r.quantity: r for r in interval_rows(ReportContext(ties_grid), n_resamples=200)}
    share = rows["SC L pool (B=2)"]
    assert (share.estimate, share.ties_a, share.against_a.estimate, share.for_a.estimate) == (2, 2, 1, 3)
    # SC_L − greedy: first-seen 0 (1 / 1); against L: {2} − {0, 2} = −1 (0 / 1); for L: {0, 1, 2} − {0, 2} = +1
    row = rows["SC: L pool − greedy"]
    assert (row.estimate, row.only_a, row.only_b, row.ties_a, row.ties_b) == (0, 1, 1, 2, None)
    against, for_a = row.against_a, row.for_a
    assert (against.estimate, against.only_a, against.only_b, against.sign_p) == (-1, 0, 1, 1.0)
    assert (for_a.estimate, for_a.only_a, for_a.only_b, for_a.sign_p) == (1, 1, 0, 1.0)
    # SC_L − SC_T: against L takes L's worst and T's best, for L the reverse
    row = rows["SC: L pool − T pool (equal budget)"]
    assert (row.estimate, row.ties_a, row.ties_b) == (1, 2, 2)
    assert (row.against_a.estimate, row.against_a.only_a, row.against_a.only_b) == (-1, 0, 1)
    assert (row.for_a.estimate, row.for_a.only_a, row.for_a.only_b, row.for_a.sign_p) == (2, 2, 0, 0.5)
    # per problem the cases bound the row, and on the same draws so do their intervals
    assert row.against_a.low <= row.low <= row.for_a.low and row.against_a.high <= row.high <= row.for_a.high
    # ties that move nothing: both cases are the row itself, on the same bootstrap draws
    row = rows["SC: L ∪ T pool − greedy"]
    assert row.ties_a == 1
    for case in (row.against_a, row.for_a):
        assert (case.estimate, case.low, case.high, case.sign_p) == (row.estimate, row.low, row.high, row.sign_p)
    assert rows["oracle: L pool − T pool (equal budget)"].against_a is None  # no vote, no ties


def test_the_report_prints_the_ties(ties_grid, tmp_path):
    report = build_report([tmp_path / "run"], tmp_path / "report", n_orders=2, sections=["pools", "intervals"])
    text = (report / "report.md").read_text()
    assert "| SC ties: tied problems (SC with ties against … for it) | 2 (1 … 2) | 2 (1 … 3) |" in text
    assert "| SC: L pool − greedy | 0 |" in text and "| 2 / — | -1 [" in text
    with open(report / "intervals.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["quantity"] == "SC: L pool − greedy")
    assert (row["ties_a"], row["ties_b"], row["against_a_estimate"], row["for_a_estimate"]) == ("2", "", "-1", "1")
    with open(report / "pools.csv", newline="") as f:
        pool = next(r for r in csv.DictReader(f) if r["pool"] == "L")
    assert (pool["sc_ties"], pool["sc_worst_solved"], pool["sc_best_solved"]) == ("2", "1", "3")


def test_the_selections_majority_vote_says_its_ties(ties_grid):
    sel = selection(ties_grid, L_POOL, "L")
    assert sel.aggregators[0].note == ("ties: 2 of 4 problems (first-seen in pool order); solved 1 … 3 with every tie "
                                       "against … for the vote")


def test_the_leaderboard_notes_the_ties_of_eglr_sc(tmp_path):
    run = tmp_path / "sc"
    lmeval_fakes.write_grid_run(run, L_POOL, grid=TIES, task="toy_eglr_sc")
    cells = cells_from_run(kind="eglr_sc", name="eglr_sc", benchmark="toy", task="toy_eglr_sc",
                           files=find_runs(run)[0], record=None, command="lm_eval ...", run_dir=run)
    text = render_markdown(cells, ["toy"], model="m")
    assert ("- EGLR-SC_L (B=2), toy: 2 of 4 votes are ties (two answer groups or more share the largest count; the "
            "group seen first in pool order wins); with every tie against … for the vote it solves 1 … 3 (25.0 … "
            "75.0 %).") in text


# ---- the committed runs the outside recount read ---------------------------------------------------------------------

QWEN = Path(__file__).resolve().parents[2] / "results" / "qwen2.5-coder-1.5b-instruct" / "gsm8k_sc"


@pytest.fixture(scope="module")
def qwen_grid():
    runs = [QWEN / name for name in ("sc_L_100", "sc_T_100", "greedy_100")]
    if not all(run.is_dir() for run in runs):
        pytest.skip(f"the committed Qwen runs are not in this checkout ({QWEN})")
    return load_grid(runs)


def test_the_committed_qwen_runs_have_the_ties_the_recount_found(qwen_grid):
    T = pool_vote(qwen_grid, pool_cells(qwen_grid.cells, "T"))
    assert sorted(T.tied) == [3, 4, 8, 19, 39, 41, 46, 58, 62, 63, 64, 93, 97]
    assert (len(T), len(T.worst), len(T.best)) == (66, 63, 68)
    L = pool_vote(qwen_grid, pool_cells(qwen_grid.cells, "L"))
    assert (len(L.tied), len(L), len(L.worst), len(L.best)) == (3, 59, 59, 61)
    rows = {r.quantity: r for r in interval_rows(ReportContext(qwen_grid))}
    row = rows["SC: T pool − greedy"]
    assert (row.estimate, round(row.sign_p, 3)) == (9, 0.035)
    against = row.against_a  # worst case: +6, CI −1 … +13, p 0.18
    assert (against.estimate, round(against.low * 100), round(against.high * 100)) == (6, -1, 13)
    assert round(against.sign_p, 2) == 0.18
    # SC_LxT's two ties move nothing against it: that case is the row itself, on the same draws (here 20 of them)
    row = next(r for r in interval_rows(ReportContext(qwen_grid), n_resamples=20)
               if r.quantity == "SC: L×T pool − greedy")  # fmt: skip
    assert (row.ties_a, row.against_a.low, row.against_a.high) == (2, row.low, row.high)


def test_the_union_pool_lists_the_T_pool_first_and_that_decides_its_ties(qwen_grid):
    L, T = pool_cells(qwen_grid.cells, "L"), pool_cells(qwen_grid.cells, "T")
    assert pool_cells(qwen_grid.cells, "LuT") == T + L  # L-major: L = 0 first
    assert (len(pool_vote(qwen_grid, T + L)), len(pool_vote(qwen_grid, L + T))) == (65, 64)


def test_a_non_numeric_answer_votes_and_can_win_on_gsm8k(qwen_grid):
    """tasks/README.md's rule, its worked example: doc 23's five "L-8" / "L - 8" outvote four "8"s, no tie."""
    rows = qwen_grid.rollouts_in(pool_cells(qwen_grid.cells, "T"), 23)
    answers = [r.answer.replace(" ", "") for r in rows]
    assert sorted(answers) == ["0", "8", "8", "8", "8", "L-8", "L-8", "L-8", "L-8", "L-8"]
    vote = pool_vote(qwen_grid, pool_cells(qwen_grid.cells, "T"))
    assert 23 not in vote.tied and 23 not in vote.best  # "L - 8" wins outright, and the vote is wrong
