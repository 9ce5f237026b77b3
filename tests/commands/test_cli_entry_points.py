"""``eglr-eval`` and ``python -m eglr_harness`` run lm-eval end to end (subprocess, tiny model, 2 docs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def _eglr_eval_script() -> str:
    found = shutil.which("eglr-eval", path=str(Path(sys.executable).parent)) or shutil.which("eglr-eval")
    if found is None:
        pytest.fail("the eglr-eval console script is not installed: pip install . (see README)")
    return found


@pytest.mark.slow  # 19-22 s each here: a whole lm_eval run through each console script
@pytest.mark.parametrize("entry", ["python -m eglr_harness", "eglr-eval"])
def test_entry_point_runs_a_task_and_records_eglr(entry, tiny_model_dir, tmp_path):
    command = [sys.executable, "-m", "eglr_harness"] if entry.startswith("python") else [_eglr_eval_script()]
    model_args = f"pretrained={tiny_model_dir('llama')},dtype=float32,L=2,tau_h=0.5"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "EGLR_AUTOLOAD": "0", "EGLR_CACHE_DIR": str(tmp_path / "cache")}  # the wrapper loads eglr-harness itself
    done = subprocess.run(
        [*command, "--model", "eglr-hf", "--model_args", model_args, "--tasks", "eglr_demo", "--limit", "2",
         "--batch_size", "2", "--device", "cpu", "--gen_kwargs", "max_gen_toks=4",
         "--output_path", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert "eglr_demo" in results["results"]
    eglr = results["config"]["eglr"]
    assert eglr["tau_h"] == {"eglr_demo": 0.5}
    assert eglr["stats"]["cells"]["L=2,T=0.0"]["tokens"] > 0
