"""Fixtures of the verifier tests: tiny randomly initialised verifiers in each format, saved as
local folders with SmolLM2's tokenizer (plus the format's tag token), and fake runs."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_config(cls, vocab: int, **extra):
    return cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               tie_word_embeddings=False, **extra)


@pytest.fixture(scope="session")
def tiny_verifier(tmp_path_factory, smollm2_tokenizer_dir):
    """Factory: ``make(format)`` -> folder of a tiny verifier of that format (built once each)."""
    import torch
    import transformers as tf

    made: dict[str, Path] = {}

    def make(fmt: str) -> Path:
        if fmt in made:
            return made[fmt]
        tok = tf.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
        if fmt == "qwen-prm":  # Qwen2.5-Math-PRM: <extra_0> is a special token, a two-label token head
            tok.add_special_tokens({"additional_special_tokens": ["<extra_0>"]})
            model = tf.Qwen2ForTokenClassification(tiny_config(tf.Qwen2Config, len(tok), num_labels=2))
        elif fmt == "shepherd":  # math-shepherd: a causal LM whose vocabulary holds the step tag ки
            tok.add_tokens(["ки"])
            model = tf.LlamaForCausalLM(tiny_config(tf.LlamaConfig, len(tok)))
        elif fmt == "value-head":  # a one-label token head: a value head
            model = tf.LlamaForTokenClassification(tiny_config(tf.LlamaConfig, len(tok), num_labels=1))
        elif fmt == "orm":
            model = tf.LlamaForSequenceClassification(tiny_config(tf.LlamaConfig, len(tok), num_labels=1))
        elif fmt == "self":
            model = tf.LlamaForCausalLM(tiny_config(tf.LlamaConfig, len(tok)))
        else:
            raise KeyError(fmt)
        torch.manual_seed(0)
        with torch.no_grad():  # random init reads ~0.5 everywhere: spread the outputs so that scores differ
            for p in model.parameters():
                p.normal_(0, 0.3)
        model.config.pad_token_id = tok.pad_token_id
        out = tmp_path_factory.mktemp(f"verifier_{fmt}")
        model.eval().save_pretrained(out)
        tok.save_pretrained(out)
        made[fmt] = out
        return out

    return make
