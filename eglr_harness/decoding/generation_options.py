"""Which of a model's ``generation_config`` settings the continuous engine can honour.

``generate`` builds logits processors from the model's generation config even when decoding
greedily (``repetition_penalty``, ``no_repeat_ngram_size``, ``suppress_tokens``, ...; some
instruct models ship one). The continuous engine draws its tokens itself and applies only
temperature, top-k and top-p (from each request's EGLR config), so it refuses every other active
processor by name rather than silently decoding other text than ``engine=hf``.
"""

from __future__ import annotations

# setting -> test that it is active (as transformers' ``GenerationMixin._get_logits_processor`` decides)
_ACTIVE = {
    "repetition_penalty": lambda v: v is not None and v != 1.0,
    "encoder_repetition_penalty": lambda v: v is not None and v != 1.0,
    "no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "encoder_no_repeat_ngram_size": lambda v: v is not None and v > 0,
    "bad_words_ids": lambda v: v is not None,
    "sequence_bias": lambda v: v is not None,
    "min_length": lambda v: v is not None and v > 0,
    "min_new_tokens": lambda v: v is not None and v > 0,
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "remove_invalid_values": lambda v: v is True,
    "exponential_decay_length_penalty": lambda v: v is not None,
    "suppress_tokens": lambda v: v is not None,
    "begin_suppress_tokens": lambda v: v is not None,
    "guidance_scale": lambda v: v is not None and v != 1,
    "watermarking_config": lambda v: v is not None,
    "renormalize_logits": lambda v: v is True,
    "num_beams": lambda v: v is not None and v > 1,
    # sampling warpers beside temperature / top-k / top-p
    "min_p": lambda v: v is not None,
    "top_h": lambda v: v is not None,
    "typical_p": lambda v: v is not None and v < 1.0,
    "epsilon_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
    "eta_cutoff": lambda v: v is not None and 0.0 < v < 1.0,
}


def unsupported_generation_settings(generation_config) -> dict[str, object]:
    """The active settings of ``generation_config`` that the continuous engine does not apply."""
    if generation_config is None:
        return {}
    return {name: getattr(generation_config, name) for name, active in _ACTIVE.items()
            if active(getattr(generation_config, name, None))}


def check_generation_config(generation_config) -> None:
    """``ValueError`` naming every active setting the continuous engine would ignore."""
    found = unsupported_generation_settings(generation_config)
    if found:
        named = ", ".join(f"{name}={value!r}" for name, value in found.items())
        raise ValueError(f"engine=continuous does not apply the model's generation_config setting(s) {named} "
                         "(generate applies them, even greedily); use engine=hf, or unset them "
                         "(e.g. model.generation_config.repetition_penalty = None) to decode without them.")
