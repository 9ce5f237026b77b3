"""Prefill within a token budget (issue 33): no forward of the continuous engine processes more
prompt tokens than ``prefill_tokens``, prompts longer than the budget are prefilled in chunks (each
attending to the slot's earlier columns), short ones are packed, and the tokens do not change; and
``batch_size=auto`` sizes the batch from K/V, slot state and the larger of a step and a budgeted prefill."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous import engine as continuous
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request
from eglr_harness.decoding.naive_reference import naive_eglr_greedy

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4


def prefill_shapes(monkeypatch) -> list[tuple[int, int, int]]:
    """Record (rows, chunk length, first position of the first row) of every prefill forward."""
    shapes = []
    real = continuous._Run.prefill

    def recording(run, work):
        shapes.append((len(work.slots), work.chunk, run.rows[work.slots[0]].prefilled))
        return real(run, work)
    monkeypatch.setattr(continuous._Run, "prefill", recording)
    return shapes


def requests_of(lengths, configs, new=8, seed=0):
    prompts = random_prompts(seed, lengths=lengths, vocab=VOCAB)
    return [Request(tuple(p), configs[i % len(configs)], new, seed=11 + i) for i, p in enumerate(prompts)]


MIXED = [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=0),
         EglrConfig(L=4, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=1, tau_h=0.0,
                                                                                           tau_kl=TAU_KL)]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma2"])
def test_long_prompts_in_chunks_and_short_ones_packed_within_the_budget_give_the_same_tokens(monkeypatch, arch):
    """Prompts of 3..70 tokens with a budget of 16: the long ones in chunks of up to 16 (their later
    chunks alone), the short ones packed; greedy, refining and sampled rows, sliding windows (Gemma-3),
    soft-caps (Gemma-2): the tokens of a budget that holds every prompt at once, which are today's."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = requests_of((70, 3, 33, 5, 4, 17, 6, 2), MIXED)
    whole = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS], prefill_tokens=10_000).run(requests)
    shapes = prefill_shapes(monkeypatch)
    budget = 16
    # admit_at=3: freed slots are filled three at a time, so that short prompts meet in one prefill
    chunked = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS], prefill_tokens=budget, admit_at=3).run(requests)
    assert all(rows * chunk <= budget for rows, chunk, _ in shapes)
    assert any(start > 0 for _, _, start in shapes)  # a prompt went in several chunks
    assert any(rows > 1 for rows, _, _ in shapes)  # short prompts were packed
    assert all(rows == 1 for rows, _, start in shapes if start > 0)  # a later chunk goes alone
    assert [o.tokens for o in chunked] == [o.tokens for o in whole]
    assert [o.token_iterations for o in chunked] == [o.token_iterations for o in whole]
    for a, b in zip(chunked, whole):
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)


def test_a_chunked_prompt_decodes_as_the_naive_reference():
    """A prompt four times the budget, refining at every token: the tokens and refinement counts of the
    uncached reference (the chunks' attention to earlier columns is the whole prompt's attention)."""
    model = build_tiny_model("qwen2", vocab_size=VOCAB, num_layers=LAYERS, seed=2)
    prompt = random_prompts(5, lengths=(41,), vocab=VOCAB)[0]
    settings = dict(L=2, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=0.0)
    outcome = ContinuousEngine(model, max_batch=1, eos_token_ids=[EOS], prefill_tokens=10).run(
        [Request(tuple(prompt), EglrConfig(**settings), 8)])[0]
    kls, ks = [], []
    tokens, _, gated = naive_eglr_greedy(model, prompt, max_new_tokens=8, eos_ids={EOS}, kl_sink=kls,
                                         iterations_sink=ks, **settings)
    assert min(abs(kl - TAU_KL) / TAU_KL for kl in kls) > 1e-3  # no KL on the threshold's edge
    assert outcome.tokens == tokens
    assert outcome.gated == sum(gated) > 0
    assert outcome.token_iterations == ks


