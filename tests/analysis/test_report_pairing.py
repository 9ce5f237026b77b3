"""Comparisons a reviewer can trust (issue 68): what `eglr-report` compares an EGLR run with.

On copies of committed runs (results/ is never touched): Qwen2.5-Coder's EGLR-SC_L runs of GSM8K, and its committed
greedy run rewritten as another model's run would be (lm-eval `hf`: one rollout a problem, no cell, no accounting):
- another model's run over more problems never enlarges the grid (it is cut to the EGLR runs' problems, said so);
- two runs named alike are each paired under a name of its own, and one file given twice is read once;
- a beam count that is no count, lm-eval's `hf` beam search at batch > 1 and an eglr-baseline run with cut answers
  are refused as baselines in every section, named with the reason;
- a run of another benchmark is named, never dropped without a word.
Then the eglr-baseline contract on synthetic runs: its measured compute (`search_tokens`) against the nominal one.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from helpers import lmeval_fakes
from helpers.samples_files import plain_samples
from eglr_harness.analysis.load import load_grid
from eglr_harness.analysis.metrics.accuracy import baselines
from eglr_harness.analysis.sections.accuracy_vs_compute import MEASURED, NOMINAL, OTHER_RUN
from eglr_harness.analysis.report import compute_report, render_markdown, write_report
from eglr_harness.core.cell import Cell

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "results" / "qwen2.5-coder-1.5b-instruct" / "gsm8k_sc"  # sc_L_30, sc_L_100, greedy_100: committed
MATH500 = REPO / "results" / "smollm2-135m-instruct" / "leaderboard" / "math500" / "eglr_sc"
REFUSED_HF = "lm-eval's hf cuts beams at batch > 1; rerun at --batch_size 1 or with --model eglr-baseline"


def _run_files(folder: Path) -> tuple[Path, Path]:
    [results] = folder.rglob("results_*.json")
    return results, plain_samples(folder)


def _edit_results(folder: Path, edit) -> None:
    results, _ = _run_files(folder)
    data = json.loads(results.read_text(encoding="utf-8"))
    edit(data)
    results.write_text(json.dumps(data), encoding="utf-8")


def _edit_samples(folder: Path, edit) -> None:
    """``edit(line)`` on every line of the run's samples file; a line for which it returns False is dropped."""
    _, samples = _run_files(folder)
    lines = map(json.loads, samples.read_text(encoding="utf-8").splitlines())
    kept = [line for line in lines if edit(line) is not False]
    samples.write_text("".join(json.dumps(line) + "\n" for line in kept), encoding="utf-8")


def as_other_model(src: Path, dst: Path, *, model: str = "hf", batch_size="1", flip: int = 0, **gen_kwargs) -> Path:
    """A copy of the committed EGLR run ``src`` as another model's run writes it: ``config.model`` ``model``, no
    ``config.eglr``, ``gen_kwargs`` (do_sample=False and these), lm-eval's ``batch_size``; each problem's first
    rollout alone, without a cell. ``flip``: the correctness of the first ``flip`` problems' answers is reversed."""
    shutil.copytree(src, dst)

    def results(data):
        data["model_source"] = data["config"]["model"] = model
        data["config"].pop("eglr", None)
        data["config"]["batch_size"] = batch_size
        data["config"]["gen_kwargs"] = {"do_sample": False, "max_gen_toks": 640, **gen_kwargs}

    def sample(line):
        first = dict(line["rollouts"][0], L=None, T=None, cycle=None, signals=None)
        first.pop("engine", None)
        if line["doc_id"] < flip:
            first["correct"] = 1 - first["correct"]
            first["answer"] = line["target"] if first["correct"] else "-1"
        line["rollouts"] = [first]

    _edit_results(dst, results)
    _edit_samples(dst, sample)
    return dst


def _report(runs, sections=("runs", "pools", "intervals", "accuracy_vs_compute")):
    ctx = compute_report(load_grid(runs), sections=sections)
    return ctx, render_markdown(ctx, {})


def _intervals(ctx) -> dict:
    return {row.quantity: row for row in ctx.results["intervals"]}


def _figures(row) -> tuple:
    """An interval row's numbers, without its name."""
    return row.method, row.estimate, row.docs, row.low, row.high, row.only_a, row.only_b, row.sign_p


def _pools(ctx) -> dict:
    return {name: (p.docs, p.sc_solved, p.oracle_solved, p.best) for name, p in ctx.results["pools"].items()}


# (a) ------------------------------------------------------------------------------------------------------------


