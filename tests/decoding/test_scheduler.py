"""The continuous engine's scheduler and step sizes, without a model: admission, prefill chunks,
retirement (``decoding/continuous/scheduler.py``), the step key and the captures a run may record
(``decoding/continuous/step_key.py``)."""

from __future__ import annotations

import logging

import pytest

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.scheduler import Drain, Prefill, Scheduler, Step
from eglr_harness.decoding.continuous.step_key import StepKey, StepSizes, length_bucket, row_buckets
from eglr_harness.decoding.continuous.step_state import READ_FIELDS, RowPhase
from eglr_harness.decoding.contract import Outcome, Request


def scheduler(lengths, *, num_slots=3, max_advancing=2, admit_at=1, prefill_tokens=8) -> Scheduler:
    requests = [Request(tuple(range(3, 3 + n)), EglrConfig(L=0), 4) for n in lengths]
    return Scheduler(requests, [Outcome() for _ in requests], num_slots=num_slots, max_advancing=max_advancing,
                     admit_at=admit_at, prefill_tokens=prefill_tokens)


def test_admission_takes_the_longest_prompts_first_and_never_beyond_the_advancing_rows():
    s = scheduler((2, 9, 4, 6))
    assert s.admit() == [0, 1]  # max_advancing 2 of 3 slots: the third is refining headroom
    assert [s.rows[i].request.prompt.__len__() for i in (0, 1)] == [9, 6]
    assert s.rows[2] is None and list(s.prefilling) == [0, 1] and s.admit() == []
    s.rows[0].phase = RowPhase.REFINE  # a refining row frees an advancing place, not a slot
    assert s.admit() == [2] and len(s.rows[2].request.prompt) == 4
    assert s.admit() == []  # no slot free
    row = s.retire(1)
    assert len(row.request.prompt) == 6 and s.rows[1] is None
    assert s.admit() == [1] and len(s.rows[1].request.prompt) == 2 and not s.waiting


def test_admission_waits_for_admit_at_rows_unless_the_batch_is_empty():
    s = scheduler((5,) * 8, num_slots=4, max_advancing=4, admit_at=3)
    assert s.admit() == [0, 1, 2, 3]
    for slot in (0, 1):
        s.retire(slot)
    assert s.admit() == []  # two could go in, three are wanted, and the batch is not empty
    s.retire(2)
    assert s.admit() == [0, 1, 2] and len(s.waiting) == 1
    s.retire(0)
    assert s.admit() == [0]  # one request waits: min(admit_at, waiting) = 1
    s = scheduler((5,), num_slots=2, max_advancing=2, admit_at=3)
    assert s.admit() == [0]  # an empty batch admits what there is


def test_prefill_chunks_pack_first_chunks_and_put_a_long_prompt_at_the_back_of_the_line():
    s = scheduler((20, 3, 2), num_slots=3, max_advancing=3, prefill_tokens=8)
    assert s.admit() == [0, 1, 2]
    slots, chunk = s.next_chunk()
    assert (slots, chunk) == ([0], 8)  # the long prompt's first chunk fills the budget alone
    assert s.prefilled(slots, [8]) == [] and list(s.prefilling) == [1, 2, 0]  # not done: back of the line
    slots, chunk = s.next_chunk()
    assert (slots, chunk) == ([1, 2], 3)  # two first chunks of 3 positions: 6 <= 8 tokens
    assert s.prefilled(slots, [3, 2]) == [1, 2] and [s.rows[i].phase for i in (1, 2)] == [RowPhase.ADVANCE] * 2
    assert s.decoding() and s.slots_in(RowPhase.ADVANCE) == [1, 2]
    assert s.next_chunk() == ([0], 8)  # further into its prompt: alone
    assert s.prefilled([0], [8]) == [] and s.next_chunk() == ([0], 4)
    assert s.prefilled([0], [4]) == [0] and not s.prefilling and s.rows[0].prompt_left == 0


def read(**values) -> list[float]:
    """One row of a forward's read, by the names of READ_FIELDS (the rest 0)."""
    return [float(values.get(name, 0)) for name in READ_FIELDS]


