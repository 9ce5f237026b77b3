"""What the continuous engine's loop step costs in compilations, host reads, ops and kernels, on a CPU.

Four figures, for this checkout and, with ``--other_checkout``, for another one (e.g. a git worktree of
the commit before a change), each in its own process:

- ``compilations``: dynamo's own count of compiled graphs (``counters["stats"]["unique_graphs"]``)
  over one process's runs with ``compile=True`` traced by dynamo without code generation (backend
  ``eager``): three engines (batch 2, 3, 1), each run twice, rows that join, refine, cross K/V widths
  up and down; a pool of several L and T; longer prompts (the sequence of
  ``tests/decoding/test_gpu_readiness.py``).
- ``host_reads``: per iteration of the engine's whole loop (``_Run.decode``: the scheduler's ``next_work``, the
  slots' upload, the step, the read of its result, the scheduler's bookkeeping, retirement), eager, six
  requests over four slots of a tiny Llama, at L=0 and at L=4 with every token gated: the host reads of a
  steady decoding step (``per_step``, and its ``per_step_max``) and of a refill (``per_refill``: admission, a
  prefill forward, the first settle), and the blocking uploads of each (host data copied to the device with
  ``non_blocking=False``: on CUDA a copy and a stream sync). Counted as ``tests/helpers/host_reads.py`` counts
  them (``LoopHostReads``); ``loop`` has every figure with where each read and upload was made.
- ``ops_per_step``: aten ops that are not views, dispatched per steady loop step (a proxy for the kernels an
  eager step launches), and ``layer_ops_per_step``, those inside the decoder layers.
- ``kernels``: the kernels of the compiled L=0 step (``compile=True``, inductor): the calls of the compiled
  decoder layer's generated code (fused C++ kernels, extern kernels such as the matrix products, aten ops
  called out), times the layers, plus the step's eager ops outside its layers (``kernels_per_step``).

    python benchmarks/step_cost.py --other_checkout ../legacy --out benchmarks/results/step_cost_cpu.json
    python benchmarks/step_cost.py --tiny --out /tmp/step_cost.json   # seconds: 4 layers, short runs (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(tiny: bool = False) -> dict:
    """This checkout's figures (the module docstring says what each is); ``tiny``: 4 layers, short runs."""
    sys.path[:0] = [str(ROOT / "tests")]  # the test helpers (tests/helpers/), as the tests import them
    import torch
    from helpers.host_reads import LoopHostReads
    from helpers.inputs import random_prompts
    from helpers.tiny_models import build_tiny_model

    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.continuous import engine as continuous
    from eglr_harness.decoding.contract import Request

    vocab, tau_kl = 96, 4.4e-4
    always = dict(tau_h=0.0, tau_kl=tau_kl)
    layers = 4 if tiny else 8

    def requests(seed, lengths, new, configs):
        prompts = random_prompts(seed, lengths=lengths, vocab=vocab)
        return [Request(tuple(p), configs[i % len(configs)], new[i % len(new)],
                        seed=11 + i) for i, p in enumerate(prompts)]

    first = [EglrConfig(L=2, **always), EglrConfig(L=0), EglrConfig(L=2, T=0.7, top_k=20, top_p=0.9, **always),
             EglrConfig(L=1, **always), EglrConfig(L=0, T=1.0, top_k=0)]
    pool = [EglrConfig(L=L, T=T, top_k=20, tau_h=0.5, tau_kl=tau_kl) for L in (1, 2) for T in (0.0, 0.6)]
    sequence = [(2, requests(0, (9, 3, 5, 2, 4), (3, 12, 6, 9, 10), first)),
                (3, requests(1, (30, 2, 11, 6, 17, 8), (12, 3, 20), pool)),
                (1, requests(2, (61, 8), (26, 5), [EglrConfig(L=1, **always)]))][:1 if tiny else 3]
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

    # the whole loop, eager: six requests over four slots (refills between steps)
    model = build_tiny_model("llama", vocab_size=vocab, num_layers=layers, seed=1)
    new = (6, 4, 5, 3, 6, 4) if tiny else (12, 9, 11, 7, 12, 8)
    labels = {"L0": EglrConfig(L=0), "L4_every_token_gated": EglrConfig(L=4, **always)}
    loop, ops, reads = {}, {}, {}
    for label, config in labels.items():
        batch = requests(0, (9, 5, 7, 3, 6, 4), new, [config])
        with LoopHostReads() as counter:
            continuous.ContinuousEngine(model, max_batch=4, eos_token_ids=[]).run(batch)
        loop[label] = counter.summary()
        step = loop[label]["step"]
        ops[label] = {"steps": step["iterations"], "ops_per_step": step["ops"]["mean"],
                      "layer_ops_per_step": step["layer_ops"]["mean"]}
        reads[label] = {"per_step": step["host_reads"]["mean"], "per_step_max": step["host_reads"]["max"],
                        "per_refill": loop[label]["prefill"]["host_reads"]["mean"],
                        "blocking_uploads_per_step": step["blocking_uploads"]["mean"],
                        "blocking_uploads_per_refill": loop[label]["prefill"]["blocking_uploads"]["mean"]}
    return {"compilations": compilations, "host_reads": reads, "ops_per_step": ops,
            "kernels": compiled_kernels(model, requests(0, (9, 5, 7, 3, 6, 4), new, [labels["L0"]]), ops["L0"]),
            "loop": loop, "layers": layers, "torch": torch.__version__}


