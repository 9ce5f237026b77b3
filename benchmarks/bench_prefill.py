"""A pool prefills each prompt once (issue 56, item 5): SmolLM2-135M on CPU, a 10-cell pool on 8-shot GSM8K prompts.

Each problem is decoded by the paper's EGLR-SC_L pool, the ten greedy cells L = 1..10 (one row each), through
the continuous engine in one run, twice per repeat in one process on the same requests: ``before`` with
``share_prompts=False`` (every row prefills its own prompt: the engine before issue 56) and ``after`` with
``share_prompts=True`` (each prompt prefilled once, its K/V and prompt state copied to its other rows). The two
alternate (before, after, before, after, ...); the best run of each counts. Reported per mode: the engine's
``prefill_report()`` for the run (prompt tokens needed, tokens prefill forwards ran, seconds in prefills, the
copies' seconds), prompt tokens served per prefill second, the run's wall time and generated tokens per
second; and whether the two modes decoded the same tokens (they must).

Prompts: lm-eval's ``gsm8k`` few-shot format ("Question: ...\\nAnswer: <worked answer>" shots, "\\n\\n"
between, the problem last: about 1,600 tokens with 8 shots and SmolLM2's tokenizer), no chat template.
``$EGLR_DATA_DIR/gsm8k`` holds the test split only (no train split to draw shots from), so the first ``--shots``
test problems are the shots and the problems decoded are the ones after them.

    OMP_NUM_THREADS=1 python benchmarks/bench_prefill.py --problems 2 --max_new_tokens 24 \\
        --out benchmarks/results/smollm2_cpu_pool_prefill.json
    python benchmarks/bench_prefill.py --tiny --out /tmp/prefill.json   # seconds: a tiny random model (CI)

``--tiny``: a tiny random Llama (10 layers: the pool's L = 1..10 fit) with SmolLM2's tokenizer instead of SmolLM2,
and ``TINY``'s settings for the flags left at their defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STOP = ("Question:", "</s>", "<|im_end|>")  # lm-eval gsm8k's `until`


TINY = {"problems": 1, "shots": 1, "max_new_tokens": 3}


def gsm8k_problems(n: int) -> list[dict]:
    data = Path(os.environ.get("EGLR_DATA_DIR", ROOT.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"
    return [json.loads(line) for line in data.read_text().splitlines()[:n]]


def few_shot_prompt(shots: list[dict], problem: dict) -> str:
    """lm-eval gsm8k's prompt: each shot "Question: q\\nAnswer: a", then the problem's "Question: q\\nAnswer:"."""
    turns = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
    return "\n\n".join([*turns, f"Question: {problem['question']}\nAnswer:"])


def tiny_defaults(args, parser, tiny: dict) -> None:
    """``--tiny``'s settings (``tiny``: argument name -> value) for the arguments left at their defaults: what a user
    gives on the command line wins."""
    for name, value in tiny.items():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, value)


def bench_model(tiny: bool):
    """(model, tokenizer) a benchmark of this folder runs: with ``tiny``, a random 10-layer Llama on SmolLM2's
    tokenizer (the test helpers'); else SmolLM2-135M-Instruct in fp32 (``load_smollm2``)."""
    if not tiny:
        return load_smollm2()
    sys.path.insert(0, str(ROOT / "tests"))  # the test helpers' tiny models
    from helpers.tiny_models import build_tiny_model, smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    model = build_tiny_model("llama", vocab_size=len(tokenizer), num_layers=10, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id)
    return model, tokenizer


def load_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eglr_harness.run.presets import load_preset

    args = load_preset("smollm2-135m-instruct")["model_args"]
    tokenizer = AutoTokenizer.from_pretrained(args["pretrained"], gguf_file=args["gguf_file"])
    model = AutoModelForCausalLM.from_pretrained(args["pretrained"], gguf_file=args["gguf_file"], dtype="float32")
    return model.eval(), tokenizer


def pool_requests(prompts: list[tuple[int, ...]], max_new_tokens: int, tau_h: float) -> list:
    """EGLR-SC_L: the cells L = 1..10 (greedy, the preset's alpha, k_max, tau_kl) on every prompt."""
    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.contract import Request

    cells = [EglrConfig(L=L, alpha=0.2, k_max=3, tau_kl=5e-4, tau_h=tau_h) for L in range(1, 11)]
    return [Request(prompt, cell, max_new_tokens, stop_strings=STOP) for prompt in prompts for cell in cells]


def timed_run(engine, requests) -> tuple[dict, list]:
    before = engine.prefill_report()
    started = time.perf_counter()
    outcomes = engine.run(requests)
    wall = time.perf_counter() - started
    after = engine.prefill_report()
    report = {key: after[key] - before[key] for key in after}
    tokens = sum(len(o.tokens) for o in outcomes)
    report.update(wall_s=wall, new_tokens=tokens, tokens_per_s=tokens / wall,
                  prompt_tokens_per_prefill_s=report["prompt_tokens"] / report["seconds"],
                  prefilled_tokens_per_s=report["prefilled_tokens"] / report["seconds"],
                  prefill_share_of_wall=report["seconds"] / wall)
    return report, [o.tokens for o in outcomes]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=3, help="problems decoded (after the shots)")
    parser.add_argument("--shots", type=int, default=8)
    parser.add_argument("--max_new_tokens", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=10, help="the engine's max_batch")
    parser.add_argument("--tau_h", type=float, default=2.5, help="the preset's gsm8k tau_h")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per mode (alternating; the best counts)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and TINY's settings: seconds (CI)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.tiny:
        tiny_defaults(args, parser, TINY)

    import torch

    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    model, tokenizer = bench_model(args.tiny)
    data = gsm8k_problems(args.shots + args.problems)
    shots, problems = data[:args.shots], data[args.shots:]
    prompts = [tuple(tokenizer(few_shot_prompt(shots, p), add_special_tokens=False)["input_ids"]) for p in problems]
    requests = pool_requests(prompts, args.max_new_tokens, args.tau_h)
    engines = {mode: ContinuousEngine(model, max_batch=args.batch_size, eos_token_ids=[tokenizer.eos_token_id],
                                      tokenizer=tokenizer, share_prompts=mode == "after")
               for mode in ("before", "after")}
    # warm-up, untimed: one short row per engine (allocator, first-call costs)
    for engine in engines.values():
        engine.run(pool_requests(prompts[:1], 2, args.tau_h)[:1])
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    tokens: dict[str, list] = {}
    for repeat in range(args.repeats):
        for mode, engine in engines.items():
            report, tokens[mode] = timed_run(engine, requests)
            runs[mode].append(report)
            print(f"repeat {repeat} {mode}: prefill {report['seconds']:.1f} s for {report['prefilled_tokens']:,} of "
                  f"{report['prompt_tokens']:,} prompt tokens; wall {report['wall_s']:.1f} s, "
                  f"{report['tokens_per_s']:.2f} new tokens/s", flush=True)
    best = {mode: min(reports, key=lambda r: r["wall_s"]) for mode, reports in runs.items()}
    summary = {
        "same_tokens": tokens["before"] == tokens["after"],
        "prompt_tokens": [len(p) for p in prompts],
        "prefill_speedup": best["before"]["seconds"] / best["after"]["seconds"],
        "wall_speedup": best["before"]["wall_s"] / best["after"]["wall_s"],
        "throughput_ratio": best["after"]["tokens_per_s"] / best["before"]["tokens_per_s"],
        "copy_seconds_after": best["after"]["copy_seconds"],
    }
    for key, value in summary.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    if args.out:
        load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        command = ("OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "") + " python benchmarks/bench_prefill.py "
                   + " ".join(argv if argv is not None else sys.argv[1:]))
        machine = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "loadavg_at_end": load,
                   "python": platform.python_version(), "torch": torch.__version__, "commit": commit}
        Path(args.out).write_text(json.dumps({"command": command, "settings": vars(args), "machine": machine,
                                              "summary": summary, "best": best, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
