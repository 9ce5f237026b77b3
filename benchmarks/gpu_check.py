"""EGLR at the paper's model shapes on one machine (issues 16, 21, 29): exactness, placement, speed, memory.

No weights are downloaded: every family is built from its transformers config with random
weights at the shapes of its published ``config.json`` (``FAMILIES``). ``--size tiny`` shrinks
every family to a few small layers, so that the same code runs on a CPU in seconds (the test
``tests/benchmarks/test_gpu_check.py`` does that).

Checks (``--checks``, all by default):

1. ``exactness`` (fp32, shortened to ``--exact_layers`` layers at full width): greedy EGLR tokens
   of the cached, batched engine equal the naive uncached reference
   (``eglr_harness/decoding/naive_reference.py``) for L in {1, N/2, N}, for each attention implementation
   (sdpa, eager, and flash_attention_2 in bf16 when ``flash_attn`` is importable, reported apart:
   FA2 has no fp32 kernels, so bf16 noise between a cached and an uncached pass may flip a token);
   L=0 equals ``generate`` token for token (fp32 and bf16); bf16 EGLR runs end with finite logits.
   The continuous engine (its own slot attention, whatever ``--attn``) equals the naive reference
   too, for the same L and gates (``continuous_fp32``).
2. ``placement``: a ``device_map`` that puts half the layers on the GPU and the rest on the CPU
   (accelerate's CPU offload, what ``parallelize=True`` gives) yields the same tokens as one device.
3. ``speed`` (full shapes, bf16): per batch size (``--batches``), the modes of ``SPEED_MODES`` in
   this order: ``generate_static`` (``generate`` with a static cache, compiled by transformers on
   CUDA: the anchor), the continuous engine's step captured (``cL0c``/``cL10c``: ``--compile``,
   auto = reduce-overhead, CUDA graphs per bucket; skipped where it resolves to eager), the
   continuous engine eager (``cL0``/``cL10``), transformers' dynamic ``generate`` (what lm-eval's
   ``hf`` calls), and the hook engine (``L0``/``L10``, engine=hook). Each mode is warmed up over the
   full length (``warmup_s``: compilation included), then timed ``--repeats`` times: the median
   and the min are reported, ratios use the medians; ms per step. Also rho, P(step gated), mean
   iterations, the FLOP ratio, the per-row and batched bounds from ``EglrStats``, whether the
   captured step's greedy tokens equal the eager step's, and on CUDA a profile of each mode
   (``--profile_tokens`` tokens): GPU kernel time / wall (busy), kernel launches and host syncs
   per step. ``goals`` holds issue 29's targets with their values (judged on full-size CUDA runs).
   The continuous engine's K/V bucket holds the whole run (``--speed_kv_bucket``): one width.
   Each captured mode also reports its warm-up split (issue 32): the engine's ``warmup_report()``
   (compilations, CUDA-graph captures, the seconds of each, compilations after warm-up; null while
   the engine has none) and, counted here, the graphs dynamo compiled in the warm-up and in the timed runs.
4. ``memory`` (CUDA only): peak allocated memory of EGLR L=10 / L=0 at a 3,072-token context.
5. ``pool`` (issue 32; only when named in ``--checks``): ``--pool_prompts`` prompts of ``--pool_prompt_lens``
   tokens, each request with its own new-token limit (``--pool_new_tokens``: rows end at different
   lengths, no EOS), ``--pool_batch`` rows: tokens/s of the continuous engine captured at L=0 (``cL0c``)
   and over the pool L=1..10 at T=0 in one run (``cpoolc``), refilling freed slots, against
   transformers' static compiled ``generate`` and dynamic ``generate`` in batches, on the same prompts;
   each mode warmed up on ``--pool_warmup_prompts`` prompts, then timed once over all of them.

Time (``--budget_s``, per family; 540 s at full size, for a 10-minute call): a part or a speed
mode starts only while time is left (a mode at a later batch only if the time it took at the batch
before is left), an alarm interrupts the part that runs when the time is spent, and the JSON says
what was interrupted and what was skipped. The JSON is rewritten after every part and every mode.

tau_h is set per model from its own greedy (L=0) entropies: the 95th percentile (rho ~ 5 %).

    python benchmarks/gpu_check.py --out gpu_check.json                  # everything, full shapes, CUDA
    python benchmarks/gpu_check.py --families llama-3.1-8b --checks exactness,speed --attn sdpa --batches 16,64 \
        --new_tokens 128 --repeats 2 --profile_tokens 16 --out llama.json   # issue 29, one family
    python benchmarks/gpu_check.py --size tiny --device cpu --out tiny.json   # seconds, CPU
    python benchmarks/gpu_check.py --families qwen2.5-3b --checks pool --out pool.json   # issue 32's pool mode
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import logging
import math
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger("gpu_check")

PAD, BOS, EOS = 0, 1, 2
CHECKS = ("exactness", "placement", "speed", "memory", "pool")
DEFAULT_CHECKS = ("exactness", "placement", "speed", "memory")  # pool (issue 32): asked for by name
SIZES = ("full", "tiny")
# Random init gives near-uniform next-token distributions; the output embedding is scaled (as
# tests/helpers/tiny_models.py does) so that greedy is not decided by near-ties: by the factor that gives
# the logits of a unit-RMS hidden state this standard deviation, whatever the width (at 4 the
# greedy entropies of a random Qwen2.5-3B spread over 1-6.5 nats).
DEFAULT_LOGIT_STD = 4.0
# A threshold this close to an observed entropy (nats) or KL (relative) makes the gate or the
# early exit a coin toss between two correct implementations (engine and naive logits differ by
# ~1e-6 in fp32): such a case is re-run with the threshold moved into the middle of the nearest
# wide-enough gap between observed values (see tests/decoding/test_engine_vs_naive.py, TAU_KL).
ENTROPY_MARGIN = 1e-4
KL_MARGIN = 1e-3
MAX_ATTEMPTS = 4
EXACT_SLIDING_WINDOW = 16  # shortened models: a window the short exactness sequences cross
PAPER = dict(alpha=0.2, k_max=3, tau_kl=5e-4)  # eglr-method.md §3


@dataclass(frozen=True)
class Family:
    """One model family at the shapes of a published checkpoint.

    Attributes:
        config_cls: the transformers config class; the model is ``AutoModelForCausalLM.from_config``.
        source: the checkpoint whose ``config.json`` gave ``shape``.
        shape: config values as written in that ``config.json`` (legacy rope keys are accepted
            by transformers' configs and converted to ``rope_parameters``).
        tiny: overrides for ``--size tiny`` (few layers, small width, same kind of attention).
        random_init: overrides that a random-weight model needs to decode anything but one token
            (each with its reason); FLOPs are unchanged.
        attn: the attention implementations transformers offers for the family (fp32 ones).
    """

    config_cls: str
    source: str
    shape: dict
    tiny: dict = field(default_factory=dict)
    random_init: dict = field(default_factory=dict)
    attn: tuple[str, ...] = ("sdpa", "eager")


_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2)
_TINY_GEMMA = dict(_TINY, head_dim=16, query_pre_attn_scalar=16, sliding_window=EXACT_SLIDING_WINDOW)
# Tied embeddings make a random model copy its last input token with entropy 0 (the gate never
# fires): Gemma scales inputs by sqrt(D), so that token's own logit is ~0.02·D (51 at D=2560)
# against N(0, 1) for the rest, and sharpening a tied matrix scales the inputs as well (a tiny
# Qwen2 collapsed so). Untied, the unembedding is an independent random matrix: the same FLOPs,
# +V·D weights in memory.
_UNTIE = dict(tie_word_embeddings=False)

FAMILIES: dict[str, Family] = {
    "qwen2.5-3b": Family("Qwen2Config", "Qwen/Qwen2.5-3B-Instruct config.json", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        sliding_window=32768, max_window_layers=70,
    ), _TINY, _UNTIE),
    "llama-3.1-8b": Family("LlamaConfig", "meta-llama/Llama-3.1-8B-Instruct config.json", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=131072,
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ), _TINY),
    "mistral-7b-v0.3": Family("MistralConfig", "mistralai/Mistral-7B-Instruct-v0.3 config.json", dict(
        vocab_size=32768, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, hidden_act="silu", max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
    ), _TINY),
    # Gemma-3 4B is multimodal; its text_config is a Gemma3ForCausalLM (model.model.layers / .norm).
    # Five sliding-window layers (local rope 10k) per global layer (rope 1M, linear scaling 8).
    "gemma-3-4b": Family("Gemma3TextConfig", "google/gemma-3-4b-it config.json (text_config)", dict(
        vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=131072, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=1024, sliding_window_pattern=6,
        query_pre_attn_scalar=256, rms_norm_eps=1e-6, final_logit_softcapping=None,
        attn_logit_softcapping=None, tie_word_embeddings=True,
    ), _TINY_GEMMA, _UNTIE),
    # Not in the default set: Gemma-2 (final-logit soft-cap 30, attention soft-cap 50; transformers
    # runs its attention soft-cap in eager only and refuses sdpa).
    "gemma-2-2b": Family("Gemma2Config", "google/gemma-2-2b-it config.json", dict(
        vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=8192, rope_theta=10000.0, sliding_window=4096, query_pre_attn_scalar=256,
        final_logit_softcapping=30.0, attn_logit_softcapping=50.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ), _TINY_GEMMA, _UNTIE, ("eager",)),
}
DEFAULT_FAMILIES = ("qwen2.5-3b", "llama-3.1-8b", "mistral-7b-v0.3", "gemma-3-4b")

# Per-size defaults of the flags left unset: full = the sizes; tiny = seconds on a CPU.
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


# ------------------------------------------------------------------------------------- models
def family_config(name: str, size: str, *, layers: int | None = None, sliding_window: int | None = None,
                  eos_token_id: int | None = EOS):
    """The transformers config of ``name`` at ``size``, optionally shortened to ``layers`` layers."""
    import transformers

    family = FAMILIES[name]
    shape = {**family.shape, **(family.tiny if size == "tiny" else {}), **family.random_init}
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if sliding_window is not None and shape.get("sliding_window"):
        shape["sliding_window"] = sliding_window
    config_cls = getattr(transformers, family.config_cls)
    return config_cls(**shape, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=eos_token_id)


def build_model(config, *, dtype: torch.dtype, attn: str, device: str, logit_std: float, seed: int):
    """A randomly initialised causal LM of ``config`` on ``device``, eval mode, its output
    embedding scaled so that logits of a unit-RMS hidden state have standard deviation ``logit_std``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialise where it will run: an 8B model in seconds on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(sharpen_factor(config, logit_std))
    return model


def sharpen_factor(config, logit_std: float) -> float:
    """Output-embedding scale: init std × sqrt(D) is the logit std of a unit-RMS hidden state."""
    return logit_std / (config.initializer_range * math.sqrt(config.hidden_size))


def random_prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 3.. avoid pad/bos/eos)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


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


