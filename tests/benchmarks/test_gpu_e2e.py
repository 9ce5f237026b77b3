"""benchmarks/gpu_e2e.py at tiny shapes on the CPU: the checkpoint loads offline and the three lm_eval runs
run end to end (2 GSM8K problems, 4 new tokens), their figures measured, not written down (~1 minute)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from eglr_harness.core.progress import counted

pytestmark = pytest.mark.slow  # runs the lm_eval CLI three times (about 1.5 minutes on one thread)
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_e2e.py"
TINY = ["--size", "tiny", "--device", "cpu"]


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("gpu_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_e2e"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_e2e", None)


@pytest.fixture(scope="module")
def report(e2e, shared_data_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_e2e")
    out = folder / "e2e.json"
    returned = e2e.main([*TINY, "--data_dir", str(shared_data_dir), "--checkpoint_dir", str(folder / "ckpt"),
                         "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned, default=str))
    return written


def test_the_published_generation_config_and_special_ids(e2e):
    assert e2e.generation_config("full") == {
        "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
        "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}
    tiny = e2e.generation_config("tiny")
    assert tiny["eos_token_id"] == [2047, 2045] and tiny["repetition_penalty"] == 1.05 and tiny["top_k"] == 20


def test_the_full_size_tokenizer_covers_qwens_ids(e2e, shared_data_dir):
    """The tokenizer the GPU run builds: 151,643 regular ids that all decode, the specials at Qwen's ids,
    the ChatML prompt of Qwen2.5 with its default system turn."""
    problems = e2e.gsm8k_problems(shared_data_dir)[:50]
    tokenizer, learned = e2e.build_tokenizer([p["problem"] for p in problems], regular_tokens=151643, bpe_vocab=2048)
    assert 256 < learned <= 2048 and len(tokenizer) == 151646
    assert [tokenizer.convert_tokens_to_ids(t) for t in e2e.SPECIAL_TOKENS] == [151643, 151644, 151645]
    assert tokenizer.eos_token_id == 151645 and tokenizer.pad_token_id == 151643
    assert tokenizer.decode([learned + 5, 151642]).startswith(" w")  # placeholders decode to words
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                    "assistant.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(151644) == 3 and ids.count(151645) == 2 and max(i for i in ids if i < 151643) < learned
    assert tokenizer.decode(ids) == text


def test_the_checkpoint_loads_offline(report):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = Path(report["settings"]["checkpoint_dir"])
    info = report["checkpoint"]
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 10
    assert model.config.vocab_size == info["config"]["vocab_size"] == 2048 == len(tokenizer)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
    assert (generation.repetition_penalty, generation.temperature, generation.top_p, generation.top_k) == (1.05, 0.7,
                                                                                                           0.8, 20)
    assert generation.eos_token_id == [2047, 2045] == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], add_generation_prompt=True)
    prompt = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    reply = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert prompt[0] == 2046 and prompt[-len(reply):] == reply
    assert info["tau_h"] > 0 and "no cap" in info["tau_h_source"] and info["gsm8k_prompt_tokens"]["mean"] > 50
    assert info["reused"] is False and info["environment"]["device"] == "cpu"


def test_the_commands_are_the_issues(report):
    commands = report["commands"]
    common = "--apply_chat_template --batch_size auto --limit 2 --gen_kwargs max_gen_toks=4"
    tau_h = report["tau_h"]
    assert float(tau_h) == pytest.approx(report["checkpoint"]["tau_h"], rel=1e-5)
    assert re.fullmatch(rf"python -m eglr_harness --model hf --model_args pretrained=\S+,dtype=float32 "
                        rf"--tasks gsm8k_eglr {common} --output_path \S+ --device cpu", commands["hf"])
    assert re.fullmatch(rf"python -m eglr_harness --model eglr-hf --model_args pretrained=\S+,dtype=float32,L=4,"
                        rf"tau_h={tau_h} --tasks gsm8k_eglr {common} --output_path \S+ --device cpu",
                        commands["eglr_L4"])
    assert re.fullmatch(rf"python -m eglr_harness --model eglr-hf --model_args pretrained=\S+,dtype=float32,"
                        rf"tau_h={tau_h} --tasks gsm8k_eglr_sc {common} --output_path \S+ --device cpu",
                        commands["eglr_pool"])
    for run, command in commands.items():
        assert report["runs"][run]["command"] == command


@pytest.mark.parametrize("run, requests, cells", [("hf", 2, None), ("eglr_L4", 2, 1), ("eglr_pool", 20, 10)])
def test_each_run_is_measured(report, run, requests, cells):
    r = report["runs"][run]
    assert r["returncode"] == 0 and r["finished"] is True and r["timed_out"] is False, r.get("log_tail")
    assert r["prompts"] == 2 and r["requests"] == requests and r["generate_calls"] == 1
    assert 0 < r["load_s"] < r["startup_s"] < r["process_wall_s"] and 0 < r["generate_s"] < r["process_wall_s"]
    assert 0 < r["generated_tokens"] <= requests * 4
    assert r["tokens_per_s"] == pytest.approx(r["generated_tokens"] / r["generate_s"])
    assert r["peak_gpu_mib"] is None and r["peak_rss_mib"] > 100  # a CPU run: the process's peak RSS
    assert r["batch"]["requested"] == "auto" and r["batch"]["chosen"] >= 1
    assert "lm_eval" in r["imported_distributions"] and "transformers" in r["imported_distributions"]
    metrics = r["results"]["metrics"]
    assert set(metrics) == {"gsm8k_eglr" if run != "eglr_pool" else "gsm8k_eglr_sc"}
    if run == "hf":
        assert r["warmup"]["batch_detect_s"] > 0 and r["plan_lines"] == [] and r["engine_runs"] == 0
        assert r["decode_s"] == pytest.approx(r["generate_s"] - r["warmup"]["batch_detect_s"])
        assert "lm-eval" in r["batch"]["by"]
        return
    # eglr-hf: the engine's token count is the one the run's own accounting wrote into its results
    assert r["generated_tokens"] == r["results"]["eglr"]["tokens"] and r["engine_runs"] == 1
    assert len(r["results"]["eglr"]["cells"]) == cells
    assert r["engine_used"] == "continuous" == r["results"]["eglr"]["engine"]
    (plan,) = [line for line in r["plan_lines"] if line.startswith("eglr-hf plan")]
    assert f"2 problems x {counted(cells, 'cells')}" in plan and f"tau_h = {report['tau_h']}" in plan
    (auto,) = [line for line in r["plan_lines"] if "batch_size=auto" in line]
    assert f"auto: {r['batch']['chosen']} running rows" in auto and r["batch"]["chosen"] == requests
    report_fn = r["warmup"]["engine"]  # the captured engine's warm-up report, once the engine has one
    assert report_fn is None or {"compiles", "captures", "compile_seconds", "capture_seconds",
                                 "late_compiles"} <= set(report_fn)


def test_the_summary_compares_the_runs(report):
    summary, runs = report["summary"], report["runs"]
    assert summary["same_prompts"] is True
    for run in ("eglr_L4", "eglr_pool"):
        assert summary[f"tokens_per_s_ratio[{run}/hf]"] == pytest.approx(
            runs[run]["tokens_per_s"] / runs["hf"]["tokens_per_s"])
        assert summary[run]["batch_chosen"] == runs[run]["batch"]["chosen"]


def test_a_run_past_the_budget_is_killed_and_the_rest_skipped(e2e, report, tmp_path, monkeypatch):
    # the first run's child never ends (not a slow machine's lm_eval that might finish inside the budget), so
    # the budget kills it whatever the machine's speed: its wait ran the whole budget, none is left for the next
    popen = e2e.subprocess.Popen
    monkeypatch.setattr(e2e.subprocess, "Popen", lambda command, **kw: popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], **kw))
    out = tmp_path / "budget.json"
    result = e2e.main([*TINY, "--data_dir", report["settings"]["data_dir"], "--checkpoint_dir",
                       report["settings"]["checkpoint_dir"], "--runs", "hf,eglr_L4", "--budget_s", "3",
                       "--out", str(out)])
    assert result["checkpoint"]["reused"] is True
    hf = result["runs"]["hf"]
    assert hf["timed_out"] is True and hf["returncode"] != 0 and not hf.get("finished")
    assert result["runs"]["eglr_L4"] == {"skipped": "--budget_s 3 spent"}
    assert json.loads(out.read_text())["runs"]["eglr_L4"] == result["runs"]["eglr_L4"]


def test_a_run_at_a_batch_is_that_run_with_its_batch_size(e2e, shared_data_dir, tmp_path):
    """issue 57's call: hf and eglr-hf at batch 32 and hf at auto, in one report; eglr_L0 is eglr-hf at L=0."""
    args = e2e.parse_args([*TINY, "--data_dir", str(shared_data_dir), "--out", str(tmp_path / "x.json"), "--runs",
                           "hf@32,eglr_L0@32,eglr_L4@8,hf", "--hf_model_args", "max_length=4096"])
    commands = e2e.assemble(Path("ckpt"), "5.5", args, tmp_path)
    assert list(commands) == ["hf@32", "eglr_L0@32", "eglr_L4@8", "hf"]
    flag = lambda argv, name: argv[argv.index(name) + 1]
    assert [flag(c, "--batch_size") for c in commands.values()] == ["32", "32", "8", "auto"]
    assert [flag(c, "--model_args").split(",")[2:] for c in commands.values()] == [
        ["max_length=4096"], ["L=0", "tau_h=5.5"], ["L=4", "tau_h=5.5"], ["max_length=4096"]]
    assert [flag(c, "--output_path") for c in commands.values()] == [str(tmp_path / run) for run in commands]