def test_the_loop_asks_what_runs_now_and_the_scheduler_owns_every_phase_change_and_finish():
    requests = [Request((3, 4), EglrConfig(L=1, tau_h=0.0), 2), Request((5,), EglrConfig(L=0), 3),
                Request((6,), EglrConfig(L=0), 3, stop_strings=("x",))]
    s = Scheduler(requests, [Outcome() for _ in requests], num_slots=2, max_advancing=2, admit_at=1,
                  prefill_tokens=8)
    work = s.next_work()
    assert work == Prefill(admitted=[0, 1], slots=[0, 1], chunk=2)  # the round admits, then prefills
    assert s.prefilled(work.slots, [2, 1]) == [0, 1]
    assert s.absorb([read(gated=1, entropy=2.0), read(emitted=1, token=7)], [0, 1], eos=frozenset({9}),
                    stopped=lambda rows: set()) == []
    assert [s.rows[0].phase, s.rows[1].phase] == [RowPhase.REFINE, RowPhase.ADVANCE]  # gated: it refines next
    work = s.next_work()
    assert work == Step(advancing=[1], refining=[0])  # the round's step, after its prefill
    finished = s.absorb([read(emitted=1, token=9), read(emitted=1, token=8, iterations=2)], [1, 0],
                        eos=frozenset({9}), stopped=lambda rows: set())
    assert [(row.index, row.outcome.finish) for row in finished] == [(1, "eos")] and s.rows[1] is None
    first = s.rows[0].outcome
    assert s.rows[0].phase == RowPhase.ADVANCE and first.iterations == {2: 1} and first.tokens == [8]
    assert first.gated == 1 and first.entropies == [2.0] and first.token_iterations == [2]
    work = s.next_work()  # the next round admits the third request into the freed slot
    assert work == Prefill(admitted=[1], slots=[1], chunk=1)
    s.prefilled(work.slots, [1])
    finished = s.absorb([read(emitted=1, token=5)], [1], eos=frozenset(), stopped=lambda rows: {id(rows[0])})
    assert [(row.index, row.outcome.finish) for row in finished] == [(2, "stop")]
    assert s.next_work() == Step(advancing=[0], refining=[])
    finished = s.absorb([read(emitted=1, token=4)], [0], eos=frozenset(), stopped=lambda rows: set())
    assert [(row.index, row.outcome.finish) for row in finished] == [(0, "length")]
    assert s.next_work() is None and not s.busy()


def test_overlapped_reads_launch_the_next_step_before_the_read_and_discard_what_ran_past_an_end():
    """overlap: a step is made while the one before is in flight; a row's last step (by length) frees its slot when
    it is launched; a row found to have ended by EOS ran one more step, whose read is discarded; a Drain takes the
    last step in flight."""
    requests = [Request((3, 4), EglrConfig(L=0), 2), Request((5,), EglrConfig(L=0), 5),
                Request((6,), EglrConfig(L=0), 2)]
    s = Scheduler(requests, [Outcome() for _ in requests], num_slots=2, max_advancing=2, admit_at=1,
                  prefill_tokens=8, overlap=True)
    with pytest.raises(ValueError, match="overlap"):
        Scheduler([Request((3,), EglrConfig(L=1, tau_h=0.0), 2)], [Outcome()], num_slots=1, max_advancing=1, admit_at=1,
                  prefill_tokens=8, overlap=True)
    work = s.next_work()
    assert work == Prefill(admitted=[0, 1], slots=[0, 1], chunk=2)
    s.prefilled(work.slots, [2, 1])
    first, second = s.rows[0], s.rows[1]
    absorb = dict(eos=frozenset({9}), stopped=lambda rows: set())
    assert s.absorb([read(emitted=1, token=7), read(emitted=1, token=7)], [0, 1], **absorb) == []  # first tokens
    step1 = s.next_work()
    assert step1 == Step(advancing=[0, 1], refining=[])
    assert s.rows[0] is None and first.in_flight == 1  # its second token is its last: its slot is free already
    step2 = s.next_work()  # the next round: admits into slot 0 while step 1 is in flight
    assert step2 == Prefill(admitted=[0], slots=[0], chunk=1) and s.rows[0].request is requests[2]
    s.prefilled(step2.slots, [1])
    assert s.absorb([read(emitted=1, token=8)], [0], **absorb) == []
    step3 = s.next_work()
    assert step3 == Step(advancing=[0, 1], refining=[]) and step3.rows[1] is second  # step 1's read not in yet
    assert s.rows[0] is None  # step 3 is the third row's last: its slot is free
    finished = s.absorb([read(emitted=1, token=8), read(emitted=1, token=9)], [0, 1], step=step1, **absorb)
    assert finished == [first, second] and [first.outcome.finish, second.outcome.finish] == ["length", "eos"]
    assert s.rows == [None, None] and s.busy()  # the EOS row leaves now; step 3 is in flight
    assert s.next_work() == Drain()  # nothing to launch
    finished = s.absorb([read(emitted=1, token=5), read(emitted=1, token=6)], [0, 1], step=step3, **absorb)
    assert [row.outcome.finish for row in finished] == ["length"] and s.outcomes[2].tokens == [8, 5]
    assert second.outcome.tokens == [7, 9]  # its step-3 token was discarded
    assert s.next_work() is None and not s.busy()


