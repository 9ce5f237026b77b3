"""benchmarks/gpu_check.py (the package benchmarks/gpucheck/) at tiny sizes on the CPU: every check runs and the
exactness verdicts hold."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
TINY = ["--size", "tiny", "--device", "cpu", "--exact_new_tokens", "6", "--batches", "1,2", "--new_tokens", "6"]


@pytest.fixture(scope="module")
def script():
    """benchmarks/gpu_check.py, the command users run, loaded by path: it loads the package ``gpucheck``."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    yield module
    for name in [n for n in sys.modules if n in ("gpu_check", "gpucheck") or n.startswith("gpucheck.")]:
        sys.modules.pop(name)


@pytest.fixture(scope="module")
def gpucheck(script):
    """The package benchmarks/gpucheck/, every module loaded: a test swaps a function in the module that looks it
    up (``gpucheck.run`` calls the checks, ``gpucheck.speed`` times the modes)."""
    return sys.modules["gpucheck"]


@pytest.fixture(scope="module")
def report(script, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "tiny.json"
    returned = script.main([*TINY, "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["summary"] == json.loads(json.dumps(returned["summary"]))
    return written


def test_the_command_is_the_package(script, gpucheck, capsys):
    """``python benchmarks/gpu_check.py`` runs ``gpucheck.run.main``, its --help describes the checks (the package's
    docstring), and it keeps every name benchmarks/gpu_e2e.py reads from it."""
    assert script.main is gpucheck.run.main and script.parse_args is gpucheck.cli.parse_args
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    assert "5. ``pool``" in capsys.readouterr().out
    e2e = (SCRIPT.parent / "gpu_e2e.py").read_text()
    used = set(re.findall(r"\bcheck\.(\w+)", e2e)) | set(re.findall(r"gpu_check\(\)\.(\w+)", e2e))
    assert {"family_config", "calibrate_tau_h"} <= used and [name for name in used if not hasattr(script, name)] == []


@pytest.mark.slow  # the module's `report` fixture runs every check of gpu_check.py at tiny sizes: 39 s here
def test_report_records_environment_and_settings(report, gpucheck):
    env = report["environment"]
    for key in ("device", "device_name", "torch", "transformers", "python"):
        assert env[key], key
    settings = report["settings"]
    assert settings["size"] == "tiny" and settings["families"] == list(gpucheck.models.DEFAULT_FAMILIES)
    assert settings["batches"] == [1, 2] and settings["new_tokens"] == 6
    assert settings["repeats"] == 1 and settings["compile"] == "auto" and settings["budget_s"] is None  # tiny, CPU
    assert report["paper_settings"] == {"alpha": 0.2, "k_max": 3, "tau_kl": 5e-4}


@pytest.mark.slow  # the module's `report` fixture runs every check of gpu_check.py at tiny sizes: 39 s here
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


@pytest.mark.slow  # the module's `report` fixture runs every check of gpu_check.py at tiny sizes: 39 s here
@pytest.mark.parametrize("family", ["qwen2.5-3b", "gemma-3-4b"])
def test_placement_speed_and_memory_fields(report, family):
    entry = report["families"][family]
    placement = entry["placement"]
    assert placement["ok"] is True and placement["skipped"].startswith("no cuda")
    speed = entry["speed"]
    assert speed["L"] == 4 and speed["layers"] == 4  # --speed_L 10 clipped to the tiny depth
    assert set(speed["batches"]) == {"1", "2"}
    for batch, figures in speed["batches"].items():
        assert set(figures["runs"]) == {"generate", "generate_static", "L0", "L4", "cL0", "cL4", "cL0c", "cL4c"}
        eager_on_cpu = {"skipped": "compile=auto runs the step eager on cpu"}
        for mode in ("cL0c", "cL4c"):  # compile=auto: eager on a CPU, so the captured modes do not run
            assert figures["runs"][mode] == figures["profile"][mode] == eager_on_cpu
        for run in (run for mode, run in figures["runs"].items() if mode not in ("cL0c", "cL4c")):
            assert run["tokens"] == int(batch) * 6 and run["tokens_per_s"] > 0
            assert run["wall_s_min"] <= run["wall_s"] and len(run["walls_s"]) == 1
        assert set(figures["profile"]) == set(figures["runs"])
        assert all(p in ({"skipped": "no cuda"}, eager_on_cpu) for p in figures["profile"].values())
        for key in ("wall_ratio_L0_vs_generate", "wall_ratio_L_vs_L0", "rho", "p_step_gated", "mean_iterations",
                    "flop_ratio", "batched_flop_ratio", "per_row_bound", "batched_bound",
                    "wall_ratio_L0_vs_generate[continuous]", "wall_ratio_L_vs_L0[continuous]", "rho[continuous]",
                    "wall_ratio_generate_static_vs_generate", "wall_ratio_L0_vs_generate_static[continuous]"):
            assert figures[key] >= 0, key
        assert figures["per_row_bound"] == pytest.approx(figures["flop_ratio"])
        assert figures["batched_bound"] >= figures["per_row_bound"]
        assert figures["wall_ratio_L_vs_L0[continuous,compiled]"] is None
        assert all(goal["met"] is None for goal in figures["goals"].values())  # GPU figures only
    assert speed["memory"]["skipped"].startswith("no cuda")
    assert speed["captured"] == {"requested": "auto", "skipped": "compile=auto runs the step eager on cpu"}
    assert entry["budget"] == {"budget_s": None, "spent_s": pytest.approx(entry["budget"]["spent_s"]),
                               "exhausted": False}


def test_exactness_reports_false_when_the_reference_disagrees(gpucheck, monkeypatch):
    """A check that cannot fail checks nothing: a reference with another alpha must be caught."""
    real = gpucheck.exactness.naive_reference()

    def other_alpha(model, prompt, *, alpha, **kwargs):
        return real(model, prompt, alpha=alpha + 0.3, **kwargs)

    monkeypatch.setattr(gpucheck.exactness, "naive_reference", lambda: other_alpha)
    args = gpucheck.cli.parse_args([*TINY, "--families", "llama-3.1-8b", "--attn", "sdpa"])
    result = gpucheck.exactness.check_exactness("llama-3.1-8b", args, "cpu")
    assert result["ok"] is False
    always = result["fp32"]["sdpa"]["vs_naive"]["always/L2"]
    assert always["tokens_equal"] is False and always["first_divergence"] is not None


def test_the_captured_modes_run_compiled_on_a_cpu(gpucheck, tmp_path):
    """The captured modes' code path, with dynamo and the eager backend (no code generation): it
    runs, its greedy tokens equal the eager step's, the goals are recorded but not judged."""
    out = tmp_path / "captured.json"
    report = gpucheck.run.main([*TINY, "--families", "llama-3.1-8b", "--checks", "speed", "--batches", "2",
                             "--new_tokens", "4", "--compile", "default", "--compile_backend", "eager",
                             "--speed_modes", "generate_static,cL0c,cLc,cL0,cL", "--out", str(out)])
    speed = report["families"]["llama-3.1-8b"]["speed"]
    assert speed["captured"] == {"requested": "default", "compile": "default", "compile_backend": "eager"}
    figures = speed["batches"]["2"]
    assert set(figures["runs"]) == {"generate_static", "cL0c", "cL4c", "cL0", "cL4"}
    for mode in ("cL0c", "cL4c"):
        run = figures["runs"][mode]
        assert run["tokens"] == 2 * 4 and run["warmup_s"] > 0 and run["wall_s"] > 0 and run["ms_per_step"] > 0
    assert figures["captured_tokens_equal_eager"] == {"cL0": True, "cL4": True}
    # the warm-up split (issue 32): the process compiles the decoder layer once (here or in an earlier test), and
    # the second mode reuses that compilation; dynamo's graphs counted by the script agree with the engine's report
    assert figures["runs"]["cL0c"]["dynamo_graphs_warmup"] <= 2 and figures["runs"]["cL4c"]["dynamo_graphs_warmup"] == 0
    for mode in ("cL0c", "cL4c"):
        run = figures["runs"][mode]
        assert run["dynamo_graphs_late"] == 0  # warmed up over the full length
        engine_report = run["warmup_report"]
        assert set(engine_report) == set(gpucheck.common.WARMUP_REPORT_KEYS)
        assert run["compiles"] == engine_report["compiles"]
    # the engine's own count (over its life: the script keeps one engine per batch) is dynamo's
    assert figures["runs"]["cL0c"]["compiles"] == figures["runs"]["cL0c"]["dynamo_graphs_warmup"]
    assert figures["runs"]["cL4c"]["compiles"] <= 2
    captured_line = report["summary"]["llama-3.1-8b"]["b2"]["captured"]
    assert set(captured_line) == {"cL0c",
                                  "cL4c"} and captured_line["cL0c"]["warmup_s"] == figures["runs"]["cL0c"]["warmup_s"]
    assert figures["wall_ratio_L_vs_L0[continuous,compiled]"] > 0
    goals = figures["goals"]
    assert set(goals) == {"captured_L0_ms_per_step_vs_generate_static", "captured_L_vs_L0", "gpu_busy[cL0c]",
                          "gpu_busy[cL4c]", "host_syncs_per_step[cL0c]", "host_syncs_per_step[cL4c]"}
    assert goals["captured_L_vs_L0"]["value"] == figures["wall_ratio_L_vs_L0[continuous,compiled]"]
    assert goals["captured_L_vs_L0"]["met"] is None and goals["gpu_busy[cL0c]"]["value"] is None  # no profile on a CPU
    assert json.loads(out.read_text())["summary"] == json.loads(json.dumps(report["summary"]))


def test_the_budget_interrupts_the_running_part_and_skips_the_rest(gpucheck, monkeypatch, tmp_path):
    """A check that outlives the family's budget is interrupted by the alarm; what finished stays, what did not start
    is recorded as skipped, and the JSON is written. No clock decides it: the budget is ample, and the placement
    check rings the alarm itself through the handler the budget installed (no "interrupted" entry without it)."""
    import signal

    def place_until_the_alarm(*args):
        assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None), "no budget alarm set"
        signal.raise_signal(signal.SIGALRM)
        raise AssertionError("the budget's alarm did not interrupt the check")

    monkeypatch.setattr(gpucheck.run, "check_exactness", lambda *args: {"ok": True})
    monkeypatch.setattr(gpucheck.run, "check_placement", place_until_the_alarm)
    out = tmp_path / "budget.json"
    report = gpucheck.run.main([*TINY, "--families", "llama-3.1-8b", "--budget_s", "100000", "--out", str(out)])
    entry = report["families"]["llama-3.1-8b"]
    assert entry["exactness"] == {"ok": True}
    assert entry["placement"]["interrupted"].startswith("--budget_s 100000 spent after")
    assert entry["speed"]["skipped"].startswith("budget: ") and entry["speed"]["skipped"].endswith("(spent)")
    assert entry["budget"]["exhausted"] is True
    assert report["summary"]["llama-3.1-8b"]["budget"].startswith("spent")
    assert json.loads(out.read_text())["families"]["llama-3.1-8b"]["speed"] == entry["speed"]


def test_the_budget_interrupts_a_speed_mode_and_lists_what_it_did_not_reach(gpucheck, monkeypatch):
    """The budget's alarm rings while the first speed mode decodes. No clock decides it (under load a budget of a
    few seconds could be spent before the mode starts): the budget is ample and the mode rings the alarm itself,
    as the timer would, through the handler the budget installed."""
    import signal

    def decode_until_the_alarm(*args, **kwargs):
        assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None), "no budget alarm set"
        signal.raise_signal(signal.SIGALRM)
        raise AssertionError("the budget's alarm did not interrupt the decode")

    monkeypatch.setattr(gpucheck.speed, "timed_decode", decode_until_the_alarm)
    report = gpucheck.run.main([*TINY, "--families", "llama-3.1-8b", "--checks", "speed,memory",
                                "--budget_s", "100000"])
    speed = report["families"]["llama-3.1-8b"]["speed"]
    assert speed["interrupted"].endswith("(during batch 1, generate_static)")
    runs = speed["batches"]["1"]["runs"]
    assert runs["generate_static"]["skipped"].startswith("started, not finished")
    assert runs["cL0c"]["skipped"] == "compile=auto runs the step eager on cpu"
    for mode in ("generate", "cL0", "cL4", "L0", "L4"):
        assert runs[mode]["skipped"].startswith("not reached")
    assert all(run["skipped"].startswith("not reached") for mode, run in speed["batches"]["2"]["runs"].items()
               if mode not in ("cL0c", "cL4c"))
    assert speed["memory"]["skipped"].startswith("not reached") and "running" not in speed


def test_a_budget_spent_before_a_part_skips_it(gpucheck, monkeypatch):
    monkeypatch.setattr(gpucheck.run, "check_exactness", lambda *args: {"ok": True})
    monkeypatch.setattr(gpucheck.budget.Budget, "allows", lambda self, need=0.0: False)
    report = gpucheck.run.main([*TINY, "--families", "qwen2.5-3b", "--checks", "exactness,speed", "--budget_s", "100"])
    entry = report["families"]["qwen2.5-3b"]
    assert entry["exactness"]["skipped"].startswith("budget:") and entry["speed"]["skipped"].startswith("budget:")
    assert report["summary"]["qwen2.5-3b"]["exact"].startswith("budget:")


def test_captured_warmup_reads_the_engines_report(gpucheck):
    """The engine's warmup_report() (the lead's API) goes into the record as it is; without it, null."""

    class Reporting:
        def warmup_report(self):
            return {"compiles": 3, "captures": 7, "compile_seconds": 41.5, "capture_seconds": 2.25, "late_compiles": 0,
                    "other": "ignored"}

    out = gpucheck.common.captured_warmup(Reporting(), 10, 13, 13)
    assert out["warmup_report"] == {"compiles": 3, "captures": 7, "compile_seconds": 41.5, "capture_seconds": 2.25,
                                    "late_compiles": 0}
    assert (out["warmup_compile_s"], out["warmup_capture_s"], out["compiles"], out["captures"],
            out["late_compiles"]) == (
        41.5, 2.25, 3, 7, 0)
    assert (out["dynamo_graphs_warmup"], out["dynamo_graphs_late"]) == (3, 0)
    bare = gpucheck.common.captured_warmup(object(), None, None, None)
    assert bare["warmup_report"] is None and bare["compiles"] is None and bare["dynamo_graphs_warmup"] is None


def test_the_pool_mode_runs_every_mode_on_the_same_prompts(gpucheck, tmp_path):
    """Issue 32's pool mode at tiny sizes: prompts and limits of varied lengths, every mode counts each request's
    own tokens, the engine refills freed slots (fewer steps than generate's batches), the captured runs (dynamo,
    eager backend) give the eager tokens and report their warm-up."""
    out = tmp_path / "pool.json"
    report = gpucheck.run.main([*TINY, "--families", "llama-3.1-8b", "--checks", "pool", "--compile", "default",
                             "--compile_backend", "eager", "--pool_modes", ",".join(gpucheck.pool.POOL_MODES),
                             "--out", str(out)])
    pool = report["families"]["llama-3.1-8b"]["pool"]
    assert pool["prompts"] == 8 and pool["batch"] == 4 and pool["spans"] == [1, 2, 3, 4]
    assert 6 <= pool["prompt_lengths"]["min"] < pool["prompt_lengths"]["max"] <= 20
    assert 3 <= pool["new_tokens"]["min"] < pool["new_tokens"]["max"] <= 10 and "different lengths" in pool["row_ends"]
    useful = round(pool["new_tokens"]["mean"] * 8)
    modes = pool["modes"]
    assert set(modes) == set(gpucheck.pool.POOL_MODES)
    for mode, run in modes.items():
        per_prompt = 4 if mode.startswith("cpool") else 1
        assert run["requests"] == 8 * per_prompt and run["tokens"] == useful * per_prompt, mode
        assert run["tokens_per_s"] == pytest.approx(run["tokens"] / run["wall_s"]) and run["warmup_s"] > 0
        assert pool["tokens_per_s"][mode] == run["tokens_per_s"]
    for mode in ("generate", "generate_static"):  # batch after batch, each to its longest row
        assert modes[mode]["steps"] == 2 * pool["new_tokens"]["max"]
        assert modes[mode]["decoded_tokens"] == 2 * 4 * pool["new_tokens"]["max"] > useful
    assert modes["cL0"]["steps"] < modes["generate"]["steps"]  # refill: freed slots take waiting requests
    assert modes["cpool"]["stats"]["tokens"] == 4 * useful and modes["cpool"]["stats"]["rho"] > 0
    # the process compiles the decoder layer once (in cL0c, or in an earlier test of this process); the pool
    # reuses it; nothing after warm-up
    assert modes["cL0c"]["dynamo_graphs_warmup"] <= 2 and modes["cpoolc"]["dynamo_graphs_warmup"] == 0
    for mode in ("cL0c", "cpoolc"):
        assert modes[mode]["dynamo_graphs_late"] == 0 and modes[mode]["late_compiles"] == 0
        assert set(modes[mode]["warmup_report"]) == set(gpucheck.common.WARMUP_REPORT_KEYS)
    assert modes["cL0c"]["compiles"] + modes["cpoolc"]["compiles"] <= 2
    # ms per step counts the engine's own steps (one batched forward of all running rows): the statistics count a
    # step once per cell of its rows, so the pool's (4 spans) are fewer than its statistics' and at least what its
    # tokens need at 4 rows a step; L=0 (one cell) counts the same in both
    assert modes["cL0c"]["engine_steps"] == modes["cL0c"]["steps"]
    assert math.ceil(modes["cpoolc"]["tokens"] / 4) <= modes["cpoolc"]["engine_steps"] < modes["cpoolc"]["steps"]
    for mode in ("cL0c", "cpoolc"):
        assert modes[mode]["ms_per_step"] == pytest.approx(1000 * modes[mode]["wall_s"] / modes[mode]["engine_steps"])
        assert pool["figures"]["ms_per_step"][mode] == modes[mode]["ms_per_step"]
    assert "engine_steps" not in modes["cL0"] and "ms_per_step" not in modes["generate"]  # eager, generate: no count
    figures = pool["figures"]
    assert figures["rows_equal[cL0c,cL0]"] == 1.0 and figures["rows_equal[cpoolc,cpool]"] == 1.0
    assert 0 <= figures["rows_equal[cL0c,generate]"] <= 1
    assert figures["tokens_per_s_ratio[cpoolc/generate]"] == pytest.approx(
        modes["cpoolc"]["tokens_per_s"] / modes["generate"]["tokens_per_s"])
    assert report["summary"]["llama-3.1-8b"]["pool"] == pool["tokens_per_s"]
    assert json.loads(out.read_text())["families"]["llama-3.1-8b"]["pool"]["modes"]["cpoolc"] == modes["cpoolc"]


def test_the_pool_modes_default_to_the_issues_four(gpucheck):
    args = gpucheck.cli.parse_args([*TINY, "--checks", "pool"])
    assert args.pool_modes == ["generate_static", "cL0c", "cpoolc", "generate"]
    assert args.pool_prompt_lens == (6, 20) and args.pool_new_tokens == (3, 10)
    full = gpucheck.cli.parse_args(["--device", "cpu", "--checks", "pool"])
    assert (full.pool_prompts, full.pool_prompt_lens, full.pool_new_tokens, full.pool_batch) == (256, (64, 1024),
                                                                                                 (64, 512), 64)
    assert "pool" not in gpucheck.cli.parse_args(["--device", "cpu"]).checks  # asked for by name only


@pytest.mark.parametrize("argv, message", [
    (["--families", "gpt2"], "--families='gpt2'"),
    (["--checks", "speed,latency"], "--checks='speed,latency'"),
    (["--attn", "flash"], "--attn='flash'"),
    (["--batches", "1,x"], "--batches='1,x'"),
    (["--exact_layers", "1"], "--exact_layers=1"),
    (["--repeats", "0"], "--repeats=0"),
    (["--compile", "cudagraphs"], "`compile`='cudagraphs'"),
    (["--speed_modes", "cL0,fast"], "--speed_modes='cL0,fast'"),
    (["--speed_kv_bucket", "7"], "--speed_kv_bucket=7"),
    (["--budget_s", "-1"], "--budget_s=-1"),
    (["--pool_prompt_lens", "64"], "--pool_prompt_lens='64'"),
    (["--pool_new_tokens", "512-64"], "--pool_new_tokens='512-64'"),
    (["--pool_modes", "cL0c,fast"], "--pool_modes='cL0c,fast'"),
    (["--pool_prompts", "250"], "--pool_prompts=250"),
    (["--size", "tiny", "--mem_context", "4", "--mem_new_tokens", "4"], "--mem_context=4"),
])
def test_bad_flags_raise_value_error(gpucheck, argv, message):
    with pytest.raises(ValueError, match=message):
        gpucheck.cli.parse_args(argv)