def test_decoding_rows_keep_stepping_between_the_chunks_of_a_long_prompt(monkeypatch):
    """A long prompt does not stall the batch: prefilling rows take turns (a short prompt admitted with
    it is prefilled after the long one's first chunk), and decoding steps run between the long one's chunks."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    events = []
    for name in ("prefill", "step"):
        real = getattr(continuous._Run, name)
        monkeypatch.setattr(continuous._Run, name, lambda run, work, _real=real,
                            _name=name: (events.append(_name), _real(run, work))[1])
    long, short = requests_of((60, 5), [EglrConfig(L=0)], new=30)
    outcomes = ContinuousEngine(model, max_batch=2, eos_token_ids=[], prefill_tokens=8, admit_at=1).run([long, short])
    assert events[:3] == ["prefill", "prefill", "step"]  # the long prompt's first chunk, the short prompt, a step
    last_prefill = len(events) - 1 - events[::-1].index("prefill")
    assert events.count("prefill") == 8 + 1 and events[2:last_prefill].count("step") >= 6
    alone = ContinuousEngine(model, max_batch=1, eos_token_ids=[], prefill_tokens=10_000).run([long, short])
    assert [o.tokens for o in outcomes] == [o.tokens for o in alone]


def test_a_bad_budget_is_refused():
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    for bad in (0, -4, 2.5, True, "8"):
        with pytest.raises(ValueError, match="prefill_tokens"):
            ContinuousEngine(model, max_batch=1, prefill_tokens=bad)


# ---------------------------------------------------------------- batch_size=auto
def test_auto_counts_kv_state_and_a_budgeted_prefill_and_says_so(monkeypatch, caplog):
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = requests_of((40, 3, 12, 7, 9, 5), [EglrConfig(L=2, tau_h=0.0, tau_kl=TAU_KL)], new=6)
    engine = ContinuousEngine(model, max_batch="auto", eos_token_ids=[], prefill_tokens=32)
    capacity = engine.capacity_for(requests)
    per_row = continuous.bytes_per_row(engine.stack, capacity)
    prefill = continuous.prefill_bytes(engine.stack, 32, capacity)
    free = int(prefill / continuous.AUTO_MEMORY_SHARE + 3.2 * per_row * 1.5 / continuous.AUTO_MEMORY_SHARE)
    monkeypatch.setattr(continuous, "free_memory", lambda device: free)
    with caplog.at_level(logging.INFO, logger=continuous.__name__):
        assert engine.auto_batch(requests) == 3  # 3.2 rows' worth after the prefill's share
    line = caplog.text
    assert "3 running rows" in line and "prefill of 32 tokens" in line and f"K/V at {capacity} columns" in line
    assert "(5 slots, refining headroom included) for 6 requests" in line  # 3 rows + ceil(1.5) headroom
    # the slots the line names are the run's: no refining headroom for a plain (L=0) run, none beyond its requests
    caplog.clear()
    plain = requests_of((40, 3, 12, 7, 9, 5), [EglrConfig(L=0)], new=6)
    with caplog.at_level(logging.INFO, logger=continuous.__name__):
        assert engine.auto_batch(plain) == 3
    assert "(3 slots, refining headroom included)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=continuous.__name__):
        assert engine.auto_batch(requests[:4]) == 3
    assert "(4 slots, refining headroom included) for 4 requests" in caplog.text
    # without the prefill's share there would be room for more rows: the budget is counted
    monkeypatch.setattr(continuous, "prefill_bytes", lambda *args: 0)
    assert engine.auto_batch(requests) > 3


def test_the_per_row_estimate_covers_what_a_workspace_allocates():
    """bytes_per_row counts at least the K/V and slot state that the engine allocates per slot."""
    for arch in ("llama", "gemma3", "qwen2"):
        model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
        engine = ContinuousEngine(model, max_batch=4, eos_token_ids=[], refine_headroom=0)
        requests = requests_of((30, 5, 8, 3), [EglrConfig(L=0)], new=20)
        engine.run(requests)
        per_slot = engine.workspace.nbytes() / (engine.workspace.num_slots + 1)
        assert continuous.bytes_per_row(engine.stack, engine.workspace.cache.capacity) >= per_slot


def test_a_kept_workspace_counts_as_free_memory(monkeypatch):
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    engine = ContinuousEngine(model, max_batch="auto", eos_token_ids=[])
    requests = requests_of((30, 5, 8, 3), [EglrConfig(L=0)], new=20)
    free = 10 * 2**20
    monkeypatch.setattr(continuous, "free_memory", lambda device: free)
    before = engine.auto_batch(requests)
    engine.run(requests)
    monkeypatch.setattr(continuous, "free_memory", lambda device: free - engine.workspace.nbytes())
    assert engine.auto_batch(requests) == before
    assert torch.is_tensor(engine.workspace.state.position)
