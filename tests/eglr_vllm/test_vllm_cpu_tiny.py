"""benchmarks/vllm_cpu.py in its tiny mode, run as its users run it (``python benchmarks/vllm_cpu.py --tiny``): stock
vLLM and eglr-vllm's modes on a tiny random model finish and the JSON has its keys (so that the script does not rot;
tests/benchmarks/test_tiny_modes.py runs the other benchmarks' tiny modes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed (its CPU build: docs/vllm.md)")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_cpu.py"


def test_vllm_cpu_tiny(tmp_path, shared_data_dir):
    out = tmp_path / "vllm_cpu.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EGLR_DATA_DIR": str(shared_data_dir),
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # as the script's users run it: vLLM's default
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], cwd=SCRIPT.parents[1], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"stock", "vplain", "vL0", "vL10", "vpool"}
    assert report["num_layers"] == 10 and report["compilation"] == "eager" and report["prompts"] == 2
    assert report["modes"]["vL0"]["equal_to_stock"] == 2  # eglr-vllm at L=0 decodes as stock vLLM
    summary = report["summary"]
    assert {"vL10_over_vL0_wall", "vL10_dense_floor_per_row", "vpool_within_10pct_of_floor"} <= set(summary)
    assert report["iteration_weights_ms_L10"]