def test_the_step_key_is_the_bucket_of_rows_and_width():
    sizes = StepSizes.of(num_slots=6, max_advancing=4, kv_bucket=4, capacity=24, bucketed=True)
    assert sizes.advancing == (2, 4, 6) and sizes.refining == (2, 4, 6)
    assert sizes.key(3, 0, 5) == StepKey(4, 0, 6)
    assert sizes.key(0, 1, 4) == StepKey(0, 2, 4)  # refining rows only: no advancing row, not even the trash slot
    assert sizes.key(0, 0, 4) == StepKey(2, 0, 4)  # else a step runs one advancing row at least (the trash slot)
    assert sizes.key(5, 5, 17) == StepKey(6, 6, 24)
    eager = StepSizes.of(num_slots=6, max_advancing=4, kv_bucket=4, capacity=24, bucketed=False)
    assert eager.key(3, 1, 5) == StepKey(3, 1, 6) and eager.key(0, 2, 5) == StepKey(0, 2, 6)
    assert eager.key(0, 0, 5) == StepKey(1, 0, 6)
    assert sizes.widths() == [4, 6, 8, 12, 16, 24] == sorted({length_bucket(n, 4) for n in range(1, 25)})
    assert row_buckets(1) == [2] and row_buckets(9, 3) == [2, 3, 4, 8, 9]


def test_a_compiled_run_says_its_buckets_at_its_start_and_the_keys_it_captured_at_its_end(caplog, monkeypatch):
    import torch
    from helpers.replay_graph import ReplayGraph
    from helpers.tiny_models import build_tiny_model

    from eglr_harness.decoding.continuous import step_graphs
    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    monkeypatch.setattr(step_graphs, "CudaGraph", ReplayGraph)
    model = build_tiny_model("llama", vocab_size=64, num_layers=2, seed=1)
    requests = [Request((5, 6, 7), EglrConfig(L=1, tau_h=0.0), 3), Request((8, 9), EglrConfig(L=0), 3)]
    engine = ContinuousEngine(model, max_batch=2, kv_bucket=4, compile=True, compile_backend="eager")
    engine.runner.capture = True  # what compile_mode="reduce-overhead" turns on, on CUDA
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="eglr_harness.decoding.continuous.engine"):
        engine.run(requests)
        engine.run(requests)  # the same keys: nothing captured again
    torch._dynamo.reset()
    said = [r.getMessage() for r in caplog.records if "step" in r.getMessage()]
    captured = engine.warmup_report()["capture_keys"]
    assert captured and said == [
        "continuous engine: 2 slots, step buckets: advancing rows [2], refining rows [0, 2], K/V widths 4, 6, 8, 12",
        f"continuous engine: this run captured {len(captured)} step keys (advancing rows, refining rows, K/V width): "
        + ", ".join(f"({a}, {r}, {w})" for a, r, w in captured),
        "continuous engine: 2 slots, step buckets: advancing rows [2], refining rows [0, 2], K/V widths 4, 6, 8, 12",
        "continuous engine: this run captured 0 step keys (advancing rows, refining rows, K/V width)"]


@pytest.mark.parametrize("moved", [False, True])
def test_debug_mode_refuses_to_replay_a_graph_on_moved_tensors(monkeypatch, moved, caplog):
    """vLLM's address check: with the logger at DEBUG, a replay checks that the workspace it was recorded on
    has not moved. Broken on purpose (a storage tensor replaced behind the runner's back): it must say so."""
    import torch
    from helpers.replay_graph import ReplayGraph
    from helpers.tiny_models import build_tiny_model

    from eglr_harness.decoding.continuous import step_graphs
    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    monkeypatch.setattr(step_graphs, "CudaGraph", ReplayGraph)
    model = build_tiny_model("llama", vocab_size=64, num_layers=2, seed=1)
    requests = [Request((5, 6, 7), EglrConfig(L=1, tau_h=0.0), 6), Request((8, 9), EglrConfig(L=0), 6)]
    engine = ContinuousEngine(model, max_batch=2, kv_bucket=4, compile=True, compile_backend="eager")
    engine.runner.capture = True
    torch._dynamo.reset()
    caplog.set_level(logging.DEBUG, logger="eglr_harness.decoding.continuous.step_graphs")
    engine.run(requests)
    if moved:
        keys = engine.workspace.cache.keys
        keys[0] = keys[0].clone()
        with pytest.raises(RuntimeError, match=r"tensors that moved .*cache\.keys\[0\]"):
            engine.run(requests)
    else:
        engine.run(requests)  # the same workspace: every replay passes the check
    torch._dynamo.reset()
