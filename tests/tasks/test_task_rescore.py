"""eglr-score: a --predict_only run's samples, scored afterwards (literal samples lines)."""

from __future__ import annotations

import gzip
import json

import pytest

from eglr_harness.commands.score import main
from eglr_harness.core.jsonl import gzip_bytes
from eglr_harness.harness.rescore import rescore_file, samples_files, task_and_timestamp

STAMP = "2026-11-21T09-13-33.714591"
GEN_KWARGS = {"until": ["<|im_end|>"], "max_gen_toks": 256, "do_sample": False, "temperature": 0.0,
              "eglr_L": "1-3", "eglr_T": 0}
RESPS = [
    "She sells 16 - 3 - 4 = 9 eggs and makes 9 * 2 = 18 dollars.\nSo the answer is $\\boxed{18}$.",
    "She makes 17 dollars. The answer is $\\boxed{17}$.",
    "Final Answer: She makes $18 every day.",
]


def predict_only_line(doc_id: int) -> dict:
    """What lm-eval writes for a --predict_only run: raw texts, no eglr keys, the bypass metric."""
    return {
        "doc_id": doc_id,
        "doc": {"id": f"gsm8k-{doc_id}", "problem": "Janet's ducks ...", "answer": "18", "answer_format": "number"},
        "target": "18",
        "arguments": {"gen_args_0": {"arg_0": "<|im_start|>user\nJanet's ducks ...", "arg_1": GEN_KWARGS}},
        "resps": [RESPS],
        "filtered_resps": [["18", "17", "18"]],
        "filter": "pool",
        "metrics": ["bypass"],
        "doc_hash": "x", "prompt_hash": "y", "target_hash": "z",
        "bypass": 999,
    }


@pytest.fixture
def predict_only_run(tmp_path):
    run = tmp_path / "run" / "smollm2"
    run.mkdir(parents=True)
    lines = [predict_only_line(0), predict_only_line(1)]
    (run / f"samples_toy_eglr_sc_{STAMP}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    results = {"results": {"toy_eglr_sc": {"alias": "toy_eglr_sc", "bypass,pool": 999}},
               "config": {"model": "eglr-hf", "model_args": "pretrained=HuggingFaceTB/SmolLM2-135M-Instruct,tau_h=1.0"}}
    (run / f"results_{STAMP}.json").write_text(json.dumps(results))
    return run


def test_a_compressed_samples_file_is_rescored_into_a_compressed_one(predict_only_run, tmp_path):
    """results/ commits samples as .jsonl.gz: eglr-score finds and reads them, and writes its output compressed."""
    plain = predict_only_run / f"samples_toy_eglr_sc_{STAMP}.jsonl"
    expected = rescore_file(plain, tmp_path / "plain")
    gz = plain.with_name(plain.name + ".gz")
    gz.write_bytes(gzip_bytes(plain.read_bytes()))
    plain.unlink()
    assert samples_files([predict_only_run]) == [gz] and task_and_timestamp(gz) == ("toy_eglr_sc", STAMP)
    assert rescore_file(gz, tmp_path / "gz") == expected
    assert gzip.decompress((tmp_path / "gz" / gz.name).read_bytes()) == (tmp_path / "plain" / plain.name).read_bytes()


def test_task_and_timestamp_from_the_file_name(tmp_path):
    assert task_and_timestamp(tmp_path / f"samples_gsm8k_eglr_sc_{STAMP}.jsonl") == ("gsm8k_eglr_sc", STAMP)


