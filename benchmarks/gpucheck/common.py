"""What every check of the GPU checks shares: greedy decoding through ``generate``, the hook engine or the
continuous engine (``decode``), the cached continuous engines, tau_h calibration, the captured modes' plan
and warm-up record, device synchronisation and freeing, and the placeholders of parts a run did not reach.
"""

from __future__ import annotations

import functools
import math

import torch

from .models import EOS, PAD

PAPER = dict(alpha=0.2, k_max=3, tau_kl=5e-4)  # eglr-method.md §3


def left_pad(prompts: list[list[int]], device, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), both (B, S), left-padded with PAD to ``width`` (default: the longest prompt)."""
    width = width or max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def decode(model, prompts, new_tokens: int, *, device, eglr: dict | None = None, scores: bool = False,
           sink: list | None = None, stats=None, eos_token_id: int | None = EOS):
    """Greedy ``generate`` (``eglr=None``) or EGLR with the settings ``eglr``; ``engine="continuous"``
    in ``eglr`` decodes all prompts through the continuous engine (one slot per prompt).

    Returns (rows, scores): each row's new tokens up to and including EOS; scores (B, S_new, V)
    when asked, else None.
    """
    from eglr_harness import eglr_generate

    if eglr is not None and eglr.get("engine") == "continuous":
        return decode_continuous(model, prompts, new_tokens, eglr=eglr, stats=stats, eos_token_id=eos_token_id), None

    ids, mask = left_pad(prompts, device)
    kwargs = dict(attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD,
                  eos_token_id=eos_token_id, output_scores=scores, return_dict_in_generate=True)
    if eglr is not None:
        kwargs.update(custom_generate=eglr_generate, **eglr)
        if sink is not None:
            kwargs["eglr_outcomes"] = sink  # one Outcome per row, with its per-token entropies
        if stats is not None:
            kwargs["eglr_stats"] = stats
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
    rows = []
    for r in range(len(prompts)):
        tokens = out.sequences[r, ids.shape[1]:].tolist()
        if eos_token_id is not None and eos_token_id in tokens:
            tokens = tokens[: tokens.index(eos_token_id) + 1]
        rows.append(tokens)
    return rows, (torch.stack(out.scores, dim=1).float() if scores else None)


def decode_continuous(model, prompts, new_tokens: int, *, eglr: dict, stats=None, eos_token_id: int | None = EOS):
    """Greedy EGLR through ``decoding.continuous_engine.ContinuousEngine``: each row's new tokens.

    ``eglr["engine_options"]``: keyword arguments of the engine (``compile``, ``compile_mode``,
    ``compile_backend``, ``kv_bucket``); the rest of ``eglr`` is the cell's ``EglrConfig``.
    """
    from eglr_harness.core.config import EglrConfig
    from eglr_harness.decoding.contract import Request

    config = EglrConfig(**{"tau_h": math.inf,
                           **{k: v for k, v in eglr.items() if k not in ("engine", "engine_options")}})
    engine = engine_of(model, len(prompts), eglr, eos_token_id)
    outcomes = engine.run([Request(tuple(p), config, new_tokens) for p in prompts],
                          stats_for=None if stats is None else (lambda _config: stats))
    return [o.tokens for o in outcomes]


@functools.lru_cache(maxsize=8)
def _continuous_engine(model, max_batch: int, eos: tuple, options: tuple):
    """One engine per (model, batch, EOS, engine options): a compiled step keeps its graphs across runs."""
    from eglr_harness.decoding.continuous.engine import ContinuousEngine

    return ContinuousEngine(model, max_batch=max_batch, eos_token_ids=list(eos), **dict(options))


def engine_of(model, max_batch: int, eglr: dict, eos_token_id: int | None = None):
    """The (cached) continuous engine that ``decode`` / the pool runs use for these settings."""
    options = tuple(sorted(eglr.get("engine_options", {}).items()))
    return _continuous_engine(model, max_batch, () if eos_token_id is None else (eos_token_id,), options)


def _is_captured(eglr: dict | None) -> bool:
    return bool(eglr) and eglr.get("engine") == "continuous" and bool(eglr.get("engine_options", {}).get("compile"))


def dynamo_graphs() -> int | None:
    """Graphs dynamo compiled in this process so far (its ``unique_graphs`` counter), where torch keeps it."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 -- a torch without the counter: nothing to report
        return None
    return int(counters["stats"]["unique_graphs"])


