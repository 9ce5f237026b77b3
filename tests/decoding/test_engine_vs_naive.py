"""The cached, batched, hook-based engine against the naive uncached reference
(eglr_harness/decoding/naive_reference.py)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from helpers import hook_checks as checks
from helpers.inputs import left_pad as _left_pad
from helpers.inputs import random_prompts as _prompts
from helpers.tiny_models import TINY_ARCHS, build_tiny_model

from eglr_harness.decoding.hook.generate import eglr_generate
from eglr_harness.decoding.naive_reference import naive_eglr_greedy, naive_eglr_sampled
from eglr_harness.decoding.sampling import row_seed
from eglr_harness.decoding.stats import EglrStats

VOCAB, LAYERS, PAD, EOS = checks.VOCAB, checks.LAYERS, checks.PAD, checks.EOS
MAX_NEW, TAU_KL, KL_MARGIN = checks.MAX_NEW, checks.TAU_KL, checks.KL_MARGIN
_engine, _median_entropy = checks.decode, checks.median_entropy


@pytest.fixture(scope="module", params=TINY_ARCHS)
def model(request):
    return build_tiny_model(request.param, vocab_size=VOCAB, num_layers=LAYERS, seed=1)


@pytest.mark.parametrize("L", [1, 2, LAYERS])
@pytest.mark.parametrize("gate", ["always", "median"])
def test_greedy_tokens_match_naive_reference(model, L, gate):
    checks.greedy_tokens_match_naive_reference(model, L, gate)


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
    assert stats.computed_refine_layer_evals >= stats.refine_layer_evals
    assert summary["batched_flop_ratio"] == pytest.approx(
        1 + stats.computed_refine_layer_evals / (LAYERS * stats.computed_rows))


# ---------------------------------------------------------------- exits, caps and sampling
# These compare the refinement count of every gated token with the naive reference. The engine is
# read only through ``EglrStats.summary()["iteration_hist"]`` (k* -> gated tokens), summed over the
# batch, so they hold however often the engine reports its counters.


def _engine_iterations(model, prompts, **settings):
    stats = EglrStats()
    rows, scores = _engine(model, prompts, eglr_stats=stats, **settings)
    return rows, scores, Counter({int(k): n for k, n in stats.summary()["iteration_hist"].items()})


def _naive_greedy_all(model, prompts, kls=None, pairs=None, **settings):
    """The naive reference over every prompt: (tokens per row, logits per row, k* histogram over gated tokens)."""
    rows, logits, iterations = [], [], []
    for prompt in prompts:
        ks: list[int] = []
        tokens, emitted, gated = naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=kls,
                                                   iterations_sink=ks, kl_pair_sink=pairs, **settings)
        assert [k > 0 for k in ks] == gated
        rows.append(tokens)
        logits.append(emitted)
        iterations += [k for k in ks if k > 0]
    return rows, logits, Counter(iterations)


def _assert_same_decode(rows, scores, ref_rows, ref_logits):
    for r, (tokens, emitted) in enumerate(zip(ref_rows, ref_logits)):
        assert rows[r] == tokens, f"row {r} diverged from the naive reference"
        for step, ref in enumerate(emitted):
            torch.testing.assert_close(scores[r, step], ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("k_max", [1, 2, 3])
def test_every_gated_token_runs_to_the_cap_when_tau_kl_is_zero(model, k_max):
    # KL < 0 never holds, so each gated token refines exactly k_max times
    prompts = _prompts(7)[:3]
    settings = dict(L=2, alpha=0.2, k_max=k_max, tau_kl=0.0, tau_h=0.0)
    pairs: list[tuple] = []
    ref_rows, ref_logits, ref_hist = _naive_greedy_all(model, prompts, pairs=pairs, **settings)
    # fp32 KLs carry ~1e-7 of noise: one this small before the cap could exit on a negative rounding
    assert min((fwd for k, fwd, _ in pairs if k < k_max), default=1.0) > 1e-6
    assert set(ref_hist) == {k_max}
    rows, scores, hist = _engine_iterations(model, prompts, **settings)
    assert hist == ref_hist
    _assert_same_decode(rows, scores, ref_rows, ref_logits)


def _straddling_tau_kl(model, prompts, settings) -> float:
    """A tau_kl strictly between KL(p_k || p_{k-1}) and KL(p_{k-1} || p_k) of some iteration k < k_max
    of the run made with that very tau_kl, with every compared KL of that run away from it."""
    pairs: list[tuple] = []
    _naive_greedy_all(model, prompts, pairs=pairs, **{**settings, "tau_kl": 0.0})
    # The two directions differ by only 1-3 % on these models; the geometric mean of a pair that
    # differs by > 1 % leaves 0.5 % on each side. The fp32 KLs of the two implementations differ by
    # ~1e-6 absolute, so only KLs > 1e-3 (alpha = 0.9 makes them so) are far enough from the noise.
    candidates = sorted(
        ((fwd * rev) ** 0.5 for k, fwd, rev in pairs
         if k < settings["k_max"] and min(fwd, rev) > 1e-3 and max(fwd, rev) > 1.01 * min(fwd, rev)),
        reverse=True,  # large KLs first: early iterations, where the exit decides most
    )
    for tau in candidates[:8]:
        kls: list[float] = []
        run_pairs: list[tuple] = []
        _naive_greedy_all(model, prompts, kls=kls, pairs=run_pairs, **{**settings, "tau_kl": tau})
        straddled = [p for p in run_pairs if p[0] < settings["k_max"] and min(p[1:]) * 1.003 < tau < max(p[1:]) / 1.003]
        if straddled and min(abs(kl - tau) / tau for kl in kls) > KL_MARGIN:
            return tau
    pytest.fail("no iteration separates the two KL directions on this model: pick other prompts")


def test_kl_early_exit_compares_the_new_distribution_with_the_previous_one(model):
    # tau_kl sits between the two directions of one iteration's KL: a swapped KL exits elsewhere
    prompts = _prompts(8)[:3]
    settings = dict(L=2, alpha=0.9, k_max=3, tau_h=0.0)
    tau = _straddling_tau_kl(model, prompts, settings)
    ref_rows, ref_logits, ref_hist = _naive_greedy_all(model, prompts, **settings, tau_kl=tau)
    rows, scores, hist = _engine_iterations(model, prompts, **settings, tau_kl=tau)
    assert hist == ref_hist
    _assert_same_decode(rows, scores, ref_rows, ref_logits)


SAMPLINGS = [
    dict(temperature=1.0, top_k=0, top_p=1.0),
    dict(temperature=0.7, top_k=5, top_p=1.0),
    dict(temperature=1.3, top_k=0, top_p=0.8),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"T{s['temperature']}-k{s['top_k']}-p{s['top_p']}")
def test_sampled_tokens_match_the_naive_reference_draw_for_draw(model, sampling):
    # tau_h = 0 refines every token; each row draws with its own noise, seeded as the engine seeds it
    prompts = _prompts(9)
    seed, salt = 1333, "L=2,T=sampled,cycle=0"
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    rows, logits, hist = _engine_iterations(model, prompts, sampling=sampling, seed=seed, seed_salt=salt, **settings)
    ref_hist: Counter = Counter()
    for r, prompt in enumerate(prompts):
        kls: list[float] = []
        ks: list[int] = []
        tokens, emitted, gated = naive_eglr_sampled(
            model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, seed=row_seed(seed, salt, prompt), kl_sink=kls,
            iterations_sink=ks, **sampling, **settings,
        )
        assert all(gated)
        assert min((abs(kl - TAU_KL) / TAU_KL for kl in kls), default=1.0) > KL_MARGIN
        ref_hist.update(ks)
        assert rows[r] == tokens, f"row {r} drew other tokens than the naive reference"
        for step, ref in enumerate(emitted):
            torch.testing.assert_close(logits[r, step], ref, atol=2e-4, rtol=1e-4)
    assert hist == ref_hist


def test_tiny_mistral_window_is_shorter_than_the_prompts():
    # otherwise the Mistral cases above would test a Llama copy, not sliding-window attention
    from helpers.tiny_models import MISTRAL_SLIDING_WINDOW

    prompt = max(_prompts(), key=len)
    assert MISTRAL_SLIDING_WINDOW < len(prompt)
    windowed = build_tiny_model("mistral", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    full = build_tiny_model("mistral", vocab_size=VOCAB, num_layers=LAYERS, seed=1, sliding_window=None)
    with torch.no_grad():
        a, b = (m(torch.tensor([prompt])).logits[0, -1] for m in (windowed, full))
    assert not torch.allclose(a, b)


def test_gate_and_kl_read_gemma2_soft_capped_logits():
    # a soft-cap of 2 moves every entropy far from the raw logits' one: gating on uncapped logits
    # (or not capping before the KL) picks other tokens than the reference, which sees the model's output
    model = build_tiny_model("gemma2", vocab_size=VOCAB, num_layers=LAYERS, seed=1, final_logit_softcapping=2.0)
    prompts = _prompts(10)
    ids, mask = _left_pad(prompts)
    plain = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD,
                           eos_token_id=EOS, output_logits=True, return_dict_in_generate=True)
    logp = torch.log_softmax(torch.stack(plain.logits, 1).flatten(0, 1).double(), -1)  # capped: the model's output
    values = (-(logp.exp() * logp).sum(-1)).sort().values
    middle = len(values) // 2
    settings = dict(L=2, alpha=0.2, k_max=3, tau_h=float(values[middle - 1] + values[middle]) / 2)
    # tau_kl at the geometric middle of the KLs seen without exits, so that some tokens exit early
    kls: list[float] = []
    _naive_greedy_all(model, prompts, kls=kls, **settings, tau_kl=0.0)
    kls.sort()
    settings["tau_kl"] = (kls[len(kls) // 2 - 1] * kls[len(kls) // 2]) ** 0.5
    kls.clear()
    ref_rows, ref_logits, ref_hist = _naive_greedy_all(model, prompts, kls=kls, **settings)
    assert min(abs(kl - settings["tau_kl"]) / settings["tau_kl"] for kl in kls) > KL_MARGIN
    assert len(ref_hist) > 1, "some tokens should exit before the cap"
    rows, scores, hist = _engine_iterations(model, prompts, **settings)
    assert hist == ref_hist
    _assert_same_decode(rows, scores, ref_rows, ref_logits)


def test_finished_rows_are_neither_gated_nor_counted(model):
    # row 0 is made to finish at its third token (that token becomes EOS); the other rows run on
    prompts = _prompts(11)
    ids, mask = _left_pad(prompts)
    settings = dict(custom_generate=eglr_generate, L=2, tau_h=0.0, k_max=2, max_new_tokens=MAX_NEW, do_sample=False,
                    pad_token_id=PAD, attention_mask=mask)
    eos = int(model.generate(ids, eos_token_id=EOS, **settings)[0, ids.shape[1] + 2])
    stats = EglrStats()
    out = model.generate(ids, eos_token_id=eos, eglr_stats=stats, **settings)[:, ids.shape[1]:].tolist()
    lengths = [row.index(eos) + 1 if eos in row else len(row) for row in out]
    assert lengths[0] <= 3 < max(lengths)
    summary = stats.summary()
    assert summary["tokens"] == summary["gated_tokens"] == sum(lengths)
