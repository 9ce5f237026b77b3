"""Issue 38 (6): eglr-report, eglr-export and eglr-score check what they read, in one place
(``eglr_harness/core/run_format.py``): a samples line or results file that breaks docs/run-format.md is
refused with one line ``FILE:LINE: what is wrong (value) and what is allowed``, exit 2, no traceback.

The files are a genuine run (``data/real_gsm8k_eglr_sc``, written by the stock lm_eval CLI) with one
value changed; the commands are run through their console entry points.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eglr_harness.commands import export
from eglr_harness.commands.report import main as report_main
from eglr_harness.commands.score import main as score_main

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

REAL = Path(__file__).parents[1] / "analysis" / "data" / "real_gsm8k_eglr_sc"  # the analysis tests' real run
REPO = Path(__file__).resolve().parents[2]
COMMANDS = {
    "eglr-report": (report_main, "eglr_harness.commands.report", lambda run, out: [str(run), "--out", str(out / "r")]),
    "eglr-export": (export.main, "eglr_harness.commands.export", lambda run,
                    out: [str(run), "--out", str(out / "x.jsonl")]),
    "eglr-score": (score_main, "eglr_harness.commands.score", lambda run,
                   out: [str(run), "--output_path", str(out / "s")]),
}


def _copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    (samples,) = run.rglob("samples_*.jsonl")
    (results,) = run.rglob("results_*.json")
    return run, samples, results


def _edit_line(samples: Path, number: int, change) -> None:
    """Apply ``change(line dict)`` to line ``number`` (1-based) of a samples file."""
    lines = [json.loads(x) for x in samples.read_text().splitlines()]
    change(lines[number - 1])
    samples.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _rollout(i: int, key: str, value):
    def change(line):
        line["rollouts"][i][key] = value
    return change


def _replace_rollout(line):
    line["rollouts"][3] = "L=4: 18"


def _one_text(line):
    line["resps"] = [line["resps"][0][:1]]


def _bad_arguments(line):
    line["arguments"] = {"gen_args_0": {"arg_1": {}}}


# (id, how the samples line 2 is changed, the value the message must name, commands that read it)
SAMPLE_CASES = [
    ("correct_as_string", _rollout(2, "correct", "0"), "`correct` is '0'; allowed: 0 or 1", list(COMMANDS)),
    ("T_as_list", _rollout(1, "T", [1]), "`T` is [1]; allowed: a finite number >= 0", list(COMMANDS)),
    ("negative_L", _rollout(0, "L", -3), "`L` is -3; allowed: an int >= 0", list(COMMANDS)),
    ("rollout_not_a_dict", _replace_rollout, "rollout #3 is 'L=4: 18'; expected a dict", list(COMMANDS)),
    ("engine_unknown", _rollout(0, "engine", "tgi"), "`engine` is 'tgi'; allowed: 'continuous', 'hook', 'vllm'",
     list(COMMANDS)),
    ("signals_not_numbers", _rollout(0, "signals", {"mean_logprob": "high"}), "`signals` is", list(COMMANDS)),
    # issue 47: exp(800) overflowed in eglr-score and the selection report ("math range error")
    ("mean_logprob_above_0", _rollout(0, "signals", {"mean_logprob": 800.0}), "`signals` is {'mean_logprob': 800.0}",
     list(COMMANDS)),
    ("signal_infinite", _rollout(0, "signals", {"max_entropy": float("inf")}), "`signals` is", list(COMMANDS)),
    # +Infinity as a vote weight swallowed every other vote; the refusal had no FILE:LINE
    ("verifier_score_infinite", _rollout(0, "verifier_scores", {"self:p_true": {"last": float("inf"), "min": 0.1,
                                                                               "prod": 0.1}}),
     "`verifier_scores` is {'self:p_true': {'last': inf", list(COMMANDS)),
    ("verifier_score_missing_aggregation", _rollout(0, "verifier_scores", {"orm:x": {"last": 0.5}}),
     "`verifier_scores` is", list(COMMANDS)),
    ("no_prompt", _bad_arguments, "has `arguments`", ["eglr-export"]),
    # issue 47: export and score refused it (texts and rollouts differ), report counted 6 documents, scored 5
    ("no_rollouts", lambda line: line.update(rollouts=[]), "doc 1 has `rollouts` []; allowed: a non-empty list",
     list(COMMANDS)),
    ("texts_fewer_than_rollouts", _one_text, "`resps`", ["eglr-export", "eglr-score"]),
]


def _refused(command: str, run: Path, tmp_path: Path, capsys) -> str:
    """Run ``command`` in-process; it must exit 2 with one line on stderr (a traceback fails the test)."""
    main, _, argv = COMMANDS[command]
    status = main(argv(run, tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, f"{command} exited {status}: {err}"
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case, change, named, commands", SAMPLE_CASES, ids=[c[0] for c in SAMPLE_CASES])
def test_a_bad_rollout_is_refused_naming_file_line_and_value(tmp_path, capsys, command, case, change, named, commands):
    if command not in commands:
        pytest.skip(f"{command} does not read this field")
    run, samples, _ = _copy(tmp_path)
    _edit_line(samples, 2, change)
    message = _refused(command, run, tmp_path, capsys)
    assert message.startswith(f"{command}: error: {samples}:2: "), message
    assert named in message, message


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_engine_that_decodes_is_read(tmp_path, capsys, command):
    """A rollout of each engine the project has is read: eglr-vllm's (`engine: vllm`) were refused by every
    reader until 2026-11-29, so no eglr-vllm run could be reported, exported or rescored."""
    run, samples, _ = _copy(tmp_path)
    engines = ("vllm", "continuous", "hook", "hf")  # the rollouts of line 1 in turn ('hf': the hook's old name)
    _edit_line(samples, 1, lambda sample: [r.update(engine=engines[i % len(engines)])
                                           for i, r in enumerate(sample["rollouts"])])
    main, _, argv = COMMANDS[command]
    assert main(argv(run, tmp_path)) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_duplicated_document_line_is_refused(tmp_path, capsys, command):
    run, samples, _ = _copy(tmp_path)
    first = samples.read_text().splitlines()[0]
    samples.write_text(samples.read_text() + first + "\n")  # today: eglr-export exports doc 0 twice
    message = _refused(command, run, tmp_path, capsys)
    assert message.startswith(f"{command}: error: {samples}:3: doc 0 appears twice"), message
    assert "first on line 1" in message


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("key, value, anchor, named", [
    ("eglr", "x", "eglr", "`config.eglr` is 'x'; allowed: the dict eglr-hf writes"),
    ("eglr.settings", [0.2], "settings", "`config.eglr.settings` is [0.2]"),
    ("eglr.tau_h", {"gsm8k_eglr_sc": "high"}, "tau_h", "`config.eglr.tau_h` is {'gsm8k_eglr_sc': 'high'}"),
    ("eglr.stats.cells", {"L4": {}}, "L4", "`config.eglr.stats.cells.L4` is {}; allowed: cell labels"),
    # issue 47: non-finite settings were read, and exported as `Infinity` literals
    ("eglr.settings.alpha", float("inf"), "alpha", "`config.eglr.settings.alpha` is inf; allowed: a float in [0, 1]"),
    # issue 55: the settings by eglr-hf's own limits (core/config.SETTING_RULES), each named with its line
    ("eglr.settings.tau_latent", "0.01", "tau_latent", "`config.eglr.settings.tau_latent` is '0.01'; allowed: a "
     "finite float in [0, 2**53]"),
    ("eglr.settings.stop", ["latent"], "stop", "`config.eglr.settings.stop` is ['latent']; allowed: one of kl, "
     "latent"),
    ("eglr.settings.k_max", -3, "k_max", "`config.eglr.settings.k_max` is -3; allowed: an int in [1, 2**53]"),
    ("eglr.settings.seed", 10**23, "seed", "`config.eglr.settings.seed` is 100000000000000000000000; allowed: an int "
     "in [-2**53, 2**53]"),
    ("eglr.stats.total.flop_ratio_with_head", 0.5, "flop_ratio_with_head",
     "`config.eglr.stats.total.flop_ratio_with_head` is 0.5; allowed: a number in [1, 2**53]"),
    ("eglr.stats.reused_rollouts", None, "reused_rollouts", "`config.eglr.stats.reused_rollouts` is None; allowed: "
     "a dict {total, cells}"),
    ("eglr.tau_h", {"gsm8k_eglr_sc": float("nan")}, "tau_h", "`config.eglr.tau_h` is {'gsm8k_eglr_sc': nan}"),
    ("eglr.tau_h", 1e308, "tau_h", "`config.eglr.tau_h` is 1e+308"),
])
def test_a_bad_config_eglr_is_refused_naming_file_line_and_value(tmp_path, capsys, command, key, value, anchor, named):
    run, _, results = _copy(tmp_path)
    data = json.loads(results.read_text())
    target = data["config"]
    *parents, last = key.split(".")
    for part in parents:
        target = target[part]
    target[last] = value
    text = json.dumps(data, indent=2)
    results.write_text(text)
    message = _refused(command, run, tmp_path, capsys)
    line = text[: text.index(f'"{anchor}":', text.index('"eglr":'))].count("\n") + 1  # the line of the bad value
    assert message.startswith(f"{command}: error: {results}:{line}: "), message
    assert named in message, message


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_console_command_prints_one_line_and_exits_2(tmp_path, command):
    """The same refusal as a user meets it: ``python -m`` the command's module, stderr one line, no traceback."""
    run, samples, _ = _copy(tmp_path)
    _edit_line(samples, 1, _rollout(0, "correct", "0"))  # today: counted as correct, exit 0
    _, module, argv = COMMANDS[command]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", module, *argv(run, tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120)
    lines = [x for x in done.stderr.splitlines() if not x.startswith(("INFO", "WARNING"))]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and re.match(rf"{command}: error: {re.escape(str(samples))}:1: doc 0 rollout #0: "
                                        r"`correct` is '0'; allowed: 0 or 1", lines[0]), lines


