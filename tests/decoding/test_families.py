"""The continuous engine on the families beyond Llama/Mistral/Qwen/Gemma (``stack.FAMILIES``), each a tiny
random model with the features that set its family apart (``tiny_models.MORE_ARCHS``), against the naive
uncached reference (greedy and sampled rows, L in {1, N/2, N}) and transformers' ``generate`` (L=0); the
logit-scaled families also through engine=hook; and the models the engine refuses, which engine=auto sends
to engine=hook with one log line naming why.

The checks themselves are those of test_continuous_engine.py and test_engine_vs_naive.py
(tests/helpers/continuous_checks.py, hook_checks.py), run here on these models."""

from __future__ import annotations

import logging
import re
from collections import Counter
from types import SimpleNamespace

import pytest
from helpers import continuous_checks as engine_checks
from helpers import hook_checks as hf_checks
from helpers.inputs import random_prompts
from helpers.tiny_models import MORE_ARCHS, build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.continuous.stack import FAMILIES
from eglr_harness.decoding.model_parts import LOGIT_SCALES
from eglr_harness.decoding.naive_reference import naive_eglr_sampled
from eglr_harness.harness.engine_choice import build_engines

VOCAB, LAYERS, MAX_NEW = engine_checks.VOCAB, engine_checks.LAYERS, engine_checks.MAX_NEW
TAU_KL = engine_checks.TAU_KL
# seed 1 as in the other engine tests; another where a KL of seed 1 lies within KL_MARGIN of TAU_KL
SEEDS = {"phi3": 2, "smollm3": 2, "starcoder2": 2}


@pytest.fixture(scope="module", params=MORE_ARCHS)
def model(request):
    return build_tiny_model(request.param, vocab_size=VOCAB, num_layers=LAYERS, seed=SEEDS.get(request.param, 1))


def test_every_tiny_family_is_a_supported_one(model):
    assert model.config.model_type in FAMILIES


@pytest.mark.parametrize("L", [1, LAYERS // 2, LAYERS])
@pytest.mark.parametrize("gate", ["always", "median"])
def test_greedy_tokens_and_iterations_match_naive_reference(model, L, gate):
    engine_checks.greedy_tokens_and_iterations_match_naive_reference(model, L, gate)


def test_plain_decoding_equals_generate_token_for_token(model):
    engine_checks.plain_decoding_equals_generate_token_for_token(model)


def test_sampled_rows_of_every_L_match_naive_reference_draw_for_draw(model):
    """Sampled rows of L = 1, N/2, N share the running batch, about half their tokens gated."""
    prompts = random_prompts(5, lengths=(9, 3, 6, 4, 7, 5), vocab=VOCAB)
    tau_h = engine_checks.median_entropy(model, prompts)
    spans = [(1, LAYERS // 2, LAYERS)[i % 3] for i in range(len(prompts))]
    sampling = dict(T=0.7, top_k=20, top_p=0.9)
    configs = [EglrConfig(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=tau_h, **sampling) for L in spans]
    seeds = [1000 + i for i in range(len(prompts))]
    outcomes = engine_checks.run(model, prompts, configs, seeds=seeds)
    gated = 0
    for prompt, config, seed, outcome in zip(prompts, configs, seeds, outcomes):
        kls, ks = [], []
        ref_tokens, _, ref_gated = naive_eglr_sampled(
            model, prompt, max_new_tokens=MAX_NEW, eos_ids={engine_checks.EOS}, temperature=config.T,
            top_k=config.top_k, top_p=config.top_p, seed=seed, kl_sink=kls, iterations_sink=ks, L=config.L,
            alpha=config.alpha, k_max=config.k_max, tau_kl=config.tau_kl, tau_h=config.tau_h)
        closest = min((abs(kl - TAU_KL) / TAU_KL for kl in kls), default=1.0)
        assert closest > engine_checks.KL_MARGIN, f"a KL lies within {closest:.1e} (relative) of tau_kl: another seed"
        assert outcome.tokens == ref_tokens
        assert outcome.iterations == Counter(k for k in ks if k > 0)
        gated += sum(ref_gated)
    assert 0 < gated < sum(len(o.tokens) for o in outcomes), "the median gate must gate some tokens, not all"


@pytest.mark.parametrize("arch", ["granite", "cohere"])
def test_the_hf_engine_gates_on_the_scaled_logits(arch):
    """engine=hook hooks the unembedding, whose output the model scales afterwards (model_parts.LOGIT_SCALES):
    its gate and KL exit read the scaled logits, as the naive reference and the continuous engine do."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    assert arch in LOGIT_SCALES
    hf_checks.greedy_tokens_match_naive_reference(model, LAYERS // 2, "median")


def _longrope_phi3():
    rotary_half = 32 // 4 // 2 // 2  # hidden 32, 4 heads, partial rotary 0.5
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": [1.0] * rotary_half, "long_factor": [4.0] * rotary_half}
    return build_tiny_model("phi3", vocab_size=VOCAB, num_layers=2, rope_parameters=rope,
                            original_max_position_embeddings=64)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2)).eval()


@pytest.mark.parametrize("build, reason", [
    (_gpt2, "cannot drive model_type='gpt2'"),
    (_longrope_phi3, "does not support rope_type 'longrope' (phi3)"),
    (lambda: build_tiny_model("llama", vocab_size=VOCAB, num_layers=2,
                              rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
     "does not support rope_type 'dynamic' (llama)"),
], ids=["other-family", "phi3-longrope", "llama-dynamic-rope"])
def test_refused_models_fall_back_to_hf_with_one_log_line(build, reason, caplog):
    model = build()
    with pytest.raises(ValueError, match=rf"{re.escape(reason)}.*use engine=hook"):
        ContinuousEngine(model, max_batch=2)
    lm = SimpleNamespace(model=model, batch_size=2, device="cpu",
                         tokenizer=SimpleNamespace(pad_token_id=0, eos_token_id=2))
    with caplog.at_level(logging.INFO, logger="eglr_harness"):
        engines, used, compiled = build_engines(lm, "auto", "auto")
    assert used == "hook" and [type(e).__name__ for e in engines] == ["HookEngine"] and compiled.recorded == "none"
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("eglr_harness")]
    assert len(lines) == 1 and lines[0].startswith("eglr-hf: decoding with engine=hook: ") and reason in lines[0]
    with pytest.raises(ValueError, match=re.escape(reason)):
        build_engines(lm, "continuous", "auto")
