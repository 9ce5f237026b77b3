"""Issue 38 (3): ``eglr-score RUN --output_path OUT`` on a real eglr-hf run keeps every field of its
samples and results files but the scores it recomputes, and the report of the rescored run has the
same sections as the original's.

The run is a tiny real one (stock lm-eval evaluator and writer, eglr-hf on a tiny random Llama, the
built-in demo problems), so its samples carry what eglr-hf logs today: ``signals``, ``engine``,
``wmaj@10``...
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eglr_harness.commands.report import main as report_main
from eglr_harness.commands.score import main as score_main

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
# what rescoring recomputes: per document, per rollout and per task
RESCORED_LINE_KEYS = {"filtered_resps"}
RESCORED_ROLLOUT_KEYS = {"answer", "correct", "cluster"}


@pytest.fixture(scope="module")
def real_run(tiny_model_dir, tmp_path_factory):
    import lm_eval
    import torch
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    out = tmp_path_factory.mktemp("real_run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tracker = EvaluationTracker(output_path=str(out / "run"))
        results = lm_eval.simple_evaluate(
            model="eglr-hf",
            model_args=f"pretrained={tiny_model_dir('llama', num_layers=10)},dtype=float32,device=cpu,tau_h=0.5",
            tasks=["eglr_demo_sc"], limit=2, gen_kwargs={"max_gen_toks": 6}, apply_chat_template=True,
            task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False), log_samples=True,
            batch_size=8, evaluation_tracker=tracker,
        )
    finally:
        torch.set_num_threads(threads)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="eglr_demo_sc", samples=samples["eglr_demo_sc"])
    return out / "run"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sections(report_md: Path) -> list[str]:
    return re.findall(r"^## (.+)$", report_md.read_text(), flags=re.M)


def test_rescoring_a_real_run_keeps_every_field(real_run, tmp_path, capsys):
    (samples_in,) = real_run.rglob("samples_*.jsonl")
    (results_in,) = real_run.rglob("results_*.json")
    assert score_main([str(samples_in.parent), "--output_path", str(tmp_path / "scored")]) == 0
    samples_out = tmp_path / "scored" / samples_in.parent.name / samples_in.name
    results_out = samples_out.with_name(results_in.name)

    before, after = _lines(samples_in), _lines(samples_out)
    assert len(before) == len(after) == 2
    assert all(r["signals"] and r["engine"] for line in before for r in line["rollouts"])  # what is at stake
    for old, new in zip(before, after):
        assert set(new) == set(old)  # today: no line key lost (wmaj@10, wmaj@10_top10 vanish)
        for key in set(old) - RESCORED_LINE_KEYS - {"rollouts"}:
            assert new[key] == old[key], key  # the same grader: the same scores
        for r_old, r_new in zip(old["rollouts"], new["rollouts"]):
            assert set(r_new) == set(r_old)  # today: `engine` is gone
            assert {k: v for k, v in r_new.items() if k not in RESCORED_ROLLOUT_KEYS} == \
                   {k: v for k, v in r_old.items() if k not in RESCORED_ROLLOUT_KEYS}  # today: signals None
            assert r_new["correct"] == r_old["correct"]

    res_before, res_after = json.loads(results_in.read_text()), json.loads(results_out.read_text())
    assert set(res_after) == set(res_before) | {"eglr_cell_accuracies"}
    for key in set(res_before) - {"results"}:
        assert res_after[key] == res_before[key], key
    task_before, task_after = res_before["results"]["eglr_demo_sc"], res_after["results"]["eglr_demo_sc"]
    assert "wmaj@10,pool" in task_before and "wmaj@10_top10,pool" in task_before
    assert set(task_after) == set(task_before)  # every metric and its stderr, name, alias, sample_len
    for key, value in task_before.items():
        assert task_after[key] == (value if isinstance(value, str) else pytest.approx(value)), key


def test_the_report_of_a_rescored_run_has_the_original_sections(real_run, tmp_path, capsys):
    assert score_main([str(real_run), "--output_path", str(tmp_path / "scored")]) == 0
    assert report_main([str(real_run), "--out", str(tmp_path / "report_in"), "--orders", "5"]) == 0
    assert report_main([str(tmp_path / "scored"), "--out", str(tmp_path / "report_out"), "--orders", "5"]) == 0
    report_in, report_out = tmp_path / "report_in", tmp_path / "report_out"
    sections = _sections(report_in / "report.md")
    assert "Selection" in sections
    assert _sections(report_out / "report.md") == sections
    assert sorted(p.name for p in report_out.iterdir()) == sorted(p.name for p in report_in.iterdir())
    # the Selection section's aggregators by confidence (today: gone with the signals); its numbers
    selection = (report_in / "selection.csv").read_text()
    assert "weighted" in selection
    assert (report_out / "selection.csv").read_text() == selection
    for name in ("cell_accuracy.csv", "oracle.csv"):
        if (report_in / name).is_file():
            assert (report_out / name).read_text() == (report_in / name).read_text(), name
