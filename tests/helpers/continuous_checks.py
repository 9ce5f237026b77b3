"""The continuous engine's checks against the naive reference and ``generate``, on any model: the tests of
tests/decoding/test_continuous_engine.py and, on more families, tests/decoding/test_families.py."""

from __future__ import annotations

import math
from collections import Counter

import torch

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.naive_reference import naive_eglr_greedy
from helpers.inputs import random_prompts

VOCAB, LAYERS, EOS, PAD = 96, 4, 2, 0
MAX_NEW = 10
TAU_KL, KL_MARGIN = 4.4e-4, 1e-3  # as in test_engine_vs_naive: chosen so that every observed KL stays clear
# Very different lengths and more prompts than slots: rows finish at different times and later
# rows join a running batch.
LENGTHS = (9, 3, 17, 5, 12, 7)


def run(model, prompts, configs, *, max_batch=2, seeds=None, **kwargs):
    requests = [Request(tuple(p), c, MAX_NEW, seed=None if seeds is None else seeds[i])
                for i, (p, c) in enumerate(zip(prompts, configs))]
    return ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[EOS]).run(requests, **kwargs)


def median_entropy(model, prompts) -> float:
    outcomes = run(model, prompts, [EglrConfig(L=0)] * len(prompts))
    values = sorted(e for o in outcomes for e in o.entropies)
    middle = len(values) // 2
    return (values[middle - 1] + values[middle]) / 2  # halfway between two observed values


def greedy_tokens_and_iterations_match_naive_reference(model, L, gate):
    """The continuous engine's greedy tokens, gate counts and iterations are the naive reference's."""
    prompts = random_prompts(0, lengths=LENGTHS, vocab=VOCAB)
    tau_h = 0.0 if gate == "always" else median_entropy(model, prompts)
    settings = dict(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=tau_h)
    outcomes = run(model, prompts, [EglrConfig(**settings)] * len(prompts))
    gated_somewhere = False
    for prompt, outcome in zip(prompts, outcomes):
        kls, ks = [], []
        ref_tokens, _, gated = naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS},
                                                 kl_sink=kls, iterations_sink=ks, **settings)
        closest = min((abs(kl - TAU_KL) / TAU_KL for kl in kls), default=1.0)
        assert closest > KL_MARGIN, f"a KL lies within {closest:.1e} (relative) of tau_kl: pick another TAU_KL"
        assert outcome.tokens == ref_tokens
        assert outcome.gated == sum(gated)
        assert outcome.iterations == Counter(k for k in ks if k > 0)
        gated_somewhere |= any(gated)
    assert gated_somewhere, "the thresholds must make the gate fire"


def plain_decoding_equals_generate_token_for_token(model):
    """L=0 (and a gate that never fires) is transformers' greedy generate, each prompt alone."""
    prompts = random_prompts(3, lengths=(3, 17, 5, 30, 9), vocab=VOCAB)
    plain = run(model, prompts, [EglrConfig(L=0)] * len(prompts))
    never = run(model, prompts, [EglrConfig(L=2, tau_h=math.inf)] * len(prompts))
    for prompt, a, b in zip(prompts, plain, never):
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=PAD, eos_token_id=EOS)
        expected = out[0, len(prompt):].tolist()
        assert a.tokens == expected
        assert b.tokens == expected
