"""Host reads per iteration of the continuous engine's whole loop, on a CPU.

``tests/decoding/test_gpu_readiness.py`` holds ``decode_step`` itself at zero host reads (on ``meta``); this
counts every iteration of ``_Run.decode``'s loop: the scheduler's ``next_work``, the slot indices' upload, the
step, the read of its result, the scheduler's bookkeeping of it (gates, exits, emitted tokens, EOS, lengths,
retirement), the refining rows' counts and the stop-string check (``helpers.host_reads.LoopHostReads``, which
counts ``.item()``/``bool``/``int``/``float``, ``.tolist()``, ``.numpy()``, ``.cpu()``, copies off the device and
data-dependent ops, on tensors that live on the device, and counts apart, as ``deferred``, the reads of a buffer
that a non-blocking copy filled in an earlier iteration).

What may read the host, and how often:

- a **steady decoding step** (an iteration whose work is a ``Step``) of a run whose rows never refine (L=0):
  **no** read. Its result is copied to the host without blocking and read one step later (the scheduler's
  overlapped reads): one deferred read, of the step before's result (none in the run's first step);
- a steady decoding step with refinement (L=4, every token gated: refining rows beside advancing ones): exactly
  **one** read, the (rows, len(READ_FIELDS)) result of the step (``StepRead.values``' ``self.host.tolist()``):
  a gate's decision shapes the next step;
- rows finishing by length, EOS and stop string in both; no blocking upload in a step, one non-blocking upload
  (its slot indices);
- a **refill** (an iteration whose work is a ``Prefill``: admission, a prefill forward or prompt copies, the
  first settle): exactly one read, its settle's result, and its host values in one non-blocking upload
  (``step_state.HostPack``), no blocking one;
- a **drain** (a ``Drain``: overlapped reads, no step to launch while one is in flight; every running row's last
  step is, or the run ends): one deferred read, no read;
- the **last** iteration (``next_work`` returns nothing): none.

There is no bookkeeping every K steps: every other iteration reads nothing else. The stop-string check reads
host tensors only (built from the rows' token lists, as the read brought them in): not a device read.
"""

from __future__ import annotations

import pytest
import torch
from helpers.host_reads import Iteration, LoopHostReads
from helpers.inputs import CharTokenizer, random_prompts
from helpers.tiny_models import build_tiny_model

from eglr_harness.core.config import EglrConfig
from eglr_harness.decoding.continuous.engine import ContinuousEngine
from eglr_harness.decoding.contract import Request

VOCAB, LAYERS, EOS = 96, 4, 2
TAU_KL = 4.4e-4
CONFIGS = {"L0": EglrConfig(L=0), "L4": EglrConfig(L=4, tau_h=0.0, tau_kl=TAU_KL)}  # L4: every token gated
STEP_READ = "self.host.tolist()"  # a step's read, as its source line says (StepRead.values)
REFILL_READ = "read.tolist()"  # a refill's settle's read


def loop_requests(config: EglrConfig, stop: str | None = None) -> list[Request]:
    """Six requests for three slots (rows join late, finish at different lengths); ``stop`` on every other one."""
    prompts = random_prompts(0, lengths=(9, 3, 17, 5, 7, 4), vocab=VOCAB)
    return [Request(tuple(p), config, n, seed=11 + i, stop_strings=(stop,) if stop and i % 2 == 0 else ())
            for i, (p, n) in enumerate(zip(prompts, (10, 7, 12, 5, 9, 6)))]


