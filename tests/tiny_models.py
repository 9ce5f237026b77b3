"""Tiny randomly initialised causal LMs of the families EGLR supports (shared by the tests)."""

from __future__ import annotations

TINY_ARCHS = ("llama", "qwen2", "mistral", "gemma2")
# build_tiny_model also builds "gemma3" (a Gemma-3 text model: sliding and full layers alternate)
# Shorter than the test prompts plus their generations, so that Mistral's sliding-window attention
# really masks part of the past (with a longer window the model is a Llama copy).
MISTRAL_SLIDING_WINDOW = 4


def build_tiny_model(arch: str, vocab_size: int = 256, num_layers: int = 4, seed: int = 0, sharpen: float = 4.0,
                     **overrides):
    """A tiny randomly initialised causal LM of the given family, fp32, eval mode.

    ``sharpen`` scales the unembedding: 4 keeps next-token entropies near log V; ~120 brings most
    of them under a nat (for tests that need entropies below the 2.5-nat cap)."""
    import torch
    from transformers import (
        Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
        MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    families = {
        "llama": (LlamaConfig, LlamaForCausalLM, {}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
        "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": MISTRAL_SLIDING_WINDOW}),
        "gemma2": (Gemma2Config, Gemma2ForCausalLM, {
            "head_dim": 8, "sliding_window": 16, "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 8,
        }),
        # per-layer kinds: sliding layers with a window shorter than the prompts, local rotary base
        "gemma3": (Gemma3TextConfig, Gemma3ForCausalLM, {
            "head_dim": 8, "sliding_window": MISTRAL_SLIDING_WINDOW, "query_pre_attn_scalar": 8,
            "layer_types": [("sliding_attention" if i % 2 == 0 else "full_attention") for i in range(num_layers)],
        }),
    }
    config_cls, model_cls, extra = families[arch]
    config = config_cls(**{**common, **extra, **overrides})
    config._attn_implementation = "eager" if arch in ("gemma2", "gemma3") else "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # Random init gives near-uniform next-token distributions; sharpen them a little so that
    # greedy decoding is not dominated by near-ties.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen)
    return model
