"""Peak memory of EGLR refinement at a long context, against plain decoding (L=0), on a tiny model on CPU.

Each mode decodes the same prompt in its own subprocess, so that its peak is its own:

- ``L0``: ``eglr_generate`` at L=0 (plain decoding);
- ``L10``: L=10 with tau_h=0, so that every step is refined (the worst case for memory).

Two measures per mode: the process's peak RSS (``ru_maxrss``: model, imports, prompt, KV cache,
every transient) and the growth of the peak over the RSS just before ``generate`` (the kernel's
high-water mark is reset there through /proc/self/clear_refs, where Linux allows it). The ratios
L10 / L0 of both are measured in one run of this script. The subprocesses run with glibc's mmap
threshold fixed at 64 KiB (``MALLOC_*`` below): every tensor buffer is then mapped and unmapped
on its own, so RSS follows the live tensors; with glibc's adaptive threshold, freed buffers stay in
the heap and the same command's peak moved by up to 20 % between runs.

    python benchmarks/bench_memory.py --context 4096 --out benchmarks/results/memory_cpu_4k.json
    python benchmarks/bench_memory.py --tiny --out /tmp/memory.json   # seconds: a 64-token context (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
MODES = {"L0": dict(L=0), "L10": dict(L=10, tau_h=0.0)}
# Big enough K/V per token that the cache, not the imports, is what a copy of it would show in.
MODEL = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=12, num_attention_heads=8,
             num_key_value_heads=8, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_mode(mode: str, context: int, new_tokens: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from eglr_harness.decoding.hook.generate import eglr_generate
    from eglr_harness.decoding.stats import EglrStats

    torch.manual_seed(0)
    config = LlamaConfig(**MODEL, max_position_embeddings=context + new_tokens + 8)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(3, MODEL["vocab_size"], (1, context), generator=torch.Generator().manual_seed(1))
    kv_bytes = 2 * MODEL["num_hidden_layers"] * (context + new_tokens) * MODEL["hidden_size"] * 4
    stats = EglrStats()
    before_kb = _status_kb("VmRSS")
    reset = _reset_peak()
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                       pad_token_id=0, custom_generate=eglr_generate, eglr_stats=stats, **MODES[mode])
    peak_kb = _status_kb("VmHWM")
    return {
        "mode": mode, "context": context, "new_tokens": new_tokens,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_generate_mb": before_kb / 1024 if before_kb else None,
        "peak_growth_in_generate_mb": (peak_kb - before_kb) / 1024 if (reset and peak_kb and before_kb) else None,
        "kv_cache_mb": kv_bytes / 2**20,
        "gated_tokens": stats.gated_tokens, "tokens": stats.tokens,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="a 64-token context and 4 new tokens: seconds (CI)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--mode", choices=sorted(MODES), help=argparse.SUPPRESS)  # one subprocess's job
    args = parser.parse_args(argv)
    if args.tiny:
        args.context, args.new_tokens = 64, 4
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.context, args.new_tokens)))
        return

    results = {}
    for mode in MODES:
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--context", str(args.context),
                              "--new_tokens", str(args.new_tokens)], check=True, capture_output=True, text=True,
                             env={**os.environ, **MALLOC})
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{mode}: {results[mode]}", file=sys.stderr)
    l0, l10 = results["L0"], results["L10"]
    report = {
        "command": "python benchmarks/bench_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.system()} {platform.machine()}, python {platform.python_version()}",
        "allocator": MALLOC,
        "model": {**MODEL, "note": "tiny random Llama, fp32, sdpa, batch 1, greedy"},
        "modes": results,
        "peak_rss_ratio_L10_over_L0": l10["peak_rss_mb"] / l0["peak_rss_mb"],
        "peak_growth_ratio_L10_over_L0": (l10["peak_growth_in_generate_mb"] / l0["peak_growth_in_generate_mb"]
                                          if l0["peak_growth_in_generate_mb"] else None),
        "target": "peak memory of L=10 within 3 % of L=0",
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