def counted_run(label: str, inject=None, **engine_options) -> tuple[LoopHostReads, list, list]:
    """Decode ``loop_requests`` of ``CONFIGS[label]`` eagerly, EOS on, a stop string on half the rows (the
    character of a token the first row emits, so that the row ends by it), counting every loop iteration.
    inject: called with each step's result inside the loop (breaks the loop on purpose); engine_options: the
    engine's. Returns the counter, the outcomes and the requests."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    tokenizer = CharTokenizer(VOCAB)
    plain = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS]).run(loop_requests(CONFIGS[label]))
    requests = loop_requests(CONFIGS[label], stop=tokenizer.CHARS[plain[0].tokens[3]])
    with LoopHostReads() as counter:
        engine = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS], tokenizer=tokenizer, **engine_options)
        if inject is not None:
            step = engine.step_fn

            def reading_step(*args):
                read = step(*args)
                inject(read)
                return read
            engine.step_fn = reading_step
        outcomes = engine.run(requests)
    return counter, outcomes, requests


def loop_violations(counter: LoopHostReads, step_reads: int) -> list[str]:
    """What breaks 'a step reads ``step_reads`` times (its own result) and, overlapped (0), reads the step before's
    result one step later; a refill reads once; a drain only the step in flight; no blocking upload; one
    non-blocking upload per step and per refill'."""
    bad = []
    for number, it in enumerate(counter.iterations):
        reads, deferred = [where for _, where in it.reads], [where for _, where in it.deferred]
        expected = {"step": ([STEP_READ] * step_reads, 1 - step_reads), "prefill": ([REFILL_READ], 0),
                    "drain": ([], 1), "end": ([], 0)}[it.kind]
        if len(reads) != len(expected[0]) or not all(what in where for what, where in zip(expected[0], reads)):
            bad.append(f"iteration {number} (a {it.kind}): {len(reads)} host reads {reads}")
        if len(deferred) > expected[1] or not all(STEP_READ in where for where in deferred):
            bad.append(f"iteration {number} (a {it.kind}): {len(deferred)} deferred reads {deferred}")
        bad += [f"iteration {number} (a {it.kind}): a blocking upload at {where}" for where in it.uploads]
        if it.kind in ("step", "prefill") and len(it.async_uploads) != 1:
            bad.append(f"iteration {number} (a {it.kind}): {len(it.async_uploads)} uploads {it.async_uploads}")
    return bad


STEP_READS = {"L0": 0, "L4": 1}  # the targets: overlapped at L=0, one read a step with refinement


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_a_steady_loop_step_reads_nothing_at_L0_and_once_with_refinement(label):
    counter, outcomes, requests = counted_run(label)
    assert loop_violations(counter, STEP_READS[label]) == []
    kinds = [it.kind for it in counter.iterations]
    # the run covered what it should: refills between steps, rows that finish by length and by stop string
    assert kinds.count("step") >= 10 and kinds.count("prefill") >= 2 and kinds[-1] == "end"
    assert any(len(o.tokens) < r.max_new_tokens for o, r in zip(outcomes, requests) if r.stop_strings)
    steps = [it for it in counter.iterations if it.kind == "step"]
    if label == "L0":  # every step but the first takes the step before's result, one step late
        assert [len(it.deferred) for it in steps] == [0] + [1] * (len(steps) - 1)
        assert kinds[-2] == "drain"  # the last step's read comes in with nothing left to launch
    if label == "L4":
        assert all(o.gated == len(o.tokens) for o in outcomes)  # every token refined
        assert any(it.refining and it.advancing for it in steps)  # refining rows beside advancing ones
        assert "drain" not in kinds
    # the count is of the whole loop step: more ops than decode_step's layers alone
    assert all(it.ops > it.layer_ops > 0 for it in steps)


def test_a_read_of_the_step_just_launched_is_a_read():
    """The counter counts a read as deferred only when it is: the same run at L=0 with the step's result read before
    the next step is launched (``overlap_reads=False``) reads the host once per step, and breaks the L=0 target."""
    counter, _, _ = counted_run("L0", overlap_reads=False)
    assert loop_violations(counter, 1) == []
    bad = loop_violations(counter, STEP_READS["L0"])
    steps = [it for it in counter.iterations if it.kind == "step"]
    assert len(bad) == len(steps) and all("(a step): 1 host reads" in line for line in bad), bad