def test_another_models_run_over_more_problems_adds_none_to_the_grid(tmp_path, caplog):
    """EGLR-SC_L over GSM8K's first 30 problems, and beside it greedy over the first 100 as lm-eval's hf writes it:
    every figure of the report is the EGLR run's alone (before, the grid held 100 problems and SC_L fell to 30 %
    of its share, pools.csv's docs said 100 while its best-config figure stayed over 30), greedy is paired over the
    30 problems, and the 70 it leaves out are named."""
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    greedy = as_other_model(QWEN / "greedy_100", tmp_path / "greedy")
    alone, _ = _report([sc])
    with caplog.at_level(logging.WARNING):
        merged, text = _report([sc, greedy])
    assert merged.grid.docs == alone.grid.docs == tuple(range(30))
    assert _pools(merged) == _pools(alone)
    assert {k: v for k, v in _intervals(merged).items() if "hf" not in k} == _intervals(alone)
    first_30 = [json.loads(line) for line in _run_files(greedy)[1].read_text(encoding="utf-8").splitlines()][:30]
    row = _intervals(merged)["hf, no beams"]
    assert (row.estimate, row.docs) == (sum(line["rollouts"][0]["correct"] for line in first_30), 30)
    note = "70 of its 100 problems are not among the EGLR runs' 30: left out of every comparison (docs 30-99)"
    assert any(note in record.getMessage() for record in caplog.records if record.levelname == "WARNING")
    assert note in text


def test_another_models_run_of_none_of_the_problems_is_left_out(tmp_path):
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    greedy = as_other_model(QWEN / "greedy_100", tmp_path / "greedy")
    _edit_samples(greedy, lambda line: line["doc_id"] >= 30)
    grid = load_grid([sc, greedy])
    assert grid.docs == tuple(range(30)) and len(grid.parts) == 1
    assert any("none of its 70 problems is among the EGLR runs' 30: left out." in note for note in grid.run_notes)


def test_without_an_eglr_run_the_problems_are_every_runs(tmp_path):
    greedy = as_other_model(QWEN / "greedy_100", tmp_path / "greedy")
    few = as_other_model(QWEN / "greedy_100", tmp_path / "few")
    _edit_samples(few, lambda line: line["doc_id"] < 10)
    assert load_grid([few, greedy]).docs == tuple(range(100))


# (b) ------------------------------------------------------------------------------------------------------------


def test_two_runs_named_alike_are_each_paired_under_their_own_name(tmp_path):
    """Two beam-4 runs, both in a folder `beam4`, the second with 40 answers flipped: each row is its own run's
    (before, both were keyed by the one name and the first run's row carried the copy's interval)."""
    sc = shutil.copytree(QWEN / "sc_L_100", tmp_path / "sc_L_100")
    first = as_other_model(QWEN / "greedy_100", tmp_path / "a" / "beam4", num_beams=4)
    second = as_other_model(QWEN / "greedy_100", tmp_path / "b" / "beam4", num_beams=4, flip=40)
    ctx, _ = _report([sc, first, second], sections=("intervals",))
    names = [part.info.name for part in ctx.grid.parts]
    assert len(set(names)) == 3 and names[1].startswith("a/beam4/") and names[2].startswith("b/beam4/")
    assert not [name for name in names if str(tmp_path) in name]  # relative: no path of the machine
    rows = _intervals(ctx)
    for run, name in ((first, names[1]), (second, names[2])):
        alone = _intervals(_report([sc, run], sections=("intervals",))[0])
        label = "Beam-4 (hf)"
        mine = {q.replace(f"{label} [{name}]", label): _figures(r) for q, r in rows.items() if f"[{name}]" in q}
        assert mine and mine == {q: _figures(r) for q, r in alone.items() if label in q}, name


def test_one_file_given_twice_is_read_once(tmp_path):
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    beam = as_other_model(QWEN / "greedy_100", tmp_path / "beam4", num_beams=4)
    (tmp_path / "link").symlink_to(beam)
    ctx, text = _report([sc, beam, tmp_path / "link", sc], sections=("runs", "intervals"))
    assert len(ctx.grid.parts) == 2 and ctx.grid.duplicates == 0
    assert "Beam-4 (hf)" in _intervals(ctx) and not [q for q in _intervals(ctx) if "[" in q]
    assert sum("given again (the same file): read once" in note for note in ctx.grid.run_notes) == 2
    assert "given again (the same file): read once" in text


