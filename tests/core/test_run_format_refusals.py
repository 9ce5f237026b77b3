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
    ("engine_unknown", _rollout(0, "engine", "vllm"), "`engine` is 'vllm'; allowed: 'continuous', 'hf'",
     list(COMMANDS)),
    ("signals_not_numbers", _rollout(0, "signals", {"mean_logprob": "high"}), "`signals` is", list(COMMANDS)),
    ("no_prompt", _bad_arguments, "has `arguments`", ["eglr-export"]),
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