@pytest.mark.parametrize("command", ["eglr-report", "eglr-export"])
def test_bad_sample_counts_are_refused_naming_file_line_and_value(tmp_path, capsys, command):
    run, _, results = _copy(tmp_path)
    data = json.loads(results.read_text())
    data["n-samples"]["gsm8k_eglr_sc"]["effective"] = [2]  # today: a TypeError traceback
    text = json.dumps(data, indent=2)
    results.write_text(text)
    message = _refused(command, run, tmp_path, capsys)
    line = text[: text.index('"gsm8k_eglr_sc":', text.index('"n-samples":'))].count("\n") + 1
    assert message.startswith(f"{command}: error: {results}:{line}: n-samples['gsm8k_eglr_sc'] is "), message
    assert "'effective': [2]" in message and "allowed: {'original': int >= 0" in message


# --------------------------------------------------------------------------- the hostile table (issue 47)
# Every field a reader uses, with every kind of bad value. A kind a field allows is left out of its row
# (e.g. None for an optional rollout field, "" for `answer`); a kind that a field allows by type but that
# breaks the file's own arithmetic (tokens 0 under 20 gated tokens) is in CONSISTENCY_CASES below.
ABSENT = object()
KINDS = {
    "absent": ABSENT, "None": None, "empty": "", "False": False, "zero": 0, "negative": -5, "NaN": float("nan"),
    "+Infinity": float("inf"), "-Infinity": float("-inf"), "huge_int": 2**60, "huge_float": 1e308,
    "string": "61735", "list": [1], "dict": {"x": "y"},
}
_NUMBERS = {"absent", "zero"}  # what an optional count or figure allows of the kinds above
ALLOWED_KINDS = {
    # rollout fields (samples line 2, rollout #1)
    "rollout.repeat": _NUMBERS,
    "rollout.L": _NUMBERS | {"None"},
    "rollout.T": _NUMBERS | {"None"},
    "rollout.cycle": _NUMBERS | {"None"},
    "rollout.cluster": _NUMBERS | {"None"},
    "rollout.answer": {"absent", "None", "empty", "string"},
    "rollout.correct": {"False", "zero"},
    "rollout.signals": {"absent", "None"},
    "rollout.engine": {"absent", "None"},
    # the line itself
    "line.doc_id": {"zero"},
    # config.eglr.stats.total (the same rules hold for every cell and calibration compute)
    "total.tokens": {"absent", "zero"},
    "total.gated_tokens": {"absent", "zero"},
    "total.rho": {"absent"},
    "total.mean_iterations": {"absent"},
    "total.iteration_hist": {"absent"},
    "total.flop_ratio": {"absent"},
    "total.batched_flop_ratio": {"absent"},
    "total.steps": {"absent", "zero"},
    "total.p_step_gated": {"absent", "zero"},
    "total.wall_time_s": {"absent", "zero"},
    "cell.tokens": {"absent", "zero"},
    "cell.wall_time_s": {"absent", "zero"},
    "cell.flop_ratio": {"absent"},
    "reused.total": {"absent", "zero"},
    "calibration.tau_h": {"absent", "zero"},
    "calibration.prompts": {"absent", "zero"},
    "calibration.entropy_tokens": {"absent", "None", "zero"},
    "calibration.cached": {"absent", "False"},
    "calibration.compute": {"absent", "None"},
    "undeclared_figure": {"absent", "None", "zero", "list"},  # a newer writer's figure: numbers >= 0 or null
}
HOSTILE = [(field, kind) for field, allowed in ALLOWED_KINDS.items() for kind in KINDS if kind not in allowed]
# allowed by type, refused by the file's own arithmetic (193 gated tokens): CONSISTENCY_CASES
# (and doc_id 0 on line 2 is doc 0 twice)
INCONSISTENT = {("total.tokens", "zero"), ("total.gated_tokens", "zero"), ("cell.tokens", "zero"),
                ("line.doc_id", "zero")}