def test_another_models_run_with_two_repeats_that_differ_counts_the_first(tmp_path):
    """Issue 71: each problem holds two repeats whose answers differ (first right, second wrong on even problems, the
    other way on odd ones; the second written before the first in the file): the first repeat (lowest ``repeat``) is
    the one counted, in the pairing."""
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    greedy = as_other_model(QWEN / "greedy_100", tmp_path / "greedy")

    def two_repeats(line):
        first = dict(line["rollouts"][0], repeat=0, correct=int(line["doc_id"] % 2 == 0))
        first["answer"] = line["target"] if first["correct"] else "-1"
        second = dict(first, repeat=1, correct=1 - first["correct"])
        second["answer"] = line["target"] if second["correct"] else "-2"
        line["rollouts"] = [second, first]

    _edit_samples(greedy, two_repeats)
    ctx, _ = _report([sc, greedy])
    [run] = baselines(ctx.grid)
    assert run.first_correct == {d: int(d % 2 == 0) for d in range(30)}
    row = _intervals(ctx)["hf, no beams"]
    assert (row.estimate, row.docs) == (15, 30)


def test_a_beam_run_over_fewer_problems_is_not_paired_and_one_over_more_is_restricted(tmp_path):
    """Issue 71: beside EGLR-SC_L over 30 problems, a Beam-4 run over 20 of them (a subset: no pairing for the other
    10) is only a point; a Beam-2 run over 100 (a superset) is paired over the 30, its other 70 left out."""
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    subset = as_other_model(QWEN / "greedy_100", tmp_path / "beam4", num_beams=4)
    _edit_samples(subset, lambda line: line["doc_id"] < 20)
    superset = as_other_model(QWEN / "greedy_100", tmp_path / "beam2", num_beams=2, flip=50)
    ctx, text = _report([sc, subset, superset])
    rows = _intervals(ctx)
    assert not [q for q in rows if "Beam-4" in q]
    paired = [q for q in rows if "Beam-2" in q]
    assert paired and all(rows[q].docs == 30 for q in paired)
    lines = [json.loads(line) for line in _run_files(superset)[1].read_text(encoding="utf-8").splitlines()]
    first_30 = sum(line["rollouts"][0]["correct"] for line in lines if line["doc_id"] < 30)
    assert rows["Beam-2 (hf)"].estimate == first_30
    runs = {run.label: run.first_correct for run in baselines(ctx.grid)}
    assert sorted(runs["Beam-4 (hf)"]) == list(range(20)) and sorted(runs["Beam-2 (hf)"]) == list(range(30))
    assert "70 of its 100 problems are not among the EGLR runs' 30" in text


# (c), and the refusals of the readers' side of the beam fix ------------------------------------------------------


def _refused_everywhere(ctx, text: str, reason: str) -> None:
    """The other run is in no comparison, and every section that would show it names it with ``reason``."""
    assert not baselines(ctx.grid)
    assert not [q for q in _intervals(ctx) if "hf" in q or "baseline" in q]
    avc = ctx.results["accuracy_vs_compute"]
    assert not [p for p in avc.points if p.kind == OTHER_RUN]
    [(label, why)] = avc.refused
    assert reason in why
    runs, intervals, compute = (text.split(f"\n## {title}")[1].split("\n## ")[0]
                                for title in ("Runs", "Confidence intervals", "Accuracy against compute"))
    for part in (runs, intervals, compute):
        assert reason in part and ctx.grid.parts[-1].info.name in part


@pytest.mark.parametrize("num_beams", ["abc", 4.0, -3, True])
def test_a_beam_count_that_is_no_count_is_refused_in_every_section(tmp_path, num_beams):
    """Before, the intervals section paired it as "hf, no beams" (greedy) while accuracy against compute left it
    out."""
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    beam = as_other_model(QWEN / "greedy_100", tmp_path / "beam", num_beams=num_beams)
    ctx, text = _report([sc, beam])
    _refused_everywhere(ctx, text, f"num_beams={str(num_beams)!r} is not a beam count (allowed: an int >= 1)")


@pytest.mark.parametrize(("batch_size", "refused"), [("64", True), ("auto", True), ("1", False), (1, False)])
def test_lm_evals_hf_beam_search_above_batch_one_is_refused(tmp_path, batch_size, refused):
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    beam = as_other_model(QWEN / "greedy_100", tmp_path / "beam4", num_beams=4, batch_size=batch_size)
    ctx, text = _report([sc, beam])
    if refused:
        _refused_everywhere(ctx, text, f"num_beams 4 at batch_size {str(batch_size)!r}: {REFUSED_HF}")
    else:
        assert "Beam-4 (hf)" in _intervals(ctx) and REFUSED_HF not in text


def test_greedy_of_lm_evals_hf_and_beams_of_eglr_baseline_are_baselines_at_any_batch(tmp_path):
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    greedy = as_other_model(QWEN / "greedy_100", tmp_path / "greedy", batch_size="64")
    beam = as_other_model(QWEN / "greedy_100", tmp_path / "beam4", model="eglr-baseline", num_beams=4,
                          batch_size="64")
    ctx, text = _report([sc, greedy, beam])
    assert {"hf, no beams", "Beam-4 (eglr-baseline)"} <= set(_intervals(ctx)) and "no baseline" not in text


