"""Tiny randomly initialised causal LMs of the families EGLR supports (shared by the tests)."""

from __future__ import annotations

TINY_ARCHS = ("llama", "qwen2", "mistral", "gemma2")
# build_tiny_model also builds "gemma3" (a Gemma-3 text model: sliding and full layers alternate)
# and the families of MORE_ARCHS (tests/decoding/test_families.py), each with the features that set it apart
MORE_ARCHS = ("phi3", "olmo2", "olmo3", "qwen2_moe", "qwen3_moe", "mixtral", "smollm3", "granite", "granitemoe", "glm",
              "glm4", "stablelm", "starcoder2", "cohere")
# Shorter than the test prompts plus their generations, so that Mistral's sliding-window attention
# really masks part of the past (with a longer window the model is a Llama copy).
MISTRAL_SLIDING_WINDOW = 4


def build_tiny_model(arch: str, vocab_size: int = 256, num_layers: int = 4, seed: int = 0, sharpen: float = 4.0,
                     **overrides):
    """A tiny randomly initialised causal LM of the given family, fp32, eval mode.

    ``sharpen`` scales the unembedding: 4 keeps next-token entropies near log V; ~120 brings most
    of them under a nat (for tests that need entropies below the 2.5-nat cap)."""
    import torch
    import transformers
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
    families.update({arch: (getattr(transformers, f"{name}Config"), getattr(transformers, f"{name}ForCausalLM"), extra)
                     for arch, (name, extra) in _MORE_FAMILIES.items()})
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


_GRANITE_SCALES = {"embedding_multiplier": 6.0, "logits_scaling": 4.0, "residual_multiplier": 0.5,
                   "attention_multiplier": 0.25}
_PARTIAL_ROTARY = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
# arch -> (transformers class prefix, config overrides)
_MORE_FAMILIES = {
    # fused QKV and gate/up projections, a sliding window (Phi-3-mini-4k's is 2047)
    "phi3": ("Phi3", {"rope_parameters": _PARTIAL_ROTARY, "sliding_window": MISTRAL_SLIDING_WINDOW}),
    "olmo2": ("Olmo2", {}),  # QK norm over all heads, norms after attention and MLP
    # sliding layers and full ones, rotary angles per layer kind (the kinds' bases differ here)
    "olmo3": ("Olmo3", {"sliding_window": MISTRAL_SLIDING_WINDOW, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0}}}),
    "qwen2_moe": ("Qwen2Moe", {  # routed experts and a gated shared expert
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}),
    "qwen3_moe": ("Qwen3Moe", {  # a dense first layer, then routed experts
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [0],
        "head_dim": 8}),
    "mixtral": ("Mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2,
                            "sliding_window": MISTRAL_SLIDING_WINDOW}),
    # every second layer without rotary, those with a sliding window
    "smollm3": ("SmolLM3", {"no_rope_layer_interval": 2, "use_sliding_window": True,
                            "sliding_window": MISTRAL_SLIDING_WINDOW}),
    "granite": ("Granite", _GRANITE_SCALES),
    "granitemoe": ("GraniteMoe", {**_GRANITE_SCALES, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "glm": ("Glm", {"head_dim": 8}),  # rotary on half of each head, interleaved
    "glm4": ("Glm4", {"head_dim": 8}),
    "stablelm": ("StableLm", {"rope_parameters": {**_PARTIAL_ROTARY, "partial_rotary_factor": 0.25},
                              "qk_layernorm": True, "use_parallel_residual": True}),
    "starcoder2": ("Starcoder2", {"sliding_window": MISTRAL_SLIDING_WINDOW}),  # layer norms and biases
    "cohere": ("Cohere", {"logit_scale": 0.25, "use_qk_norm": True}),  # layer norms, parallel residual
}


def save_tiny_model(folder, tokenizer, arch: str = "llama", num_layers: int = 4, **overrides):
    """A tiny random model of ``arch`` over ``tokenizer``'s vocabulary and special ids (``build_tiny_model``; its
    config ``overrides``), saved with the tokenizer as a HF folder of safetensors (what ``pretrained=`` and vLLM
    take); returns the folder."""
    from pathlib import Path

    model = build_tiny_model(arch, vocab_size=len(tokenizer), num_layers=num_layers,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **overrides)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (with its chat template), from the GGUF of the project's preset."""
    from transformers import AutoTokenizer

    from eglr_harness.run.presets import load_preset

    args = load_preset("smollm2-135m-instruct")["model_args"]
    return AutoTokenizer.from_pretrained(args["pretrained"], gguf_file=args["gguf_file"])
