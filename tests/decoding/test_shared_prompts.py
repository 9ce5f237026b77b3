"""A pool prefills each prompt once (issue 56, item 5): the continuous engine's rows of one prompt (a pool's
cells, cycles and seeds) take a copy of the K/V and prompt state that one prefill computed, and decode the
tokens they decoded when each prefilled its own prompt (``share_prompts=False``, the engine before the issue)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers.inputs import random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.continuous.scheduler import Scheduler
from eglr_harness.decoding.continuous.step_state import RowPhase
from eglr_harness.decoding.contract import Outcome, Request

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4
# ten cells as a pool has them: greedy L cells gated at every token (so that the first token refines from the
# copied anchor), L=0, sampled T cells with and without refinement, a gate that lets some tokens through
POOL = [EglrConfig(L=L, tau_h=0.0, tau_kl=TAU_KL) for L in (1, 2, 3, 4)] + [
    EglrConfig(L=0), EglrConfig(L=0, T=0.8), EglrConfig(L=2, T=0.7, top_k=20, top_p=0.9, tau_h=0.0, tau_kl=TAU_KL),
    EglrConfig(L=1, T=1.0, tau_h=0.0, tau_kl=TAU_KL), EglrConfig(L=3, tau_h=1.0, tau_kl=TAU_KL),
    EglrConfig(L=4, T=0.5, tau_h=0.0, tau_kl=TAU_KL)]


def pool_requests(prompts, cycles=1, new=(6, 1, 9)):
    """Every cell of POOL on every prompt, ``cycles`` times with other seeds; some rows end at their first token
    (a holder may retire in the prefill that completes its prompt)."""
    return [Request(tuple(prompt), config, new[i % len(new)], seed=1000 * cycle + 37 * i + j)
            for cycle in range(cycles) for j, prompt in enumerate(prompts) for i, config in enumerate(POOL)]


def decode(model, requests, share, **engine):
    engine = ContinuousEngine(model, eos_token_ids=[EOS], share_prompts=share, **engine)
    return engine.run(requests), engine.prefill_report()


def assert_same_decoding(shared, alone):
    assert [o.tokens for o in shared] == [o.tokens for o in alone]
    assert [o.token_iterations for o in shared] == [o.token_iterations for o in alone]
    assert [(o.gated, o.iterations, o.finish) for o in shared] == [(o.gated, o.iterations, o.finish) for o in alone]
    for a, b in zip(shared, alone):  # a first token's logits may differ in the last bits with the prefill's rows
        assert a.entropies == pytest.approx(b.entropies, abs=1e-5)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma2"])
@pytest.mark.parametrize("max_batch, prefill_tokens", [(4, 4096), (3, 16), (32, 4096)])
def test_a_pool_with_shared_prompts_decodes_what_it_decoded_prefilling_every_row(arch, max_batch, prefill_tokens):
    """Ten cells (L and T, seeds) x three prompts x two cycles, in batches that hold a few rows (holders retire
    and hand their prompt on), all of them, and with prompts prefilled in chunks of 16 (followers wait for a
    chunked holder); sliding windows (Gemma-3) and soft-caps (Gemma-2): the same tokens, iterations, gates and
    finishes as every row prefilling its own prompt."""
    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = pool_requests(random_prompts(3, lengths=(23, 41, 23), vocab=VOCAB), cycles=2)
    alone, _ = decode(model, requests, False, max_batch=max_batch, prefill_tokens=prefill_tokens)
    shared, report = decode(model, requests, True, max_batch=max_batch, prefill_tokens=prefill_tokens)
    assert_same_decoding(shared, alone)
    assert report["shared_rows"] > 0


def test_a_follower_copies_its_prompt_only_once_its_holder_has_prefilled_all_of_it():
    """Issue 71: two prompts of 24 tokens, prefilled 16 at a time, every row in one batch of 32: the first forward
    leaves A 8 tokens short and the second prefills B, so A's 8 left fit in that forward's chunk though A is not in
    it. A follower copies its holder's prompt only when the holder's last chunk runs in that forward
    (``Scheduler.ready_copies``), never from a half-prefilled holder: the same decoding as every row alone."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    requests = pool_requests(random_prompts(5, lengths=(24, 24), vocab=VOCAB))
    alone, _ = decode(model, requests, False, max_batch=32, prefill_tokens=16)
    shared, report = decode(model, requests, True, max_batch=32, prefill_tokens=16)
    assert_same_decoding(shared, alone)
    assert (report["rows"], report["shared_rows"], report["prefilled_tokens"]) == (20, 18, 48)


