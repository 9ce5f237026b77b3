"""benchmarks/gpu_check.py at tiny sizes on the CPU: every check runs and the exactness verdicts hold."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
TINY = ["--size", "tiny", "--device", "cpu", "--exact_new_tokens", "6", "--batches", "1,2", "--new_tokens", "6"]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


@pytest.fixture(scope="module")
def report(gpu_check, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "tiny.json"
    returned = gpu_check.main([*TINY, "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["summary"] == json.loads(json.dumps(returned["summary"]))
    return written


def test_report_records_environment_and_settings(report, gpu_check):
    env = report["environment"]
    for key in ("device", "device_name", "torch", "transformers", "python"):
        assert env[key], key
    settings = report["settings"]
    assert settings["size"] == "tiny" and settings["families"] == list(gpu_check.DEFAULT_FAMILIES)
    assert settings["batches"] == [1, 2] and settings["new_tokens"] == 6
    assert settings["repeats"] == 1 and settings["continuous_compile"] is False  # tiny defaults on a CPU
    assert report["paper_settings"] == {"alpha": 0.2, "k_max": 3, "tau_kl": 5e-4}


@pytest.mark.parametrize("family", ["qwen2.5-3b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-3-4b"])
def test_exactness_holds_at_tiny_sizes(report, family):
    entry = report["families"][family]
    assert "config.json" in entry["source"]
    exact = entry["exactness"]
    assert exact["spans"] == [1, 2, 4]
    assert exact["ok"] is True
    for attn in ("sdpa", "eager"):
        fp32 = exact["fp32"][attn]
        assert fp32["L0_equals_generate"] is True
        assert set(fp32["vs_naive"]) == {f"{g}/L{L}" for g in ("p95", "always") for L in (1, 2, 4)}
        for name, case in fp32["vs_naive"].items():
            assert case["tokens_equal"] is True and case["first_divergence"] is None, (attn, name)
            assert case["gated_tokens"] > 0, f"{attn} {name}: the gate never fired, the case checks nothing"
            assert case["max_abs_logit_diff"] < 1e-4
    continuous = exact["continuous_fp32"]
    assert continuous["L0_equals_generate"] is True
    assert set(continuous["vs_naive"]) == {f"{g}/L{L}" for g in ("p95", "always") for L in (1, 2, 4)}
    for name, case in continuous["vs_naive"].items():
        assert case["tokens_equal"] is True and case["first_divergence"] is None, name
        assert case["gated_tokens"] > 0, name
    assert exact["bf16"]["L0_equals_generate"] and exact["bf16"]["finite_p95"] and exact["bf16"]["finite_always"]
    assert exact["flash_attention_2_bf16"] == {"skipped": "no cuda"}


@pytest.mark.parametrize("family", ["qwen2.5-3b", "gemma-3-4b"])
def test_placement_speed_and_memory_fields(report, family):
    entry = report["families"][family]
    placement = entry["placement"]
    assert placement["ok"] is True and placement["skipped"].startswith("no cuda")
    speed = entry["speed"]
    assert speed["L"] == 4 and speed["layers"] == 4  # --speed_L 10 clipped to the tiny depth
    assert set(speed["batches"]) == {"1", "2"}
    for batch, figures in speed["batches"].items():
        assert set(figures["runs"]) == {"generate", "generate_static", "L0", "L4", "cL0", "cL4"}
        for run in figures["runs"].values():
            assert run["tokens"] == int(batch) * 6 and run["tokens_per_s"] > 0
            assert run["wall_s_min"] <= run["wall_s"] and len(run["walls_s"]) == 1
        assert set(figures["profile"]) == set(figures["runs"])
        assert all(p == {"skipped": "no cuda"} for p in figures["profile"].values())
        for key in ("wall_ratio_L0_vs_generate", "wall_ratio_L_vs_L0", "rho", "p_step_gated", "mean_iterations",
                    "flop_ratio", "batched_flop_ratio", "per_row_bound", "batched_bound",
                    "wall_ratio_L0_vs_generate[continuous]", "wall_ratio_L_vs_L0[continuous]", "rho[continuous]",
                    "wall_ratio_generate_static_vs_generate", "wall_ratio_L0_vs_generate_static[continuous]"):
            assert figures[key] >= 0, key
        assert figures["per_row_bound"] == pytest.approx(figures["flop_ratio"])
        assert figures["batched_bound"] >= figures["per_row_bound"]
    assert speed["memory"]["skipped"].startswith("no cuda")


def test_exactness_reports_false_when_the_reference_disagrees(gpu_check, monkeypatch):
    """A check that cannot fail checks nothing: a reference with another alpha must be caught."""
    real = gpu_check.naive_reference()

    def other_alpha(model, prompt, *, alpha, **kwargs):
        return real(model, prompt, alpha=alpha + 0.3, **kwargs)

    monkeypatch.setattr(gpu_check, "naive_reference", lambda: other_alpha)
    args = gpu_check.parse_args([*TINY, "--families", "llama-3.1-8b", "--attn", "sdpa"])
    result = gpu_check.check_exactness("llama-3.1-8b", args, "cpu")
    assert result["ok"] is False
    always = result["fp32"]["sdpa"]["vs_naive"]["always/L2"]
    assert always["tokens_equal"] is False and always["first_divergence"] is not None


@pytest.mark.parametrize("argv, message", [
    (["--families", "gpt2"], "--families='gpt2'"),
    (["--checks", "speed,latency"], "--checks='speed,latency'"),
    (["--attn", "flash"], "--attn='flash'"),
    (["--batches", "1,x"], "--batches='1,x'"),
    (["--exact_layers", "1"], "--exact_layers=1"),
    (["--repeats", "0"], "--repeats=0"),
    (["--size", "tiny", "--mem_context", "4", "--mem_new_tokens", "4"], "--mem_context=4"),
])
def test_bad_flags_raise_value_error(gpu_check, argv, message):
    with pytest.raises(ValueError, match=message):
        gpu_check.parse_args(argv)
