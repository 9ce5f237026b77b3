"""The model families of the GPU checks: random-weight causal LMs at the shapes of published checkpoints.

No weights are downloaded: ``family_config`` builds a family's transformers config from the values of its
``config.json`` (``FAMILIES``), at ``size`` "full" or "tiny" (a few small layers, for a CPU), and
``build_model`` initialises it on the device with its output embedding scaled (``DEFAULT_LOGIT_STD``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

PAD, BOS, EOS = 0, 1, 2
# Random init gives near-uniform next-token distributions; the output embedding is scaled (as
# tests/helpers/tiny_models.py does) so that greedy is not decided by near-ties: by the factor that gives
# the logits of a unit-RMS hidden state this standard deviation, whatever the width (at 4 the
# greedy entropies of a random Qwen2.5-3B spread over 1-6.5 nats).
DEFAULT_LOGIT_STD = 4.0

EXACT_SLIDING_WINDOW = 16  # shortened models: a window the short exactness sequences cross


@dataclass(frozen=True)
class Family:
    """One model family at the shapes of a published checkpoint.

    Attributes:
        config_cls: the transformers config class; the model is ``AutoModelForCausalLM.from_config``.
        source: the checkpoint whose ``config.json`` gave ``shape``.
        shape: config values as written in that ``config.json`` (legacy rope keys are accepted
            by transformers' configs and converted to ``rope_parameters``).
        tiny: overrides for ``--size tiny`` (few layers, small width, same kind of attention).
        random_init: overrides that a random-weight model needs to decode anything but one token
            (each with its reason); FLOPs are unchanged.
        attn: the attention implementations transformers offers for the family (fp32 ones).
    """

    config_cls: str
    source: str
    shape: dict
    tiny: dict = field(default_factory=dict)
    random_init: dict = field(default_factory=dict)
    attn: tuple[str, ...] = ("sdpa", "eager")


_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2)
_TINY_GEMMA = dict(_TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=EXACT_SLIDING_WINDOW)
# Tied embeddings make a random model copy its last input token with entropy 0 (the gate never
# fires): Gemma scales inputs by sqrt(D), so that token's own logit is ~0.02·D (51 at D=2560)
# against N(0, 1) for the rest, and sharpening a tied matrix scales the inputs as well (a tiny
# Qwen2 collapsed so). Untied, the unembedding is an independent random matrix: the same FLOPs,
# +V·D weights in memory.
_UNTIE = dict(tie_word_embeddings=False)

FAMILIES: dict[str, Family] = {
    "qwen2.5-3b": Family("Qwen2Config", "Qwen/Qwen2.5-3B-Instruct config.json", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=32768, max_window_layers=70,
    ), _TINY, _UNTIE),
    "llama-3.1-8b": Family("LlamaConfig", "meta-llama/Llama-3.1-8B-Instruct config.json", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072,
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ), _TINY),
    "mistral-7b-v0.3": Family("MistralConfig", "mistralai/Mistral-7B-Instruct-v0.3 config.json", dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
    ), _TINY),
    # Gemma-3 4B is multimodal; its text_config is a Gemma3ForCausalLM (model.model.layers / .norm).
    # Five sliding-window layers (local rope 10k) per global layer (rope 1M, linear scaling 8).
    "gemma-3-4b": Family("Gemma3TextConfig", "google/gemma-3-4b-it config.json (text_config)", dict(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=131072, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=1024, sliding_window_pattern=6,
        query_pre_attn_scalar=256, rms_norm_eps=1e-6, final_logit_softcapping=None,
        attn_logit_softcapping=None, tie_word_embeddings=True,
    ), _TINY_GEMMA, _UNTIE),
    # Not in the default set: Gemma-2 (final-logit soft-cap 30, attention soft-cap 50; transformers
    # runs its attention soft-cap in eager only and refuses sdpa).
    "gemma-2-2b": Family("Gemma2Config", "google/gemma-2-2b-it config.json", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=8192, rope_theta=10000.0, sliding_window=4096, query_pre_attn_scalar=256,
        final_logit_softcapping=30.0, attn_logit_softcapping=50.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ), _TINY_GEMMA, _UNTIE, ("eager",)),
}
DEFAULT_FAMILIES = ("qwen2.5-3b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-3-4b")


def family_config(name: str, size: str, *, layers: int | None = None, sliding_window: int | None = None,
                  eos_token_id: int | None = EOS):
    """The transformers config of ``name`` at ``size``, optionally shortened to ``layers`` layers."""
    import transformers

    family = FAMILIES[name]
    shape = {**family.shape, **(family.tiny if size == "tiny" else {}), **family.random_init}
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if sliding_window is not None and shape.get("sliding_window"):
        shape["sliding_window"] = sliding_window
    config_cls = getattr(transformers, family.config_cls)
    return config_cls(**shape, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=eos_token_id)


def build_model(config, *, dtype: torch.dtype, attn: str, device: str, logit_std: float, seed: int):
    """A randomly initialised causal LM of ``config`` on ``device``, eval mode, its output
    embedding scaled so that logits of a unit-RMS hidden state have standard deviation ``logit_std``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialise where it will run: an 8B model in seconds on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen_factor(config, logit_std))
    return model


def sharpen_factor(config, logit_std: float) -> float:
    """Output-embedding scale: init std × sqrt(D) is the logit std of a unit-RMS hidden state."""
    return logit_std / (config.initializer_range * math.sqrt(config.hidden_size))


def random_prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 3.. avoid pad/bos/eos)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