def test_the_summary_pairs_each_run_with_hf_at_its_batch_and_l4_with_l0():
    """After the warm-up (the engine's compiles and captures, lm-eval's probe) each eglr run is set against hf at
    its own batch, and L=4's per-token cost against L=0's and the paper's bound (its own flop_ratio) plus 10 %."""
    spec = importlib.util.spec_from_file_location("gpu_e2e_summary", SCRIPT)
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    engine = lambda compile_s, capture_s: {"engine": {"compile_seconds": compile_s, "capture_seconds": capture_s}}
    runs = {
        "hf@32": {"generated_tokens": 100, "decode_s": 1.0, "tokens_per_s": 100.0},
        "hf": {"generated_tokens": 100, "decode_s": 0.5, "tokens_per_s": 50.0, "warmup": {"batch_detect_s": 1.5}},
        "eglr_L0@32": {"generated_tokens": 100, "decode_s": 2.0, "tokens_per_s": 50.0, "warmup": engine(1.5, 0.25)},
        "eglr_L4@32": {"generated_tokens": 100, "decode_s": 1.0, "tokens_per_s": 100.0, "warmup": engine(0.5, 0.0),
                       "results": {"eglr": {"stats": {"flop_ratio": 1.1}}}},
    }
    summary = e2e.summarise(runs)
    assert summary["eglr_L0@32"]["tokens_per_s_after_warmup"] == pytest.approx(400.0)
    assert summary["hf"]["tokens_per_s_after_warmup"] == pytest.approx(200.0)
    assert summary["tokens_per_s_ratio[eglr_L0@32/hf@32]"] == pytest.approx(0.5)
    assert summary["tokens_per_s_after_warmup_ratio[eglr_L0@32/hf@32]"] == pytest.approx(4.0)
    assert summary["tokens_per_s_after_warmup_ratio[eglr_L4@32/hf@32]"] == pytest.approx(2.0)
    assert not any("/hf]" in key for key in summary)  # hf at auto only where no hf ran at the run's batch
    assert summary["per_token_ratio[eglr_L4@32/eglr_L0@32]"] == pytest.approx(
        {"after_warmup": 2.0, "paper_bound": 1.1, "allowed": 1.21, "within": False})


@pytest.mark.parametrize("argv, message", [
    (["--runs", "hf,vllm"], "--runs='hf,vllm'"),
    (["--runs", "hf@0"], "--runs='hf@0'"),
    (["--runs", "eglr_L4@many"], "--runs='eglr_L4@many'"),
    (["--runs", "hf@32,hf@32"], "a run named twice"),
    (["--limit", "0"], "--limit=0"),
    (["--dtype", "int8"], "--dtype='int8'"),
    (["--tau_h", "high"], "--tau_h='high'"),
    (["--budget_s", "-1"], "--budget_s=-1"),
    (["--data_dir", "/nonexistent-eglr-data"], "--data_dir='/nonexistent-eglr-data'"),
])
def test_bad_flags_raise_value_error(e2e, argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        e2e.parse_args([*TINY, "--out", "x.json", *argv])
