"""build_report / eglr-report: the files, their numbers, the images, partial grids, errors."""

from __future__ import annotations

import csv

import pytest

from helpers import lmeval_fakes
from eglr_harness.analysis import build_report
from eglr_harness.core.cell import Cell
from eglr_harness.commands.report import main as report_main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CELLS = list(lmeval_fakes.GRID)
FIGURES = [
    "accuracy_heatmap.png",
    "cumulative_oracle.png",
    "disagreement_L_vs_L.png",
    "disagreement_T_vs_T.png",
    "disagreement_T_vs_L.png",
    "budget_T.png",
    "budget_L.png",
    "budget_LuT.png",
    "budget_LxT.png",
]
TABLES = [
    "cell_accuracy.csv",
    "cumulative_oracle.csv",
    "pools.csv",
    "exclusive_marginal.csv",
    "missing_cells.csv",
    "disagreement_L_vs_L.csv",
    "disagreement_T_vs_T.csv",
    "disagreement_T_vs_L.csv",
    "budget_T.csv",
    "budget_L.csv",
    "budget_LuT.csv",
    "budget_LxT.csv",
    "compute_runs.csv",
    "compute_cells.csv",
    "accuracy_vs_compute.csv",
]


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of the full toy grid, built once for the module (into the default folder)."""
    run = tmp_path_factory.mktemp("lxt")
    lmeval_fakes.write_grid_run(
        run, CELLS, eglr=lmeval_fakes.eglr_block(cells={"L=1,T=0.0": {"tokens": 1000, "flop_ratio": 1.04}})
    )
    out = build_report([run])
    assert out == run / "report"
    return out


def test_report_folder_has_every_file(report):
    for name in ["report.md", *TABLES, *FIGURES]:
        assert (report / name).is_file(), name


def test_figures_are_valid_pngs(report):
    from matplotlib.image import imread

    for name in FIGURES:
        path = report / name
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        image = imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, name


def test_csv_tables_hold_the_hand_computed_numbers(report):
    cum = {
        (int(r["L_max"]), float(r["T_max"])): (int(r["solved"]), r["corner"])
        for r in _rows(report / "cumulative_oracle.csv")
    }
    assert cum[(0, 0.0)] == (1, "greedy") and cum[(0, 1.0)] == (3, "T-only")
    assert cum[(2, 0.0)] == (2, "L-only") and cum[(2, 1.0)] == (4, "joint")
    pools = {r["pool"]: r for r in _rows(report / "pools.csv")}
    assert (float(pools["LxT"]["sc"]), float(pools["LxT"]["oracle"]), pools["L"]["best_config"]) == (
        0.75,
        1.0,
        "L=1,T=0.0",
    )
    assert float(pools["LuT"]["oracle"]) == 0.75 and float(pools["T"]["random_oracle"]) == pytest.approx(19 / 36)
    excl = {
        (int(r["L"]), float(r["T"])): (int(r["exclusive"]), int(r["marginal_over_greedy"]))
        for r in _rows(report / "exclusive_marginal.csv")
    }
    assert excl[(1, 1.0)] == (1, 1) and excl[(0, 1.0)] == (0, 2)
    tl = _rows(report / "disagreement_T_vs_L.csv")
    assert [r["L=1,T=0.0"] for r in tl] == ["2", "2"] and [r["L=2,T=0.0"] for r in tl] == ["3", "1"]
    budget = _rows(report / "budget_LxT.csv")
    assert [float(r["sc_stated"]) for r in budget] == [0.25, 0.5, 0.75, 0.75, 0.75, 1.0, 1.0, 1.0, 0.75]
    assert _rows(report / "missing_cells.csv") == []
    cells = {r["run_or_cell"]: r for r in _rows(report / "compute_cells.csv")}
    assert float(cells["L=1,T=0.0"]["flop_ratio"]) == 1.04


def test_report_markdown_names_corners_pools_and_compute(report):
    text = (report / "report.md").read_text()
    assert "| greedy | 1 | 25.0 |" in text and "| joint | 4 | 100.0 |" in text
    assert "| SC (majority vote) | 75.0 (3) | 50.0 (2) | 75.0 (3) | 75.0 (3) |" in text
    # expected oracle of 2, 2, 4 and 9 random rollouts of the toy grid, one per cell (test_analysis_metrics)
    assert "| Oracle of B random grid rollouts (expected) | 52.8 | 52.8 | 79.2 | 100.0 |" in text
    assert "| T-vs-L | 2×2 | 4 | 2.0 | 3 |" in text
    assert "1.020" in text and "grid is complete" in text
    for name in FIGURES:
        assert f"]({name})" in text
    # only L=1,T=0.0 has accounting in the fixture; the run predates reuse counts, so no reuse line
    assert "8 of 9 cells carry no accounting" in text and "L=0,T=0.0, L=0,T=0.5," in text
    assert "taken from the rollout store" not in text


def test_report_says_how_many_rollouts_were_reused(tmp_path):
    cells = {f"L={L},T={T}": {"tokens": 100, "flop_ratio": 1.01} for L, T in CELLS}
    eglr = lmeval_fakes.eglr_block(tokens=900, cells=cells, reused={"L=0,T=0.0": 4, "L=1,T=0.0": 2})
    lmeval_fakes.write_grid_run(tmp_path / "run", CELLS, eglr=eglr)
    text = (build_report([tmp_path / "run"]) / "report.md").read_text()
    assert "6 of 36 rollouts were taken from the rollout store" in text
    assert "carry no accounting" not in text


def _accounted_run(path, cells, tokens):
    """A run of ``cells`` whose accounting gives cell i ``tokens[i]`` tokens, none gated."""
    stats = {Cell(*c).label: {"tokens": t, "gated_tokens": 0, "rho": 0.0, "flop_ratio": 1.0} for c, t in
             zip(cells, tokens)}
    eglr = lmeval_fakes.eglr_block(tokens=sum(tokens), gated=0, flop_ratio=1.0, cells=stats)
    return lmeval_fakes.write_grid_run(path, cells, eglr=eglr)


def test_a_resumed_copy_of_a_run_is_counted_once_in_the_compute_tables(tmp_path):
    """Issue 71 (8): ``eglr-report RUN COPY`` counted 672 tokens for 336 in the compute tables while the grid kept
    each rollout once; a run that repeats some of an earlier run's cells brings only its other cells."""
    import shutil

    _accounted_run(tmp_path / "run", CELLS[:2], [136, 200])
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    alone = build_report([tmp_path / "run"], tmp_path / "alone", n_orders=1)
    both = build_report([tmp_path / "run", tmp_path / "copy"], tmp_path / "both", n_orders=1)
    assert _rows(both / "compute_cells.csv") == _rows(alone / "compute_cells.csv")
    runs = _rows(both / "compute_runs.csv")
    assert [(r["run_or_cell"].split("/")[0], r["tokens"]) for r in runs] == [("run", "336"), ("all runs", "336")]
    assert "copy/" in (both / "report.md").read_text() and "not counted again" in (both / "report.md").read_text()

    _accounted_run(tmp_path / "more", CELLS[:3], [150, 210, 70])  # repeats run's two cells, adds a third
    merged = build_report([tmp_path / "run", tmp_path / "more"], tmp_path / "merged", n_orders=1)
    runs = {r["run_or_cell"].split("/")[0]: r["tokens"] for r in _rows(merged / "compute_runs.csv")}
    assert runs == {"run": "336", "more": "70", "all runs": "406"}
    cells = {r["run_or_cell"]: r["tokens"] for r in _rows(merged / "compute_cells.csv")}
    assert cells == {"L=0,T=0.0": "136", "L=0,T=0.5": "200", "L=0,T=1.0": "70"}, cells
    text = (merged / "report.md").read_text()
    assert "its cells L=0,T=0.0, L=0,T=0.5 repeat an earlier run's rollouts" in text


