"""Tiny models of each family saved as fp32 safetensors, and vLLM engines over them (shared by tests/eglr_vllm)."""

from __future__ import annotations

import gc

from helpers.tiny_models import build_tiny_model

VOCAB, LAYERS, EOS = 96, 4, 2
# vLLM's CPU attention takes head sizes that are multiples of 32 (and not 8, the engine tests' size)
TINY_SHAPE = dict(vocab_size=VOCAB, num_layers=LAYERS, seed=1, hidden_size=128, intermediate_size=256)
FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "gemma3")
# the KL exit threshold of these models' refinements (as tests/decoding/test_engine_vs_naive.py): every KL that their
# naive reference runs observed stays more than 0.1 % away from it
TAU_KL = 3e-4
# what a family needs beside TINY_SHAPE: heads of 32 (vLLM's CPU attention) where the family sets its own
# head size; Gemma-3 keeps its alternating sliding (window 4, shorter than the prompts) and full layers
FAMILY_SHAPE = {"gemma3": dict(head_dim=32, query_pre_attn_scalar=32), "qwen3": dict(head_dim=32)}


def _build(arch: str):
    if arch == "qwen3":  # tests/tiny_models.py has no dense Qwen3: its shape here (QK norm per head, no biases)
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(vocab_size=VOCAB, hidden_size=TINY_SHAPE["hidden_size"],
                             intermediate_size=TINY_SHAPE["intermediate_size"], num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0,
                             bos_token_id=1, eos_token_id=EOS, tie_word_embeddings=False, **FAMILY_SHAPE["qwen3"])
        config._attn_implementation = "sdpa"
        torch.manual_seed(TINY_SHAPE["seed"])
        model = Qwen3ForCausalLM(config).eval()
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(4.0)  # build_tiny_model's default sharpening
        return model
    return build_tiny_model(arch, **TINY_SHAPE, **FAMILY_SHAPE.get(arch, {}))


def save_tiny_model(arch: str, folder):
    """Build the family's tiny model, save it (fp32 safetensors) into ``folder``; returns the HF model."""
    model = _build(arch)
    model.save_pretrained(folder, safe_serialization=True)
    return model


# vLLM's default, multiprocessing on (its engine core in a process of its own): tests/eglr_vllm/conftest.py turns it
# off for the engines the tests start in their own process; the tests of what it changes, and the commands run as users
# run them, put this in their environment
MULTIPROCESSING_ON = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}


def make_engine(folder, *, eglr: bool, architecture: str | None = None, spans=None, **options):
    """A vLLM engine (fp32, eager; its engine core in this process unless ``VLLM_ENABLE_V1_MULTIPROCESSING`` is 1)
    over ``folder``; EGLR's engine arguments when ``eglr`` (serving ``spans``, default every L in 1..LAYERS).
    ``options``: more ``LLM`` arguments."""
    from vllm import LLM

    from eglr_harness.vllm import engine_args

    eglr_args = engine_args(architecture, spans=spans, num_layers=LAYERS) if eglr else {}
    return LLM(**{**dict(model=str(folder), dtype="float32", enforce_eager=True, skip_tokenizer_init=True,
                         max_model_len=128, seed=0), **eglr_args, **options})


def close_engine(llm) -> None:
    """Shut ``llm`` down so that the next engine of this process starts clean."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def generate(llm, prompts, settings_per_prompt, *, max_tokens=10, temperature=0.0, seeds=None):
    """One ``generate`` call: prompt i with EGLR settings ``settings_per_prompt[i]`` (None: plain).
    Returns each request's new tokens (a list of ints, EOS included)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [SamplingParams(temperature=temperature, max_tokens=max_tokens, detokenize=False, stop_token_ids=[EOS],
                             seed=None if seeds is None else seeds[i],
                             extra_args=None if s is None else {"eglr": s})
              for i, s in enumerate(settings_per_prompt)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]
