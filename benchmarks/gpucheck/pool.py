"""Check 5, pool: continuous batching with refill against ``generate`` in batches, on the same prompts with
per-request new-token limits (``check_pool``; run only when named in ``--checks``)."""

from __future__ import annotations

import logging
import math
import time

import torch

from .budget import Budget
from .common import (NOT_REACHED, PAPER, STARTED, _continuous_engine, _free, _sync, calibrate_tau_h, captured_plan,
                     captured_warmup, dynamo_graphs, engine_of, greedy_entropies, left_pad)
from .models import FAMILIES, PAD, build_model, family_config, random_prompts

logger = logging.getLogger(__name__)

POOL_MODES = ("generate_static", "cL0c", "cpoolc", "generate", "cL0", "cpool")
"""``generate_static`` / ``generate``: transformers' generate (static cache compiled on CUDA / dynamic), batches
of ``--pool_batch`` prompts; ``cL0c`` / ``cpoolc``: the continuous engine captured (``--compile``) at L=0 / over
the pool L=1..10 at T=0; ``cL0`` / ``cpool``: the same eager."""
DEFAULT_POOL_MODES = ("generate_static", "cL0c", "cpoolc", "generate")
ROW_ENDS = ("each request's max_new_tokens drawn uniformly from --pool_new_tokens (seeded), no EOS: rows end at "
            "different lengths; generate runs each batch to the longest and counts only each row's own tokens")


def pool_workload(config, args) -> tuple[list[list[int]], list[int]]:
    """(prompts, per-prompt new-token limits): ``--pool_prompts`` random prompts with lengths and limits drawn
    uniformly from ``--pool_prompt_lens`` and ``--pool_new_tokens`` (seeded)."""
    g = torch.Generator().manual_seed(args.seed + 5)
    (lo, hi), (new_lo, new_hi) = args.pool_prompt_lens, args.pool_new_tokens
    lengths = torch.randint(lo, hi + 1, (args.pool_prompts,), generator=g).tolist()
    limits = torch.randint(new_lo, new_hi + 1, (args.pool_prompts,), generator=g).tolist()
    return random_prompts(lengths, config.vocab_size, args.seed + 6), limits


def generate_batches(model, prompts, limits, *, batch: int, static: bool, width: int, new_tokens: int, device: str
                     ) -> list[list[int]]:
    """transformers' greedy ``generate`` over ``prompts`` in batches of ``batch`` (no refill), every batch left-padded
    to ``width`` and run for ``new_tokens`` (the longest prompt and limit of the whole workload: one shape, one
    compiled graph for the static cache). Returns each row's first ``limit`` new tokens."""
    cache = {"cache_implementation": "static"} if static else {}
    rows: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        ids, mask = left_pad(prompts[start:start + batch], device, width)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                                 eos_token_id=None, **cache)
        rows += out[:, width:].tolist()
    return [row[:limit] for row, limit in zip(rows, limits)]


def continuous_pool(model, prompts, limits, *, spans: list[int], tau_h: float, batch: int, options: dict, stats=None
                    ) -> list[list[int]]:
    """One continuous-engine run of every prompt at every span of ``spans`` (``[0]``: plain decoding), each request
    with its own limit, ``batch`` rows advancing, freed slots refilled from the queue. Returns the rows' tokens
    (prompt-major: prompt 0 at every span, then prompt 1, ...)."""
    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.contract import Request

    configs = [EglrConfig(L=0, tau_h=math.inf) if L == 0 else EglrConfig(L=L, tau_h=tau_h, **PAPER) for L in spans]
    requests = [Request(tuple(p), config, limit) for p, limit in zip(prompts, limits) for config in configs]
    engine = engine_of(model, batch, {"engine_options": options})
    outcomes = engine.run(requests, stats_for=None if stats is None else (lambda _config: stats))
    return [o.tokens for o in outcomes]


