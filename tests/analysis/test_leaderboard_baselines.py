"""The leaderboard's baseline rows: beam search charged its measured search tokens, nominal where a run records
none, and a run with cut answers refused (docs/baselines.md)."""

from __future__ import annotations

from helpers import lmeval_fakes
import pytest

from eglr_harness.analysis.load import find_runs
from eglr_harness.leaderboard.table import cells_from_run, measured_compute, render_markdown

pytestmark = pytest.mark.unit


def _baseline_run(tmp_path, name, *, beams, finishes, search_tokens, model="eglr-baseline"):
    docs = {d: [{"repeat": 0, "L": None, "T": None, "cycle": None, "answer": "1", "correct": int(d % 2 == 0),
                 "cluster": 0, "signals": None, "finish": f, "search_tokens": s}]
            for d, (f, s) in enumerate(zip(finishes, search_tokens))}
    gen = {"do_sample": False, **({"num_beams": beams} if beams > 1 else {})}
    lmeval_fakes.write_run(tmp_path / name, task="gsm8k_eglr", docs=docs, model=model, gen_kwargs=gen,
                           metrics={"acc": 0.5})
    return find_runs(tmp_path / name)[0]


def _cells(tmp_path, name, files, beams):
    return cells_from_run(kind="beam" if beams > 1 else "greedy", name=name, benchmark="gsm8k", task="gsm8k_eglr",
                          files=files, record=None, command="lm_eval ...", run_dir=tmp_path / name,
                          num_beams=beams if beams > 1 else None)


def test_a_beam_row_is_charged_its_search_tokens_over_greedys(tmp_path):
    greedy = _cells(tmp_path, "greedy", _baseline_run(tmp_path, "greedy", beams=1, finishes=["eos"] * 4,
                                                        search_tokens=[100, 120, 80, 100]), 1)
    beam = _cells(tmp_path, "beam4", _baseline_run(tmp_path, "beam4", beams=4,
                                                     finishes=["eos", "length", "stop", "eos"],
                                                     search_tokens=[400, 800, 360, 440]), 4)
    cells = {c.method: c for c in measured_compute([*greedy, *beam])}
    assert cells["beam4"].flop_ratio == pytest.approx(500 / 100)  # not the nominal 4
    assert cells["beam4"].compute_basis == "measured" and cells["greedy"].flop_ratio == 1.0
    md = render_markdown(list(cells.values()), ["gsm8k"], model="m")
    assert "| Beam-4 | 5.00× |" in md


def test_a_beam_row_without_search_tokens_is_nominal_and_says_so(tmp_path):
    greedy = _cells(tmp_path, "greedy", _baseline_run(tmp_path, "greedy", beams=1, finishes=[None] * 2,
                                                        search_tokens=[None] * 2), 1)
    beam = _cells(tmp_path, "beam4", _baseline_run(tmp_path, "beam4", beams=4, finishes=[None] * 2,
                                                     search_tokens=[None] * 2, model="hf"), 4)
    cells = {c.method: c for c in measured_compute([*greedy, *beam])}
    assert cells["beam4"].flop_ratio == 4.0 and cells["beam4"].compute_basis == "nominal"
    assert "| Beam-4 | 4.00× (nominal) |" in render_markdown(list(cells.values()), ["gsm8k"], model="m")


def test_a_run_with_cut_answers_is_refused_as_a_baseline_naming_them(tmp_path):
    files = _baseline_run(tmp_path, "beam4", beams=4, finishes=["eos", "cut", "eos", "cut"],
                          search_tokens=[400, 120, 360, 200])
    (cell,) = _cells(tmp_path, "beam4", files, 4)
    assert cell.status == "refused"
    assert "2 answers cut" in cell.detail and "docs 1, 3" in cell.detail
    md = render_markdown([cell], ["gsm8k"], model="m")
    assert "| Beam-4 | refused |" in md
