"""Check 3, speed (and check 4 on the same model): wall time per decoding step of each mode of ``SPEED_MODES``
at each batch size, the cost bounds, a CUDA profile of each mode and the speed goals
(``check_speed_and_memory``)."""

from __future__ import annotations

import logging
import time

import torch

from .budget import Budget
from .common import (NOT_REACHED, PAPER, STARTED, _free, _is_captured, _sync, calibrate_tau_h, captured_plan,
                     captured_warmup, decode, dynamo_graphs, engine_of, greedy_entropies, left_pad)
from .memory import check_memory
from .models import FAMILIES, PAD, build_model, family_config, random_prompts

logger = logging.getLogger(__name__)


def decode_with(model, prompts, new_tokens: int, *, device: str, mode: str, eglr: dict | None, stats=None):
    """One greedy decode of ``mode``: ``generate_static`` is ``generate`` with a static cache (compiled
    by transformers on CUDA), any other mode goes through ``decode``."""
    if mode != "generate_static":
        return decode(model, prompts, new_tokens, device=device, eglr=eglr, stats=stats, eos_token_id=None)[0]
    ids, mask = left_pad(prompts, device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                             eos_token_id=None, cache_implementation="static")
    return out[:, ids.shape[1]:].tolist()


def timed_decode(model, prompts, new_tokens: int, *, device: str, mode: str, eglr: dict | None, repeats: int
                 ) -> tuple[dict, list[list[int]]]:
    """Wall times of ``repeats`` greedy decodes (every row runs ``new_tokens``: no EOS) after one warm-up
    decode of the full length (the caching allocator, matmul plans and compiled graphs grow with the
    K/V length; ``warmup_s`` holds any compilation). Reports the median (``wall_s``, what ratios use),
    the min, and ms per step (median wall / decoding steps: the engine's count for EGLR modes,
    ``new_tokens`` else). Returns (figures, the last decode's rows)."""
    import statistics

    from eglr_harness.decoding.stats import EglrStats

    captured = _is_captured(eglr)
    graphs_before = dynamo_graphs()
    _sync(device)
    started = time.perf_counter()
    decode_with(model, prompts, new_tokens, device=device, mode=mode, eglr=eglr)  # warm-up, full length
    _sync(device)
    warmup = time.perf_counter() - started
    graphs_warm = dynamo_graphs()
    walls, stats, rows = [], None, []
    for _ in range(repeats):
        stats = EglrStats() if eglr is not None else None
        _sync(device)
        started = time.perf_counter()
        rows = decode_with(model, prompts, new_tokens, device=device, mode=mode, eglr=eglr, stats=stats)
        _sync(device)
        walls.append(time.perf_counter() - started)
    tokens = sum(map(len, rows))
    if tokens != len(prompts) * new_tokens:
        raise RuntimeError(f"expected {len(prompts) * new_tokens} new tokens without EOS, got {tokens}")
    median = statistics.median(walls)
    steps = (stats.steps if stats is not None and stats.steps else new_tokens)
    out = {"wall_s": median, "wall_s_min": min(walls), "walls_s": walls, "warmup_s": warmup, "tokens": tokens,
           "tokens_per_s": tokens / median, "steps": steps, "ms_per_step": 1000 * median / steps}
    if stats is not None:
        out["stats"] = stats.summary()
    if captured:
        engine = engine_of(model, len(prompts), eglr)
        out.update(captured_warmup(engine, graphs_before, graphs_warm, dynamo_graphs()))
    return out, rows