CALIBRATION = {"tau_h": 1.0, "prompts": 4, "entropy_tokens": 96, "cached": False, "compute": None}


def _set(target: dict, key: str, value) -> None:
    if value is ABSENT:
        target.pop(key, None)
    else:
        target[key] = value


def _hostile_edit(run: Path, samples: Path, results: Path, field: str, value) -> tuple[Path, str]:
    """Put ``value`` at ``field``; returns the file and the words the refusal must name."""
    scope, name = field.split(".") if "." in field else ("stats", field)
    if scope in ("rollout", "line"):
        def change(line):
            _set(line["rollouts"][1] if scope == "rollout" else line, name, value)
        _edit_line(samples, 2, change)
        return samples, (f"doc 1 rollout #1: `{name}` is" if scope == "rollout" and value is not ABSENT else
                         "has no `correct`" if scope == "rollout" else f":2: `{name}` is")
    data = json.loads(results.read_text())
    stats = data["config"]["eglr"]["stats"]
    stats["calibration"] = {"gsm8k_eglr_sc": dict(CALIBRATION)}
    target, path = {
        "total": (stats["total"], f"total.{name}"),
        "cell": (stats["cells"]["L=4,T=0.0"], f"cells.L=4,T=0.0.{name}"),
        "reused": (stats.setdefault("reused_rollouts", {"total": 0, "cells": {}}), f"reused_rollouts.{name}"),
        "calibration": (stats["calibration"]["gsm8k_eglr_sc"], f"calibration.gsm8k_eglr_sc.{name}"),
        "stats": (stats["total"], "total.flops_per_token"),
    }[scope]
    _set(target, "flops_per_token" if scope == "stats" else name, value)
    results.write_text(json.dumps(data, indent=2))
    return results, f"`config.eglr.stats.{path}` is"


