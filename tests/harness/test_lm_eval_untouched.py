"""A run of a model and tasks that are not the project's is lm-eval's own, byte for byte (issue 48): the stock
``lm_eval`` console script, lm-eval's ``dummy`` model, a task defined here with local data; with the autoload
switched off (``EGLR_AUTOLOAD=0``, the baseline) and on, the same exit code, output, messages, files and file
names, on success and on failure. Only what changes from run to run (times, dates, rates) is masked."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TASK = """\
task: echo_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
metric_list:
  - metric: exact_match
"""
CHANGING = [  # what differs between two runs of lm-eval itself
    (re.compile(r"\d{4}-\d\d-\d\d[:T]\d\d[:-]\d\d[:-]\d\d(\.\d+)?"), "<time>"),
    (re.compile(r"[\d.]+ ?(it|examples)/s"), "<rate>"),
    (re.compile(r"\d\d:\d\d<[\d:?]+"), "<eta>"),
]
TIMED_FIELDS = ("date", "start_time", "end_time", "total_evaluation_time_seconds")


def masked(text: str) -> str:
    for pattern, mask in CHANGING:
        text = pattern.sub(mask, text)
    return text


def lm_eval(args: list[str], *, cwd: Path, autoload: bool) -> dict:
    """One run of the ``lm_eval`` console script in ``cwd``: its exit code, output, messages and files."""
    cwd.mkdir()
    (cwd / "blocked").write_text("a file, not a folder")  # for an --output_path that cannot be made
    env = {**os.environ, "EGLR_AUTOLOAD": "1" if autoload else "0", "HF_HOME": str(cwd / "hf"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    script = Path(sysconfig.get_path("scripts")) / "lm_eval"
    done = subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    shutil.rmtree(cwd / "hf", ignore_errors=True)  # the datasets cache: lm-eval's, not part of the run's output
    files = {}
    for path in sorted(p for p in cwd.rglob("*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            results = json.loads(text)
            for field in TIMED_FIELDS:
                results.pop(field, None)
            text = json.dumps(results, indent=2)
        files[masked(str(path.relative_to(cwd)))] = masked(text)
    return {"exit code": done.returncode, "stdout": masked(done.stdout), "stderr": masked(done.stderr), "files": files}


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tasks")
    data = folder / "echo.jsonl"
    data.write_text('{"question": "one", "answer": "lol"}\n{"question": "two", "answer": "no"}\n')
    (folder / "echo.yaml").write_text(TASK.format(data=data))
    return folder


@pytest.mark.parametrize("case", ["success", "unwritable output path", "misspelt task"])
def test_another_models_run_is_lm_evals_own(tmp_path, task_folder, case):
    task = "echo_locl" if case == "misspelt task" else "echo_local"
    output = "blocked/out" if case == "unwritable output path" else "out"
    args = ["--model", "dummy", "--model_args", "pretrained=dummy", "--tasks", task, "--include_path",
            str(task_folder), "--output_path", output, "--log_samples"]
    without = lm_eval(args, cwd=tmp_path / "without", autoload=False)
    with_project = lm_eval(args, cwd=tmp_path / "with", autoload=True)
    assert with_project == without
    assert without["exit code"] == (0 if case != "misspelt task" else 1)  # lm-eval's own: a failed save exits 0
    assert ("results_<time>.json" in str(without["files"])) == (case == "success")
