"""EGLR inside vLLM (eglr_harness/vllm) against stock vLLM and the project's continuous engine, on the
same prompts in one process: tokens/s of each, the L10/L0 cost ratio and the L=1..10 pool's per-row cost
against the paper's bound 1 + rho x k_bar x L/N (at the measured rho and k_bar).

Modes, in this order: `stock` = stock vLLM greedy (the checkpoint's own architecture); `vplain` = the
EGLR architecture with requests that carry no EGLR settings (stock's forward); `vL0`, `vL10` =
eglr-vllm's engine (``VllmEngine``: the EGLR architecture, settings and signals per request) at L=0 and
L=10; `vpool` = the same engine with request i at L = 1 + i mod 10 (the L=1..10 pool in one engine);
`cL0`, `cL10` = the continuous engine (``ContinuousEngine``) over the transformers model of the same
folder, the reference on this machine. With ``--tp2``: `stock_tp2` and `vL10_tp2`, the same with
``tensor_parallel_size=2`` (on a CPU with one NUMA node, bind a core per worker: ``--tp2_bind '0|1'``
sets vLLM's own ``VLLM_CPU_OMP_THREADS_BIND`` for those engines). tau_h of the refining modes: ``--tau_h``, else
the 95th percentile of vL0's entropies capped at 2.5 nats (eglr-method.md §3). Each mode decodes all
prompts in one call, ``--repeats`` times, after an untimed warm-up call of each engine; the best wall
counts. The EGLR engine's four modes repeat in rounds (vplain, vL0, vL10, vpool, then again), so that a
slow spell of a shared machine falls on all of them alike.

After the EGLR modes, ``iteration_weights_ms_L10`` times, inside the worker, the dense products of one L=10
refinement iteration (the top 10 layers' projections and the LM head, each part on its own:
``iteration_weights_split_ms_L10``) on 1 to 64 rows: what an iteration of a few rows costs at least, since each
product reads all of its weights whatever the rows. From it and each refining mode's per-token k* (with each
request's own L: a pool's pass reads each layer once for the rows whose span covers it, and the head once),
``summary.vL10_dense_floor_per_row`` and ``summary.vpool_dense_floor_per_row``: the per-token cost over L=0's that
those products alone would give (each output position taken as one step), beside the paper's FLOP bound, and the
verdict on issue 58's target, each mode within 10 % of its floor (``..._within_10pct_of_floor``).

Every mode runs in one compilation mode: vLLM's default compilation of the platform (on CPU: Dynamo
traced once, Inductor; on a GPU: piecewise CUDA graphs, for stock vLLM too, since eglr-vllm refuses full
ones) and the continuous engine compiled (``compile=True``, Inductor), or, with ``--enforce_eager``, all
eager. vLLM runs its engine core and workers as it defaults them (V1 multiprocessing). Needs vLLM
(docs/vllm.md) and a safetensors folder (eglr_harness.vllm.convert_gguf) or a hub id.

    VLLM_CPU_KVCACHE_SPACE=4 OMP_NUM_THREADS=1 python benchmarks/vllm_cpu.py --model DIR --prompts 64 \\
        --max_gen_toks 256 --tp2 --tp2_bind '0|1' --out benchmarks/results/vllm_cpu_smollm2.json

The same script is ready for a GPU with vLLM's CUDA build (``pip install ".[vllm]"``; not run: the wheel cannot
reach the lent GPU machines): ``--dtype bfloat16``, the continuous engine on the GPU, the iteration probe
synchronised, ``--tp2`` on two GPUs, e.g.

    python benchmarks/vllm_cpu.py --model Qwen/Qwen2.5-3B-Instruct --dtype bfloat16 --prompts 256 \\
        --max_gen_toks 512 --tp2 --out vllm_gpu_qwen2.5-3b.json

``--tiny`` (what .ci/vllm runs, so that the script does not rot): a tiny random Llama (10 layers, head size 32 as
vLLM's CPU attention wants, SmolLM2's tokenizer) saved in a temporary folder instead of ``--model``, and ``TINY``'s
settings (2 prompts, 4 new tokens, every mode eager, the continuous engine's modes left out):

    OMP_NUM_THREADS=1 python benchmarks/vllm_cpu.py --tiny --out /tmp/vllm_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE_SPAN = 10  # the span whose iteration the probe times: L=10's, and one layer's share prices any span
TINY = {"prompts": 2, "max_gen_toks": 4, "enforce_eager": True, "no_continuous": True, "max_model_len": 512}


def _prompts(n: int, tokenizer) -> list[list[int]]:
    data = Path(os.environ.get("EGLR_DATA_DIR", ROOT.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"
    questions = [json.loads(line)["question"] for line in data.read_text().splitlines()[:n]]
    suffix = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q + suffix}], tokenize=False,
                                           add_generation_prompt=True) for q in questions]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def _timed(fn, repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _bound(outcomes, spans, num_layers: int) -> dict:
    """rho, k_bar and the paper's per-row cost bound 1 + rho x k_bar x L/N of one mode's outcomes (request i at
    L = spans[i]): the sum over gated tokens of k* x L, over N x all tokens."""
    tokens = sum(len(o.tokens) for o in outcomes)
    gated = sum(o.gated for o in outcomes)
    iterations = sum(k * n for o in outcomes for k, n in o.iterations.items())
    layer_iterations = sum(k * n * L for o, L in zip(outcomes, spans) for k, n in o.iterations.items())
    return {"rho": round(gated / tokens, 4), "k_bar": round(iterations / gated, 3) if gated else 0.0,
            "paper_bound_per_row": round(1 + layer_iterations / (num_layers * tokens), 4)}


def _iteration_weights_ms(span: int, rows_list=(1, 4, 8, 16, 64), repeats: int = 5):
    """A function for ``LLM.collective_rpc``: per row count A, the milliseconds (best of ``repeats``) of the dense
    products of one refinement iteration of span ``span`` on A rows inside the worker, in two parts: ``layers``, the
    top ``span`` layers' four projections, and ``head``, the LM head. Each product reads all of its weights whatever A
    (no attention: that reads each row's own past). What a few rows' iteration costs at least, against A/R of a
    step's normal pass; ``layers / span`` is one layer's share (the layers of a family have one shape), from which
    an iteration of any span, or a pool's pass (``_dense_floor_s``), is priced."""
    def probe(worker):
        import time

        import torch

        model = worker.model_runner.model
        layers = model.model.layers[len(model.model.layers) - span:]
        hidden = model.model.norm.weight.shape[0]
        device, dtype = model.model.norm.weight.device, model.model.norm.weight.dtype
        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def best_ms(products) -> float:
            best = float("inf")
            for _ in range(repeats):
                synchronize()
                start = time.perf_counter()
                products()
                synchronize()
                best = min(best, time.perf_counter() - start)
            return round(best * 1e3, 3)

        result = {}
        for rows in rows_list:
            def inputs(projection):  # (rows, the projection's input width on this rank)
                return torch.randn(rows, projection.input_size_per_partition, dtype=dtype, device=device)

            x = torch.randn(rows, hidden, dtype=dtype, device=device)
            attention_out, mlp_in = inputs(layers[0].self_attn.o_proj), inputs(layers[0].mlp.down_proj)

            def layer_products():
                for layer in layers:
                    layer.self_attn.qkv_proj(x)
                    layer.self_attn.o_proj(attention_out)
                    layer.mlp.gate_up_proj(x)
                    layer.mlp.down_proj(mlp_in)

            result[rows] = {"layers": best_ms(layer_products), "head": best_ms(lambda: model.compute_logits(x))}
        return result

    return probe


def _interpolated_ms(table: dict, rows: int) -> float:
    """Milliseconds of ``rows`` rows from a probe's {row count: ms}: linear between its row counts, per row beyond its
    last one."""
    table = {int(count): ms for count, ms in table.items()}
    sizes = sorted(table)
    for low, high in zip(sizes, sizes[1:]):
        if rows <= high:
            share = (rows - low) / (high - low) if rows > low else 0.0
            return table[low] + share * (table[high] - table[low])
    return table[sizes[-1]] * rows / sizes[-1]


def _dense_floor_s(outcomes, spans, layer_ms: dict, head_ms: dict) -> float:
    """Seconds an EGLR mode's refinement spends at least in dense products: per output position (all requests start
    together, so a position is about one step), per iteration k, one pass over the rows whose k* at that position
    reaches k, as ``_refine`` runs it (models.py: every span in one pass, each row joining at its own layer N-L):
    the layer at depth d (N-d) runs the rows whose span L >= d, each layer reading its weights once for them, and
    the LM head reads its weights once for them all (every row's rule here is kl, which projects the head at every
    iteration). outcomes[i] decoded at span ``spans[i]``; layer_ms: {rows: ms of one layer's four projections},
    head_ms: {rows: ms of the head} (the probe, ``_iteration_weights_ms``). Attention, the norms, the log-softmax
    and all host work come on top."""
    total_ms = 0.0
    for position in range(max(len(o.token_iterations) for o in outcomes)):
        reached = [(o.token_iterations[position], span) for o, span in zip(outcomes, spans)
                   if position < len(o.token_iterations)]
        for k in range(1, max(k_star for k_star, _ in reached) + 1):
            active = [span for k_star, span in reached if k_star >= k]  # the rows of iteration k's pass
            total_ms += _interpolated_ms(head_ms, len(active))
            total_ms += sum(_interpolated_ms(layer_ms, sum(span >= depth for span in active))
                            for depth in range(1, max(active) + 1))
    return total_ms / 1e3


def _floor_verdict(cost: float, floor: float, margin: float = 0.10) -> str:
    """'met' when a per-token cost is within ``margin`` of its dense-product floor (both over L=0's), else 'not met'."""
    return "met" if cost <= floor * (1 + margin) else "not met"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a safetensors folder (fp32); required without --tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max_gen_toks", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tau_h", type=float, default=None)
    parser.add_argument("--tensor_parallel_size", type=int, default=1)
    parser.add_argument("--tp2", action="store_true", help="also stock and L=10 with tensor_parallel_size=2")
    parser.add_argument("--tp2_bind", default=None,
                        help="VLLM_CPU_OMP_THREADS_BIND for the TP=2 engines only, e.g. '0|1' (one NUMA node)")
    parser.add_argument("--enforce_eager", action="store_true", help="every mode eager (default: every mode compiled)")
    parser.add_argument("--no_continuous", action="store_true", help="skip the continuous engine's modes")
    parser.add_argument("--max_model_len", type=int, default=2048)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="of every engine (default float32: exact comparisons on CPU; bfloat16 on a GPU)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and TINY's settings (CI)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.tiny == (args.model is not None):
        parser.error(f"--model={args.model!r} with --tiny={args.tiny}; allowed: --model DIR, or --tiny alone")
    if args.tiny:
        import tempfile

        for name, value in TINY.items():
            setattr(args, name, value)
        sys.path.insert(0, str(ROOT / "tests"))  # the test helpers' tiny models
        from helpers.tiny_models import save_tiny_model, smollm2_tokenizer

        folder = tempfile.TemporaryDirectory(prefix="vllm_cpu_tiny_")
        args.model = str(save_tiny_model(folder.name, smollm2_tokenizer(), num_layers=10, hidden_size=128,
                                         intermediate_size=256))

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from eglr_harness.core.config import TAU_H_CAP, EglrConfig
    from eglr_harness.decoding.continuous.engine import ContinuousEngine
    from eglr_harness.decoding.contract import Request
    from eglr_harness.vllm import engine_args as eglr_engine_args
    from eglr_harness.vllm.distribution import vllm_version
    from eglr_harness.vllm.engine import VllmEngine

    # the iteration probe is a function sent to vLLM's worker process (pickled: a local benchmark, not a server)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = _prompts(args.prompts, tokenizer)
    config = AutoConfig.from_pretrained(args.model)
    architecture, num_layers = config.architectures[0], config.num_hidden_layers
    if args.tp2 and config.num_attention_heads % 2:  # found before the first engine starts, not after the others ran
        parser.error(f"--tp2: {args.model} has {config.num_attention_heads} attention heads; allowed: a model whose "
                     "attention heads divide by 2 (vLLM splits them across the two ranks)")
    pool_spans = [1 + i % 10 for i in range(len(prompts))]
    served = sorted({10, *pool_spans})
    # eglr-vllm's engines ask for piecewise CUDA graphs (engine_args); stock vLLM gets the same, so that every mode
    # runs in one compilation mode (a platform without graphs, the CPU, ignores it)
    base_args = dict(model=args.model, dtype=args.dtype, enforce_eager=args.enforce_eager,
                     max_model_len=args.max_model_len, seed=0,
                     compilation_config=eglr_engine_args(architecture)["compilation_config"])
    modes: dict[str, dict] = {}
    params = SamplingParams(temperature=0, max_tokens=args.max_gen_toks)

    def record(mode, wall, token_lists, **extra):
        tokens = sum(len(t) for t in token_lists)
        modes[mode] = {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 2), **extra}
        print(mode, modes[mode], flush=True)

    def requests(spans, tau_h):
        return [Request(tuple(p), EglrConfig(L=L, tau_h=tau_h), args.max_gen_toks) for p, L in zip(prompts, spans)]

    def warm_up(llm, eglr: bool) -> None:
        """One short untimed call of each kind the timed modes make (the first steps of an engine pay one-off
        costs: lazy initialisation, compiled shapes)."""
        few = SamplingParams(temperature=0, max_tokens=4)
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:2]], few, use_tqdm=False)
        if eglr:
            VllmEngine(llm).run([Request(tuple(p), EglrConfig(L=L, tau_h=0.0), 4)
                                 for p in prompts[:2] for L in (0, 10)])

    def stock_run(tp: int, name: str) -> list[list[int]]:
        stock = LLM(**base_args, tensor_parallel_size=tp)
        warm_up(stock, eglr=False)
        wall, outs = _timed(lambda: stock.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                                   use_tqdm=False), args.repeats)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        record(name, wall, tokens)
        stock.llm_engine.engine_core.shutdown()
        return tokens

    stock_tokens = stock_run(args.tensor_parallel_size, "stock")
    eglr_llm = LLM(**{**base_args, **eglr_engine_args(architecture, spans=served)},
                   tensor_parallel_size=args.tensor_parallel_size)
    engine = VllmEngine(eglr_llm)
    warm_up(eglr_llm, eglr=True)
    # the EGLR engine's four modes in rounds: each repeat runs every mode once, in turn, so that a slow spell of a
    # shared machine falls on all of them alike, not on one mode's back-to-back repeats; the best wall of each counts
    walls: dict[str, float] = {}

    def timed_once(mode: str, fn):
        start = time.perf_counter()
        result = fn()
        walls[mode] = min(walls.get(mode, float("inf")), time.perf_counter() - start)
        return result

    tau_h = args.tau_h
    for _ in range(args.repeats):
        outs = timed_once("vplain", lambda: eglr_llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                                               params, use_tqdm=False))
        v0 = timed_once("vL0", lambda: engine.run(requests([0] * len(prompts), float("inf"))))
        if tau_h is None:  # from L=0's entropies (the same in every round: greedy)
            entropies = sorted(e for o in v0 for e in o.entropies)
            tau_h = min(TAU_H_CAP, entropies[int(0.95 * (len(entropies) - 1))])
        v10 = timed_once("vL10", lambda: engine.run(requests([10] * len(prompts), tau_h)))
        pool = timed_once("vpool", lambda: engine.run(requests(pool_spans, tau_h)))
    record("vplain", walls["vplain"], [list(o.outputs[0].token_ids) for o in outs])
    record("vL0", walls["vL0"], [o.tokens for o in v0],
           equal_to_stock=sum(o.tokens == s for o, s in zip(v0, stock_tokens)))
    record("vL10", walls["vL10"], [o.tokens for o in v10], tau_h=tau_h, gated_tokens=sum(o.gated for o in v10),
           **_bound(v10, [10] * len(prompts), num_layers))
    record("vpool", walls["vpool"], [o.tokens for o in pool], tau_h=tau_h, spans="1 + i mod 10",
           gated_tokens=sum(o.gated for o in pool), **_bound(pool, pool_spans, num_layers))
    probe = eglr_llm.collective_rpc(_iteration_weights_ms(PROBE_SPAN))[0]  # rank 0's
    print(f"iteration_weights_ms (L={PROBE_SPAN})", probe, flush=True)
    eglr_llm.llm_engine.engine_core.shutdown()
    del eglr_llm, engine

    if args.tp2:
        if args.tp2_bind:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.tp2_bind  # read by the workers vLLM starts next
        stock_run(2, "stock_tp2")
        tp2 = LLM(**{**base_args, **eglr_engine_args(architecture, spans=[10])}, tensor_parallel_size=2)
        warm_up(tp2, eglr=True)
        wall, v10_tp2 = _timed(lambda: VllmEngine(tp2).run(requests([10] * len(prompts), tau_h)), args.repeats)
        record("vL10_tp2", wall, [o.tokens for o in v10_tp2],
               equal_to_vL10=sum(a.tokens == b.tokens for a, b in zip(v10_tp2, v10)),
               equal_k_star_to_vL10=sum(a.token_iterations == b.token_iterations for a, b in zip(v10_tp2, v10)))
        tp2.llm_engine.engine_core.shutdown()
        del tp2

    if not args.no_continuous:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(device).eval()
        eos = model.generation_config.eos_token_id
        continuous = ContinuousEngine(model, max_batch=len(prompts),
                                      eos_token_ids=[eos] if isinstance(eos, int) else list(eos),
                                      tokenizer=tokenizer, compile=not args.enforce_eager)
        wall, c0 = _timed(lambda: continuous.run(requests([0] * len(prompts), float("inf"))), args.repeats)
        record("cL0", wall, [o.tokens for o in c0], equal_to_vL0=sum(a.tokens == b.tokens for a, b in zip(c0, v0)))
        wall, c10 = _timed(lambda: continuous.run(requests([10] * len(prompts), tau_h)), args.repeats)
        record("cL10", wall, [o.tokens for o in c10],
               equal_to_vL10=sum(a.tokens == b.tokens for a, b in zip(c10, v10)),
               gated_tokens=sum(o.gated for o in c10))

    def ratio(a: str, b: str, field: str = "tokens_per_s"):
        return round(modes[a][field] / modes[b][field], 3) if a in modes and b in modes else None

    layer_ms = {rows: parts["layers"] / PROBE_SPAN for rows, parts in probe.items()}
    head_ms = {rows: parts["head"] for rows, parts in probe.items()}

    def cost_per_token(mode: str) -> float:
        """A mode's wall per token over L=0's (refined texts are longer: this is the per-row figure)."""
        return modes[mode]["wall_s"] / modes[mode]["tokens"] / (modes["vL0"]["wall_s"] / modes["vL0"]["tokens"])

    def floor_figures(mode: str, outcomes, spans) -> dict:
        """The mode's dense-product floor (seconds, and per token over L=0's: L=0's wall per token times the mode's
        tokens, plus the floor), its cost over that floor, and the verdict on the target (within 10 %)."""
        floor_s = _dense_floor_s(outcomes, spans, layer_ms, head_ms)
        floor = 1 + floor_s / (modes["vL0"]["wall_s"] / modes["vL0"]["tokens"] * modes[mode]["tokens"])
        cost = cost_per_token(mode)
        return {f"{mode}_cost_per_token": round(cost, 4), f"{mode}_dense_floor_s": round(floor_s, 2),
                f"{mode}_dense_floor_per_row": round(floor, 4), f"{mode}_cost_over_floor": round(cost / floor, 4),
                f"{mode}_within_10pct_of_floor": _floor_verdict(cost, floor)}

    summary = {
        "vL10_over_vL0_wall": ratio("vL10", "vL0", "wall_s"),
        "vL10_paper_bound_per_row": modes["vL10"]["paper_bound_per_row"],
        "vpool_over_vL0_wall": ratio("vpool", "vL0", "wall_s"),
        "vpool_paper_bound_per_row": modes["vpool"]["paper_bound_per_row"],
        **floor_figures("vL10", v10, [10] * len(prompts)),
        **floor_figures("vpool", pool, pool_spans),
        "vpool_cost_over_bound": round(modes["vpool"]["wall_s"] / modes["vL0"]["wall_s"]
                                       / modes["vpool"]["paper_bound_per_row"], 3),
        "cL10_over_cL0_wall": ratio("cL10", "cL0", "wall_s"),
        "vplain_over_stock_tokens_per_s": ratio("vplain", "stock"),
        "vL0_over_stock_tokens_per_s": ratio("vL0", "stock"),
        "vL0_over_cL0_tokens_per_s": ratio("vL0", "cL0"),
        "stock_tp2_over_stock_tokens_per_s": ratio("stock_tp2", "stock"),
        "vL10_tp2_over_vL10_tokens_per_s": ratio("vL10_tp2", "vL10"),
    }
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "prompts": len(prompts),
              "max_gen_toks": args.max_gen_toks, "repeats": args.repeats,
              "tensor_parallel_size": args.tensor_parallel_size, "dtype": args.dtype,
              "compilation": "eager" if args.enforce_eager else "default (vLLM: the platform's; continuous: inductor)",
              "num_layers": num_layers, "summary": summary, "modes": modes,
              # the whole iteration (as before the split) and its two parts
              f"iteration_weights_ms_L{PROBE_SPAN}": {str(rows): round(parts["layers"] + parts["head"], 3)
                                                      for rows, parts in probe.items()},
              f"iteration_weights_split_ms_L{PROBE_SPAN}": {str(rows): parts for rows, parts in probe.items()},
              "versions": {"vllm": vllm_version(), "torch": torch.__version__,
                           "transformers": __import__("transformers").__version__},
              "threads": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