def pool_modes(spans: list[int], captured: dict, only: list[str]) -> dict:
    """Mode -> (kind, spans, engine options) or the reason it is skipped."""
    compiled = captured.get("skipped") or {"compile": True, "compile_mode": captured["compile"],
                                           "compile_backend": captured["compile_backend"]}
    settings = {"generate_static": ("generate", None, {"static": True}),
                "generate": ("generate", None, {"static": False}),
                "cL0": ("continuous", [0], {}), "cpool": ("continuous", spans, {}),
                "cL0c": compiled if isinstance(compiled, str) else ("continuous", [0], compiled),
                "cpoolc": compiled if isinstance(compiled, str) else ("continuous", spans, compiled)}
    return {mode: settings[mode] for mode in POOL_MODES if mode in only}


def timed_pool_mode(model, prompts, limits, *, spec, tau_h: float, args, device: str) -> tuple[dict, list]:
    """One pool mode: a warm-up over the first ``--pool_warmup_prompts`` prompts (same settings; the compiled
    graphs and captures it leaves are reused), then one timed run over all of them."""
    from eglr_harness.decoding.stats import EglrStats

    kind, spans, options = spec

    def once(n: int, stats=None) -> list[list[int]]:
        if kind == "generate":
            return generate_batches(model, prompts[:n], limits[:n], batch=args.pool_batch, width=max(map(len, prompts)),
                                    new_tokens=max(limits), device=device, **options)
        return continuous_pool(model, prompts[:n], limits[:n], spans=spans, tau_h=tau_h, batch=args.pool_batch,
                               options=options, stats=stats)

    _continuous_engine.cache_clear()  # each mode its own engine: its warm-up report counts its own compiles
    graphs_before = dynamo_graphs()
    _sync(device)
    started = time.perf_counter()
    once(args.pool_warmup_prompts)
    _sync(device)
    warmup = time.perf_counter() - started
    graphs_warm = dynamo_graphs()
    stats = EglrStats() if kind == "continuous" else None
    steps_before = engine_steps(kind, model, args.pool_batch, options)
    started = time.perf_counter()
    rows = once(len(prompts), stats)
    _sync(device)
    wall = time.perf_counter() - started
    steps_after = engine_steps(kind, model, args.pool_batch, options)
    per_row = [limit for limit in limits for _ in (spans or [None])]
    tokens = sum(map(len, rows))
    if [len(r) for r in rows] != per_row:
        raise RuntimeError(f"expected {sum(per_row)} new tokens ({len(per_row)} rows at their limits), got {tokens}")
    out = {"requests": len(rows), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "warmup_s": warmup,
           "warmup_prompts": args.pool_warmup_prompts}
    if kind == "generate":
        batches = math.ceil(len(prompts) / args.pool_batch)
        out["decoded_tokens"] = batches * args.pool_batch * max(limits)  # what ran, padding rows' steps included
        out["steps"] = batches * max(limits)
    else:
        out["steps"] = stats.steps  # the statistics' count: a step's rows of several cells count once per cell
        out["stats"] = stats.summary()
        if steps_before is not None and steps_after is not None and steps_after > steps_before:
            # the engine's own count of the timed run's decoding steps (one batched forward each, every cell's
            # rows together): what "ms per step" means for the GPU goals
            out["engine_steps"] = steps_after - steps_before
            out["ms_per_step"] = 1000 * wall / out["engine_steps"]
        if options.get("compile"):
            out.update(captured_warmup(engine_of(model, args.pool_batch, {"engine_options": options}), graphs_before,
                                       graphs_warm, dynamo_graphs()))
    return out, rows


def engine_steps(kind: str, model, batch: int, options: dict) -> int | None:
    """Decoding steps the mode's compiled continuous engine has run after its warm-up (its ``warmup_report``);
    None for ``generate`` and for an eager engine (which counts none)."""
    if kind != "continuous" or not options.get("compile"):
        return None
    return engine_of(model, batch, {"engine_options": options}).warmup_report().get("steps")


