"""Best-of-N curves on a small synthetic pool with known answers and scores (no model):
eglr_harness/analysis/metrics/bestofn.py and its report section."""

from __future__ import annotations

import csv

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis.load import load_grid
from eglr_harness.analysis.metrics.bestofn import best_of_n, budgets
from eglr_harness.analysis.report import build_report

# A 2×3 cross: greedy (0,0), T pool (0,.5),(0,1), L pool (1,0),(2,0). Per doc: cell -> (answer, score).
# Gold of doc d is "g{d}".
CELLS = [(0, 0.0), (0, 0.5), (0, 1.0), (1, 0.0), (2, 0.0)]
DOCS = {
    # majority "w" (3 votes, wrong); the best-scored rollout is right; weighted: g0 1.6 vs w 1.2 -> right
    0: [("w", 0.4), ("g0", 0.9), ("w", 0.4), ("w", 0.4), ("g0", 0.7)],
    # majority right (g1 ×3); naive picks the wrong 0.95; weighted: g1 0.9 vs w 0.95 -> wrong
    1: [("g1", 0.3), ("w", 0.95), ("g1", 0.3), ("g1", 0.3), ("x", 0.1)],
    # nothing right
    2: [("a", 0.5), ("b", 0.6), ("c", 0.7), ("a", 0.1), (None, 0.99)],
    # the top score has no answer: it never answers; the next best (right) wins
    3: [(None, 0.99), ("g3", 0.8), ("q", 0.2), ("q", 0.2), ("r", 0.1)],
}


def _rollouts(doc, scored=True, steps=None):
    out = []
    for i, (cell, (answer, score)) in enumerate(zip(CELLS, DOCS[doc])):
        r = {"repeat": i, "L": cell[0], "T": cell[1], "cycle": 0, "answer": answer,
             "correct": int(answer == f"g{doc}")}
        if scored:
            s = steps or [score]
            r["verifier_scores"] = {"self:p_true": {"steps": s, "last": score, "min": min(s), "prod": score,
                                                    "model": "m"}}
        out.append(r)
    return out


@pytest.fixture
def scored_run(tmp_path):
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs={d: _rollouts(d) for d in DOCS})
    return tmp_path / "run"


def _at(result, pool, method, n):
    (p,) = [p for p in result.points if p.pool == pool and p.method == method and p.n == n]
    return p


def test_full_budget_selection_by_hand(scored_run):
    result = best_of_n(load_grid([scored_run]), n_orders=4, n_resamples=200)
    assert result.verifiers == {"self:p_true": ("m", ("last",), 4)}
    # the whole cross (5 cells): naive solves 0 and 3; weighted 0 and 3 (doc 3: g3 0.8 vs q 0.4); majority 1
    assert _at(result, "LxT", "naive", 5).accuracy == pytest.approx(2 / 4)
    assert _at(result, "LxT", "weighted", 5).accuracy == pytest.approx(2 / 4)
    assert _at(result, "LxT", "majority", 5).accuracy == pytest.approx(1 / 4)
    # L pool (1,0),(2,0): doc 0 naive g0 0.7 right, weighted w .4 vs g0 .7 right; doc 1 g1 .3 vs x .1 right
    assert _at(result, "L", "naive", 2).accuracy == pytest.approx(2 / 4)
    # N = 1: every method answers with the one rollout; the mean over orders of a pool of two cells
    for method in ("naive", "weighted", "majority"):
        assert _at(result, "L", method, 1).accuracy == _at(result, "L", "majority", 1).accuracy
    tests = {t.comparison: t for t in result.tests}
    t = tests["LxT: naive − majority"]
    assert (t.estimate, t.only_a, t.only_b) == (1, 2, 1)
    assert 0 <= t.sign_p <= 1 and t.low <= t.estimate / t.docs <= t.high
    assert "naive: L pool − T pool (equal budget)" in tests
    assert "naive: L pool − 2 random grid cells" in tests


def test_unscored_documents_are_left_out(tmp_path):
    docs = {d: _rollouts(d, scored=d < 2) for d in DOCS}
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs=docs)
    result = best_of_n(load_grid([tmp_path / "run"]), n_orders=2, n_resamples=100)
    assert result.verifiers["self:p_true"][2] == 2
    assert _at(result, "LxT", "naive", 5).accuracy == pytest.approx(1 / 2)  # doc 0 of docs 0, 1


def test_aggregations_shown_only_when_they_differ(tmp_path):
    docs = {d: _rollouts(d, steps=[0.5, 0.05]) for d in DOCS}  # min differs from last
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs=docs)
    result = best_of_n(load_grid([tmp_path / "run"]), n_orders=2, n_resamples=100)
    assert result.verifiers["self:p_true"][1] == ("last", "min")


def test_budgets():
    assert budgets(10) == [1, 2, 4, 8, 10] and budgets(8) == [1, 2, 4, 8] and budgets(1) == [1]


def test_report_writes_the_table_and_figure(scored_run, tmp_path):
    out = build_report([scored_run], tmp_path / "report", sections=["runs", "bestofn"], n_orders=3)
    rows = list(csv.DictReader(open(out / "bestofn.csv")))
    assert {r["pool"] for r in rows} == {"T", "L", "LuT", "LxT", "random"}
    assert (out / "bestofn_self_p_true_last.png").stat().st_size > 1000
    text = (out / "report.md").read_text()
    assert "## Best-of-N with verifiers" in text and "LxT: naive − majority" in text


def test_report_without_scores_has_no_section(tmp_path):
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs={d: _rollouts(d, scored=False) for d in DOCS})
    out = build_report([tmp_path / "run"], tmp_path / "report", sections=["runs", "bestofn"])
    assert "Best-of-N" not in (out / "report.md").read_text() and not (out / "bestofn.csv").exists()


def test_malformed_scores_name_the_file(tmp_path):
    docs = {d: _rollouts(d) for d in DOCS}
    docs[1][2]["verifier_scores"] = {"self:p_true": {"last": "high"}}
    lmeval_fakes.write_run(tmp_path / "run", task="toy_eglr_sc", docs=docs)
    with pytest.raises(ValueError, match="doc 1 rollout #2"):
        best_of_n(load_grid([tmp_path / "run"]))


def test_two_verifiers_in_folders_of_one_name_get_two_figures():
    """Issue 47: `qwen-prm:/a/ckpt` and `qwen-prm:/b/ckpt` were both drawn to bestofn_ckpt_min.png."""
    from eglr_harness.analysis.sections.bestofn import _slug

    assert _slug("qwen-prm:/a/ckpt", "min") != _slug("qwen-prm:/b/ckpt", "min")
    assert _slug("qwen-prm:/a/ckpt", "min").startswith("qwen_prm_ckpt_")
    assert _slug("self:p_true", "last") == "self_p_true_last"  # the committed reports' names stay