def profile_decode(model, prompts, new_tokens: int, *, device: str, mode: str, eglr: dict | None) -> dict:
    """torch.profiler over one (warm) decode of ``new_tokens``: GPU kernel time / wall, kernel
    launches and host syncs per step (steps: the engine's own count for EGLR, ``new_tokens`` else)."""
    if not device.startswith("cuda"):
        return {"skipped": "no cuda"}
    from torch.profiler import ProfilerActivity, profile

    from eglr_harness.decoding.stats import EglrStats

    stats = EglrStats() if eglr is not None else None
    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        decode_with(model, prompts, new_tokens, device=device, mode=mode, eglr=eglr, stats=stats)
        _sync(device)
        wall = time.perf_counter() - started
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    kernel_s = sum(e.device_time_total for e in kernels) / 1e6
    syncs = sum(1 for e in events if e.name.startswith(("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                          "cudaEventSynchronize"))
                or e.name in ("cudaMemcpy", "cudaMemcpy2D"))
    launches = sum(1 for e in events if e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch",
                                                             "cudaLaunchKernelExC")))
    steps = (stats.steps if stats is not None and getattr(stats, "steps", 0) else new_tokens) or 1
    return {"new_tokens": new_tokens, "wall_s": wall, "gpu_kernel_s": kernel_s, "gpu_busy": kernel_s / wall,
            "steps": steps, "kernels_per_step": len(kernels) / steps, "launch_calls_per_step": launches / steps,
            "host_syncs_per_step": syncs / steps, "ms_per_step": 1000 * wall / steps}


def check_speed_and_memory(name: str, args, device: str, checks: set[str], result: dict | None = None,
                           budget: "Budget | None" = None, save=lambda: None) -> dict:
    """Checks 3 and 4 on the full-depth bf16 model of ``name``, filling ``result`` as modes finish
    (``save`` is called after each, so a run cut short keeps them).

    Modes run in ``speed_modes``' order (the goals' modes first), batch by batch; a mode starts only
    while ``budget`` has time left and, at a later batch, at least the time it took at the batch before.
    """
    result = {} if result is None else result
    budget = budget or Budget(None)
    config = family_config(name, args.size, eos_token_id=None)
    n = config.num_hidden_layers
    span = min(args.speed_L, n)
    supported = (*FAMILIES[name].attn, "flash_attention_2")  # FA2 runs bf16, which is what speed uses
    attn = args.speed_attn if args.speed_attn in supported else FAMILIES[name].attn[0]
    model = build_model(config, dtype=torch.bfloat16, attn=attn, device=device, logit_std=args.logit_std,
                        seed=args.seed)
    batches = args.batches
    prompts = random_prompts([args.prompt_len] * max(batches), config.vocab_size, args.seed + 2)
    calib = prompts[: min(16, len(prompts))]
    tau_h = calibrate_tau_h(greedy_entropies(model, calib, args.calib_tokens, device=device, eos_token_id=None))
    kv_bucket = args.speed_kv_bucket or run_kv_bucket(args.prompt_len, args.new_tokens)
    captured = captured_plan(args, device)
    result.update({"layers": n, "L": span, "tau_h_p95": tau_h, "calib_prompts": len(calib),
                   "calib_tokens": args.calib_tokens, "attn": attn, "repeats": args.repeats,
                   "continuous_kv_bucket": kv_bucket, "captured": captured})
    modes = speed_modes(span, tau_h, captured=captured, kv_bucket=kv_bucket, only=args.speed_modes)
    if "memory" in checks:
        result["memory"] = dict(NOT_REACHED)
    if "speed" in checks:
        # every mode of every batch is listed from the start: a part cut short says what it did not reach
        unreached = lambda: {mode: {"skipped": eglr} if isinstance(eglr, str) else dict(NOT_REACHED)
                             for mode, eglr in modes.items()}
        result["batches"] = {str(batch): {"runs": unreached(), "profile": unreached()} for batch in batches}
        took: dict[str, float] = {}  # mode -> seconds at the previous batch
        for batch in batches:
            rows = prompts[:batch]
            figures = result["batches"][str(batch)]
            runs, profiles, tokens = figures["runs"], figures["profile"], {}
            for mode, eglr in modes.items():
                if isinstance(eglr, str):  # a reason not to run it
                    runs[mode] = profiles[mode] = {"skipped": eglr}
                    continue
                need = took.get(mode, 0.0)
                if not budget.allows(need):
                    why = budget.skip_reason(need, f"{mode} took {need:.0f} s at the batch before" if need else "")
                    runs[mode] = profiles[mode] = {"skipped": why}
                    continue
                logger.info("%s speed: batch %d, %s (%.0f s of the budget left)", name, batch, mode, budget.left())
                result["running"] = f"batch {batch}, {mode}"
                runs[mode] = profiles[mode] = dict(STARTED)
                started = time.perf_counter()
                runs[mode], tokens[mode] = timed_decode(model, rows, args.new_tokens, device=device, mode=mode,
                                                        eglr=eglr,
                                                        repeats=args.repeats)
                profiles[mode] = profile_decode(model, rows, args.profile_tokens, device=device, mode=mode, eglr=eglr)
                took[mode] = time.perf_counter() - started
                runs[mode]["mode_s"] = took[mode]
                del result["running"]
                figures.update(speed_figures(runs, span, n, profiles, tokens,
                                             judge=device.startswith("cuda") and args.size == "full"))
                save()
    if "memory" in checks:
        if budget.allows():
            result["running"] = "memory"
            result["memory"] = check_memory(model, config, args, device, span)
            del result["running"]
        else:
            result["memory"] = {"skipped": budget.skip_reason()}
    del model
    _free(device)
    return result


