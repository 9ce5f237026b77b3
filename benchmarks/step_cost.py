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
  prefill forward, the first settle); the deferred reads of a step (``deferred_per_step``: a read of the step
  before's result, copied without blocking and read after this step was launched, the engine's overlapped reads
  at L=0) and the drains (``drains``: a step's deferred read with no step to launch, at the end of the run); the
  blocking uploads of each (host data copied to the device with ``non_blocking=False``: on CUDA a copy and a
  stream sync) and the non-blocking ones (``uploads_per_step``, ``uploads_per_refill``). Counted as
  ``tests/helpers/host_reads.py`` counts them (``LoopHostReads``); ``loop`` has every figure with where each
  read and upload was made.
- ``ops_per_step``: aten ops that are not views, dispatched per steady loop step (a proxy for the kernels an
  eager step launches), and ``layer_ops_per_step``, those inside the decoder layers.
- ``kernels``: the kernels of the compiled L=0 step (``compile=True``, inductor): the calls of each compiled
  region's generated code (the decoder layer with its rotary angles, the unembedding: fused C++ kernels, extern
  kernels such as the matrix products, aten ops called out), times its calls per step, plus the ops the step
  runs outside its regions (``kernels_per_step``), and the seconds the compilation took (``compile_seconds``:
  each checkout is measured with inductor's caches empty, a fresh ``TORCHINDUCTOR_CACHE_DIR``, unless set).

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
import tempfile
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
        refill = loop[label]["prefill"]
        reads[label] = {"per_step": step["host_reads"]["mean"], "per_step_max": step["host_reads"]["max"],
                        "deferred_per_step": step["deferred_reads"]["mean"],
                        "deferred_per_step_max": step["deferred_reads"]["max"],
                        "per_refill": refill["host_reads"]["mean"],
                        "drains": loop[label].get("drain", {}).get("iterations", 0),
                        "blocking_uploads_per_step": step["blocking_uploads"]["mean"],
                        "blocking_uploads_per_refill": refill["blocking_uploads"]["mean"],
                        "uploads_per_step": step["async_uploads"]["mean"],
                        "uploads_per_refill": refill["async_uploads"]["mean"]}
    return {"compilations": compilations, "host_reads": reads, "ops_per_step": ops,
            "kernels": compiled_kernels(model, requests(0, (9, 5, 7, 3, 6, 4), new, [labels["L0"]]), ops["L0"]),
            "loop": loop, "layers": layers, "torch": torch.__version__}


def compiled_kernels(model, batch, eager: dict) -> dict:
    """Kernels of the compiled L=0 step on this CPU (``compile=True``, inductor): each compiled region's generated
    code (``step_graphs.CompiledRegion``: the decoder layer with its rotary angles, the unembedding), its calls
    counted (``cpp_fused_*`` kernels, ``extern_kernels`` such as the matrix products, aten ops called out such as
    attention), times the region's calls per step, plus the ops the step runs outside its regions (per steady
    step, views aside: ``tests/helpers/region_ops.py``; the loop's own ops around the step, which the eager
    figures count, are left out). ``eager``: the loop's figures at L=0, for the ops of
    the eager step beside them. ``compile_seconds``: the warm-up's compilation seconds (``main`` runs each
    checkout with inductor's caches empty: a cold compilation)."""
    import torch
    from helpers.region_ops import RegionOps
    from torch._inductor.codecache import PyCodeCache

    from eglr_harness.decoding.continuous import step_graphs
    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    if not hasattr(step_graphs, "CompiledRegion"):  # another checkout, from before the compiled regions
        return {"error": "this checkout's step compiles its decoder layer alone (no step_graphs.CompiledRegion): "
                         "its kernels are counted by its own benchmarks/step_cost.py"}
    torch._dynamo.reset()
    before = set(_code_files(PyCodeCache))
    engine = ContinuousEngine(model, max_batch=4, eos_token_ids=[], compile=True, compile_backend="inductor")
    engine.run(batch)
    report = engine.warmup_report()
    per_region = {}
    for path in sorted(set(_code_files(PyCodeCache)) - before):
        source = Path(path).read_text()
        if "def call(" not in source:
            continue
        body = [line for line in source[source.index("def call("):].splitlines()
                if not line.lstrip().startswith(("#", "assert"))]
        calls = {kind: sum(1 for line in body if re.search(pattern, line))
                 for kind, pattern in (("cpp_fused", r"^\s+cpp_fused_\w+\("), ("extern", r"extern_kernels\.\w+\("),
                                       ("aten", r"torch\.ops\.\w+\.[\w.]+\("))}
        region = "decoder layer" if "scaled_dot_product" in source else "unembedding"
        if region in per_region:  # one compiled graph per region for a Llama (one layer kind)
            return {"error": f"more than one compiled graph of the {region}", "graphs": per_region}
        per_region[region] = calls
    with RegionOps() as counter:  # the same step, its regions run eagerly: the ops outside them
        ContinuousEngine(model, max_batch=4, eos_token_ids=[], compile=True, compile_backend="inductor").run(batch)
    outside, region_calls = counter.per_steady_step()
    kernels = sum(region_calls[region] * sum(calls.values()) for region, calls in per_region.items()) + outside
    layer = per_region.get("decoder layer", {})
    return {"kernels_per_step": kernels, "kernels_per_layer_call": sum(layer.values()),
            "kernels_per_layer_call_by_kind": layer, "layer_calls_per_step": region_calls.get("decoder layer", 0),
            "kernels_per_region_call": {region: sum(calls.values()) for region, calls in per_region.items()},
            "region_calls_per_step": region_calls, "ops_outside_regions_per_step": outside,
            "eager_ops_per_step": eager["ops_per_step"],
            "eager_ops_outside_layers_per_step": eager["ops_per_step"] - eager["layer_ops_per_step"],
            "compiles": report["compiles"], "compile_seconds": round(report["compile_seconds"], 1),
            "late_compiles": report["late_compiles"]}


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
        with tempfile.TemporaryDirectory(prefix="step_cost_inductor_") as cache:
            # inductor's caches empty, so that compile_seconds is a cold compilation's (unless the caller chose one)
            env.setdefault("TORCHINDUCTOR_CACHE_DIR", cache)
            out = subprocess.run([sys.executable, __file__, "--measure", *(["--tiny"] if args.tiny else [])],
                                 cwd=root, env=env, capture_output=True, text=True)
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