def test_predict_only_run_is_scored_with_its_pool(predict_only_run, tmp_path):
    out = tmp_path / "scored"
    task, metrics = rescore_file(predict_only_run / f"samples_toy_eglr_sc_{STAMP}.jsonl", out)
    assert task == "toy_eglr_sc"
    assert metrics == {"rollouts,pool": 6, "acc,pool": pytest.approx(2 / 3), "maj@3,pool": 1, "oracle@3,pool": 1,
                       "pass@1,pool": pytest.approx(2 / 3), "pass@3,pool": 1.0, "best_cfg_acc,pool": 1.0}
    lines = [json.loads(x) for x in (out / f"samples_toy_eglr_sc_{STAMP}.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and "bypass" not in lines[0]
    rollouts = lines[0]["rollouts"]
    # the pool eglr-hf ran: the task's eglr_L 1-3 at T 0, in repeat order
    assert [(r["L"], r["T"], r["cycle"]) for r in rollouts] == [(1, 0.0, 0), (2, 0.0, 0), (3, 0.0, 0)]
    assert [r["answer"] for r in rollouts] == ["18", "17", "18"] and [r["cluster"] for r in rollouts] == [0, 1, 0]
    assert lines[0]["filtered_resps"] == [["18", "17", "18"]] and lines[0]["resps"] == [RESPS]
    results = json.loads((out / f"results_{STAMP}.json").read_text())
    assert results["results"]["toy_eglr_sc"]["acc,pool"] == pytest.approx(2 / 3)
    assert results["eglr_cell_accuracies"]["toy_eglr_sc"] == {"L=1,T=0.0": 1.0, "L=2,T=0.0": 0.0, "L=3,T=0.0": 1.0}
    assert results["config"]["model"] == "eglr-hf"  # the run's config is kept


@pytest.mark.parametrize("model_args, cells", [
    # one deterministic cell repeated: eglr-hf decodes it once and logs every repeat as cycle 0
    ("pretrained=x,L=0,T=0", [(0, 0.0, 0), (0, 0.0, 0), (0, 0.0, 0)]),
    # one sampled cell repeated: a fresh seed per cycle
    ("pretrained=x,L=0,T=0.5", [(0, 0.5, 0), (0, 0.5, 1), (0, 0.5, 2)]),
])
def test_repeats_of_one_cell_get_the_cycles_eglr_hf_logs(predict_only_run, tmp_path, model_args, cells):
    results_path = predict_only_run / f"results_{STAMP}.json"
    results = json.loads(results_path.read_text())
    results["config"]["model_args"] = model_args
    results_path.write_text(json.dumps(results))
    rescore_file(predict_only_run / f"samples_toy_eglr_sc_{STAMP}.jsonl", tmp_path / "scored")
    line = json.loads((tmp_path / "scored" / f"samples_toy_eglr_sc_{STAMP}.jsonl").read_text().splitlines()[0])
    assert [(r["L"], r["T"], r["cycle"]) for r in line["rollouts"]] == cells


def test_without_results_file_the_cells_are_unknown(predict_only_run, tmp_path):
    (predict_only_run / f"results_{STAMP}.json").unlink()
    rescore_file(predict_only_run / f"samples_toy_eglr_sc_{STAMP}.jsonl", tmp_path / "scored")
    line = json.loads((tmp_path / "scored" / f"samples_toy_eglr_sc_{STAMP}.jsonl").read_text().splitlines()[0])
    assert {(r["L"], r["T"]) for r in line["rollouts"]} == {(None, None)}
    assert line["best_cfg_acc"] == {"unknown": pytest.approx(2 / 3)}


def test_cli_scores_a_run_folder(predict_only_run, tmp_path, capsys):
    assert main([str(predict_only_run), "--output_path", str(tmp_path / "scored")]) == 0
    assert "maj@3,pool" in capsys.readouterr().out
    assert (tmp_path / "scored" / "smollm2" / f"samples_toy_eglr_sc_{STAMP}.jsonl").is_file()


def test_cli_names_a_path_without_samples(tmp_path, capsys):
    """One line and exit status 2, as every eglr-* refusal (argparse's usage was printed beside it)."""
    assert main([str(tmp_path), "--output_path", str(tmp_path / "scored")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("eglr-score: error: ") and "no samples_*.jsonl" in err, err


def test_two_tasks_of_one_run_keep_both_results(predict_only_run, tmp_path, capsys):
    """The tasks of one run share its results file: scoring the second keeps the first's scored results."""
    first = predict_only_run / f"samples_toy_eglr_sc_{STAMP}.jsonl"
    (predict_only_run / f"samples_toy2_eglr_sc_{STAMP}.jsonl").write_text(first.read_text())
    results = predict_only_run / f"results_{STAMP}.json"
    data = json.loads(results.read_text())
    data["results"]["toy2_eglr_sc"] = {"alias": "toy2_eglr_sc", "bypass,pool": 999}
    results.write_text(json.dumps(data))
    assert main([str(predict_only_run), "--output_path", str(tmp_path / "scored")]) == 0
    written = json.loads((tmp_path / "scored" / "smollm2" / f"results_{STAMP}.json").read_text())
    scored = written["results"]
    assert set(scored) == {"toy_eglr_sc", "toy2_eglr_sc"}
    assert all("maj@3,pool" in scored[task] for task in scored), scored
    # issue 55 (a surviving mutant): the second task's scoring dropped the first task's per-cell accuracies
    assert set(written["eglr_cell_accuracies"]) == {"toy_eglr_sc", "toy2_eglr_sc"}
