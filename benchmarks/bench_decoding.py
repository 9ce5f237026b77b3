"""EGLR decoding benchmarks on SmolLM2-135M (CPU or GPU), reported as ratios measured in one run.

Modes: `hf` = lm-eval's HFLM; `L0`, `L10` = eglr-hf (engine=hook) at L=0 / L=10; `cL0`, `cL10` =
eglr-hf with engine=continuous (refinement folded into the batch, continuous batching); `oL0`,
`oL10` = the same with the eglr_harness of another checkout (``--other_checkout``, e.g. a git
worktree of an earlier commit), to time an engine against its earlier self in one run (the JSON
records its commit, not its path); `pL0`, `pL10` = the continuous engine with
``repetition_penalty=1.05`` (what Qwen2.5-Instruct's generation config asks for): the processors' cost.

1. eglr-hf at L=0 vs lm-eval's `hf` (greedy): throughput ratio, per engine (targets: >= 1.0 for
   engine=hook, >= 1.3 for engine=continuous).
2. eglr-hf at L=10 with a calibrated tau_h vs L=0, per engine: wall-time ratio, set against the
   per-row bound 1 + rho*k*L/N and the batched bound 1 + P(any row gated)*k*L/N (target <= 1.15).
   Each mode is timed `--repeats` times in one warm process; the best run counts.
3. Peak memory (max RSS of a process running one mode; CUDA peak allocated on GPU).

Each mode runs in its own subprocess (so peak memory is its own) on the same prompts: the first
`--prompts` GSM8K questions of $EGLR_DATA_DIR (default ../shared/data) with SmolLM2's chat template.

    python benchmarks/bench_decoding.py --prompts 16 --max_gen_toks 128 --out benchmarks/results.json
    python benchmarks/bench_decoding.py --modes cL0,cL10,L0,L10 --prompts 32 --batch_size 32 --tau_h 2.5 ...
    python benchmarks/bench_decoding.py --tiny --out /tmp/bench.json   # seconds: a tiny random model (CI)

``--tiny``: a tiny random Llama (10 layers) with SmolLM2's tokenizer instead of SmolLM2, and ``TINY``'s settings
for the flags left at their defaults; ``--model``: any HF folder instead of SmolLM2's GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = {"hf": None, "L0": ("hook", 0), "L10": ("hook", 10), "cL0": ("continuous", 0), "cL10": ("continuous", 10),
         "oL0": ("continuous", 0), "oL10": ("continuous", 10), "pL0": ("continuous", 0), "pL10": ("continuous", 10)}
# p* modes: the continuous engine with Qwen2.5-Instruct's generation-config penalty, as a gen kwarg
PENALTY = {"repetition_penalty": 1.05}
TINY = {"prompts": 2, "max_gen_toks": 8, "batch_size": 2, "repeats": 1, "modes": "hf,cL0,cL10"}


def _prompts(n: int, tokenizer) -> list[str]:
    data = Path(os.environ.get("EGLR_DATA_DIR", ROOT.parent / "shared" / "data")) / "gsm8k" / "test.jsonl"
    questions = [json.loads(line)["question"] for line in data.read_text().splitlines()[:n]]
    suffix = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    return [tokenizer.apply_chat_template([{"role": "user", "content": q + suffix}], tokenize=False,
                                          add_generation_prompt=True) for q in questions]


def run_mode(mode: str, n_prompts: int, max_gen_toks: int, batch_size: int, tau_h: float | None, device: str,
             repeats: int, model: str | None = None) -> dict:
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from eglr_harness.harness.model import EglrHFLM
    from eglr_harness.run.presets import load_preset

    if model is None:
        preset = load_preset("smollm2-135m-instruct")["model_args"]
        weights = dict(pretrained=preset["pretrained"], gguf_file=preset["gguf_file"])
    else:
        weights = dict(pretrained=model)
    common = dict(**weights, dtype="float32", device=device, batch_size=batch_size)
    if mode == "hf":
        lm = HFLM(**common)
    else:
        engine, L = MODES[mode]
        lm = EglrHFLM(**common, L=L, tau_h=tau_h if tau_h is not None else "auto", calib_limit=n_prompts,
                      engine=engine)
    prompts = _prompts(n_prompts, lm.tokenizer)
    gen = {"until": ["<|im_end|>"], "max_gen_toks": max_gen_toks, "do_sample": False,
           **(PENALTY if mode.startswith("p") else {})}
    requests = [Instance("generate_until", doc={}, arguments=(p, dict(gen)), idx=0, metadata=("bench", i, 1))
                for i, p in enumerate(prompts)]
    if MODES[mode] and MODES[mode][1] > 0 and tau_h is None:  # calibrate first, outside the timed region
        lm.calibrate(requests)
        lm.forget_rollouts()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(repeats):  # best of `repeats` warm runs; nothing is reused between them
        if mode != "hf":
            lm.forget_rollouts()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        texts = lm.generate_until(requests, disable_tqdm=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - started)
    wall = min(walls)  # the best run; the median is in the JSON too
    median = sorted(walls)[len(walls) // 2]
    tokens = sum(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    result = {"mode": mode, "wall_s": wall, "wall_s_median": median, "walls_s": walls, "tokens": tokens,
              "tokens_per_s": tokens / wall,
              "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "texts": texts}
    if device.startswith("cuda"):
        result["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    if mode != "hf":
        info = lm.get_model_info()["eglr"]
        result["eglr"] = info["stats"]["total"]
        result["tau_h"] = info["tau_h"].get("bench")
        result["num_layers"] = info["num_layers"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max_gen_toks", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tau_h", type=float, default=None, help="default: calibrated on the same prompts")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per mode (the best counts)")
    parser.add_argument("--modes", default="hf,L0,L10", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--out", default=None, help="write all figures as JSON here")
    parser.add_argument("--other_checkout", default=None, help="repository root whose eglr_harness the o* modes import")
    parser.add_argument("--model", default=None, help="a HF folder to decode with (default: SmolLM2's GGUF)")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model and TINY's settings: seconds (CI)")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # internal: one mode per process
    args = parser.parse_args(argv)
    if args.tiny:
        if args.model:
            parser.error("--tiny builds its own model; allowed: --tiny or --model, not both")
        from bench_prefill import tiny_defaults  # this folder's

        tiny_defaults(args, parser, TINY)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"--modes {unknown} not allowed; allowed: {', '.join(MODES)}")
    if any(m.startswith("o") for m in modes) and not args.other_checkout:
        parser.error("the o* modes need --other_checkout (the repository root of the other eglr_harness)")

    if args.mode:
        print(json.dumps(run_mode(args.mode, args.prompts, args.max_gen_toks, args.batch_size, args.tau_h, args.device,
                                  args.repeats, args.model)))
        return
    with tempfile.TemporaryDirectory(prefix="bench_decoding_") as folder:
        if args.tiny:
            sys.path.insert(0, str(ROOT / "tests"))  # the test helpers' tiny models
            from helpers.tiny_models import save_tiny_model, smollm2_tokenizer

            args.model = str(save_tiny_model(folder, smollm2_tokenizer(), num_layers=10))  # L=10 fits
        _run_modes(args, modes)


def _run_modes(args, modes: list[str]) -> None:

    results = {}
    for mode in modes:
        cmd = [sys.executable, __file__, "--mode", mode, "--prompts", str(args.prompts), "--max_gen_toks",
               str(args.max_gen_toks), "--batch_size", str(args.batch_size), "--device", args.device,
               "--repeats", str(args.repeats), *(["--model", args.model] if args.model else [])]
        if args.tau_h is not None:
            cmd += ["--tau_h", str(args.tau_h)]
        env = {**os.environ, "EGLR_CACHE_DIR": os.environ.get("EGLR_CACHE_DIR", "/tmp/eglr_bench_cache")}
        if mode.startswith("o"):  # the other checkout's package first on the path
            env["PYTHONPATH"] = os.pathsep.join(p for p in (args.other_checkout, env.get("PYTHONPATH")) if p)
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode:
            raise SystemExit(f"bench_decoding.py: mode {mode} failed:\n{out.stderr[-4000:]}")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode}: {results[mode]['wall_s']:.1f}s, {results[mode]['tokens_per_s']:.1f} tok/s, "
              f"max RSS {results[mode]['max_rss_mib']:.0f} MiB", flush=True)

    settings = dict(vars(args))
    if args.tiny:
        settings["model"] = "tiny random Llama, 10 layers, SmolLM2's tokenizer"
    if args.other_checkout:  # its commit, not a path of this machine
        settings["other_checkout"] = subprocess.run(["git", "-C", args.other_checkout, "rev-parse", "--short", "HEAD"],
                                                    capture_output=True, text=True).stdout.strip() or "unknown"
    summary = {"settings": settings}
    for prefix, engine in (("", "hf"), ("c", "continuous"), ("o", "other"), ("p", "continuous, repetition_penalty")):
        summary.update(_engine_summary(results, prefix, engine))
    for a, b, key in (("L10", "cL10", "same_text_L10_hf_vs_continuous"), ("L0", "cL0", "same_text_L0_hf_vs_continuous"),
                      ("oL10", "cL10", "same_text_L10_other_vs_continuous"),
                      ("oL0", "cL0", "same_text_L0_other_vs_continuous")):
        if a in results and b in results:
            summary[key] = [str(t) for t in results[b]["texts"]] == [str(t) for t in results[a]["texts"]]
    for mode in ("cL0", "cL10"):
        for other, key in (("o", "other"), ("p", "penalty")):
            if mode in results and other + mode[1:] in results:
                summary[f"wall_ratio_{other}{mode[1:]}_vs_{mode}"] = (results[other + mode[1:]]["wall_s"]
                                                                     / results[mode]["wall_s"])
        if mode in results and "p" + mode[1:] in results:
            summary[f"penalty_changed_text_{mode[1:]}"] = ([str(t) for t in results[mode]["texts"]] !=
                                                           [str(t) for t in results["p" + mode[1:]]["texts"]])
    for key, value in summary.items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    if args.out:
        for r in results.values():
            r.pop("texts", None)
        Path(args.out).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))


def _engine_summary(results: dict, prefix: str, engine: str) -> dict:
    """Ratios of one engine's modes (``L0``/``L10`` or ``cL0``/``cL10``) to each other and to ``hf``."""
    out = {}
    hf, l0, l10 = results.get("hf"), results.get(prefix + "L0"), results.get(prefix + "L10")
    if hf and l0:
        out[f"same_text_L0_vs_hf[{engine}]"] = [str(t) for t in l0["texts"]] == hf["texts"]
        out[f"throughput_ratio_L0_vs_hf[{engine}]"] = l0["tokens_per_s"] / hf["tokens_per_s"]
    if l0 and l10:
        st, n = l10["eglr"], l10["num_layers"]
        k = st["mean_iterations"]
        out.update({
            f"wall_ratio_L10_vs_L0[{engine}]": l10["wall_s"] / l0["wall_s"],
            f"rho[{engine}]": st["rho"], f"p_step_gated[{engine}]": st["p_step_gated"],
            f"mean_iterations[{engine}]": k, f"tau_h[{engine}]": l10["tau_h"],
            f"per_row_bound[{engine}]": 1 + st["rho"] * k * 10 / n,
            f"batched_bound[{engine}]": 1 + st["p_step_gated"] * k * 10 / n,  # a step waits for its gated rows
            f"flop_ratio[{engine}]": st["flop_ratio"],
            f"peak_memory_ratio_L10_vs_L0[{engine}]": l10.get("cuda_peak_mib", l10["max_rss_mib"]) /
            l0.get("cuda_peak_mib", l0["max_rss_mib"]),
        })
    return out


if __name__ == "__main__":
    main()
