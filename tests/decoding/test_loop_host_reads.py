"""Host reads per iteration of the continuous engine's whole loop, on a CPU.

``tests/decoding/test_gpu_readiness.py`` holds ``decode_step`` itself at zero host reads (on ``meta``); this
counts every iteration of ``_Run.decode``'s loop: the scheduler's ``next_work``, the slot indices' upload, the
step, the read of its result, the scheduler's bookkeeping of it (gates, exits, emitted tokens, EOS, lengths,
retirement), the refining rows' counts and the stop-string check (``helpers.host_reads.LoopHostReads``, which
counts ``.item()``/``bool``/``int``/``float``, ``.tolist()``, ``.numpy()``, ``.cpu()``, copies off the device and
data-dependent ops, on tensors that live on the device).

What may read the host, and how often:

- a **steady decoding step** (an iteration whose work is a ``Step``), at L=0 and at L=4 with every token gated
  (refining rows beside advancing ones, rows finishing by length, EOS and stop string): exactly **one** read,
  the (rows, len(READ_FIELDS)) result of the step (``engine.py``'s ``read.tolist()``), and no blocking upload;
- a **refill** (an iteration whose work is a ``Prefill``: admission, a prefill forward or prompt copies, the
  first settle): exactly one read, its settle's result; its uploads (the admitted rows' settings, the chunk's
  ids and indices) are blocking copies and are not held here (``benchmarks/step_cost.py`` counts them);
- the **last** iteration (``next_work`` returns nothing): none.

There is no bookkeeping every K steps: every other iteration reads nothing else. The stop-string check reads
host tensors only (built from the rows' token lists): not a device read.
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
STEP_READ = "read.tolist()"  # the step's one read, as its source line says


def loop_requests(config: EglrConfig, stop: str | None = None) -> list[Request]:
    """Six requests for three slots (rows join late, finish at different lengths); ``stop`` on every other one."""
    prompts = random_prompts(0, lengths=(9, 3, 17, 5, 7, 4), vocab=VOCAB)
    return [Request(tuple(p), config, n, seed=11 + i, stop_strings=(stop,) if stop and i % 2 == 0 else ())
            for i, (p, n) in enumerate(zip(prompts, (10, 7, 12, 5, 9, 6)))]


def counted_run(label: str, inject=None) -> tuple[LoopHostReads, list, list]:
    """Decode ``loop_requests`` of ``CONFIGS[label]`` eagerly, EOS on, a stop string on half the rows (the
    character of a token the first row emits, so that the row ends by it), counting every loop iteration.
    inject: called with each step's result inside the loop (breaks the loop on purpose). Returns the counter, the
    outcomes and the requests."""
    model = build_tiny_model("llama", vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    tokenizer = CharTokenizer(VOCAB)
    plain = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS]).run(loop_requests(CONFIGS[label]))
    requests = loop_requests(CONFIGS[label], stop=tokenizer.CHARS[plain[0].tokens[3]])
    with LoopHostReads() as counter:
        engine = ContinuousEngine(model, max_batch=3, eos_token_ids=[EOS], tokenizer=tokenizer)
        if inject is not None:
            step = engine.step_fn

            def reading_step(*args):
                read = step(*args)
                inject(read)
                return read
            engine.step_fn = reading_step
        outcomes = engine.run(requests)
    return counter, outcomes, requests


def loop_violations(counter: LoopHostReads) -> list[str]:
    """What breaks 'one read per steady step and per refill, none elsewhere, no blocking upload in a step'."""
    bad = []
    for number, it in enumerate(counter.iterations):
        if it.kind == "step":
            if [where for _, where in it.reads if STEP_READ in where] != [where for _, where in it.reads] or \
                    len(it.reads) != 1:
                bad.append(f"iteration {number} (a step): {len(it.reads)} host reads {it.reads}")
            bad += [f"iteration {number} (a step): a blocking upload at {where}" for where in it.uploads]
        elif it.kind == "prefill" and len(it.reads) != 1:
            bad.append(f"iteration {number} (a refill): {len(it.reads)} host reads {it.reads}")
        elif it.kind == "end" and it.reads:
            bad.append(f"iteration {number} (the last): {it.reads}")
    return bad


@pytest.mark.parametrize("label", sorted(CONFIGS))
def test_a_steady_loop_step_reads_the_host_once(label):
    counter, outcomes, requests = counted_run(label)
    assert loop_violations(counter) == []
    kinds = [it.kind for it in counter.iterations]
    # the run covered what it should: refills between steps, rows that finish by length and by stop string
    assert kinds.count("step") >= 10 and kinds.count("prefill") >= 2 and kinds[-1] == "end"
    assert any(len(o.tokens) < r.max_new_tokens for o, r in zip(outcomes, requests) if r.stop_strings)
    if label == "L4":
        assert all(o.gated == len(o.tokens) for o in outcomes)  # every token refined
        steps = [it for it in counter.iterations if it.kind == "step"]
        assert any(it.refining and it.advancing for it in steps)  # refining rows beside advancing ones
    # the count is of the whole loop step: more ops than decode_step's layers alone
    assert all(it.ops > it.layer_ops > 0 for it in counter.iterations if it.kind == "step")


INJECTED = {
    "item": lambda read: read[0, 0].item(),
    "bool": lambda read: bool(read[0, 0] > 0),
    "tolist": lambda read: read[:, 0].tolist(),
    "cpu": lambda read: read.cpu(),
    "nonzero": lambda read: torch.nonzero(read[:, 1]),
}


@pytest.mark.parametrize("kind", sorted(INJECTED))
def test_a_host_read_added_to_the_loop_step_is_caught(kind):
    """Broken on purpose: the loop reads the step's result once more (as an ``.item()`` in ``_Run.step`` would)."""
    counter, _, _ = counted_run("L0", inject=INJECTED[kind])
    bad = loop_violations(counter)
    assert bad and all("(a step): 2 host reads" in line for line in bad), bad


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