WARMUP_REPORT_KEYS = ("compiles", "captures", "compile_seconds", "capture_seconds", "late_compiles")
CAPTURED_SUMMARY = ("warmup_s", "warmup_compile_s", "warmup_capture_s", "compiles", "captures", "late_compiles",
                    "dynamo_graphs_warmup", "dynamo_graphs_late")


def captured_warmup(engine, graphs_before: int | None, graphs_warm: int | None, graphs_after: int | None) -> dict:
    """A captured mode's warm-up, split: the engine's own ``warmup_report()`` (compiles, captures, their
    seconds, compiles after warm-up; None while the engine has no such report) and, counted here,
    the graphs dynamo compiled during the warm-up decode and during the timed decodes (late)."""
    report = getattr(engine, "warmup_report", None)
    report = report() if callable(report) else None
    delta = lambda a, b: None if a is None or b is None else b - a
    return {
        "warmup_report": None if report is None else {k: report.get(k) for k in WARMUP_REPORT_KEYS},
        "warmup_compile_s": None if report is None else report.get("compile_seconds"),
        "warmup_capture_s": None if report is None else report.get("capture_seconds"),
        "compiles": None if report is None else report.get("compiles"),
        "captures": None if report is None else report.get("captures"),
        "late_compiles": None if report is None else report.get("late_compiles"),
        "dynamo_graphs_warmup": delta(graphs_before, graphs_warm),
        "dynamo_graphs_late": delta(graphs_warm, graphs_after),
    }


def greedy_entropies(model, prompts, new_tokens: int, *, device, eos_token_id: int | None = EOS) -> torch.Tensor:
    """Raw-logit entropies (nats) of every generated token of a greedy L=0 run.  -> (n_tokens,)."""
    sink: list = []
    decode(model, prompts, new_tokens, device=device, eglr=dict(L=0), sink=sink, eos_token_id=eos_token_id)
    return torch.tensor([e for outcome in sink for e in outcome.entropies])


def calibrate_tau_h(entropies: torch.Tensor) -> float:
    """The paper's rule without its 2.5-nat cap: the 95th percentile of greedy entropies.

    The cap is meant for trained models; a random-weight model's entropies (1-6.5 nats for
    Qwen2.5-3B's shape) sit mostly above it, where the capped threshold would gate most tokens
    instead of about 5 %.
    """
    from eglr_harness.run.calibration import calibrated_threshold

    return calibrated_threshold(entropies, cap=math.inf)


def captured_plan(args, device: str) -> dict:
    """What the captured modes (cL0c, cLc) run: ``--compile`` resolved on ``device``
    (``decoding/compile_setting.py``), or why they are skipped."""
    from eglr_harness.decoding.compile_setting import resolve_compile

    try:
        plan = resolve_compile(args.compile, device)
    except ValueError as error:
        return {"requested": args.compile, "skipped": str(error)}
    if not plan.compile:
        return {"requested": args.compile, "skipped": f"compile={args.compile} runs the step eager on {device}"}
    return {"requested": args.compile, "compile": plan.recorded, "compile_backend": args.compile_backend}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    _continuous_engine.cache_clear()  # engines hold their model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


NOT_REACHED = {"skipped": "not reached: the part stopped before it (see its `interrupted` or `error`)"}
STARTED = {"skipped": "started, not finished: the part stopped during it (see its `interrupted` or `error`)"}