def test_partial_grid_report_says_what_is_missing(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", [c for c in CELLS if c != (2, 0.5) and c != (0, 0.0)])
    out = build_report([tmp_path / "a"], tmp_path / "rep")
    text = (out / "report.md").read_text()
    assert "**Missing cells** (no rollout): L=0,T=0.0, L=2,T=0.5." in text
    assert "No greedy cell" in text
    assert [(r["L"], r["T"]) for r in _rows(out / "missing_cells.csv")] == [("0", "0.0"), ("2", "0.5")]
    assert (out / "accuracy_heatmap.png").read_bytes()[:8] == PNG_MAGIC


def test_single_pool_run_gives_a_report(tmp_path):
    # an _eglr_sc run: L-only pool 1..2 at T=0, no greedy, no T pool
    lmeval_fakes.write_grid_run(tmp_path / "sc", [(1, 0.0), (2, 0.0)], task="toy_eglr_sc")
    out = build_report([tmp_path / "sc"])
    pools = {r["pool"]: r for r in _rows(out / "pools.csv")}
    assert pools["T"]["configs"] == "0" and pools["L"]["sc"] == "0.5"
    assert not (out / "budget_T.png").exists() and (out / "budget_L.png").is_file()


def test_cli_writes_report_and_prints_its_path(tmp_path, capsys):
    lmeval_fakes.write_grid_run(tmp_path / "run", [(0, 0.0), (1, 0.0)])
    assert report_main([str(tmp_path / "run"), "--out", str(tmp_path / "x"), "--orders", "2"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "x" / "report.md")
    assert (tmp_path / "x" / "report.md").is_file()


def test_cli_refuses_mixed_tasks_with_a_clear_error(tmp_path, capsys):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:2], task="gsm8k_eglr_lxt")
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:2], task="math500_eglr_lxt")
    assert report_main([str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "gsm8k_eglr_lxt" in err and "math500_eglr_lxt" in err and "--task" in err
    assert report_main([str(tmp_path / "a"), "--task", "gsm8k_eglr_lxt"]) == 0


def test_cli_refuses_an_unknown_section_before_reading_any_run(tmp_path, capsys, monkeypatch):
    """Issue 71: ``--sections bogus`` read every run (minutes on a big one) before it was refused."""
    import eglr_harness.analysis.report as report_module

    lmeval_fakes.write_grid_run(tmp_path / "run", CELLS[:2])

    def read(*args, **kwargs):
        raise AssertionError("the runs were read before the sections were checked")

    monkeypatch.setattr(report_module, "load_grid", read)
    for given, named in (("runs,bogus", "['bogus']"), (" , ", "no report section named")):
        assert report_main([str(tmp_path / "run"), "--sections", given]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and named in err and "allowed: runs" in err, err
    assert not (tmp_path / "run" / "report").exists()


def test_a_registered_section_adds_its_table_and_text_to_the_report(tmp_path):
    from eglr_harness.analysis.report import SECTIONS, Section, Table, register_section

    lmeval_fakes.write_grid_run(tmp_path / "run", CELLS)
    build_report([tmp_path / "run"], tmp_path / "before", n_orders=1)  # the built-in sections registered
    try:

        @register_section("greedy_docs")
        class GreedyDocs(Section):
            DEFINITIONS = "- Greedy docs: problems the greedy cell solves.\n"

            def compute(self, ctx):
                return sorted(ctx.solved[(0, 0.0)])

            def tables(self, ctx, result):
                return [Table("greedy_docs.csv", ["doc"], [[d] for d in result])]

            def markdown(self, ctx, result, figs):
                return ["\n## Greedy docs\n", f"greedy solves {result}"]

        with pytest.raises(ValueError, match="greedy_docs.*twice"):
            register_section("greedy_docs")(GreedyDocs)
        out = build_report([tmp_path / "run"], tmp_path / "after", n_orders=1)
    finally:
        SECTIONS.pop("greedy_docs", None)
    text = (out / "report.md").read_text()
    assert "## Greedy docs\n\ngreedy solves [0]\n\n\n## Definitions" in text
    assert text.endswith("- Greedy docs: problems the greedy cell solves.\n")
    assert _rows(out / "greedy_docs.csv") == [{"doc": "0"}]
    assert text.replace(text[text.index("\n## Greedy docs") : text.index("\n\n## Definitions")], "").replace(
        "- Greedy docs: problems the greedy cell solves.\n", ""
    ) == (tmp_path / "before" / "report.md").read_text()
