"""The GPU checks' command line: ``parse_args`` reads and checks the flags (a bad value raises ``ValueError``
naming the flag and what is allowed) and fills those left unset with the defaults of ``--size``."""

from __future__ import annotations

import argparse
import sys

import torch

from .models import DEFAULT_FAMILIES, DEFAULT_LOGIT_STD, FAMILIES
from .pool import DEFAULT_POOL_MODES, POOL_MODES
from .speed import SPEED_MODES

CHECKS = ("exactness", "placement", "speed", "memory", "pool")
DEFAULT_CHECKS = ("exactness", "placement", "speed", "memory")  # pool: asked for by name
SIZES = ("full", "tiny")

# Per-size defaults of the flags left unset: full = the sizes the GPU goals are judged at; tiny = seconds on a CPU.
SIZE_DEFAULTS = {
    "full": dict(exact_layers=6, exact_new_tokens=16, batches="1,16,64", new_tokens=512, prompt_len=64,
                 calib_tokens=128, mem_context=3072, mem_batch=16, mem_new_tokens=16, repeats=3, profile_tokens=32,
                budget_s=540, pool_prompts=256, pool_prompt_lens="64-1024", pool_new_tokens="64-512", pool_batch=64,
                 pool_warmup_prompts=64),
    "tiny": dict(exact_layers=4, exact_new_tokens=12, batches="1,4", new_tokens=16, prompt_len=8,
                 calib_tokens=16, mem_context=64, mem_batch=2, mem_new_tokens=4, repeats=1, profile_tokens=4,
                budget_s=0, pool_prompts=8, pool_prompt_lens="6-20", pool_new_tokens="3-10", pool_batch=4,
                 pool_warmup_prompts=4),
}