@pytest.mark.parametrize("field, kind", HOSTILE, ids=[f"{f}={k}" for f, k in HOSTILE])
def test_every_field_refuses_every_kind_of_bad_value(tmp_path, capsys, field, kind):
    """One command per case, in turn, so that each command meets every kind of field (all three read
    the same check; the SAMPLE_CASES above run each case through all three)."""
    command = list(COMMANDS)[HOSTILE.index((field, kind)) % len(COMMANDS)]
    run, samples, results = _copy(tmp_path)
    where, named = _hostile_edit(run, samples, results, field, KINDS[kind])
    # a dict of figures is refused at its bad key: `...compute.x`
    if kind == "dict" and field in ("calibration.compute", "undeclared_figure"):
        named = named.replace("` is", ".x` is")
    message = _refused(command, run, tmp_path, capsys)
    assert message.startswith(f"{command}: error: {where}:"), message
    assert named in message and "allowed:" in message, message


ALLOWED = [(f, k) for f, allowed in ALLOWED_KINDS.items() for k in sorted(allowed) if (f, k) not in INCONSISTENT]


@pytest.mark.parametrize("field, kind", ALLOWED, ids=[f"{f}={k}" for f, k in ALLOWED])
def test_what_a_field_allows_is_read(tmp_path, capsys, field, kind):
    """The other side of the table: the kinds a field allows pass the check (a check that refused
    everything would pass the test above)."""
    run, samples, results = _copy(tmp_path)
    _hostile_edit(run, samples, results, field, KINDS[kind])
    assert export.main([str(run), "--out", str(tmp_path / "x.jsonl")]) == 0, capsys.readouterr().err


