"""Check 4, memory: CUDA peak allocated memory of EGLR against L=0 at a long context (``check_memory``, run by
``speed.check_speed_and_memory`` on its model)."""

from __future__ import annotations

import torch

from .common import PAPER, _free, decode
from .models import random_prompts


def check_memory(model, config, args, device: str, span: int) -> dict:
    """Check 4: CUDA peak allocated memory, EGLR L=span / L=0, at a ``mem_context``-token context.

    tau_h = 0 gates every row at every step: the most memory refinement can hold.
    """
    if not device.startswith("cuda"):
        return {"skipped": "no cuda (peak RSS of one process mixes the modes; benchmarks/bench_decoding.py "
                           "measures RSS per process)"}
    prompt_len = args.mem_context - args.mem_new_tokens
    prompts = random_prompts([prompt_len] * args.mem_batch, config.vocab_size, args.seed + 3)
    out = {"context": args.mem_context, "prompt_len": prompt_len, "new_tokens": args.mem_new_tokens,
           "batch": args.mem_batch, "tau_h": 0.0}
    for mode, eglr in (("L0", dict(L=0)), (f"L{span}", dict(L=span, tau_h=0.0, **PAPER))):
        _free(device)
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        decode(model, prompts, args.mem_new_tokens, device=device, eglr=eglr, eos_token_id=None)
        peak = torch.cuda.max_memory_allocated()
        out[mode] = {"peak_mib": peak / 2**20, "above_weights_mib": (peak - base) / 2**20}
    out["peak_ratio"] = out[f"L{span}"]["peak_mib"] / out["L0"]["peak_mib"]
    out["above_weights_ratio"] = out[f"L{span}"]["above_weights_mib"] / out["L0"]["above_weights_mib"]
    return out
