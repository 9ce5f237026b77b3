"""``eglr-hf``: lm-eval's ``HFLM`` with EGLR decoding (the lm-eval glue; the maths is in ``decoding/``).

Everything HFLM accepts keeps working (``pretrained``, ``gguf_file``, ``dtype``, ``device``,
``batch_size``, ``parallelize``, chat templates, accelerate data parallel). On top of it:

- model args ``L``, ``T``, ``alpha``, ``k_max``, ``tau_kl``, ``tau_h`` (float or ``auto``),
  ``top_k``, ``top_p``, ``seed``, ``model_config`` (a preset in ``model_configs/``),
  ``calib_limit`` and ``rollout_cache`` (a folder; config-aware resume);
- per request, the task's pool (gen kwargs ``eglr_L``/``eglr_T``/``eglr_budget_*``) and the
  pool rule of ``pool.py`` decide the (L, T) cell of each repeat;
- each response is a :class:`~eglr_harness.rollout.Rollout` (a ``str`` with L, T, cycle);
- compute accounting lands in the results JSON under ``config.eglr``.

Precedence of every setting: model args > gen kwargs > preset > built-in default.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from eglr_harness import config as defaults
from eglr_harness.calibrate import DEFAULT_CALIB_LIMIT, TauHCache, calibrated_threshold, calibration_key
from eglr_harness.config import EglrConfig, parse_tau_h
from eglr_harness.decoding.accounting import EglrStats
from eglr_harness.decoding.generate import eglr_generate
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.pool import TASK_POOL_KEYS, PoolPlan, resolve_pool, task_axes
from eglr_harness.presets import benchmark_of, load_preset
from eglr_harness.rollout import Rollout
from eglr_harness.rollout_store import RolloutStore, rollout_key
from eglr_harness.specs import parse_L_spec, parse_T_spec

logger = logging.getLogger(__name__)

# Concrete per-cell settings carried in gen kwargs from generate_until to _model_generate.
_CELL_KEYS = ("eglr_L", "eglr_T", "eglr_cycle", "eglr_tau_h")


def _follow_lm_eval_logging() -> None:
    """Show our INFO lines (pools, tau_h, reuse) where lm-eval shows its own, unless the program
    configured logging itself (root handlers)."""
    ours, theirs = logging.getLogger("eglr_harness"), logging.getLogger("lm_eval")
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return
    ours.setLevel(theirs.getEffectiveLevel())
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.propagate = False


def cell_name(L: int, T: float) -> str:
    return f"L={L},T={T}"


@register_model("eglr-hf")
class EglrHFLM(HFLM):
    """Hugging Face causal LM decoded with Entropy-Gated Latent Recursion."""

    def __init__(self, pretrained=None, L=None, T=None, alpha=None, k_max=None, tau_kl=None, tau_h=None,
                 top_k=None, top_p=None, seed=None, model_config=None, calib_limit=DEFAULT_CALIB_LIMIT,
                 rollout_cache=None, **kwargs):
        _follow_lm_eval_logging()
        preset = load_preset(model_config) if model_config else {"model_args": {}, "eglr": {}, "tau_h": {}, "name": None}
        hf_args = {**preset["model_args"], **kwargs}
        if pretrained is not None:
            hf_args["pretrained"] = pretrained
        if "pretrained" not in hf_args:
            raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
        self.preset = preset
        pe = preset["eglr"]

        # Axes the user pinned (model args) vs defaults that tasks may override.
        self.user_L = parse_L_spec(L) if L is not None else None
        self.user_T = parse_T_spec(T) if T is not None else None
        self.default_L = parse_L_spec(pe.get("L", defaults.DEFAULT_L), name="preset L")[0]
        self.default_T = parse_T_spec(pe.get("T", 0.0), name="preset T")[0]
        self._explicit_sampling = {k: v for k, v in (("top_k", top_k), ("top_p", top_p)) if v is not None}
        self._preset_sampling = {k: pe[k] for k in ("top_k", "top_p") if k in pe}
        # Validate the scalar settings once, through the config dataclass.
        base = EglrConfig(
            L=0, alpha=float(_first(alpha, pe.get("alpha"), defaults.DEFAULT_ALPHA)),
            k_max=int(_first(k_max, pe.get("k_max"), defaults.DEFAULT_K_MAX)),
            tau_kl=float(_first(tau_kl, pe.get("tau_kl"), defaults.DEFAULT_TAU_KL)),
            top_k=int(_first(top_k, pe.get("top_k"), defaults.DEFAULT_TOP_K)),
            top_p=float(_first(top_p, pe.get("top_p"), defaults.DEFAULT_TOP_P)),
            seed=int(_first(seed, pe.get("seed"), defaults.DEFAULT_SEED)),
        )
        self.settings = base
        self.tau_h_arg = parse_tau_h(tau_h) if tau_h is not None else None
        if not isinstance(calib_limit, int) or calib_limit < 1:
            raise ValueError(f"`calib_limit`={calib_limit!r} is not allowed; allowed: an int >= 1.")
        self.calib_limit = calib_limit

        super().__init__(**hf_args)

        self.parts = find_model_parts(self.model)
        self.num_layers = self.parts.num_layers
        for value in self.user_L or ():
            EglrConfig(L=value).validate_for_model(self.num_layers)
        self._fingerprint = {
            "pretrained": _model_id(hf_args["pretrained"]), "gguf_file": hf_args.get("gguf_file"),
            "revision": hf_args.get("revision", "main"), "dtype": str(self.model.dtype),
            "max_length": self.max_length, "settings": base.as_dict(),
        }
        self._store = RolloutStore(rollout_cache, rank=self.rank) if rollout_cache else None
        self._memo: dict[str, str] = {}
        self._stats: dict[tuple[int, float], EglrStats] = defaultdict(lambda: EglrStats(num_layers=self.num_layers))
        self.tau_h_by_task: dict[str, float] = {}
        self._plans_logged: set = set()
        self._record_entropies = False
        self._refiners: list = []
        self.calibrate_always = False  # eglr-calibrate sets it to calibrate L=0 runs too
        self._gathered_stats = None
        # Rollouts taken from the store or the in-run memo carry no accounting: count them per cell
        # so that the results say how much of the pool the compute figures cover.
        self._reused: Counter = Counter()
        self._gathered_reused = None

    # ------------------------------------------------------------------ lm-eval hooks
    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            raise ValueError(
                "eglr-hf does not support lm-eval's --use_cache: it keys on (context, gen_kwargs) and would "
                "collapse a pool of (L, T) configs into one answer. Use --model_args rollout_cache=DIR instead "
                "(config-aware and resumable)."
            )
        super().set_cache_hook(cache_hook)

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        jobs = self._assign_cells(requests)
        for task in dict.fromkeys(job["task"] for job in jobs):
            task_jobs = [job for job in jobs if job["task"] == task]
            if self.calibrate_always or any(job["L"] > 0 for job in task_jobs):
                self._ensure_tau_h(task, task_jobs, disable_tqdm)
        # Identical (context, cell) jobs -- deterministic cells across cycles -- run once.
        concrete = [(job["context"], self._concrete_gen_kwargs(job)) for job in jobs]
        item_of = [(context, _freeze(gk)) for context, gk in concrete]
        unique = dict(zip(item_of, concrete))  # first concrete item of each distinct key
        texts = dict(zip(unique, self._generate(list(unique.values()), disable_tqdm)))
        self._gather_stats()
        return [Rollout(texts[item], L=job["L"], T=job["T"], cycle=job["cycle"]) for item, job in zip(item_of, jobs)]

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        L = int(generation_kwargs.pop("eglr_L", 0))
        T = float(generation_kwargs.pop("eglr_T", 0.0))
        cycle = int(generation_kwargs.pop("eglr_cycle", 0))
        tau_h = float(generation_kwargs.pop("eglr_tau_h", math.inf))
        s = self.settings
        eglr_kwargs = dict(
            custom_generate=eglr_generate, L=L, alpha=s.alpha, k_max=s.k_max, tau_kl=s.tau_kl, tau_h=tau_h,
            seed=s.seed, seed_salt=f"{cell_name(L, T)},cycle={cycle}", eglr_stats=self._stats[(L, T)],
            eglr_stop_strings=list(stop or []), eglr_tokenizer=self.tokenizer,  # rows stop on their own stop strings
        )
        if self._record_entropies:
            eglr_kwargs["eglr_refiner_sink"] = self._refiners
        return super()._model_generate(context, max_length, stop, **generation_kwargs, **eglr_kwargs)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        total = EglrStats(num_layers=self.num_layers)
        cells = self._gathered_stats if self._gathered_stats is not None else self._stats
        reused = self._gathered_reused if self._gathered_reused is not None else self._reused
        for stats in cells.values():
            total.merge(stats)
        s = self.settings
        info["eglr"] = {
            "num_layers": self.num_layers,
            "preset": self.preset.get("name"),
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed},
            "tau_h": dict(self.tau_h_by_task),
            "stats": {
                "total": total.summary(),
                "cells": {cell_name(*cell): st.summary() for cell, st in sorted(cells.items())},
                "reused_rollouts": {
                    "total": sum(reused.values()),
                    "cells": {cell_name(*cell): n for cell, n in sorted(reused.items())},
                },
            },
        }
        return info

    # ------------------------------------------------------------------ pools
    def _pool(self, task: str | None, gen_kwargs: dict, repeats: int) -> PoolPlan:
        plan = resolve_pool(user_L=self.user_L, user_T=self.user_T, task=task_axes(gen_kwargs),
                            default_L=self.default_L, default_T=self.default_T, repeats=repeats, task_name=task)
        for L, _T in plan.cells:
            EglrConfig(L=L).validate_for_model(self.num_layers)
        if task not in self._plans_logged:
            self._plans_logged.add(task)
            logger.info("eglr-hf task %s: pool of %d configs over %d repeats (%s): %s", task, len(plan.cells),
                        repeats, plan.reason, ", ".join(cell_name(*c) for c in plan.cells))
            if len(plan.cells) < repeats and repeats % len(plan.cells):
                logger.warning("eglr-hf task %s: %d repeats do not divide evenly over %d configs; configs "
                               "repeat unevenly in majority votes.", task, repeats, len(plan.cells))
        return plan

    def _assign_cells(self, requests: list[Instance]) -> list[dict]:
        """Repeat i of a request (lm-eval passes it i+1-th time) runs pool cell i mod |pool|."""
        seen: Counter = Counter()
        plans: dict = {}
        jobs = []
        for req in requests:
            context, gen_kwargs = req.args
            repeat_key = (req.task_name, req.doc_id, req.idx, context)
            repeat = seen[repeat_key]
            seen[repeat_key] += 1
            repeats = max(int(req.repeats or 1), 1)
            plan_key = (req.task_name, _freeze(gen_kwargs), repeats)
            if plan_key not in plans:
                plans[plan_key] = self._pool(req.task_name, gen_kwargs, repeats)
            (L, T), cycle = plans[plan_key].cell_for_repeat(repeat)
            jobs.append({"task": req.task_name, "context": context, "gen_kwargs": gen_kwargs,
                         "L": L, "T": T, "cycle": cycle if T > 0 else 0})
        return jobs

    def _sampling_value(self, name: str, gen_kwargs: dict):
        return _first(self._explicit_sampling.get(name), gen_kwargs.get(name), self._preset_sampling.get(name),
                      getattr(self.settings, name))

    def _concrete_gen_kwargs(self, job: dict) -> dict:
        """The task's gen kwargs with the pool keys replaced by one concrete cell."""
        gk = {k: v for k, v in job["gen_kwargs"].items() if k not in TASK_POOL_KEYS}
        L, T = job["L"], job["T"]
        if T > 0:
            gk.update(do_sample=True, temperature=T, top_k=int(self._sampling_value("top_k", gk)),
                      top_p=float(self._sampling_value("top_p", gk)), eglr_cycle=job["cycle"])
        else:
            gk.update(do_sample=False, temperature=0.0)
            gk.pop("top_k", None), gk.pop("top_p", None)
        gk.update(eglr_L=L, eglr_T=T)
        if L > 0:
            gk["eglr_tau_h"] = self.tau_h_by_task[job["task"]]
        return gk

    # ------------------------------------------------------------------ tau_h
    def _tau_h_setting(self, task: str | None):
        if self.tau_h_arg is not None:
            return self.tau_h_arg
        table = self.preset["tau_h"]
        for key in (task, benchmark_of(task), "default"):
            if key in table:
                return table[key]
        return "auto"

    def _ensure_tau_h(self, task: str | None, jobs: list[dict], disable_tqdm: bool) -> None:
        if task in self.tau_h_by_task:
            return
        setting = self._tau_h_setting(task)
        if setting != "auto":
            self.tau_h_by_task[task] = setting
            return
        contexts = list(dict.fromkeys(job["context"] for job in jobs))[: self.calib_limit]
        greedy = self._concrete_gen_kwargs({**jobs[0], "L": 0, "T": 0.0, "cycle": 0})
        key = calibration_key(self._fingerprint, contexts, greedy)
        cache = TauHCache()
        if (hit := cache.get(key)) is not None:
            self.tau_h_by_task[task] = hit["tau_h"]
            logger.info("eglr-hf task %s: tau_h = %.4f nats (cached calibration, %s)", task, hit["tau_h"], cache.path)
            return
        logger.info("eglr-hf task %s: calibrating tau_h on a greedy run of %d prompts", task, len(contexts))
        self._record_entropies, self._refiners = True, []
        try:
            self._generate([(c, dict(greedy)) for c in contexts], disable_tqdm)  # also reused as the L=0 rollouts
            entropies = [e for refiner in self._refiners for e in refiner.entropies]
        finally:
            self._record_entropies, self._refiners = False, []
        values = torch.cat(entropies) if entropies else torch.empty(0)
        tau = calibrated_threshold(values)
        self.tau_h_by_task[task] = tau
        cache.put(key, {"tau_h": tau, "task": task, "model": self._fingerprint["pretrained"],
                        "prompts": len(contexts), "tokens": int(values.numel())})
        logger.info("eglr-hf task %s: tau_h = %.4f nats (95th percentile of %d token entropies, cap %.1f)",
                    task, tau, values.numel(), defaults.TAU_H_CAP)

    # ------------------------------------------------------------------ generation with resume
    def _generate(self, items: list[tuple[str, dict]], disable_tqdm: bool) -> list[str]:
        """Generate (context, concrete gen kwargs) items, reusing finished rollouts."""
        keys = [rollout_key(self._fingerprint, c, g) for c, g in items]
        texts: list[str | None] = []
        for key in keys:
            text = self._memo.get(key)
            if text is None and self._store is not None:
                text = self._store.get(key)
            texts.append(text)
        missing = [i for i, t in enumerate(texts) if t is None]
        if len(missing) < len(items):
            logger.info("eglr-hf: %d of %d rollouts reused from earlier work", len(items) - len(missing), len(items))
            self._reused.update(
                (int(items[i][1]["eglr_L"]), float(items[i][1]["eglr_T"])) for i, t in enumerate(texts) if t is not None
            )
        if missing:
            instances = [Instance("generate_until", doc={}, arguments=items[i], idx=0) for i in missing]
            previous_hook = self.cache_hook
            self.cache_hook = _RolloutHook(self)  # HFLM reports each finished text here, batch by batch
            try:
                fresh = HFLM.generate_until(self, instances, disable_tqdm=disable_tqdm)
            finally:
                self.cache_hook = previous_hook
            for i, text in zip(missing, fresh):
                texts[i] = text
        return texts

    def _remember(self, context: str, gen_kwargs: dict, text: str) -> None:
        key = rollout_key(self._fingerprint, context, gen_kwargs)
        self._memo[key] = text
        if self._store is not None:
            self._store.put(key, text)

    def _gather_stats(self) -> None:
        """With several processes, give every rank the accounting of all (rank 0 writes results)."""
        if self.world_size <= 1 or not torch.distributed.is_initialized():
            return
        gathered: list = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, (dict(self._stats), dict(self._reused)))
        merged: dict = defaultdict(lambda: EglrStats(num_layers=self.num_layers))
        reused: Counter = Counter()
        for part_stats, part_reused in gathered:
            for cell, stats in part_stats.items():
                merged[cell].merge(stats)
            reused.update(part_reused)
        self._gathered_stats, self._gathered_reused = merged, reused


class _RolloutHook:
    """Receives HFLM's per-result ``add_partial`` calls and files them as finished rollouts."""

    def __init__(self, lm: EglrHFLM):
        self.lm = lm

    def add_partial(self, attr, req, res) -> None:
        if attr == "generate_until":
            context, gen_kwargs = req
            self.lm._remember(context, gen_kwargs, res)


def _model_id(pretrained) -> str:
    """A hub id or folder, also when HFLM was handed an already loaded model object."""
    if isinstance(pretrained, str):
        return pretrained
    return getattr(getattr(pretrained, "config", None), "_name_or_path", None) or type(pretrained).__name__


def _first(*values):
    return next((v for v in values if v is not None), None)


def _freeze(value):
    """A hashable, order-independent form of gen kwargs."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value