def check_pool(name: str, args, device: str, result: dict | None = None, budget: "Budget | None" = None,
               save=lambda: None) -> dict:
    """Check 5: continuous batching with refill against ``generate`` on the same prompts, in one run.

    ``--pool_prompts`` prompts (lengths ``--pool_prompt_lens``), each request with its own new-token limit
    (``--pool_new_tokens``: rows end at different lengths), ``--pool_batch`` rows: generate with a static cache
    (compiled on CUDA) and dynamic, batch after batch; the continuous engine captured at L=0 and over the pool
    L=1..min(10, N) at T=0 (all spans in one run), refilling freed slots. Tokens/s count each request's own tokens.
    """
    result = {} if result is None else result
    budget = budget or Budget(None)
    config = family_config(name, args.size, eos_token_id=None)
    n = config.num_hidden_layers
    spans = list(range(1, min(args.pool_L, n) + 1))
    model = build_model(config, dtype=torch.bfloat16, attn=FAMILIES[name].attn[0], device=device,
                        logit_std=args.logit_std, seed=args.seed)
    prompts, limits = pool_workload(config, args)
    tau_h = calibrate_tau_h(greedy_entropies(model, prompts[:16], args.calib_tokens, device=device, eos_token_id=None))
    captured = captured_plan(args, device)
    modes = pool_modes(spans, captured, args.pool_modes)
    result.update({
        "layers": n, "spans": spans, "tau_h_p95": tau_h, "prompts": len(prompts), "batch": args.pool_batch,
        "prompt_lengths": {"min": min(map(len, prompts)), "max": max(map(len, prompts)),
                           "mean": sum(map(len, prompts)) / len(prompts)},
        "new_tokens": {"min": min(limits), "max": max(limits), "mean": sum(limits) / len(limits)},
        "row_ends": ROW_ENDS, "captured": captured,
        "modes": {mode: {"skipped": spec} if isinstance(spec,
                                                        str) else dict(NOT_REACHED) for mode, spec in modes.items()},
    })
    rows_of: dict[str, list] = {}
    for mode, spec in modes.items():
        if isinstance(spec, str):
            continue
        if not budget.allows():
            result["modes"][mode] = {"skipped": budget.skip_reason()}
            continue
        logger.info("%s pool: %s (%.0f s of the budget left)", name, mode, budget.left())
        result["running"] = mode
        result["modes"][mode] = dict(STARTED)
        result["modes"][mode], rows_of[mode] = timed_pool_mode(model, prompts, limits, spec=spec, tau_h=tau_h,
                                                               args=args, device=device)
        del result["running"]
        result.update(pool_figures(result["modes"], rows_of, len(spans)))
        save()
    del model
    _free(device)
    return result


def pool_figures(runs: dict, rows_of: dict, spans: int) -> dict:
    """Tokens/s ratios of the modes that ran, and whether L=0 of the engine gave generate's tokens."""
    tps = {mode: run["tokens_per_s"] for mode, run in runs.items() if "tokens_per_s" in run}
    ratio = lambda a, b: tps[a] / tps[b] if a in tps and b in tps else None
    same = lambda a, b: (sum(x == y for x, y in zip(rows_of[a], rows_of[b])) / len(rows_of[a])
                         if a in rows_of and b in rows_of else None)
    return {"tokens_per_s": tps, "figures": {
        "tokens_per_s_ratio[cL0c/generate_static]": ratio("cL0c", "generate_static"),
        "tokens_per_s_ratio[cL0c/generate]": ratio("cL0c", "generate"),
        "tokens_per_s_ratio[cpoolc/generate]": ratio("cpoolc", "generate"),
        "tokens_per_s_ratio[cpoolc/cL0c]": ratio("cpoolc", "cL0c"),
        "tokens_per_s_ratio[generate_static/generate]": ratio("generate_static", "generate"),
        # greedy bf16: kernels may round a near-tie differently across shapes, so a share, not a verdict
        "rows_equal[cL0c,generate]": same("cL0c", "generate"),
        "rows_equal[cL0c,cL0]": same("cL0c", "cL0"),
        "rows_equal[cpoolc,cpool]": same("cpoolc", "cpool"),
        # the captured modes' time per engine step (one batched forward of every running row): the GPU goal's unit
        "ms_per_step": {mode: run["ms_per_step"] for mode, run in runs.items() if "ms_per_step" in run},
        "ms_per_step_ratio[cpoolc/cL0c]": (runs["cpoolc"]["ms_per_step"] / runs["cL0c"]["ms_per_step"]
                                           if "ms_per_step" in runs.get("cpoolc", {})
                                           and "ms_per_step" in runs.get("cL0c", {}) else None),
    }}