# ------------------------------------------------------------------------------------- exactness
def naive_reference():
    """``naive_eglr_greedy`` of eglr_harness/decoding/naive_reference.py (asked for here, so that a test can swap
    it)."""
    from eglr_harness.decoding.naive_reference import naive_eglr_greedy

    return naive_eglr_greedy


@contextlib.contextmanager
def inputs_on(model, device):
    """Move the model's positional input_ids to ``device`` (the naive reference builds them on the CPU)."""
    def move(module, args, kwargs):
        return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), kwargs

    handle = model.register_forward_pre_hook(move, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def move_off(threshold: float, observed: list[float], clear) -> float:
    """The midpoint, nearest to ``threshold``, of a gap between sorted ``observed`` values whose
    ends are both ``clear(value, midpoint)``; ``threshold`` itself when no gap is wide enough."""
    values = sorted(set(observed))
    mids = [(a + b) / 2 for a, b in zip(values, values[1:]) if clear(a, (a + b) / 2) and clear(b, (a + b) / 2)]
    mids = [m for m in mids if m > 0]  # thresholds must stay positive
    return min(mids, key=lambda m: abs(m - threshold)) if mids else threshold


def compare_with_naive(model, prompts, *, L: int, tau_h: float, tau_kl: float, new_tokens: int, device) -> dict:
    """Engine (batched, cached) vs naive reference (one prompt at a time, uncached) at one L.

    A threshold within ENTROPY_MARGIN of an observed entropy, or KL_MARGIN of an observed KL, is
    moved and the case re-run: there float noise, not a bug, decides. The thresholds used and the
    closest observed values are in the result.
    """
    naive = naive_reference()
    settings = dict(L=L, alpha=PAPER["alpha"], k_max=PAPER["k_max"])
    for attempt in range(1, MAX_ATTEMPTS + 1):
        sink: list = []
        rows, scores = decode(model, prompts, new_tokens, device=device, scores=True, sink=sink,
                              eglr=dict(settings, tau_kl=tau_kl, tau_h=tau_h))
        entropies = torch.tensor([e for outcome in sink for e in outcome.entropies])
        kls: list[float] = []
        ref_rows, ref_logits, gated = [], [], 0
        with inputs_on(model, device):
            for prompt in prompts:
                tokens, logits, flags = naive(model, prompt, max_new_tokens=new_tokens, eos_ids={EOS}, kl_sink=kls,
                                              tau_kl=tau_kl, tau_h=tau_h, **settings)
                ref_rows.append(tokens)
                ref_logits.append(logits)
                gated += sum(flags)
        h_gap = min((abs(h - tau_h) for h in entropies.tolist()), default=math.inf)  # nats
        kl_gap = min((abs(kl - tau_kl) / tau_kl for kl in kls), default=math.inf)  # relative
        if (h_gap > ENTROPY_MARGIN and kl_gap > KL_MARGIN) or attempt == MAX_ATTEMPTS:
            break
        logger.info("L=%d: a value lies on a threshold (entropy gap %.1e nats, KL gap %.1e); moving it", L, h_gap,
                    kl_gap)
        moved = (move_off(tau_h, entropies.tolist(), lambda v, t: abs(v - t) > ENTROPY_MARGIN)
                 if h_gap <= ENTROPY_MARGIN else tau_h,
                 move_off(tau_kl, kls, lambda v, t: abs(v - t) / t > KL_MARGIN) if kl_gap <= KL_MARGIN else tau_kl)
        if moved == (tau_h, tau_kl):
            break  # no gap wide enough: the result says how close the values are
        tau_h, tau_kl = moved

    first_divergence, max_diff, min_margin = None, 0.0, math.inf
    for r, (got, ref) in enumerate(zip(rows, ref_rows)):
        for step, ref_step in enumerate(ref_logits[r]):
            if step >= len(got) or got[step] != ref[step]:
                top2 = ref_step.topk(2).values
                first_divergence = first_divergence or {"row": r, "step": step,
                                                        "ref_top2_gap": float(top2[0] - top2[1])}
                break
            max_diff = max(max_diff, float((scores[r, step] - ref_step.to(scores.device)).abs().max()))
            top2 = ref_step.topk(2).values
            min_margin = min(min_margin, float(top2[0] - top2[1]))
    return {
        "L": L, "tau_h": tau_h, "tau_kl": tau_kl, "tokens_equal": rows == ref_rows,
        "rows_equal": sum(a == b for a, b in zip(rows, ref_rows)), "rows": len(rows),
        "tokens": sum(map(len, ref_rows)), "gated_tokens": gated, "first_divergence": first_divergence,
        "max_abs_logit_diff": max_diff, "min_top2_logit_gap": _finite(min_margin),
        "entropy_gap_nats": _finite(h_gap), "kl_gap_rel": _finite(kl_gap), "attempts": attempt,
    }


def continuous_vs_naive(model, prompts, *, L: int, tau_h: float, tau_kl: float, new_tokens: int, device) -> dict:
    """The continuous engine's greedy tokens against the naive reference at one L (tokens only)."""
    naive = naive_reference()
    settings = dict(L=L, alpha=PAPER["alpha"], k_max=PAPER["k_max"], tau_kl=tau_kl, tau_h=tau_h)
    rows, _ = decode(model, prompts, new_tokens, device=device, eglr=dict(settings, engine="continuous"))
    with inputs_on(model, device):
        ref = [naive(model, p, max_new_tokens=new_tokens, eos_ids={EOS}, **settings) for p in prompts]
    ref_rows = [r[0] for r in ref]
    divergence = next(({"row": r, "step": next(i for i, (a, b) in enumerate(zip(got + [None], want)) if a != b)}
                       for r, (got, want) in enumerate(zip(rows, ref_rows)) if got != want), None)
    return {"L": L, "tau_h": tau_h, "tau_kl": tau_kl, "tokens_equal": rows == ref_rows,
            "rows_equal": sum(a == b for a, b in zip(rows, ref_rows)), "rows": len(rows),
            "tokens": sum(map(len, ref_rows)), "gated_tokens": sum(sum(r[2]) for r in ref),
            "first_divergence": divergence}


def _finite(value: float) -> float | None:
    """JSON has no infinity: None stands for 'no value observed'."""
    return value if math.isfinite(value) else None


def check_exactness(name: str, args, device: str) -> dict:
    """Check 1 on a shortened, full-width, fp32 model of ``name``."""
    n = args.exact_layers
    config = family_config(name, args.size, layers=n, sliding_window=EXACT_SLIDING_WINDOW)
    prompts = random_prompts([12, 7, 9, 5], config.vocab_size, args.seed)
    spans = sorted({1, n // 2, n})
    attns = [a for a in args.attn if a in FAMILIES[name].attn]
    if not attns:
        raise ValueError(f"--attn={','.join(args.attn)}: {name} supports only {', '.join(FAMILIES[name].attn)}")
    model = build_model(config, dtype=torch.float32, attn=attns[0], device=device, logit_std=args.logit_std,
                        seed=args.seed)
    tau_h = calibrate_tau_h(greedy_entropies(model, prompts, args.exact_new_tokens, device=device))
    result: dict = {"layers": n, "spans": spans, "tau_h_p95": tau_h, "prompt_lengths": list(map(len, prompts)),
                    "new_tokens": args.exact_new_tokens, "fp32": {},
                    "attn_skipped": [a for a in args.attn if a not in attns]}
    for attn in attns:
        model.set_attn_implementation(attn)
        stock, _ = decode(model, prompts, args.exact_new_tokens, device=device)
        plain, _ = decode(model, prompts, args.exact_new_tokens, device=device, eglr=dict(L=0))
        cases = {}
        for gate, threshold in (("p95", tau_h), ("always", 0.0)):
            for L in spans:
                logger.info("%s exactness: %s, tau_h %s, L=%d", name, attn, gate, L)
                cases[f"{gate}/L{L}"] = compare_with_naive(model, prompts, L=L, tau_h=threshold, tau_kl=PAPER["tau_kl"],
                                                           new_tokens=args.exact_new_tokens, device=device)
        result["fp32"][attn] = {"L0_equals_generate": stock == plain, "vs_naive": cases}
    # the continuous engine runs its own slot attention, whatever the model's attn setting; the
    # thresholds are the ones the hf engine's cases settled on (moved off observed values)
    first = result["fp32"][attns[0]]["vs_naive"]
    cont_plain, _ = decode(model, prompts, args.exact_new_tokens, device=device, eglr=dict(L=0, engine="continuous"))
    result["continuous_fp32"] = {"L0_equals_generate": cont_plain == stock, "vs_naive": {
        key: continuous_vs_naive(model, prompts, L=case["L"], tau_h=case["tau_h"], tau_kl=case["tau_kl"],
                                 new_tokens=args.exact_new_tokens, device=device)
        for key, case in first.items()}}

    model.to(torch.bfloat16)
    model.set_attn_implementation(attns[0])
    result["bf16"] = bf16_checks(model, prompts, args, device, span=n // 2, tau_h=tau_h)
    fa2 = "flash_attention_2"
    if device.startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        model.set_attn_implementation(fa2)
        result[f"{fa2}_bf16"] = bf16_checks(model, prompts, args, device, span=n // 2, tau_h=tau_h, vs_naive=True)
    else:
        result[f"{fa2}_bf16"] = {"skipped": "flash_attn not importable" if device.startswith("cuda") else "no cuda"}
    del model
    _free(device)
    result["ok"] = exactness_ok(result)
    return result


def bf16_checks(model, prompts, args, device, *, span: int, tau_h: float, vs_naive: bool = False) -> dict:
    """L=0 equals generate in bf16; EGLR at L=span gating at the p95 and at every token ends with finite logits."""
    stock, _ = decode(model, prompts, args.exact_new_tokens, device=device)
    plain, _ = decode(model, prompts, args.exact_new_tokens, device=device, eglr=dict(L=0))
    out = {"attn": model.config._attn_implementation, "L0_equals_generate": stock == plain, "L": span}
    for gate, threshold in (("p95", tau_h), ("always", 0.0)):
        try:
            _, scores = decode(model, prompts, args.exact_new_tokens, device=device, scores=True,
                               eglr=dict(L=span, tau_h=threshold, **PAPER))
            out[f"finite_{gate}"] = bool(torch.isfinite(scores).all())
        except FloatingPointError as error:  # the engine's own NaN/inf check
            out[f"finite_{gate}"], out[f"error_{gate}"] = False, str(error)
    if vs_naive:  # informational: bf16 noise between cached and uncached passes may flip a token
        out["vs_naive_p95"] = compare_with_naive(model, prompts, L=span, tau_h=tau_h, tau_kl=PAPER["tau_kl"],
                                                 new_tokens=args.exact_new_tokens, device=device)
    return out


def exactness_ok(result: dict) -> bool:
    """Every fp32 case equals the naive reference, L=0 equals generate, bf16 is finite (FA2 is informational)."""
    fp32 = all(v["L0_equals_generate"] and all(c["tokens_equal"] for c in v["vs_naive"].values())
               for v in [*result["fp32"].values(), result["continuous_fp32"]])
    bf16 = result["bf16"]
    return bool(fp32 and bf16["L0_equals_generate"] and bf16["finite_p95"] and bf16["finite_always"])


# ------------------------------------------------------------------------------------- placement
def split_device_map(model, first, second) -> dict:
    """Layers [0, N/2), the embeddings and rotary tables on ``first``; the rest, the final norm and
    lm_head on ``second``. The random models here are untied (``_UNTIE``), so no weight is split."""
    decoder = model.model
    layers = len(decoder.layers)
    device_map = {}
    for name, _ in decoder.named_children():
        if name == "layers":
            device_map.update({f"model.layers.{i}": first if i < layers // 2 else second for i in range(layers)})
        elif name == "norm":
            device_map[f"model.{name}"] = second
        else:
            device_map[f"model.{name}"] = first
    for name, _ in model.named_children():
        if name != "model":
            device_map[name] = second
    return device_map


def check_placement(name: str, args, device: str) -> dict:
    """Check 2: the same tokens (L=0 and L=N/2) with half the model offloaded as on one device.

    With CUDA: GPU + CPU (accelerate executes CPU-mapped modules on the GPU, streaming weights, as
    ``parallelize=True`` with a CPU ``max_memory`` does). Without CUDA the same code path runs as
    CPU + disk offload and the check is marked skipped.
    """
    try:
        from accelerate import dispatch_model
    except ImportError:
        return {"skipped": "accelerate not installed (pip install accelerate)"}
    n = args.exact_layers
    config = family_config(name, args.size, layers=n, sliding_window=EXACT_SLIDING_WINDOW)
    prompts = random_prompts([12, 7, 9, 5], config.vocab_size, args.seed + 1)
    model = build_model(config, dtype=torch.float32, attn=FAMILIES[name].attn[0], device=device,
                        logit_std=args.logit_std, seed=args.seed)
    tau_h = calibrate_tau_h(greedy_entropies(model, prompts, args.exact_new_tokens, device=device))
    modes = {"L0": dict(L=0), f"L{n // 2}": dict(L=n // 2, tau_h=tau_h, **PAPER),
             f"L{n // 2}_always": dict(L=n // 2, tau_h=0.0, **PAPER)}
    single = {mode: decode(model, prompts, args.exact_new_tokens, device=device,
                           eglr=eglr)[0] for mode, eglr in modes.items()}
    cuda = device.startswith("cuda")
    first, second = (0, "cpu") if cuda else ("cpu", "disk")
    model.to("cpu")
    device_map = split_device_map(model, first, second)
    with tempfile.TemporaryDirectory() as offload_dir:
        dispatch_model(model, device_map=device_map, main_device=first, offload_dir=offload_dir)
        split = {mode: decode(model, prompts, args.exact_new_tokens, device=device, eglr=eglr)[0]
                 for mode, eglr in modes.items()}
        del model
    _free(device)
    result = {"devices": [str(first), second], "layers": n, "tau_h_p95": tau_h,
              "tokens_equal": {mode: single[mode] == split[mode] for mode in modes}}
    result["ok"] = all(result["tokens_equal"].values())
    if not cuda:
        result["skipped"] = "no cuda: ran as CPU + disk offload instead of GPU + CPU"
    return result


# ------------------------------------------------------------------------------------- speed / memory
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import gc

    _continuous_engine.cache_clear()  # engines hold their model
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


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


NOT_REACHED = {"skipped": "not reached: the part stopped before it (see its `interrupted` or `error`)"}
STARTED = {"skipped": "started, not finished: the part stopped during it (see its `interrupted` or `error`)"}


def run_kv_bucket(prompt_len: int, new_tokens: int) -> int:
    """A K/V bucket that holds a whole speed run (prompt, new tokens, the engine's 2 spare columns),
    even: the continuous engine's attention then has one width, and a captured step one graph per
    row-count bucket (like the static cache of ``generate_static``, sized to the run)."""
    need = prompt_len + new_tokens + 2
    return need + need % 2


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


GOALS = (  # issue 29: (name, figure or profile key, mode, target, comparison)
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
    """Each goal of issue 29: {"value", "target", "met"}; value None where its modes did not run, met
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


# ------------------------------------------------------------------------------------- pool (issue 32)
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
            # rows together): what "ms per step" means for the GPU goals (issue 57)
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
    """Check 5 (issue 32): continuous batching with refill against ``generate`` on the same prompts, in one run.

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
        # the captured modes' time per engine step (one batched forward of every running row), issue 57's goal
        "ms_per_step": {mode: run["ms_per_step"] for mode, run in runs.items() if "ms_per_step" in run},
        "ms_per_step_ratio[cpoolc/cL0c]": (runs["cpoolc"]["ms_per_step"] / runs["cL0c"]["ms_per_step"]
                                           if "ms_per_step" in runs.get("cpoolc", {})
                                           and "ms_per_step" in runs.get("cL0c", {}) else None),
    }}


# ------------------------------------------------------------------------------------- budget
class BudgetExhausted(BaseException):
    """Raised by ``Budget.alarm`` in the main thread when the family's time is spent. A BaseException,
    so that the checks' own ``except Exception`` (``guarded``) let it through."""


class Budget:
    """The time one family may take (``--budget_s``; None: no limit).

    Parts start only while time is left (``allows``); ``alarm`` interrupts the part that is running
    when the time runs out (SIGALRM, main thread only), and the report says what was interrupted
    and what was skipped. A compilation or a CUDA-graph capture cut short leaves the process fit
    only for writing the report: everything after it is skipped.
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.started = time.perf_counter()
        self.exhausted = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def allows(self, need: float = 0.0) -> bool:
        """Whether a part that needs ``need`` seconds may start."""
        return not self.exhausted and self.left() > need

    def skip_reason(self, need: float = 0.0, why: str = "") -> str:
        left = max(self.left(), 0.0)
        return (f"budget: {left:.0f} s of --budget_s {self.seconds:g} left" + (f", {why}" if why else "")
                + (" (spent)" if self.exhausted or left <= need and not why else ""))

    @contextlib.contextmanager
    def alarm(self):
        """Raise ``BudgetExhausted`` inside the block when the time runs out."""
        import signal
        import threading

        usable = (self.seconds is not None and hasattr(signal, "setitimer")
                  and threading.current_thread() is threading.main_thread())
        if not usable:
            yield
            return

        def ring(signum, frame):
            self.exhausted = True
            raise BudgetExhausted(f"--budget_s {self.seconds:g} spent after {self.elapsed():.0f} s")

        previous = signal.signal(signal.SIGALRM, ring)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 1e-3))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------------- main
def environment(device: str) -> dict:
    import transformers

    env = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "platform": platform.platform()}
    for package in ("accelerate", "flash_attn"):
        spec = importlib.util.find_spec(package)
        env[package] = getattr(__import__(package), "__version__", "?") if spec is not None else None
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    else:
        env["device_name"] = platform.processor() or platform.machine()
        env["cpu_threads"] = torch.get_num_threads()
    return env


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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


def main(argv: list[str] | None = None) -> dict:
    """Run the chosen checks on the chosen families; returns (and with --out writes) the results.

    The JSON is rewritten after every part and every speed mode: a run cut short keeps what it finished."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    device, checks = args.device, set(args.checks)
    report: dict = {"settings": {k: v for k, v in vars(args).items()}, "paper_settings": PAPER,
                    "environment": environment(device), "families": {}}
    started = time.perf_counter()

    def save() -> None:
        report["wall_s"] = time.perf_counter() - started
        report["summary"] = summarise(report)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")

    for name in args.families:
        family = FAMILIES[name]
        config = family_config(name, args.size)
        entry: dict = {"source": family.source, "config_cls": family.config_cls, "random_init": family.random_init,
                       "output_embedding_scale": sharpen_factor(config, args.logit_std),
                       "config": {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_")}}
        report["families"][name] = entry
        run_family(name, entry, args, device, checks, save)
        logger.info("%s done (%.0f s so far)", name, time.perf_counter() - started)
        save()
    print(json.dumps(report["summary"], indent=1, default=str))
    return report


def run_family(name: str, entry: dict, args, device: str, checks: set[str], save) -> None:
    """The checks of one family within its budget, in ``entry``: exactness, placement, speed (+ memory), pool.

    A part the budget does not reach is ``{"skipped": ...}``; the one the alarm interrupts keeps what
    it finished and says ``"interrupted"``."""
    budget = Budget(args.budget_s)
    entry["budget"] = {"budget_s": args.budget_s}
    parts = [part for part in ("exactness", "placement", "speed", "pool") if part in checks or
             (part == "speed" and "memory" in checks)]
    checks_of = {"exactness": check_exactness, "placement": check_placement}
    running = None
    try:
        with budget.alarm():
            for part in parts:
                if not budget.allows():
                    entry[part] = {"skipped": budget.skip_reason()}
                    continue
                running = part
                if part in ("speed", "pool"):  # filled mode by mode, saved after each
                    result = entry[part] = {}
                    out = (guarded(check_speed_and_memory, name, args, device, checks, result, budget, save)
                           if part == "speed" else guarded(check_pool, name, args, device, result, budget, save))
                    if out is not result:  # an error: keep the modes that finished beside it
                        result.update(out)
                else:
                    entry[part] = guarded(checks_of[part], name, args, device)
                running = None
                save()
    except BudgetExhausted as spent:
        logger.warning("%s: %s; %s interrupted, the rest skipped", name, spent, running)
        if running is not None:
            previous = entry.get(running) if isinstance(entry.get(running), dict) else {}
            during = previous.pop("running", running)
            entry[running] = {**previous, "interrupted": f"{spent} (during {during})"}
        for part in parts[parts.index(running) + 1 if running in parts else len(parts):]:
            entry.setdefault(part, {"skipped": budget.skip_reason()})
        try:  # an interrupted CUDA-graph capture may leave the device unusable: the report comes first
            _free(device)
        except Exception:  # noqa: BLE001
            logger.exception("%s: freeing the device after the interruption failed", name)
    entry["budget"].update({"spent_s": budget.elapsed(), "exhausted": budget.exhausted})


def guarded(check, name: str, args, device: str, *rest) -> dict:
    """Run one check; an exception becomes {"ok": False, "error": ...} so the other checks still run."""
    try:
        return check(name, args, device, *rest)
    except Exception as error:  # noqa: BLE001 - reported in the JSON, with the traceback in the log
        logger.exception("%s: %s failed", name, check.__name__)
        _free(device)
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}


def summarise(report: dict) -> dict:
    """One line per family and check: the verdicts, the headline speed figures, the goals, what was skipped."""
    out = {}
    for name, entry in report["families"].items():
        line = {}
        exact = entry.get("exactness")
        if exact is not None:
            line["exact"] = exact.get("ok", exact.get("skipped") or exact.get("interrupted"))
            cont = exact.get("continuous_fp32")
            if cont:
                line["exact[continuous]"] = cont["L0_equals_generate"] and all(
                    c["tokens_equal"] for c in cont["vs_naive"].values())
        if "placement" in entry:
            line["placement"] = entry["placement"].get("ok", entry["placement"].get("skipped"))
        speed = entry.get("speed", {})
        for batch, figures in speed.get("batches", {}).items():
            line[f"b{batch}"] = {k: round(figures[k], 3) for k in (
                "wall_ratio_L0_vs_generate", "wall_ratio_L_vs_L0", "wall_ratio_generate_static_vs_generate",
                "wall_ratio_L0_vs_generate_static[continuous]", "wall_ratio_L_vs_L0[continuous]",
                "wall_ratio_L0_vs_generate_static[continuous,compiled]", "wall_ratio_L_vs_L0[continuous,compiled]",
                "per_row_bound", "batched_bound", "rho") if figures.get(k) is not None}
            goals = {goal: v["met"] for goal, v in figures.get("goals", {}).items() if v["met"] is not None}
            if goals:
                line[f"b{batch}"]["goals_met"] = goals
            skipped = sorted(mode for mode, run in figures["runs"].items() if "skipped" in run)
            if skipped:
                line[f"b{batch}"]["skipped"] = skipped
            captured = {mode: {k: run.get(k) for k in CAPTURED_SUMMARY} for mode, run in figures["runs"].items()
                        if "dynamo_graphs_warmup" in run}
            if captured:
                line[f"b{batch}"]["captured"] = captured
        pool = entry.get("pool")
        if pool is not None:
            line["pool"] = {mode: run.get("tokens_per_s", run.get("skipped")) for mode, run in pool.get("modes",
                                                                                                        {}).items()}
            for key in ("skipped", "interrupted", "error"):
                if key in pool:
                    line["pool"][key] = pool[key]
        for key in ("error", "interrupted", "skipped"):
            if key in speed:
                line[f"speed_{key}"] = speed[key]
        if "memory" in speed:
            line["memory_peak_ratio"] = speed["memory"].get("peak_ratio", speed["memory"].get("skipped"))
        if entry.get("budget", {}).get("exhausted"):
            line["budget"] = f"spent ({entry['budget']['spent_s']:.0f} s of {entry['budget']['budget_s']:g})"
        out[name] = line
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
