"""Every script of benchmarks/ runs as its users run it, in a tiny mode of seconds, and writes the JSON it promises:
so that none rots while the code it measures moves on.

Each run here is ``python benchmarks/<script> --tiny --out <file>`` in a subprocess; ``COVERED_ELSEWHERE`` names
the scripts whose tiny mode another test runs. ``test_every_benchmark_script_has_a_tiny_run`` fails for a script
that is in neither table. What the figures are is each script's business (and the tests of the code it measures):
here only that the run finishes and its JSON has its keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# script -> the test that runs its tiny mode (or its whole job at tiny sizes)
COVERED_ELSEWHERE = {
    "gpu_check.py": "tests/benchmarks/test_gpu_check.py (--size tiny --device cpu, slow)",
    "gpu_e2e.py": "tests/benchmarks/test_gpu_e2e.py (--size tiny --device cpu, slow)",
    "gpu_route.py": "tests/benchmarks/test_gpu_route.py (its --dry_run and its machine steps on a fake tree)",
    "pad_heads.py": "tests/benchmarks/test_pad_heads.py (a tiny random Llama, run as its command)",
    "vllm_cpu.py": "tests/eglr_vllm/test_vllm_cpu_tiny.py (needs vLLM: .ci/vllm)",
}


def run_tiny(script: str, tmp_path: Path, data_dir: Path | None = None) -> dict:
    """``python benchmarks/<script> --tiny --out <json>`` from the repository root at one thread; its JSON."""
    out = tmp_path / f"{Path(script).stem}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if data_dir is not None:
        env["EGLR_DATA_DIR"] = str(data_dir)
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--tiny", "--out", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_benchmark_script_has_a_tiny_run():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    tested = {"step_cost.py", "mutation_run.py", "bench_memory.py", "bench_prefill.py", "bench_decoding.py",
              "bench_ride_along.py"}
    assert scripts - tested - set(COVERED_ELSEWHERE) == set(), "a benchmark script without a tiny run in CI"
    for script, where in COVERED_ELSEWHERE.items():
        assert (ROOT / where.split()[0]).is_file(), where


@pytest.mark.slow  # an inductor compilation of the decoder layer (~15 s cold) and eager runs: ~30 s at one thread
def test_step_cost(tmp_path):
    figures = run_tiny("step_cost.py", tmp_path)["this"]
    for label in ("L0", "L4_every_token_gated"):
        reads = figures["host_reads"][label]
        assert set(reads) >= {"per_step", "per_step_max", "per_refill", "blocking_uploads_per_step",
                              "blocking_uploads_per_refill"}
        assert figures["ops_per_step"][label]["ops_per_step"] > figures["ops_per_step"][label]["layer_ops_per_step"]
        assert {"step", "prefill"} <= set(figures["loop"][label])
    kernels = figures["kernels"]
    assert "error" not in kernels, kernels
    regions = kernels["kernels_per_region_call"]
    assert set(regions) == set(kernels["region_calls_per_step"]) == {"decoder layer", "unembedding"}
    assert kernels["kernels_per_step"] == (sum(kernels["region_calls_per_step"][r] * regions[r] for r in regions)
                                           + kernels["ops_outside_regions_per_step"])
    assert kernels["late_compiles"] == 0 and figures["compilations"] >= 1 and figures["commit"]


def test_mutation_run(tmp_path):
    """Every mutant's anchor is still in the code (a refactoring that moves one must move the mutant), and the
    tiny mutant is killed."""
    report = run_tiny("mutation_run.py", tmp_path)
    assert report["stale"] == [], f"mutants whose code moved on: {report['stale']}"
    assert report["mutants_defined"] > 100
    assert [m["status"] for m in report["mutants"]] == ["killed"] and report["killed"] == report["total"] == 1


def test_bench_memory(tmp_path):
    report = run_tiny("bench_memory.py", tmp_path)
    assert set(report["modes"]) == {"L0", "L10"}
    assert report["modes"]["L10"]["gated_tokens"] == report["modes"]["L10"]["tokens"] > 0  # every token refined
    assert report["peak_rss_ratio_L10_over_L0"] > 0 and "--tiny" in report["command"]


def test_bench_prefill(tmp_path, shared_data_dir):
    report = run_tiny("bench_prefill.py", tmp_path, shared_data_dir)
    assert report["summary"]["same_tokens"] is True
    best = report["best"]
    assert best["before"]["prefilled_tokens"] == 10 * best["after"]["prefilled_tokens"]  # ten cells, one prefill
    assert set(report["summary"]) >= {"prefill_speedup", "wall_speedup", "throughput_ratio", "copy_seconds_after"}


def test_bench_ride_along(tmp_path, shared_data_dir):
    report = run_tiny("bench_ride_along.py", tmp_path, shared_data_dir)
    runs, summary = report["runs"], report["summary"]
    assert set(runs) == {"L0", "L10_before", "L10"} and summary["same_tokens_L10_before_and_after"] is True
    before, after = runs["L10_before"][0], runs["L10"][0]
    assert after["refining_row_steps"] > 0 and runs["L0"][0]["refining_row_steps"] == 0
    # a step of refining rows only ran the trash slot as its advancing row before, and runs no advancing row now
    assert before["padding_row_steps"] == after["steps_without_advancing_rows"] > 0 == after["padding_row_steps"]
    assert {"wall_ratio_vs_L0", "cpu_ratio_vs_L0", "ratios_vs_L0", "per_row_bound_with_unembedding"} <= set(
        summary["L10"])


@pytest.mark.slow  # three modes, each a process of its own that imports lm_eval: ~40 s at one thread
def test_bench_decoding(tmp_path, shared_data_dir):
    report = run_tiny("bench_decoding.py", tmp_path, shared_data_dir)
    assert set(report["runs"]) == {"hf", "cL0", "cL10"}
    summary = report["summary"]
    assert summary["same_text_L0_vs_hf[continuous]"] is True
    assert {"wall_ratio_L10_vs_L0[continuous]", "per_row_bound[continuous]",
            "batched_bound[continuous]"} <= set(summary)
    assert summary["settings"]["tiny"] is True
