"""Tiny models of each family saved as fp32 safetensors, and vLLM engines over them (shared by tests/eglr_vllm)."""

from __future__ import annotations

import gc

from helpers.tiny_models import build_tiny_model

VOCAB, LAYERS, EOS = 96, 4, 2
# vLLM's CPU attention takes head sizes that are multiples of 32 (and not 8, the engine tests' size)
TINY_SHAPE = dict(vocab_size=VOCAB, num_layers=LAYERS, seed=1, hidden_size=128, intermediate_size=256)
FAMILIES = ("llama", "qwen2", "mistral")


def save_tiny_model(arch: str, folder):
    """Build the family's tiny model, save it (fp32 safetensors) into ``folder``; returns the HF model."""
    model = build_tiny_model(arch, **TINY_SHAPE)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def make_engine(folder, *, eglr: bool, architecture: str | None = None):
    """A vLLM engine (in this process, fp32, eager) over ``folder``; EGLR's architecture when ``eglr``."""
    from vllm import LLM

    from eglr_harness.vllm import engine_overrides

    overrides = engine_overrides(architecture) if eglr else None
    return LLM(model=str(folder), dtype="float32", enforce_eager=True, skip_tokenizer_init=True, max_model_len=128,
               seed=0, hf_overrides=overrides)


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