def test_a_ten_cell_pool_over_two_prompts_prefills_two_prompts_tokens():
    """The saving, counted: ten cells over two prompts (each cell's rows of a prompt in one run, a batch of four
    rows) run prefill forwards over the two prompts' tokens, not twenty prompts'; without sharing, twenty."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompts = random_prompts(3, lengths=(29, 17), vocab=VOCAB)
    requests = pool_requests(prompts)
    _, shared = decode(model, requests, True, max_batch=4)
    _, alone = decode(model, requests, False, max_batch=4)
    assert shared["prompt_tokens"] == alone["prompt_tokens"] == alone["prefilled_tokens"] == 10 * (29 + 17)
    assert shared["prefilled_tokens"] == 29 + 17
    assert (shared["rows"], shared["shared_rows"]) == (20, 18)
    assert shared["forwards"] < alone["forwards"]


def scheduler(prompts, *, num_slots, admit_at=1, prefill_tokens=64) -> Scheduler:
    requests = [Request(tuple(p), EglrConfig(L=0), 4) for p in prompts]
    return Scheduler(requests, [Outcome() for _ in requests], num_slots=num_slots, max_advancing=num_slots,
                     admit_at=admit_at, prefill_tokens=prefill_tokens, share_prompts=True)


def test_a_freed_slot_keeps_its_prompt_for_the_next_request_of_that_prompt():
    """A holder that retires with no other row of its prompt in a slot leaves the prompt in its freed slot: the
    next request of that prompt takes that slot back and copies nothing, and a request of another prompt takes
    it only when no other slot is free."""
    a, b = (5, 6, 7), (8, 9, 10)
    s = scheduler([a, b, a], num_slots=2)
    assert s.admit() == [0, 1]  # one request of each prompt (the two of a together: a first)
    assert [s.rows[i].request.prompt for i in (0, 1)] == [a, a] and s.rows[1].source == 0
    work = s.next_work()
    assert (work.slots, work.copies) == ([0], [(0, 1)])  # a is prefilled once, copied to its follower
    s.prefilled(work.slots, [3])
    s.copied([1])
    for slot in (0, 1):  # the holder retires first: its follower, past its prompt, holds a now
        s.retire(slot)
    assert s.holders == {a: 1}
    assert s.admit() == [0]  # b goes to the slot that keeps nothing
    assert s.rows[0].source is None and s.holders == {a: 1, b: 0}

    s = scheduler([a, b, a, a], num_slots=1)
    assert s.admit() == [0] and list(s.prefilling) == [0]
    s.prefilled([0], [3])
    s.retire(0)
    assert s.admit() == [0] and s.rows[0].source == 0  # its own slot kept a: nothing to prefill or copy
    work = s.next_work()
    assert (work.slots, work.copies) == ([], [(0, 0)])
    s.copied([0])
    assert s.rows[0].phase == RowPhase.ADVANCE
    s.retire(0)
    s.admit()
    s.retire(0)
    assert s.admit() == [0] and s.rows[0].request.prompt == b and s.rows[0].source is None
    assert s.holders == {b: 0}  # a's K/V is overwritten: no longer held

    b = (8, 9, 10, 11)  # longer: admitted first
    s = scheduler([b, a, a], num_slots=2)
    assert s.admit() == [0, 1] and s.holders == {b: 0, a: 1}
    s.retire(0)  # b's freed slot keeps b
    assert s.admit() == [0] and s.rows[0].source == 1  # the only free slot: a's copy overwrites b there
    assert s.holders == {a: 1}


@pytest.mark.slow
def test_smollm2_decodes_a_pool_byte_for_byte_with_its_prompts_shared(smollm2_path):
    """The real SmolLM2-135M GGUF (fp32), a ten-cell pool (L and T cells, seeds) over two GSM8K-style prompts in a
    batch of four: the same tokens, so the same texts byte for byte, as every row prefilling its own prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, gguf = smollm2_path
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype="float32").eval()
    texts = ["Question: Janet has 16 eggs and eats 3. How many are left?\nAnswer:",
             "Question: A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts?\nAnswer:"]
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    requests = [dataclasses.replace(r, stop_strings=("Question:",)) for r in pool_requests(prompts, new=(12, 1, 16))]
    engine = dict(max_batch=4, tokenizer=tokenizer)
    alone, _ = decode(model, requests, False, **engine)
    shared, report = decode(model, requests, True, **engine)
    assert_same_decoding(shared, alone)
    assert [tokenizer.decode(o.tokens) for o in shared] == [tokenizer.decode(o.tokens) for o in alone]
    assert report["prefilled_tokens"] == sum(len(p) for p in prompts) and report["shared_rows"] == 18
