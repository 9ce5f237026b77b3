"""EGLR inside vLLM (eglr_harness/vllm) against stock vLLM and the project's continuous engine, on the
same prompts in one process: tokens/s of each and the L10/L0 cost ratio (paper bound ~1.05 per row).

Modes, in this order: `stock` = stock vLLM greedy (the checkpoint's own architecture); `vplain` = the
EGLR architecture with requests that carry no EGLR settings (stock's forward); `vL0`, `vL10` =
eglr-vllm's engine (``VllmEngine``: the EGLR architecture, settings and signals per request) at L=0 and
L=10; `cL0`, `cL10` = the continuous engine (``ContinuousEngine``, eager) over the transformers model of
the same folder. tau_h of the L10 modes: ``--tau_h``, else the 95th percentile of vL0's entropies capped
at 2.5 nats (eglr-method.md §3). Each mode decodes all prompts in one call, ``--repeats`` times; the best
wall counts. vLLM runs its engine core and workers as it defaults them (V1 multiprocessing);
``--tensor_parallel_size`` sets its workers for stock and EGLR alike. Needs vLLM (docs/vllm.md) and a
safetensors folder (eglr_harness.vllm.convert_gguf).

    VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 python benchmarks/vllm_cpu.py --model DIR --prompts 16 \\
        --max_gen_toks 64 --out benchmarks/results/vllm_cpu_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a safetensors folder (fp32)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max_gen_toks", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tau_h", type=float, default=None)
    parser.add_argument("--tensor_parallel_size", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

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

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = _prompts(args.prompts, tokenizer)
    architecture = AutoConfig.from_pretrained(args.model).architectures[0]
    engine_args = dict(model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
                       tensor_parallel_size=args.tensor_parallel_size)
    modes: dict[str, dict] = {}

    def record(mode, wall, token_lists, **extra):
        tokens = sum(len(t) for t in token_lists)
        modes[mode] = {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 2), **extra}
        print(mode, modes[mode], flush=True)

    stock = LLM(**engine_args)
    params = SamplingParams(temperature=0, max_tokens=args.max_gen_toks)
    wall, outs = _timed(lambda: stock.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                               use_tqdm=False), args.repeats)
    stock_tokens = [list(o.outputs[0].token_ids) for o in outs]
    record("stock", wall, stock_tokens)
    stock.llm_engine.engine_core.shutdown()
    del stock

    eglr_llm = LLM(**engine_args, **eglr_engine_args(architecture))
    engine = VllmEngine(eglr_llm)
    wall, outs = _timed(lambda: eglr_llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                                  use_tqdm=False), args.repeats)
    record("vplain", wall, [list(o.outputs[0].token_ids) for o in outs])

    def requests(L, tau_h):
        return [Request(tuple(p), EglrConfig(L=L, tau_h=tau_h), args.max_gen_toks) for p in prompts]

    wall, v0 = _timed(lambda: engine.run(requests(0, float("inf"))), args.repeats)
    record("vL0", wall, [o.tokens for o in v0], equal_to_stock=sum(o.tokens == s for o, s in zip(v0, stock_tokens)))
    entropies = sorted(e for o in v0 for e in o.entropies)
    tau_h = args.tau_h if args.tau_h is not None else min(TAU_H_CAP, entropies[int(0.95 * (len(entropies) - 1))])
    wall, v10 = _timed(lambda: engine.run(requests(10, tau_h)), args.repeats)
    gated = sum(o.gated for o in v10)
    record("vL10", wall, [o.tokens for o in v10], tau_h=tau_h, gated_tokens=gated,
           rho=round(gated / sum(len(o.tokens) for o in v10), 4))
    eglr_llm.llm_engine.engine_core.shutdown()
    del eglr_llm, engine

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    continuous = ContinuousEngine(model, max_batch=len(prompts),
                                  eos_token_ids=[eos] if isinstance(eos, int) else list(eos),
                                  tokenizer=tokenizer)
    wall, c0 = _timed(lambda: continuous.run(requests(0, float("inf"))), args.repeats)
    record("cL0", wall, [o.tokens for o in c0], equal_to_vL0=sum(a.tokens == b.tokens for a, b in zip(c0, v0)))
    wall, c10 = _timed(lambda: continuous.run(requests(10, tau_h)), args.repeats)
    record("cL10", wall, [o.tokens for o in c10], equal_to_vL10=sum(a.tokens == b.tokens for a, b in zip(c10, v10)),
           gated_tokens=sum(o.gated for o in c10))

    summary = {
        "vL10_over_vL0_wall": round(modes["vL10"]["wall_s"] / modes["vL0"]["wall_s"], 3),
        "cL10_over_cL0_wall": round(modes["cL10"]["wall_s"] / modes["cL0"]["wall_s"], 3),
        "vplain_over_stock_tokens_per_s": round(modes["vplain"]["tokens_per_s"] / modes["stock"]["tokens_per_s"], 3),
        "vL0_over_stock_tokens_per_s": round(modes["vL0"]["tokens_per_s"] / modes["stock"]["tokens_per_s"], 3),
        "vL0_over_cL0_tokens_per_s": round(modes["vL0"]["tokens_per_s"] / modes["cL0"]["tokens_per_s"], 3),
        "paper_bound_per_row": round(1 + modes["vL10"]["rho"] * 3 * 10 / model.config.num_hidden_layers, 3),
    }
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "prompts": len(prompts),
              "max_gen_toks": args.max_gen_toks, "repeats": args.repeats,
              "tensor_parallel_size": args.tensor_parallel_size,
              "summary": summary, "modes": modes,
              "versions": {"vllm": vllm_version(), "torch": torch.__version__,
                           "transformers": __import__("transformers").__version__},
              "threads": os.environ.get("OMP_NUM_THREADS")}
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