def run_kv_bucket(prompt_len: int, new_tokens: int) -> int:
    """A K/V bucket that holds a whole speed run (prompt, new tokens, the engine's 2 spare columns),
    even: the continuous engine's attention then has one width, and a captured step one graph per
    row-count bucket (like the static cache of ``generate_static``, sized to the run)."""
    need = prompt_len + new_tokens + 2
    return need + need % 2

SPEED_MODES = ("generate_static", "cL0c", "cLc", "generate", "cL0", "cL", "L0", "L")
"""Every mode, in the order they run: the goals' modes first (the anchor, continuous captured L0 and L),
then the eager continuous engine, transformers' dynamic ``generate`` and the hook engine (hf)."""


def speed_modes(span: int, tau_h: float, *, captured: dict, kv_bucket: int, only: list[str] | None = None) -> dict:
    """Mode name -> EGLR settings (None: transformers' own ``generate``; a string: why it is skipped).

    ``L``-modes take the span in their name (``L10``, ``cL10``, ``cL10c``); ``only``: generic names."""
    eglr = dict(L=span, tau_h=tau_h, **PAPER)
    eager = dict(engine="continuous", engine_options={"kv_bucket": kv_bucket})
    if "skipped" in captured:
        compiled: dict | str = captured["skipped"]
    else:
        compiled = dict(engine="continuous", engine_options={
            "kv_bucket": kv_bucket, "compile": True, "compile_mode": captured["compile"],
            "compile_backend": captured["compile_backend"]})
    settings = {"generate_static": None, "generate": None, "L0": dict(L=0), "L": eglr,
                "cL0": dict(eager, L=0), "cL": dict(eager, **eglr),
                "cL0c": compiled if isinstance(compiled, str) else dict(compiled, L=0),
                "cLc": compiled if isinstance(compiled, str) else dict(compiled, **eglr)}
    name = lambda mode: mode.replace("L", f"L{span}") if mode in ("L", "cL", "cLc") else mode
    return {name(mode): settings[mode] for mode in SPEED_MODES if only is None or mode in only}


