"""Integration on the real SmolLM2-135M-Instruct GGUF: the stock lm_eval CLI, and L=0 vs `hf`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.slow


def _lm_eval_cli() -> str:
    exe = shutil.which("lm_eval")
    assert exe, "the stock lm_eval console script is not on PATH"
    return exe


def test_stock_lm_eval_cli_runs_eglr_hf_with_our_task(tmp_path):
    out = tmp_path / "run"
    cmd = [
        _lm_eval_cli(), "--model", "eglr-hf",
        "--model_args", "model_config=smollm2-135m-instruct,L=4,tau_h=1.0",
        "--tasks", "eglr_demo", "--apply_chat_template", "--limit", "3", "--batch_size", "3",
        "--gen_kwargs", "max_gen_toks=24", "--output_path", str(out), "--log_samples",
    ]
    env = {**os.environ, "EGLR_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]

    results = json.loads(next(out.rglob("results_*.json")).read_text())
    eglr = results["config"]["eglr"]
    assert eglr["num_layers"] == 30 and eglr["preset"] == "smollm2-135m-instruct"
    assert eglr["tau_h"] == {"eglr_demo": 1.0}
    total = eglr["stats"]["total"]
    assert total["tokens"] > 0 and 0 < total["rho"] <= 1 and total["flop_ratio"] > 1
    assert list(eglr["stats"]["cells"]) == ["L=4,T=0.0"]
    assert "eglr_demo" in results["results"]

    lines = [json.loads(line) for line in next(out.rglob("samples_eglr_demo_*.jsonl")).read_text().splitlines()]
    assert len(lines) == 3
    for line in lines:
        assert [(r["L"], r["T"]) for r in line["rollouts"]] == [(4, 0.0)]
        assert line["resps"][0][0].strip()


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = smollm2_path
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32).eval()
    return model, tokenizer


def test_L0_on_smollm2_equals_lm_eval_hf(smollm2):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.harness.model import EglrHFLM

    model, tokenizer = smollm2
    questions = ["What is 12 times 7?", "Name three primary colors.", "Solve for x: 2x + 3 = 11.", "What is 15% of 80?"]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True)
               for q in questions]
    gen = {"until": ["<|im_end|>"], "max_gen_toks": 24, "do_sample": False}
    reqs = lambda: [Instance("generate_until", doc={}, arguments=(p, dict(gen)), idx=0, metadata=("t", i, 1))
                    for i, p in enumerate(prompts)]
    hf = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu")
    ours = EglrHFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu", L=0)
    assert [str(t) for t in ours.generate_until(reqs())] == hf.generate_until(reqs())
    refined = EglrHFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, device="cpu", L=10, tau_h=0.5)
    texts = refined.generate_until(reqs())
    assert refined.get_model_info()["eglr"]["stats"]["total"]["gated_tokens"] > 0
    assert all(t.L == 10 for t in texts)
