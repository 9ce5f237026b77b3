"""The refinement's per-row bookkeeping (``decoding/refine_state.py``) on hand-made tensors, and its NaN policy in
both eglr-hf engines: a NaN injected into the refined state at iteration 2 is not taken (the row keeps iteration
1 and stops), the row is flagged, and the engine raises ``FloatingPointError`` (eglr-method.md, "Decision — NaN";
the vLLM model's side: tests/eglr_vllm/test_refine_state_nan.py)."""

from __future__ import annotations

import pytest
import torch
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding import refine_state as rs
from eglr_harness.decoding.continuous import fixed_step
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.continuous.step_state import READ_FIELDS
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.hook.generate import eglr_generate
from eglr_harness.decoding.hook.refiner import EglrRefiner

VOCAB, LAYERS, EOS, PAD = 96, 4, 2, 0
NAN = float("nan")


# ---------------------------------------------------------------- the state, by hand
def test_a_row_ends_at_its_rules_exit_or_k_max_and_counts_its_iterations():
    state = rs.start(torch.tensor([True, True, False]))
    # iteration 1: row 0's KL is below the threshold (a hit: it ends), row 1's is not, row 2 does not refine
    state, taken = rs.advance(state, "kl", torch.tensor([1e-5, 0.5, 9.0]), 1e-3, 1, 2)
    assert taken.tolist() == [True, True, False]
    assert state.running.tolist() == [False, True, False] and state.iterations.tolist() == [1, 1, 0]
    assert state.signal.tolist() == pytest.approx([1e-5, 0.5, 0.0]) and state.streak.tolist() == [1, 0, 0]
    # iteration 2: only row 1 moves, and ends at k_max = 2 without a hit
    state, taken = rs.advance(state, "kl", torch.tensor([0.0, 0.25, 0.0]), 1e-3, 2, 2)
    assert taken.tolist() == [False, True, False]
    assert state.running.tolist() == [False, False, False] and state.iterations.tolist() == [1, 2, 0]
    assert state.signal.tolist() == pytest.approx([1e-5, 0.25, 0.0]) and not state.non_finite.any()


def test_accel_needs_two_hits_in_a_row():
    state = rs.start(torch.tensor([True]))
    for k, signal, running in [(1, 0.0, True), (2, 0.0, True), (3, 0.5, True), (4, 0.0, True), (5, 0.0, False)]:
        state, _ = rs.advance(state, "accel", torch.tensor([signal]), 0.03, k, 9)
        assert state.running.tolist() == [running], f"k={k}"  # k = 1 is no hit (accel's first is k = 2)
    assert state.iterations.tolist() == [5] and state.streak.tolist() == [2]


def test_a_nan_signal_is_not_taken_ends_the_row_and_flags_it():
    state = rs.start(torch.tensor([True, True]))
    state, _ = rs.advance(state, "kl", torch.tensor([0.5, 0.5]), 1e-3, 1, 4)
    state, taken = rs.advance(state, "kl", torch.tensor([NAN, 0.25]), 1e-3, 2, 4)
    assert taken.tolist() == [False, True]
    assert state.running.tolist() == [False, True] and state.iterations.tolist() == [1, 2]
    assert state.signal.tolist() == pytest.approx([0.5, 0.25]) and state.non_finite.tolist() == [True, False]
    kept = rs.choose(taken, torch.full((2, 3), NAN), torch.zeros(2, 3))
    assert not kept[0].isnan().any() and kept[1].isnan().all()


def test_rows_limits_a_call_to_one_rules_rows():
    state = rs.start(torch.tensor([True, True]))
    state, taken = rs.advance(state, "latent", torch.tensor([0.0, 0.0]), 0.03, 1, 4, torch.tensor([False, True]))
    assert taken.tolist() == [False, True] and state.running.tolist() == [True, False]
    assert state.iterations.tolist() == [0, 1]


def test_the_exit_projection_is_used_where_an_iteration_was_taken_and_it_is_finite():
    state = rs.start(torch.tensor([True, True, True]))
    state, _ = rs.advance(state, "latent", torch.tensor([NAN, 0.5, 0.5]), 0.03, 1, 1)
    logp = torch.tensor([[0.0, -9.0], [0.0, -9.0], [NAN, 0.0]])
    state, use = rs.exit_projection(state, logp)
    assert use.tolist() == [False, True, False]  # row 0 took no iteration; row 2's projection is NaN
    assert state.non_finite.tolist() == [True, False, True]


# ---------------------------------------------------------------- the NaN policy in the hook engine
def _nan_at_iteration_2(monkeypatch):
    """Make every refinement's second iteration of the hook engine produce a NaN state; returns the list that
    collects what each ``_refine`` call returned."""
    refine, run_top = EglrRefiner._refine, EglrRefiner._run_top_layers
    returned, calls = [], [0]

    def counted_refine(self, *args, **kwargs):
        calls[0] = 0
        returned.append(refine(self, *args, **kwargs))
        return returned[-1]

    def nan_second(self, fused, *args):
        calls[0] += 1
        hidden = run_top(self, fused, *args)
        return torch.full_like(hidden, NAN) if calls[0] == 2 else hidden

    monkeypatch.setattr(EglrRefiner, "_refine", counted_refine)
    monkeypatch.setattr(EglrRefiner, "_run_top_layers", nan_second)
    return returned


@pytest.mark.parametrize("rule", ["kl", "latent"])
def test_hook_engine_keeps_the_last_finite_iteration_of_a_nan_row_and_raises(monkeypatch, rule):
    returned = _nan_at_iteration_2(monkeypatch)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    ids = torch.tensor([random_prompts(0, lengths=(6,), vocab=VOCAB)[0]])
    config = EglrConfig(L=2, k_max=3, tau_h=0.0, tau_kl=0.0, tau_latent=0.0, stop=rule)  # no exit before k_max
    with pytest.raises(FloatingPointError, match=r"non-finite logits at a decoding step of this batch \(rows \[0\]\)"):
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                       pad_token_id=PAD, custom_generate=eglr_generate, eglr_config=config)
    assert returned, "no refinement ran: the test could not fail"
    for chosen, iterations, _signal, chosen_logp, flagged in returned:
        assert iterations.tolist() == [1] and flagged.tolist() == [True]
        assert not chosen.isnan().any() and not chosen_logp.isnan().any()


# ---------------------------------------------------------------- the NaN policy in the continuous engine
def test_continuous_engine_ends_a_nan_row_at_its_last_finite_iteration_and_raises(monkeypatch):
    settle, reads = fixed_step.settle, []

    def nan_second(stack, invariants, state, rows, num_refining, last_hidden, raw):
        refining = torch.arange(rows.shape[0]) >= rows.shape[0] - num_refining
        second = (refining & (state.iterations[rows] == 1))[:, None]  # rows running their second iteration
        read = settle(stack, invariants, state, rows, num_refining, torch.where(second, NAN, last_hidden),
                      torch.where(second, NAN, raw))
        reads.append((read, second[:, 0]))
        return read

    monkeypatch.setattr(fixed_step, "settle", nan_second)
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompt = tuple(random_prompts(0, lengths=(6,), vocab=VOCAB)[0])
    engine = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS])
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        engine.run([Request(prompt, EglrConfig(L=2, k_max=3, tau_h=0.0, tau_kl=0.0), 3)])
    read, second = reads[-1]
    assert second.any(), "no row ran a second iteration: the test could not fail"
    column = {name: read[second, i].tolist() for i, name in enumerate(READ_FIELDS)}
    assert column["iterations"] == [1.0] and column["nan"] == [1.0] and column["emitted"] == [1.0]
