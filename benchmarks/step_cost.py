"""What the continuous engine's step costs in compilations and in ops, on a CPU (issue 32).

Two figures, for this checkout and, with ``--other_checkout``, for another one (e.g. a git worktree of
the commit before a change), each in its own process:

- ``compilations``: dynamo's own count of compiled graphs (``counters["stats"]["unique_graphs"]``)
  over one process's runs with ``compile=True`` traced by dynamo without code generation (backend
  ``eager``): three engines (batch 2, 3, 1), each run twice, rows that join, refine, cross K/V widths
  up and down; a pool of several L and T; longer prompts (the sequence of
  ``tests/decoding/test_gpu_readiness.py``).
- ``ops_per_step``: aten ops that are not views, dispatched per eager decoding step (a proxy for the
  kernels a step launches), at L=0 and at L=4 with every token gated, on a tiny 8-layer Llama.

    python benchmarks/step_cost.py --other_checkout ../legacy --out benchmarks/results/step_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure() -> dict:
    sys.path[:0] = [str(ROOT / "tests")]  # the test helpers (tests/helpers/), as the tests import them
    import torch
    from helpers.inputs import random_prompts
    from helpers.tiny_models import build_tiny_model
    from torch.utils._python_dispatch import TorchDispatchMode

    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.continuous import engine as continuous
    from eglr_harness.decoding.contract import Request

    vocab, tau_kl = 96, 4.4e-4
    always = dict(tau_h=0.0, tau_kl=tau_kl)

    def requests(seed, lengths, new, configs):
        prompts = random_prompts(seed, lengths=lengths, vocab=vocab)
        return [Request(tuple(p), configs[i % len(configs)], new[i % len(new)],
                        seed=11 + i) for i, p in enumerate(prompts)]

    first = [EglrConfig(L=2, **always), EglrConfig(L=0), EglrConfig(L=2, T=0.7, top_k=20, top_p=0.9, **always),
             EglrConfig(L=1, **always), EglrConfig(L=0, T=1.0, top_k=0)]
    pool = [EglrConfig(L=L, T=T, top_k=20, tau_h=0.5, tau_kl=tau_kl) for L in (1, 2) for T in (0.0, 0.6)]
    sequence = [(2, requests(0, (9, 3, 5, 2, 4), (3, 12, 6, 9, 10), first)),
                (3, requests(1, (30, 2, 11, 6, 17, 8), (12, 3, 20), pool)),
                (1, requests(2, (61, 8), (26, 5), [EglrConfig(L=1, **always)]))]
    model = build_tiny_model("llama", vocab_size=vocab, num_layers=2, seed=1)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    engines = {}
    with torch._dynamo.config.patch(recompile_limit=4096):  # let a per-shape step finish, to count it
        for max_batch, batch in sequence:
            if max_batch not in engines:
                engines[max_batch] = continuous.ContinuousEngine(model, max_batch=max_batch, eos_token_ids=[],
                                                                 kv_bucket=4, compile=True, compile_backend="eager")
            engines[max_batch].run(batch)
            engines[max_batch].run(batch)
    compilations = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    class Ops(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 0 if func.is_view else 1
            return func(*args, **(kwargs or {}))

    ops = {}
    model = build_tiny_model("llama", vocab_size=vocab, num_layers=8, seed=1)
    real = continuous._Run.step
    for label, config in (("L0", EglrConfig(L=0)), ("L4_every_token_gated", EglrConfig(L=4, **always))):
        counts = []

        def step(run, work):
            with Ops() as counter:
                real(run, work)
            counts.append(counter.count)
        continuous._Run.step = step
        batch = requests(0, (9, 5, 7, 3), (12,), [config])
        continuous.ContinuousEngine(model, max_batch=4, eos_token_ids=[]).run(batch)
        continuous._Run.step = real
        ops[label] = {"steps": len(counts), "ops_per_step": sum(counts) / len(counts)}
    return {"compilations": compilations, "ops_per_step": ops, "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other_checkout", default=None, help="repository root of another commit to measure too")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # internal: one checkout per process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    results = {}
    for label, root in (("this", ROOT), ("other", args.other_checkout)):
        if root is None:
            continue
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        out = subprocess.run([sys.executable, __file__, "--measure"], cwd=root, env=env, capture_output=True,
                             text=True, check=True)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        results[label]["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True).stdout.strip()
        print(label, json.dumps(results[label]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
