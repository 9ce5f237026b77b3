"""Qwen2.5-Coder-1.5B-Instruct (Qwen2, the Q4_K_M GGUF that scripts/get_model.py
assembles) through eglr-hf with its preset: 28 layers, the tasks' L grid, tau_h calibration and the chat
template through both engines, and L = 0 equal to lm-eval's own `hf` decoding, in bf16 on GSM8K prompts.

Skips, saying how to get the model, when the GGUF is not in ``EGLR_QWEN_CODER_DIR`` or the script's cache
folder (``$EGLR_CACHE_DIR/models/qwen2.5-coder-1.5b-instruct``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from helpers.inputs import requests_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "get_model.py"
GREEDY = {"until": ["<|im_end|>"], "max_gen_toks": 16, "do_sample": False}


def _script():
    spec = importlib.util.spec_from_file_location("get_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def qwen_gguf() -> tuple[Path, str]:
    gm = _script()
    folder = Path(os.environ.get("EGLR_QWEN_CODER_DIR") or gm.default_cache_dir()).expanduser()
    if not (folder / gm.GGUF_NAME).is_file():
        pytest.skip(f"Qwen2.5-Coder-1.5B-Instruct GGUF not found in {folder}: run "
                    "scripts/get_model.py (or set EGLR_QWEN_CODER_DIR)")
    return folder, gm.GGUF_NAME


@pytest.fixture(scope="module")
def preset_lm(qwen_gguf, tmp_path_factory):
    """eglr-hf loaded through the preset, the model args naming the local GGUF (the registry route)."""
    from eglr_harness.harness.model import EglrHFLM

    os.environ.setdefault("EGLR_CACHE_DIR", str(tmp_path_factory.mktemp("eglr_cache")))
    folder, gguf = qwen_gguf
    return EglrHFLM(model_config="qwen2.5-coder-1.5b-instruct", pretrained=str(folder), gguf_file=gguf,
                    device="cpu", batch_size=2, L=0)


@pytest.fixture(scope="module")
def prompts(preset_lm, shared_data_dir) -> list[str]:
    """The first two GSM8K test questions in the model's chat template."""
    lines = (shared_data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()[:2]
    questions = [json.loads(line)["question"] for line in lines]
    return [preset_lm.tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                    add_generation_prompt=True) for q in questions]


def _requests(prompts, repeats=1):
    return requests_for(prompts, GREEDY, repeats=repeats, task="gsm8k_eglr")


def _lm(preset_lm, **model_args):
    from eglr_harness.harness.model import EglrHFLM

    return EglrHFLM(pretrained=preset_lm.model, tokenizer=preset_lm.tokenizer, device="cpu", batch_size=2,
                    **model_args)


def test_the_preset_loads_qwen2_in_bf16_with_28_layers(preset_lm):
    import torch

    config = preset_lm.model.config
    assert config.model_type == "qwen2" and config.num_hidden_layers == 28
    assert preset_lm.model.dtype == torch.bfloat16  # the preset's dtype, applied to the GGUF route
    with pytest.raises(ValueError, match=r"`L`=29 exceeds the model's 28 decoder layers; allowed: 0\.\.28"):
        _lm(preset_lm, L=29)


def test_the_chat_template_is_qwens(prompts):
    assert prompts[0].startswith("<|im_start|>system\n") and prompts[0].endswith("<|im_start|>assistant\n")
    assert "Janet" in prompts[0] and "<|im_start|>user\n" in prompts[0]


def test_L0_through_the_hook_engine_equals_lm_evals_hf_decoding_in_bf16(preset_lm, prompts):
    """The hook engine decodes through transformers' generate, batch for batch as lm-eval's `hf` does."""
    from lm_eval.models.huggingface import HFLM

    plain = HFLM(pretrained=preset_lm.model, tokenizer=preset_lm.tokenizer, batch_size=2, device="cpu")
    ours = _lm(preset_lm, L=0, engine="hook")
    assert [str(t) for t in ours.generate_until(_requests(prompts))] == plain.generate_until(_requests(prompts))
    assert ours.get_model_info()["eglr"]["engine"] == "hook"


def test_L0_through_the_continuous_engine_equals_lm_evals_hf_decoding_in_fp32(preset_lm, prompts):
    """The continuous engine lays rows out otherwise than a padded batch, so in bf16 a near-tie may break the
    other way (l0_check/agreement.md: 3 of 4 problems identical at 32 tokens); in fp32 it is the same text.
    The model is cast to fp32 in place (its bf16 weights exactly; one copy in memory, not two) and back after."""
    import torch
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.harness.model import EglrHFLM

    model = preset_lm.model.to(torch.float32)
    try:
        plain = HFLM(pretrained=model, tokenizer=preset_lm.tokenizer, batch_size=2, device="cpu")
        ours = EglrHFLM(pretrained=model, tokenizer=preset_lm.tokenizer, device="cpu", batch_size=2, L=0,
                        engine="continuous")
        texts = [str(t) for t in ours.generate_until(_requests(prompts))]
        assert texts == plain.generate_until(_requests(prompts))
        assert ours.get_model_info()["eglr"]["engine"] == "continuous"
    finally:
        preset_lm.model.to(torch.bfloat16)


@pytest.mark.parametrize("engine", ["continuous", "hook"])
def test_tau_h_calibration_and_the_L_grid_run(preset_lm, prompts, engine, tmp_path, monkeypatch):
    """tau_h=auto calibrates on the task's prompts (capped at 2.5 nats), then L = 1, 10 and 28 refine."""
    monkeypatch.setenv("EGLR_CACHE_DIR", str(tmp_path))
    lm = _lm(preset_lm, L="1,10,28", tau_h="auto", calib_limit=2, engine=engine)
    texts = lm.generate_until(_requests(prompts, repeats=3))  # one repeat per cell of the pool
    eglr = lm.get_model_info()["eglr"]
    assert eglr["num_layers"] == 28 and eglr["engine"] == engine
    calibration = eglr["stats"]["calibration"]["gsm8k_eglr"]
    assert calibration["prompts"] == 2 and calibration["entropy_tokens"] == 2 * GREEDY["max_gen_toks"]
    assert 0 < eglr["tau_h"]["gsm8k_eglr"] == calibration["tau_h"] <= 2.5
    assert set(eglr["stats"]["cells"]) == {"L=1,T=0.0", "L=10,T=0.0", "L=28,T=0.0"}
    assert eglr["stats"]["total"]["gated_tokens"] > 0 and eglr["stats"]["total"]["flop_ratio"] > 1
    assert sorted(t.L for t in texts) == [1, 1, 10, 10, 28, 28]