def _csv(value: str, allowed, flag: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise ValueError(f"{flag}={value!r}: unknown {bad or 'empty list'}; allowed: {', '.join(allowed)}")
    return items


def _span(value: str, flag: str) -> tuple[int, int]:
    """``lo-hi`` -> (lo, hi), 1 <= lo <= hi."""
    try:
        lo, hi = (int(part) for part in str(value).split("-"))
    except ValueError:
        raise ValueError(f"{flag}={value!r}: expected lo-hi, two integers, e.g. 64-512") from None
    if not 1 <= lo <= hi:
        raise ValueError(f"{flag}={value!r}: expected 1 <= lo <= hi")
    return lo, hi


def apply_size_defaults(args, defaults: dict) -> None:
    """Fill the arguments left unset with the defaults of ``args.size`` (``defaults``: size -> {name: value})."""
    for key, value in defaults[args.size].items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=sys.modules[__package__].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="full", choices=SIZES,
                        help="full = the checkpoints' shapes; tiny = CPU seconds")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES), help=f"comma list of {', '.join(FAMILIES)}")
    parser.add_argument("--checks", default=",".join(DEFAULT_CHECKS), help=f"comma list of {', '.join(CHECKS)} "
                        "(default: all but pool)")
    parser.add_argument("--attn", default="sdpa,eager", help="attention implementations of the fp32 exactness check")
    parser.add_argument("--exact_layers", type=int, help="layers of the shortened exactness/placement models (full: 6)")
    parser.add_argument("--exact_new_tokens", type=int, help="new tokens per exactness run (full: 16)")
    parser.add_argument("--batches", help="speed batch sizes (full: 1,16,64)")
    parser.add_argument("--new_tokens", type=int, help="new tokens per speed run (full: 512)")
    parser.add_argument("--prompt_len", type=int, help="prompt tokens of the speed runs (full: 64)")
    parser.add_argument("--calib_tokens", type=int, help="new tokens of the tau_h calibration run (full: 128)")
    parser.add_argument("--speed_L", type=int, default=10, help="EGLR layer span of the speed and memory runs")
    parser.add_argument("--speed_attn", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"),
                        help="attention implementation of the speed runs (a family without it uses its own first)")
    parser.add_argument("--repeats", type=int, help="timed runs per mode after a full-length warm-up; median and "
                                                   "min reported (full: 3)")
    parser.add_argument("--profile_tokens", type=int, help="new tokens of each mode's profiled decode (CUDA; full: 32)")
    parser.add_argument("--compile", default="auto", help="the captured modes' `compile` setting (cL0c, cLc; "
                        "decoding/compile_setting.py): auto = reduce-overhead (CUDA graphs) on CUDA, skipped elsewhere")
    parser.add_argument("--compile_backend", default="inductor",
                        help="torch.compile backend of the captured modes (eager / aot_eager: a CPU smoke test)")
    parser.add_argument("--speed_modes", default=",".join(SPEED_MODES),
                        help=f"comma list of {', '.join(SPEED_MODES)} (L: the --speed_L span; c: captured)")
    parser.add_argument("--speed_kv_bucket", type=int, default=None,
                        help="the continuous engine's kv_bucket in the speed runs (default: one bucket that holds "
                             "the run, so that attention has one width)")
    parser.add_argument("--budget_s", type=float, help="seconds per family: parts start only while time is "
                        "left, the running one is interrupted when it runs out, the report says what was skipped "
                        "(full: 540, for a 10-minute call; tiny: none); 0 = no limit")
    parser.add_argument("--pool_prompts", type=int, help="prompts of the pool check (full: 256)")
    parser.add_argument("--pool_prompt_lens", help="prompt lengths of the pool check, lo-hi, drawn uniformly "
                        "(full: 64-1024)")
    parser.add_argument("--pool_new_tokens", help="each request's new-token limit, lo-hi, drawn uniformly: rows end "
                        "at different lengths (full: 64-512)")
    parser.add_argument("--pool_batch", type=int, help="rows of the pool check: generate's batch, the engine's "
                        "max_batch (full: 64)")
    parser.add_argument("--pool_warmup_prompts", type=int, help="prompts of each pool mode's warm-up run (full: 64)")
    parser.add_argument("--pool_L", type=int, default=10, help="the pool's spans: L=1..this (capped at the depth)")
    parser.add_argument("--pool_modes", default=",".join(DEFAULT_POOL_MODES),
                        help=f"comma list of {', '.join(POOL_MODES)} (c...c: captured)")
    parser.add_argument("--mem_context", type=int, help="prompt + new tokens of the memory check (full: 3072)")
    parser.add_argument("--mem_batch", type=int, help="batch of the memory check (full: 16)")
    parser.add_argument("--mem_new_tokens", type=int, help="new tokens of the memory check (full: 16)")
    parser.add_argument("--logit_std", type=float, default=DEFAULT_LOGIT_STD,
                        help="logit std the random models' output embedding is scaled to (see DEFAULT_LOGIT_STD)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    apply_size_defaults(args, SIZE_DEFAULTS)
    args.families = _csv(args.families, FAMILIES, "--families")
    args.checks = _csv(args.checks, CHECKS, "--checks")
    args.attn = _csv(args.attn, ("sdpa", "eager"), "--attn")
    try:
        args.batches = [int(b) for b in str(args.batches).split(",")]
    except ValueError:
        raise ValueError(f"--batches={args.batches!r}: expected comma-separated positive integers, e.g. "
                         "1,16,64") from None
    for flag in ("exact_layers", "exact_new_tokens", "new_tokens", "prompt_len", "calib_tokens", "speed_L", "repeats",
                 "mem_batch", "mem_new_tokens", "profile_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag}={getattr(args, flag)}: must be >= 1")
    if min(args.batches) < 1:
        raise ValueError(f"--batches={args.batches}: every batch size must be >= 1")
    if args.exact_layers < 2:
        raise ValueError(f"--exact_layers={args.exact_layers}: must be >= 2 (the check uses L = 1, N/2, N)")
    if args.mem_context <= args.mem_new_tokens:
        raise ValueError(f"--mem_context={args.mem_context}: must exceed --mem_new_tokens={args.mem_new_tokens}")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={args.device}: CUDA is not available on this machine; use --device cpu")
    from eglr_harness.decoding.compile_setting import check_compile_setting

    args.compile = check_compile_setting(args.compile)
    args.speed_modes = _csv(args.speed_modes, SPEED_MODES, "--speed_modes")
    args.pool_modes = _csv(args.pool_modes, POOL_MODES, "--pool_modes")
    args.pool_prompt_lens = _span(args.pool_prompt_lens, "--pool_prompt_lens")
    args.pool_new_tokens = _span(args.pool_new_tokens, "--pool_new_tokens")
    for flag in ("pool_prompts", "pool_batch", "pool_warmup_prompts", "pool_L"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag}={getattr(args, flag)}: must be >= 1")
    for flag in ("pool_prompts", "pool_warmup_prompts"):  # whole batches: generate's static cache keeps one shape
        if getattr(args, flag) % args.pool_batch or getattr(args, flag) > args.pool_prompts:
            raise ValueError(f"--{flag}={getattr(args, flag)}: must be a multiple of --pool_batch={args.pool_batch}"
                             f" and at most --pool_prompts={args.pool_prompts}")
    if args.speed_kv_bucket is not None and (args.speed_kv_bucket < 2 or args.speed_kv_bucket % 2):
        raise ValueError(f"--speed_kv_bucket={args.speed_kv_bucket}: must be an even int >= 2")
    if args.budget_s is not None and args.budget_s < 0:
        raise ValueError(f"--budget_s={args.budget_s}: must be >= 0 (0 = no limit)")
    args.budget_s = args.budget_s or None
    return args