def _results_edit(results: Path, change) -> None:
    data = json.loads(results.read_text())
    change(data["config"]["eglr"]["stats"])
    results.write_text(json.dumps(data, indent=2))


# (id, how config.eglr.stats is changed, the words of the refusal): each figure is allowed alone, the file's
# arithmetic is not (a report would print these as they are, or merge them into wrong totals)
CONSISTENCY_CASES = [
    ("gated_over_tokens", lambda s: s["total"].update(tokens=0, rho=0.0),
     "`config.eglr.stats.total.gated_tokens` is 193; allowed: at most `tokens` (0)"),
    ("rho_not_gated_over_tokens", lambda s: s["total"].update(rho=0.32),
     "`config.eglr.stats.total.rho` is 0.32; allowed: gated_tokens / tokens = 193/320"),
    ("hist_not_summing_to_gated", lambda s: s["cells"]["L=4,T=0.0"]["iteration_hist"].update({"3": 19}),
     "`config.eglr.stats.cells.L=4,T=0.0.iteration_hist` is {'3': 19}; "
     "allowed: counts that sum to `gated_tokens` (20)"),
    ("hist_key_not_an_int", lambda s: s["cells"]["L=4,T=0.0"].update(iteration_hist={"x": 20}),
     "`config.eglr.stats.cells.L=4,T=0.0.iteration_hist` is {'x': 20}; allowed: a dict 'k'"),
    ("mean_not_the_hist_mean", lambda s: s["cells"]["L=4,T=0.0"].update(mean_iterations=2.5),
     "`config.eglr.stats.cells.L=4,T=0.0.mean_iterations` is 2.5; allowed: the mean of `iteration_hist` (3)"),
    ("total_not_the_cells_sum", lambda s: s["cells"]["L=4,T=0.0"].update(tokens=64, rho=20 / 64),
     "`config.eglr.stats.total.tokens` is 320; allowed: the sum of the cells' `tokens` (352)"),
    ("reused_total_not_the_sum", lambda s: s.update(reused_rollouts={"total": 3, "cells": {"L=4,T=0.0": 2}}),
     "`config.eglr.stats.reused_rollouts.total` is 3; allowed: the sum of `reused_rollouts.cells` (2)"),
    ("reused_cell_negative", lambda s: s.update(reused_rollouts={"total": 0, "cells": {"L=4,T=0.0": -1}}),
     "`config.eglr.stats.reused_rollouts.cells.L=4,T=0.0` is -1; allowed: an int in [0, 2**53]"),
    # the edges the mutation run found unguarded (benchmarks/results/mutation_issue47.json)
    ("gated_one_over_tokens", lambda s: s["total"].update(tokens=192),
     "`config.eglr.stats.total.gated_tokens` is 193; allowed: at most `tokens` (192)"),
    ("hist_k_zero", lambda s: s["cells"]["L=4,T=0.0"].update(iteration_hist={"0": 20}),
     "`config.eglr.stats.cells.L=4,T=0.0.iteration_hist` is {'0': 20}; allowed: a dict 'k'"),
    ("hist_with_no_gated_tokens", lambda s: s["cells"]["L=4,T=0.0"].update(gated_tokens=0, rho=0.0),
     "`config.eglr.stats.cells.L=4,T=0.0.iteration_hist` is {'3': 20}; "
     "allowed: counts that sum to `gated_tokens` (0)"),
    ("rho_with_no_tokens", lambda s: s["cells"]["L=4,T=0.0"].update(tokens=0, gated_tokens=0, rho=0.5,
                                                                     iteration_hist={}, mean_iterations=0.0),
     "`config.eglr.stats.cells.L=4,T=0.0.rho` is 0.5; allowed: gated_tokens / tokens = 0/0 = 0"),
    ("total_gated_not_the_cells_sum", lambda s: s["cells"]["L=4,T=0.0"].update(gated_tokens=19, rho=19 / 32,
                                                                                iteration_hist={"3": 19}),
     "`config.eglr.stats.total.gated_tokens` is 193; allowed: the sum of the cells' `gated_tokens` (192)"),
]