# (d) ------------------------------------------------------------------------------------------------------------


def test_a_run_of_another_benchmark_is_named_not_dropped_without_a_word(tmp_path, caplog):
    sc = shutil.copytree(QWEN / "sc_L_30", tmp_path / "sc_L_30")
    math = as_other_model(MATH500, tmp_path / "math500_greedy")
    with caplog.at_level(logging.WARNING):
        ctx, text = _report([sc, math], sections=("runs",))
    assert len(ctx.grid.parts) == 1
    line = "math500_greedy/SmolLM2-135M-Instruct.Q4_1/results_"
    note = "(hf) holds no samples of gsm8k_eglr_sc nor of another task of its benchmark gsm8k (its samples: " \
           "math500_eglr_sc): left out."
    assert any(line in r.getMessage() and note in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert line in text and note in text


# the eglr-baseline contract (synthetic runs: docs/run-format.md) -------------------------------------------------

DOCS = (0, 1, 2, 3)
L_RUN = [(0, 0.0), (1, 0.0), (2, 0.0)]
TOKENS = {(0, 0.0): 400, (1, 0.0): 440, (2, 0.0): 480}  # each cell's tokens over its 4 rollouts: greedy 100 a rollout
SEARCH = [400, 480, 360, 440]  # the beam run's search tokens per problem: 420 on average, 4.2 x greedy's 100


def _baseline_grid(root: Path, *, search=SEARCH, finish=("stop", "eos", "length", "stop"), batch_size=1) -> list:
    stats = {Cell.of(*c).label: {"tokens": TOKENS[c], "flop_ratio": 1.0 + 0.05 * c[0]} for c in L_RUN}
    lmeval_fakes.write_grid_run(root / "eglr", L_RUN, eglr=lmeval_fakes.eglr_block(
        tokens=sum(TOKENS.values()), cells=stats, task="toy_eglr_lxt"))
    docs = {d: [{"repeat": 0, "L": None, "T": None, "cycle": None, "answer": f"g{d}" if d % 2 == 0 else "x",
                 "correct": int(d % 2 == 0), "finish": finish[d],
                 **({} if search[d] is None else {"search_tokens": search[d]})}] for d in DOCS}
    lmeval_fakes.write_run(root / "beam", task="toy_eglr", docs=docs, model="eglr-baseline",
                           gen_kwargs={"do_sample": False, "num_beams": 4})
    _edit_results(root / "beam", lambda data: data["config"].update(batch_size=batch_size))
    return [root / "eglr", root / "beam"]


def _beam_point(ctx):
    [point] = [p for p in ctx.results["accuracy_vs_compute"].points if p.kind == OTHER_RUN]
    return point


def test_eglr_baselines_compute_is_its_search_tokens_over_greedys(tmp_path):
    runs = _baseline_grid(tmp_path, batch_size="64")
    ctx, text = _report(runs)
    point = _beam_point(ctx)
    assert (point.label, point.compute, point.basis) == ("Beam-4 (eglr-baseline)", pytest.approx(4.2), MEASURED)
    assert "| Beam-4 (eglr-baseline) | method | 1 | 4.20 |" in text
    out = write_report(ctx, tmp_path / "report")
    lines = (out / "accuracy_vs_compute.csv").read_text(encoding="utf-8").splitlines()
    assert lines[0].endswith(",compute_basis") and lines[-1].startswith("Beam-4 (eglr-baseline),other run,1,4.2,")
    assert lines[-1].endswith(",measured") and all(line.endswith(",measured") for line in lines[1:])


def test_without_search_tokens_on_every_answer_the_compute_is_nominal_and_says_so(tmp_path):
    runs = _baseline_grid(tmp_path, search=[400, None, 360, 440])
    ctx, text = _report(runs)
    point = _beam_point(ctx)
    assert (point.compute, point.basis) == (4.0, NOMINAL)
    assert "| Beam-4 (eglr-baseline) | method | 1 | 4.00 (nominal) |" in text
    out = write_report(ctx, tmp_path / "report")
    assert (out / "accuracy_vs_compute.csv").read_text(encoding="utf-8").splitlines()[-1].endswith(",nominal")


def test_an_eglr_baseline_run_with_cut_answers_is_refused_naming_them(tmp_path):
    runs = _baseline_grid(tmp_path, finish=("stop", "cut", "eos", "cut"))
    ctx, text = _report(runs)
    _refused_everywhere(ctx, text, "2 answers cut before their limit without a stop string or EOS: docs 1, 3")
