"""The report's accuracy-against-compute section: each method's compute per problem relative to greedy worked out
here from the fixture runs' own accounting, its accuracy and Wilson interval, the PNG and the CSV, and a method the
runs do not support left out (never drawn at zero)."""

from __future__ import annotations

import csv

import pytest

from helpers import lmeval_fakes
from eglr_harness.analysis import build_report
from eglr_harness.analysis.load import GREEDY, load_grid
from eglr_harness.analysis.metrics.accuracy import cell_accuracy
from eglr_harness.analysis.sections.accuracy_vs_compute import (
    OTHER_RUN, TOKENS_UNIT, UPPER_BOUND, accuracy_vs_compute,
)
from eglr_harness.analysis.metrics.intervals import sign_test_p, wilson_interval
from eglr_harness.analysis.sections.intervals import interval_rows
from eglr_harness.analysis.sections.section import ReportContext
from eglr_harness.analysis.sections.pools import summarize_pool
from eglr_harness.core.cell import Cell

DOCS = (0, 1, 2, 3)
L_RUN = [(0, 0.0), (1, 0.0), (2, 0.0)]  # greedy and the L pool
T_RUN = [(0, 0.5), (0, 1.0)]  # the T pool
# each cell's accounting: tokens over its 4 rollouts, FLOP ratio; two of (0, 1.0)'s rollouts came from the store
TOKENS = {(0, 0.0): 400, (1, 0.0): 440, (2, 0.0): 480, (0, 0.5): 420, (0, 1.0): 300}
RATIOS = {(0, 0.0): 1.0, (1, 0.0): 1.05, (2, 0.0): 1.1, (0, 0.5): 1.0, (0, 1.0): 1.0}
REUSED = {(0, 1.0): 2}
BEAM_ANSWERS = ["g0", "x", "g2", "x"]  # the beam-4 run's answers of docs 0..3 (gold "g<d>")


def _eglr(cells, reused=None):
    stats = {Cell.of(*c).label: {"tokens": TOKENS[c], "flop_ratio": RATIOS[c]} for c in cells}
    return lmeval_fakes.eglr_block(tokens=sum(TOKENS[c] for c in cells), cells=stats, task="toy_eglr_lxt",
                                   reused=None if reused is None else {Cell.of(*c).label: n for c, n in reused.items()})


def _write(root, *, t_pool=True, beam=True, accounted=tuple(TOKENS), beam_task="toy_eglr_lxt", num_beams=4) -> list:
    runs = [root / "l"]
    lmeval_fakes.write_grid_run(root / "l", L_RUN, eglr=_eglr([c for c in L_RUN if c in accounted]))
    if t_pool:
        runs.append(root / "t")
        lmeval_fakes.write_grid_run(root / "t", T_RUN, eglr=_eglr([c for c in T_RUN if c in accounted], REUSED))
    if beam:
        runs.append(root / "beam")
        docs = {d: [{"repeat": 0, "L": None, "T": None, "cycle": None, "answer": a, "correct": int(a == f"g{d}")}]
                for d, a in zip(DOCS, BEAM_ANSWERS)}
        lmeval_fakes.write_run(root / "beam", task=beam_task, docs=docs, model="hf",
                               gen_kwargs={"do_sample": False, "num_beams": num_beams})
    return runs


def _cost(cell) -> float:
    """FLOPs per problem of a cell in greedy-token units: tokens × ratio per decoded rollout, one rollout a problem."""
    decoded = len(DOCS) - REUSED.get(cell, 0)
    return TOKENS[cell] * RATIOS[cell] / decoded


def _relative(cells) -> float:
    return sum(_cost(c) for c in cells) / _cost((0, 0.0))


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return load_grid(_write(tmp_path_factory.mktemp("avc")))


def _points(grid):
    found = accuracy_vs_compute(grid, cell_accuracy(grid))
    return {p.label: p for p in found.points}, found.left_out


def test_each_method_sits_at_its_flops_per_problem_relative_to_greedy(grid):
    points, left_out = _points(grid)
    assert not left_out
    expected = {
        "greedy": 1.0,
        "best single config (L=0,T=0.5)": _relative([(0, 0.5)]),  # 2 of 4, first of the tied cells in L-major order
        "SC T pool (B=2)": _relative(T_RUN),
        "SC L pool (B=2)": _relative(L_RUN[1:]),
        "SC L ∪ T pool (B=4)": _relative([*T_RUN, *L_RUN[1:]]),
        "SC L×T pool (B=5)": _relative([*L_RUN, *T_RUN]),
        "Beam-4 (hf)": 4.0,
    }
    for label, x in expected.items():
        assert points[label].compute == pytest.approx(x), label
    for pool in ("T pool (B=2)", "L pool (B=2)", "L ∪ T pool (B=4)", "L×T pool (B=5)"):
        oracle = points[f"oracle {pool}"]
        assert oracle.kind == UPPER_BOUND and oracle.compute == points[f"SC {pool}"].compute
    assert points["SC L×T pool (B=5)"].rollouts == 5 and points["Beam-4 (hf)"].kind == OTHER_RUN


