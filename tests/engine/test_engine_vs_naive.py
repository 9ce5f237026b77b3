"""The cached, batched, hook-based engine against the naive uncached reference (tests/engine/naive_reference.py)."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import TINY_ARCHS, build_tiny_model
from naive_reference import naive_eglr_greedy

from eglr_harness.decoding.accounting import EglrStats
from eglr_harness.decoding.generate import eglr_generate

VOCAB, LAYERS, PAD, EOS = 96, 4, 0, 2
MAX_NEW = 10
# Not the paper's 5e-4: on these tiny models a KL of 5.0013e-4 occurs (qwen2, L=2), and float noise
# between the two implementations then flips the early exit. 3e-4 keeps every observed KL > 0.5 %
# away; KL_MARGIN makes the test say so if a model or library change brings one closer.
TAU_KL = 3e-4
KL_MARGIN = 1e-3


def _prompts(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 5, 7, 3]
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _left_pad(prompts):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    return ids, mask


def _engine(model, prompts, **eglr):
    ids, mask = _left_pad(prompts)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS,
        custom_generate=eglr_generate, output_scores=True, return_dict_in_generate=True, **eglr,
    )
    rows = []
    for r in range(len(prompts)):
        tokens = out.sequences[r, ids.shape[1]:].tolist()
        if EOS in tokens:
            tokens = tokens[: tokens.index(EOS) + 1]
        rows.append(tokens)
    scores = torch.stack(out.scores, dim=1)  # (B, steps, V)
    return rows, scores


@pytest.fixture(scope="module", params=TINY_ARCHS)
def model(request):
    return build_tiny_model(request.param, vocab_size=VOCAB, num_layers=LAYERS, seed=1)


def _median_entropy(model, prompts) -> float:
    sink = []
    ids, mask = _left_pad(prompts)
    model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD,
                   eos_token_id=EOS, custom_generate=eglr_generate, L=0, eglr_refiner_sink=sink)
    values = torch.cat(sink[0].entropies).sort().values
    middle = len(values) // 2
    # halfway between two observed entropies, so float noise cannot flip a gate decision
    return float(values[middle - 1] + values[middle]) / 2


@pytest.mark.parametrize("L", [1, 2, LAYERS])
@pytest.mark.parametrize("gate", ["always", "median"])
def test_greedy_tokens_match_naive_reference(model, L, gate):
    prompts = _prompts()
    tau_h = 0.0 if gate == "always" else _median_entropy(model, prompts)
    settings = dict(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=tau_h)
    rows, scores = _engine(model, prompts, **settings)
    any_gated = False
    for r, prompt in enumerate(prompts):
        kls: list[float] = []
        ref_tokens, ref_logits, gated = naive_eglr_greedy(
            model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=kls, **settings
        )
        closest = min((abs(kl - TAU_KL) / TAU_KL for kl in kls), default=1.0)
        assert closest > KL_MARGIN, f"a KL lies within {closest:.1e} (relative) of tau_kl: pick another TAU_KL"
        any_gated |= any(gated)
        assert rows[r] == ref_tokens, f"row {r} diverged from the naive reference"
        for step, ref in enumerate(ref_logits):
            torch.testing.assert_close(scores[r, step], ref, atol=2e-4, rtol=1e-4)
    assert any_gated, "the test thresholds must make the gate fire"
    if gate == "median":
        # mixed gating: the refined distribution must differ from plain decoding somewhere
        plain_rows, plain_scores = _engine(model, prompts, L=0)
        assert not torch.equal(plain_scores[:, :1], scores[:, :1]) or plain_rows != rows


def test_plain_decoding_is_identical_at_L0_and_at_infinite_threshold(model):
    ids, mask = _left_pad(_prompts(3))
    common = dict(attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    stock = model.generate(ids, **common)
    assert torch.equal(stock, model.generate(ids, custom_generate=eglr_generate, L=0, **common))
    assert torch.equal(stock, model.generate(ids, custom_generate=eglr_generate, L=2, tau_h=math.inf, **common))


def test_refinement_changes_decoding_when_gated(model):
    ids, mask = _left_pad(_prompts(4))
    common = dict(attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS,
                  output_scores=True, return_dict_in_generate=True)
    plain = model.generate(ids, **common)
    refined = model.generate(ids, custom_generate=eglr_generate, L=2, tau_h=0.0, **common)
    assert not torch.allclose(plain.scores[0], refined.scores[0])


def test_accounting_matches_what_ran(model):
    prompts = _prompts(5)
    stats = EglrStats()
    rows, _ = _engine(model, prompts, L=2, tau_h=0.0, k_max=3, eglr_stats=stats)
    summary = stats.summary()
    generated = sum(len(r) for r in rows)
    assert summary["tokens"] == generated  # finished rows are not counted
    assert summary["gated_tokens"] == generated  # tau_h = 0 gates every token
    assert summary["rho"] == 1.0
    assert 1 <= summary["mean_iterations"] <= 3
    assert sum(summary["iteration_hist"].values()) == generated
    expected_ratio = 1 + summary["mean_iterations"] * 2 / LAYERS
    assert summary["flop_ratio"] == pytest.approx(expected_ratio)
    # the batched loop runs until the slowest gated row exits: at least every row's own iterations
    assert stats.batched_refine_layer_evals >= stats.refine_layer_evals
    assert summary["batched_flop_ratio"] == pytest.approx(1 + stats.batched_refine_layer_evals / (LAYERS * stats.row_steps))