def speed_figures(runs: dict, span: int, n: int, profiles: dict | None = None, tokens: dict | None = None,
                  judge: bool = False) -> dict:
    """Wall ratios (medians), cost bounds (eglr-method.md §4) and the goals of one batch size, from
    the modes that ran (a figure whose modes did not run is None); ``judge``: say whether the goals
    are met (full-size models on a GPU only: the goals are GPU figures)."""
    done = {mode: run for mode, run in runs.items() if "wall_s" in run}
    profiles, tokens = profiles or {}, tokens or {}

    def ratio(a: str, b: str, key: str = "wall_s") -> float | None:
        return done[a][key] / done[b][key] if a in done and b in done else None

    stat = lambda mode, key: done[mode]["stats"][key] if mode in done and "stats" in done[mode] else None
    L, cL, cLc = f"L{span}", f"cL{span}", f"cL{span}c"
    rho, k, p_any = stat(L, "rho"), stat(L, "mean_iterations"), stat(L, "p_step_gated")
    out = {
        "wall_ratio_L0_vs_generate": ratio("L0", "generate"),
        "wall_ratio_L_vs_L0": ratio(L, "L0"),
        "rho": rho, "p_step_gated": p_any, "mean_iterations": k,
        "flop_ratio": stat(L, "flop_ratio"), "batched_flop_ratio": stat(L, "batched_flop_ratio"),
        "per_row_bound": None if rho is None else 1 + rho * k * span / n,  # the paper's 1 + rho·k·L/N
        "batched_bound": None if p_any is None else 1 + p_any * k * span / n,  # a step waits for its gated rows
        # the anchor: transformers' static-cache generate (compiled on CUDA)
        "wall_ratio_generate_static_vs_generate": ratio("generate_static", "generate"),
        # engine=continuous: refinement folded into the batch
        "wall_ratio_L0_vs_generate[continuous]": ratio("cL0", "generate"),
        "wall_ratio_L0_vs_generate_static[continuous]": ratio("cL0", "generate_static"),
        "wall_ratio_L_vs_L0[continuous]": ratio(cL, "cL0"),
        "rho[continuous]": stat(cL, "rho"),
        # the step captured (compile=reduce-overhead on CUDA)
        "wall_ratio_L0_vs_generate_static[continuous,compiled]": ratio("cL0c", "generate_static"),
        "wall_ratio_L_vs_L0[continuous,compiled]": ratio(cLc, "cL0c"),
        # greedy bf16 tokens of the captured step against the eager step's (kernels may round differently)
        "captured_tokens_equal_eager": {mode: tokens[mode + "c"] == tokens[mode] for mode in ("cL0", cL)
                                        if mode in tokens and mode + "c" in tokens} or None,
    }
    out["goals"] = speed_goals(out, profiles, span, judge)
    return out


GOALS = (  # the speed targets of the captured engine: (name, figure or profile key, mode, target, comparison)
    # the same prompts and tokens: the wall ratio is the ratio of ms per decoding step
    ("captured_L0_ms_per_step_vs_generate_static", "wall_ratio_L0_vs_generate_static[continuous,compiled]", None, 1.0,
     "<="),
    ("captured_L_vs_L0", "wall_ratio_L_vs_L0[continuous,compiled]", None, 1.10, "<="),
    ("gpu_busy[cL0c]", "gpu_busy", "cL0c", 0.85, ">="),
    ("gpu_busy[cLc]", "gpu_busy", "cLc", 0.85, ">="),
    ("host_syncs_per_step[cL0c]", "host_syncs_per_step", "cL0c", 1.0, "<="),
    ("host_syncs_per_step[cLc]", "host_syncs_per_step", "cLc", 1.0, "<="),
)


def speed_goals(figures: dict, profiles: dict, span: int, judge: bool) -> dict:
    """Each goal of ``GOALS``: {"value", "target", "met"}; value None where its modes did not run, met
    None then and when not ``judge`` (tiny models, CPUs: the goals are figures of full-size models on a GPU)."""
    out = {}
    for name, key, mode, target, comparison in GOALS:
        if mode is None:
            value = figures.get(key)
        else:
            profile = profiles.get(mode.replace("cLc", f"cL{span}c"), {})
            value = profile.get(key)
        met = None if value is None or not judge else (value <= target if comparison == "<=" else value >= target)
        out[name.replace("cLc", f"cL{span}c")] = {"value": value, "target": f"{comparison} {target:g}", "met": met}
    return out