def compiled_kernels(model, batch, eager: dict) -> dict:
    """Kernels of the compiled L=0 step on this CPU: the decoder layer compiled by inductor (the engine's
    ``compile=True``), its generated code's calls counted (``cpp_fused_*`` kernels, ``extern_kernels`` such as the
    matrix products, aten ops called out such as attention), times the layers, plus the eager ops of the step
    outside its layers (``eager``: the loop's figures at L=0)."""
    import torch
    from torch._inductor import metrics
    from torch._inductor.codecache import PyCodeCache

    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    torch._dynamo.reset()
    metrics.reset()
    before = set(_code_files(PyCodeCache))
    engine = ContinuousEngine(model, max_batch=4, eos_token_ids=[], compile=True, compile_backend="inductor")
    engine.run(batch)
    per_call = {}
    for path in sorted(set(_code_files(PyCodeCache)) - before):
        source = Path(path).read_text()
        if "def call(" not in source:
            continue
        body = [line for line in source[source.index("def call("):].splitlines()
                if not line.lstrip().startswith(("#", "assert"))]
        calls = {kind: sum(1 for line in body if re.search(pattern, line))
                 for kind, pattern in (("cpp_fused", r"^\s+cpp_fused_\w+\("), ("extern", r"extern_kernels\.\w+\("),
                                       ("aten", r"torch\.ops\.\w+\.[\w.]+\("))}
        per_call[Path(path).name] = calls
    if len(per_call) != 1:  # one compiled graph for a Llama (one layer kind)
        return {"error": f"{len(per_call)} compiled graphs; expected one", "graphs": per_call}
    calls = next(iter(per_call.values()))
    layer_kernels = sum(calls.values())
    outside = eager["ops_per_step"] - eager["layer_ops_per_step"]
    num_layers = model.config.num_hidden_layers
    return {"kernels_per_step": num_layers * layer_kernels + outside, "kernels_per_layer_call": layer_kernels,
            "kernels_per_layer_call_by_kind": calls, "layer_calls_per_step": num_layers,
            "eager_ops_outside_layers_per_step": outside, "eager_ops_per_step": eager["ops_per_step"],
            "inductor_generated_kernel_count": metrics.generated_kernel_count,
            "compiles": engine.warmup_report()["compiles"], "late_compiles": engine.warmup_report()["late_compiles"]}


def _code_files(cache) -> list[str]:
    modules = cache.modules.values() if isinstance(cache.modules, dict) else cache.modules
    return [getattr(module, "__file__", None) for module in modules if getattr(module, "__file__", None)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other_checkout", default=None, help="repository root of another commit to measure too")
    parser.add_argument("--tiny", action="store_true", help="4 layers and short runs: seconds (what CI runs)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # internal: one checkout per process
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.tiny)))
        return
    results = {}
    for label, root in (("this", ROOT), ("other", args.other_checkout)):
        if root is None:
            continue
        env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        out = subprocess.run([sys.executable, __file__, "--measure", *(["--tiny"] if args.tiny else [])], cwd=root,
                             env=env, capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"step_cost.py: measuring {label} ({root}) failed:\n{out.stderr[-4000:]}")
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        results[label]["commit"] = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True).stdout.strip()
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "loop"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
