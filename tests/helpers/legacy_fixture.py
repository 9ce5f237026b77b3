"""Greedy tokens of the continuous engine as it was before the fixed-shape step (commit 6a0a64e).

``python tests/helpers/legacy_fixture.py`` wrote ``data/legacy_continuous_tokens.json`` with that
engine; ``test_fixed_step.py`` checks that today's engine gives the same tokens, case by case.
The cases: every tiny family, L in {1, 2, N}, the gate always on or at the median entropy, a
mixed-cell batch, more prompts than slots (rows join a running batch).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

VOCAB, LAYERS, EOS, MAX_NEW = 96, 4, 2, 10
ARCHS = ("llama", "qwen2", "mistral", "gemma2", "gemma3")
LENGTHS = (9, 3, 17, 5, 12, 7)
TAU_KL = 4.4e-4
FIXTURE = Path(__file__).parent / "data" / "legacy_continuous_tokens.json"


def cases():
    """(name, arch, prompt seed, per-prompt config kwargs, max_batch, refine_headroom)."""
    for arch in ARCHS:
        for L in (1, 2, LAYERS):
            for tau_h in (0.0, "median"):
                yield f"{arch}-L{L}-{tau_h}", arch, 0, [dict(L=L, tau_kl=TAU_KL, tau_h=tau_h)] * len(LENGTHS), 2, 0.5
        mixed = [dict(L=0), dict(L=1, tau_h=0.0, tau_kl=TAU_KL), dict(L=4, tau_h="median", tau_kl=TAU_KL),
                 dict(L=2, tau_h=0.0, tau_kl=TAU_KL, alpha=0.5), dict(L=3, tau_h=0.0, tau_kl=TAU_KL, k_max=2),
                 dict(L=0, tau_h=math.inf)]
        yield f"{arch}-mixed", arch, 7, mixed, 3, 0.5
        yield f"{arch}-mixed-noheadroom", arch, 7, mixed, 3, 0.0


def run_case(arch, prompt_seed, settings, max_batch, headroom, run):
    """Tokens per prompt; ``run(model, prompts, configs, max_batch, headroom)`` decodes."""
    from helpers.inputs import random_prompts
    from helpers.tiny_models import build_tiny_model

    from eglr_harness.core.config import EglrConfig

    model = build_tiny_model(arch, vocab_size=VOCAB, num_layers=LAYERS, seed=1)
    prompts = random_prompts(prompt_seed, lengths=LENGTHS, vocab=VOCAB)
    median = None
    if any(s.get("tau_h") == "median" for s in settings):
        outs = run(model, prompts, [EglrConfig(L=0)] * len(prompts), max_batch, headroom, True)
        values = sorted(e for o in outs for e in o.entropies)
        median = (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    configs = [EglrConfig(**{**s, **({"tau_h": median} if s.get("tau_h") == "median" else {})}) for s in settings]
    return [o.tokens for o in run(model, prompts, configs, max_batch, headroom, False)]


def engine_run(model, prompts, configs, max_batch, headroom, record):
    from eglr_harness.decoding.continuous.engine import ContinuousEngine
    from eglr_harness.decoding.contract import Request

    requests = [Request(tuple(p), c, MAX_NEW) for p, c in zip(prompts, configs)]
    engine = ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[EOS], refine_headroom=headroom)
    return engine.run(requests)  # every outcome carries its entropies: `record` is the old engine's switch


if __name__ == "__main__":
    out = {name: run_case(arch, seed, settings, mb, hr, engine_run) for name, arch, seed, settings, mb, hr in cases()}
    entries = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(out.items()))
    FIXTURE.write_text("{\n" + entries + "\n}\n")
    print(f"{len(out)} cases -> {FIXTURE}")
