"""One vote rule: the report and the leaderboard vote on the tasks' equivalence clusters (``cluster``
in each logged rollout) and so reproduce ``maj@B``; runs without cluster ids fall back to exact
answer strings, and the report says so."""

from __future__ import annotations

import csv

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis import budget_curve, build_report, load_grid
from eglr_harness.analysis.load import RolloutRow, find_runs, vote_labels
from eglr_harness.core.votes import best_cell, majority, weighted_majority
from eglr_harness.leaderboard.table import cells_from_run

# One problem (gold 1/2), five L-pool rollouts that differ only in notation. The task clusters
# \frac12, 0.5 and 1/2 together (3 votes) against "3" (2 votes): maj@5 = 1. Voting on the strings,
# "3" wins 2 to 1: SC = 0.
ANSWERS = ["\\frac12", "3", "0.5", "3", "1/2"]
CLUSTERS = [0, 1, 0, 1, 0]
MAJ = 1.0


def _rollouts(with_clusters: bool) -> list[dict]:
    out = []
    for i, (answer, cluster) in enumerate(zip(ANSWERS, CLUSTERS)):
        row = {"repeat": i, "L": i + 1, "T": 0.0, "cycle": 0, "answer": answer, "correct": int(cluster == 0)}
        if with_clusters:
            row["cluster"] = cluster
        out.append(row)
    return out


def _run(path, *, with_clusters: bool, metrics: dict | None = None):
    lmeval_fakes.write_run(path, task="toy_eglr_sc", docs={0: _rollouts(with_clusters)}, metrics=metrics)
    return path


def _report_sc(run, out) -> tuple[float, str]:
    report = build_report([run], out, n_orders=2)
    pools = {row["pool"]: row for row in csv.DictReader(open(report / "pools.csv", newline=""))}
    return float(pools["L"]["sc"]), (report / "report.md").read_text()


def _leaderboard_sc(run):
    cells = cells_from_run(
        kind="eglr_sc",
        name="eglr_sc",
        benchmark="toy",
        task="toy_eglr_sc",
        files=find_runs(run)[0],
        record=None,
        command="lm_eval ...",
        run_dir=run,
    )
    sc = next(c for c in cells if c.method == "eglr_sc")
    return sc.accuracy, sc.source


def test_notation_variants_give_the_report_and_leaderboard_the_tasks_maj(tmp_path):
    run = _run(tmp_path / "run", with_clusters=True)  # no aggregated maj@5: the leaderboard votes on samples
    sc, text = _report_sc(run, tmp_path / "report")
    assert sc == MAJ
    assert "equivalence clusters (logged by the task)" in text
    assert _leaderboard_sc(run) == (MAJ, "samples (cluster votes)")
    grid = load_grid([run])
    assert budget_curve(grid, grid.cells).sc[-1] == MAJ


def test_the_leaderboard_prefers_the_tasks_aggregate_and_it_agrees(tmp_path):
    run = _run(tmp_path / "run", with_clusters=True, metrics={"maj@5": MAJ, "oracle@5": 1.0, "best_cfg_acc": 1.0})
    assert _leaderboard_sc(run) == (MAJ, "results: maj@5")
    assert _report_sc(run, tmp_path / "report")[0] == MAJ


def test_runs_without_cluster_ids_vote_on_strings_and_say_so(tmp_path):
    run = _run(tmp_path / "run", with_clusters=False)
    sc, text = _report_sc(run, tmp_path / "report")
    assert sc == 0.0  # "3" wins 2 to 1 on exact strings
    assert "exact string equality, as these runs log no" in text
    assert _leaderboard_sc(run) == (0.0, "samples (exact-string votes)")


def _row(answer, cluster):
    return RolloutRow(0, 0, 1, 0.0, 0, answer, int(answer != "3"), cluster)


def test_vote_labels_join_clusters_within_a_run_and_equal_strings_across_runs():
    rows = [
        (0, _row("3", 0)),
        (0, _row("\\frac12", 1)),
        (0, _row("0.5", 1)),  # same cluster as \frac12 in run 0
        (1, _row("3", 0)),  # same string as run 0's "3"
        (1, _row(None, None)),  # no answer: no vote
        (1, _row("1/2", 1)),  # run 1's cluster 1 shares no string with run 0's cluster 1
    ]
    assert vote_labels(rows) == [0, 1, 1, 0, None, 2]


def test_cluster_ids_of_different_runs_are_not_compared(tmp_path):
    # run a: "3" (cluster 0); run b: "7", "7" (cluster 0 there). Ids alone would put all three together.
    lmeval_fakes.write_run(tmp_path / "a", task="t", docs={0: [_doc_row(1, "3", 0, 1)]})
    lmeval_fakes.write_run(tmp_path / "b", task="t", docs={0: [_doc_row(2, "7", 0, 0), _doc_row(3, "7", 0, 0)]})
    grid = load_grid([tmp_path / "a", tmp_path / "b"])
    rows = grid.rollouts_in(grid.cells, 0)
    assert [r.vote for r in rows] == [0, 1, 1]
    assert budget_curve(grid, grid.cells).sc[-1] == 0.0  # "7" wins 2 to 1


def _doc_row(L, answer, cluster, correct):
    return {"repeat": 0, "L": L, "T": 0.0, "cycle": 0, "answer": answer, "correct": correct, "cluster": cluster}


@pytest.mark.parametrize(
    ("labels", "winner"),
    [
        ([0, 1, 1], 1),
        ([0, 1], 0),  # tie: the group whose first member came first
        ([1, 0, 0, 1], 0),
        ([None, None, 5], 2),  # no answer never votes
        ([None], None),
        ([], None),
    ],
)
def test_majority_is_the_first_member_of_the_largest_group(labels, winner):
    assert majority(labels) == winner


def test_best_cell_ties_go_to_the_first_cell_in_L_major_order():
    from eglr_harness.core.cell import Cell

    scores = {Cell(2, 0.0): 0.5, Cell(0, 0.7): 0.5, Cell(10, 0.0): 0.5, Cell(1, 0.0): 0.25}
    assert best_cell(scores) == Cell(0, 0.7)
    assert best_cell({}) is None


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), -1.0, True, "0.5"])
def test_a_weight_that_is_not_a_finite_number_at_least_0_is_refused(weight):
    """Issue 47: +Infinity was accepted, and won every vote it took part in."""
    with pytest.raises(ValueError, match=r"weight .* of label #1 is not allowed; allowed: finite numbers >= 0"):
        weighted_majority(["a", "b"], [1.0, weight])
