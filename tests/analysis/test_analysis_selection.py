"""Selection by signals (analysis/sections/selection.py: the aggregators and their section) on synthetic runs."""

from __future__ import annotations

import json

import pytest
from lm_eval.utils import hash_string

from helpers import lmeval_fakes
from eglr_harness.analysis import build_report, load_grid
from eglr_harness.analysis.metrics.accuracy import sc_solved
from eglr_harness.analysis.sections.selection import half_of, l_agreement, selection
from eglr_harness.analysis.load import RolloutRow

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

CELLS = [(1, 0.1), (2, 0.2), (3, 0.3)]  # one rollout per T: no L-agreement


def _doc_half(d: int) -> int:
    doc = {"problem": f"problem {d}", "answer": f"g{d}"}  # as lmeval_fakes writes it
    return half_of(hash_string(json.dumps(doc, indent=2, ensure_ascii=False)))


def _signal_run(path, docs=range(24), *, flip_half0=True):
    """Per problem: the right answer in the middle rollout, two wrong ones, all different (the vote
    picks the first, wrong). On half 1 the right rollout is the most confident; on half 0 (when
    ``flip_half0``) the least."""
    per_doc = {}
    for d in docs:
        right_conf = -3.0 if flip_half0 and _doc_half(d) == 0 else -0.1
        answers, confs = [f"w{d}a", f"g{d}", f"w{d}b"], [-1.0, right_conf, -2.0]
        per_doc[d] = [
            {"repeat": i, "L": L, "T": T, "cycle": 0, "answer": a, "correct": int(a == f"g{d}"), "cluster": i,
             "signals": {"mean_logprob": c, "mean_entropy": -c}}
            for i, ((L, T), a, c) in enumerate(zip(CELLS, answers, confs))
        ]
    lmeval_fakes.write_run(path, task="toy_eglr_sc", docs=per_doc)
    return load_grid([path])


def _agg(sel, name):
    return next(a for a in sel.aggregators if a.name == name)


def test_both_halves_are_used():
    assert {_doc_half(d) for d in range(24)} == {0, 1}


def test_signals_are_read_and_aggregators_follow_them(tmp_path):
    grid = _signal_run(tmp_path / "run", flip_half0=False)
    sel = selection(grid, grid.cells, "all", doc_hashes=grid.parts[0].samples.doc_hashes)
    assert sel.signals == ("mean_entropy", "mean_logprob")
    assert _agg(sel, "majority vote").accuracy == 0  # three different answers: the first (wrong) wins
    for name in ("DeepConf weighted vote", "DeepConf top-10% vote", "best by mean_logprob", "best by mean_entropy",
                 "fitted combination: best rollout", "best single signal (fit half)"):
        assert _agg(sel, name).accuracy == 1, name
    assert sel.vs_majority["best by mean_logprob"][0] == 1.0
    assert sel.gap_recovered(_agg(sel, "majority vote")) is None  # no greedy cell


def test_fitted_choice_never_sees_the_half_it_is_scored_on(tmp_path):
    # The signal points one way on half 1 and the other way on half 0: a fit on the other half
    # is wrong on every problem, where a fit that saw the scored problems would get some right.
    grid = _signal_run(tmp_path / "run")
    sel = selection(grid, grid.cells, "all", doc_hashes=grid.parts[0].samples.doc_hashes)
    n_half1 = sum(_doc_half(d) == 1 for d in grid.docs)
    assert _agg(sel, "best by mean_logprob").solved == tuple(int(_doc_half(d) == 1) for d in grid.docs)
    assert sum(_agg(sel, "best by mean_logprob").solved) == n_half1
    assert sum(_agg(sel, "fitted combination: best rollout").solved) == 0
    assert sum(_agg(sel, "best single signal (fit half)").solved) <= n_half1


def test_l_agreement():
    rows = [RolloutRow(0, i, L, T, 0, a, 0, vote=a) for i, (L, T, a) in
            enumerate([(1, 0.0, "x"), (2, 0.0, "x"), (3, 0.0, "y"), (1, 0.5, "x"), (2, 0.5, None)])]
    assert l_agreement(rows) == [0.5, 0.5, 0.0, 0.0, None]


def test_report_without_signals_says_so_and_matches_the_vote(full_run, tmp_path):
    out = build_report([full_run], tmp_path / "rep", sections=("runs", "selection"))
    text = (out / "report.md").read_text()
    assert "No signals recorded" in text and "best by l_agreement" in text
    grid = load_grid([full_run])
    from eglr_harness.analysis.metrics.accuracy import pool_cells

    sel = selection(grid, pool_cells(grid.cells, "LxT"), "LxT")
    majority = _agg(sel, "majority vote")
    assert {d for d, s in zip(grid.docs, majority.solved) if s} == sc_solved(grid, pool_cells(grid.cells, "LxT"))
    assert sum(sel.oracle) == 4 and sum(sel.greedy) == 1
    rows = (out / "selection.csv").read_text().splitlines()
    assert rows[0].startswith("pool,aggregator,solved") and any(",majority vote," in r for r in rows)


def test_report_with_signals_has_deepconf_rows(tmp_path):
    _signal_run(tmp_path / "run", flip_half0=False)
    out = build_report([tmp_path / "run"], tmp_path / "rep", sections=("selection",))
    text = (out / "report.md").read_text()
    assert "No signals recorded" not in text and "DeepConf weighted vote" in text


def test_unknown_section_is_refused(full_run, tmp_path):
    with pytest.raises(ValueError, match="do not exist"):
        build_report([full_run], tmp_path / "rep", sections=("nope",))