INJECTED = {
    "item": lambda read: read[0, 0].item(),
    "bool": lambda read: bool(read[0, 0] > 0),
    "tolist": lambda read: read[:, 0].tolist(),
    "cpu": lambda read: read.cpu(),
    "nonzero": lambda read: torch.nonzero(read[:, 1]),
}


@pytest.mark.parametrize("kind", sorted(INJECTED))
def test_a_host_read_added_to_the_loop_step_is_caught(kind):
    """Broken on purpose: the loop reads the step's result (as an ``.item()`` in ``_Run.step`` would)."""
    counter, _, _ = counted_run("L0", inject=INJECTED[kind])
    bad = loop_violations(counter, STEP_READS["L0"])
    assert bad and all("(a step): 1 host reads" in line for line in bad), bad


def test_a_buffer_read_is_deferred_only_when_an_earlier_iteration_filled_it_and_nothing_wrote_it_since():
    """The counter's rule for overlapped reads: a host buffer filled by a non-blocking copy is a deferred read in a
    later iteration, a read in the iteration that filled it, and a read once anything wrote it after the copy; a
    blocking copy's buffer is always read as the device's."""
    device = torch.ones(3).mul(2)
    with LoopHostReads() as counter:
        counter.iterations.append(Iteration(kind="step"))
        early, same, blocking = torch.empty(3), torch.empty(3), torch.empty(3)
        for buffer in (early, same):
            buffer.copy_(device, non_blocking=True)
        blocking.copy_(device)
        same.tolist()  # the host waits for the copy it just made
        counter.iterations.append(Iteration(kind="step"))
        early[:2].tolist()  # a view of it, one iteration later: deferred
        int(early[0])
        blocking.tolist()
        early.add_(1)  # written after the copy: a read from now on
        early.tolist()
    first, second = counter.iterations[-2:]
    assert [what for what, _ in first.reads] == ["Tensor.tolist (3,)"] and first.deferred == []
    assert [what for what, _ in second.deferred] == ["Tensor.tolist (2,)", "aten._local_scalar_dense.default"]
    assert [what for what, _ in second.reads] == ["Tensor.tolist (3,)"] * 2


def test_host_side_tensors_are_not_reads():
    """The counter's exemptions: a tensor built from host data, and what is computed from it alone, is read
    freely; the same tensor moved to the device is counted."""
    with LoopHostReads() as counter:
        counter.iterations.append(Iteration(kind="step"))
        host = torch.tensor([1, 2, 3])
        (host * 2).tolist()
        int(host[0])
        device = host.to("cpu")
        device.tolist()
        torch.ones(2).sum().item()
    assert [what for what, _ in counter.iterations[-1].reads] == [
        "Tensor.tolist (3,)", "aten._local_scalar_dense.default"]


def test_a_refills_values_travel_in_one_copy_and_arrive_as_torch_tensor_would_make_them():
    """``HostPack``: ints (a 63-bit seed), bools, fp32 and float64 values of any shape, one upload, each equal to
    ``torch.tensor(values, dtype=...)``, bit for bit (a Python float rounds to fp32 on the device as on the host)."""
    from eglr_harness.decoding.continuous.step_state import HostPack

    values = [([3, 2**62 + 7, -1], torch.long), ([True, False], torch.bool), ([0.1, 1 / 3, 1e-40], torch.float32),
              ([[0.1, float("inf")], [2.5, -0.0]], torch.float64), ([], torch.long)]
    pack = HostPack()
    handles = [pack.add(v, dtype) for v, dtype in values]
    with LoopHostReads() as counter:
        counter.iterations.append(Iteration(kind="prefill"))
        sent = pack.send("cpu")
    assert len(counter.iterations[-1].async_uploads) == 1 and counter.iterations[-1].uploads == []
    for (v, dtype), handle in zip(values, handles):
        got, expected = sent[handle], torch.tensor(v, dtype=dtype)
        assert got.dtype == dtype and got.shape == expected.shape
        assert torch.equal(got.view(torch.uint8) if got.numel() else got, expected.view(torch.uint8)
                           if expected.numel() else expected)