def test_each_point_has_the_pools_tables_accuracy_and_its_wilson_interval(grid):
    points, _ = _points(grid)
    accuracy = cell_accuracy(grid)
    n = len(DOCS)
    expected = {
        "greedy": (accuracy[GREEDY].correct, accuracy[GREEDY].rollouts),
        "best single config (L=0,T=0.5)": (accuracy[Cell(0, 0.5)].correct, accuracy[Cell(0, 0.5)].rollouts),
        "Beam-4 (hf)": (sum(a == f"g{d}" for d, a in zip(DOCS, BEAM_ANSWERS)), n),
    }
    for pool, name in (("T", "T pool (B=2)"), ("L", "L pool (B=2)"), ("LuT", "L ∪ T pool (B=4)"),
                       ("LxT", "L×T pool (B=5)")):
        summary = summarize_pool(grid, pool, accuracy)
        expected[f"SC {name}"] = (summary.sc_solved, n)
        expected[f"oracle {name}"] = (summary.oracle_solved, n)
    assert set(points) == set(expected)
    for label, (correct, total) in expected.items():
        point = points[label]
        assert (point.correct, point.n) == (correct, total), label
        assert (point.low, point.high) == wilson_interval(correct, total), label


def test_the_report_writes_the_figure_and_the_table_of_the_points(tmp_path):
    out = build_report(_write(tmp_path), tmp_path / "report", sections=["accuracy_vs_compute"])
    png = (out / "accuracy_vs_compute.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "accuracy_vs_compute.csv", newline="") as handle:
        rows = {r["method"]: r for r in csv.DictReader(handle)}
    assert float(rows["SC L pool (B=2)"]["compute_vs_greedy"]) == pytest.approx(_relative(L_RUN[1:]), abs=1e-6)
    assert rows["oracle L×T pool (B=5)"]["kind"] == UPPER_BOUND
    text = (out / "report.md").read_text()
    assert "![accuracy against compute](accuracy_vs_compute.png)" in text
    assert "| SC T pool (B=2) | method | 2 | " in text and "upper bound, not a method" in text


def test_a_method_the_runs_do_not_support_has_no_point(tmp_path):
    """No T pool and no beam run: no point for them; a cell without accounting: its methods are named, not drawn."""
    points, left_out = _points(load_grid(_write(tmp_path / "a", t_pool=False, beam=False)))
    assert set(points) == {"greedy", "best single config (L=1,T=0.0)", "SC L pool = L ∪ T pool (B=2)",
                           "oracle L pool = L ∪ T pool (B=2)", "SC L×T pool (B=3)", "oracle L×T pool (B=3)"}
    points, left_out = _points(load_grid(_write(tmp_path / "b", accounted=[c for c in TOKENS if c != (2, 0.0)])))
    assert not [label for label in points if "L pool" in label or "L×T" in label or "L ∪ T" in label]
    assert "SC T pool (B=2)" in points and "Beam-4 (hf)" in points
    assert ("SC L pool (B=2)", "no compute accounting for 1 of its 2 cells (L=2,T=0.0)") in left_out


def test_without_greedy_the_points_are_drawn_in_token_evaluations(tmp_path):
    """Issue 71: the README's EGLR-SC run (L = 1..10, no greedy cell) got an empty section headed "No method of these
    runs has its compute accounted" and no figure. Without greedy, the unit, compute is per problem in full-model
    token evaluations; a beam run whose compute is nominal (num_beams × greedy's) is left out, and says why."""
    runs = [tmp_path / "l", _write(tmp_path / "with_greedy", t_pool=False)[-1]]  # the beam run of _write
    lmeval_fakes.write_grid_run(runs[0], L_RUN[1:], eglr=_eglr(L_RUN[1:]))  # the L pool without greedy
    grid = load_grid(runs)
    found = accuracy_vs_compute(grid, cell_accuracy(grid))
    assert found.unit == TOKENS_UNIT
    points = {p.label: p.compute for p in found.points}
    assert points == pytest.approx({"best single config (L=1,T=0.0)": _cost((1, 0.0)),
                                    "SC L pool = L ∪ T pool = L×T pool (B=2)": _cost((1, 0.0)) + _cost((2, 0.0)),
                                    "oracle L pool = L ∪ T pool = L×T pool (B=2)": _cost((1, 0.0)) + _cost((2, 0.0))})
    assert [label for label, why in found.left_out if "nominal compute is num_beams × greedy's" in why] == [
        "Beam-4 (hf)"]
    out = build_report(runs, tmp_path / "report", sections=["accuracy_vs_compute"])
    text = (out / "report.md").read_text()
    assert "no greedy cell (L=0, T=0), the unit of compute elsewhere: compute is per problem in full-model" in text
    assert "| compute per problem (token evaluations) |" in text and "No method" not in text
    assert (out / "accuracy_vs_compute.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "accuracy_vs_compute.csv", newline="") as handle:
        assert "compute_token_evals_per_problem" in next(csv.reader(handle))


def test_without_greedy_nor_accounting_the_section_says_why_nothing_is_drawn(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "l", L_RUN[1:])
    points, left_out = _points(load_grid([tmp_path / "l"]))
    assert not points
    assert left_out and all("no greedy cell" in why for _label, why in left_out)
    out = build_report([tmp_path / "l"], tmp_path / "report", sections=["accuracy_vs_compute"])
    assert ("No method of these runs can be placed: no greedy cell (L=0, T=0), the unit of compute, and no cell with "
            "compute accounting.") in (out / "report.md").read_text()


def test_the_leaderboards_beam_run_of_the_single_rollout_task_joins_the_pools_grid(tmp_path):
    """The leaderboard decodes beam search on ``<b>_eglr`` (one rollout a problem) and EGLR-SC on ``<b>_eglr_sc``:
    one report of both folders reads the EGLR runs' task, and the beam run joins it as the same benchmark's."""
    grid = load_grid(_write(tmp_path / "a", beam_task="toy_eglr"))
    assert grid.task == "toy_eglr_lxt"
    points, left_out = _points(grid)
    assert not left_out and points["Beam-4 (hf)"].correct == 2 and points["Beam-4 (hf)"].compute == 4.0
    # another benchmark's run does not join (the several-tasks refusal names both)
    runs = _write(tmp_path / "b", beam_task="other_eglr")
    assert "Beam-4 (hf)" not in _points(load_grid(runs))[0]
    lmeval_fakes.write_grid_run(tmp_path / "b" / "sc", L_RUN, task="toy_eglr_sc", eglr=_eglr(L_RUN))
    with pytest.raises(ValueError, match=r"several tasks \['toy_eglr_lxt', 'toy_eglr_sc'\]"):
        load_grid([*runs, tmp_path / "b" / "sc"])


def test_a_beam_count_that_is_no_count_is_named_not_drawn(tmp_path):
    found = accuracy_vs_compute(grid := load_grid(_write(tmp_path, num_beams="many")), cell_accuracy(grid))
    points = {p.label for p in found.points}
    assert not [p for p in points if p.startswith("Beam")] and "hf, no beams" not in points and not found.left_out
    [(label, why)] = found.refused
    assert label.startswith("hf run beam") and why == "num_beams='many' is not a beam count (allowed: an int >= 1)"


def test_the_beam_run_is_paired_with_greedy_and_each_pools_vote(tmp_path):
    """Solved sets of the fixture grid (lmeval_fakes.GRID): greedy {0}, T pool's SC {0, 1, 2}, L pool's SC
    {0, 2}; the beam run is right on docs 0 and 2 (BEAM_ANSWERS)."""
    grid = load_grid(_write(tmp_path, beam_task="toy_eglr"))
    rows = {r.quantity: r for r in interval_rows(ReportContext(grid), n_resamples=200)}
    beam = rows["Beam-4 (hf)"]
    assert (beam.estimate, beam.docs) == (2, 4) and (beam.low, beam.high) == wilson_interval(2, 4)
    expected = {"Beam-4 (hf) − greedy": (1, 1, 0), "SC: T pool − Beam-4 (hf)": (1, 1, 0),
                "SC: L pool − Beam-4 (hf)": (0, 0, 0)}
    for name, (estimate, only_a, only_b) in expected.items():
        row = rows[name]
        assert (row.estimate, row.only_a, row.only_b) == (estimate, only_a, only_b), name
        assert row.sign_p == sign_test_p(only_a, only_b)
    text = (build_report(_write(tmp_path / "r", beam_task="toy_eglr"), tmp_path / "report",
                         sections=["intervals"]) / "report.md").read_text()
    assert "| SC: L pool − Beam-4 (hf) | 0 |" in text and "Other models' runs merged into the report" in text


def test_two_beam_runs_of_one_beam_count_are_paired_each_under_its_own_name(tmp_path):
    runs = _write(tmp_path, beam_task="toy_eglr")
    docs = {d: [{"repeat": 0, "L": None, "T": None, "cycle": None, "answer": f"g{d}", "correct": 1}] for d in DOCS}
    lmeval_fakes.write_run(tmp_path / "beam_again", task="toy_eglr", docs=docs, model="hf",
                           gen_kwargs={"do_sample": False, "num_beams": 4})
    rows = {r.quantity: r for r in interval_rows(ReportContext(load_grid([*runs, tmp_path / "beam_again"])),
                                                 n_resamples=200)}
    named = {name: row for name, row in rows.items() if name.startswith("Beam-4 (hf) [")}
    assert sorted(row.estimate for name, row in named.items() if " − " not in name) == [2, 4]  # 2 right, and all 4
    assert sorted(row.estimate for name, row in named.items() if name.endswith(" − greedy")) == [1, 3]  # greedy: {0}