@pytest.mark.parametrize("case, change, named", CONSISTENCY_CASES, ids=[c[0] for c in CONSISTENCY_CASES])
def test_figures_that_contradict_each_other_are_refused(tmp_path, capsys, case, change, named):
    run, _, results = _copy(tmp_path)
    _results_edit(results, change)
    message = _refused("eglr-report", run, tmp_path, capsys)
    assert message.startswith(f"eglr-report: error: {results}:") and named in message, message


def test_the_console_script_refuses_a_string_token_count_naming_its_line(tmp_path):
    """As the issue found it: `tokens` "61735" in a results file was accepted (and a merged report then
    dropped the run from `tokens` but kept it in `gated_tokens`). The installed console script, a real file."""
    run, _, results = _copy(tmp_path)
    _results_edit(results, lambda s: s["total"].update(tokens="61735"))
    text = results.read_text()
    line = text[: text.index('"tokens":', text.index('"total":'))].count("\n") + 1
    script = Path(sys.executable).with_name("eglr-report")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "eglr_harness.commands.report"]
    done = subprocess.run([*argv, str(run), "--out", str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=120)
    lines = [x for x in done.stderr.splitlines() if not x.startswith(("INFO", "WARNING"))]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines == [f"eglr-report: error: {results}:{line}: `config.eglr.stats.total.tokens` is '61735'; allowed: "
                     "an int in [0, 2**53] (docs/run-format.md)."], lines
    assert not (tmp_path / "r").exists()



@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_lone_surrogate_is_refused_naming_file_and_line(tmp_path, capsys, command):
    """Issue 47: "\\ud800" parses as JSON but is no text: eglr-score died writing it, without FILE:LINE."""
    run, samples, _ = _copy(tmp_path)
    lines = samples.read_text().splitlines()
    line = json.loads(lines[1])
    line["rollouts"][0]["answer"] = "SURROGATE"
    lines[1] = json.dumps(line).replace("SURROGATE", "\\ud800")
    samples.write_text("\n".join(lines) + "\n")
    message = _refused(command, run, tmp_path, capsys)
    assert message.startswith(f"{command}: error: {samples}:2: a string holds a lone surrogate ('\\ud800'"), message
