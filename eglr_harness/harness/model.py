"""``eglr-hf``: lm-eval's ``HFLM`` decoded with EGLR. Glue only: the rules live in leaf modules.

Everything HFLM accepts keeps working (``pretrained``, ``gguf_file``, ``dtype``, ``device``,
``batch_size``, ``parallelize``, chat templates, accelerate data parallel). On top of it the model
args of ``settings.RunSettings``. Per request: the pool rule (``pool.py``) assigns each repeat its
``Cell``; ``tau_h=auto`` is calibrated per task (``calibrate.py``); finished rollouts are reused
from the run and the rollout store (``stores.py``); each response is a ``rollout.Rollout``;
compute accounting (``accounts.py``) lands in the results JSON under ``config.eglr``.
"""

from __future__ import annotations

import inspect
import logging

from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm
from transformers import PreTrainedModel

from eglr_harness.accounts import RunAccounts
from eglr_harness.calibrate import DEFAULT_CALIB_LIMIT, calibrate, first_reported
from eglr_harness.cell import Cell
from eglr_harness.config import EglrConfig
from eglr_harness.decoding.generate import eglr_generate
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.distributed import process_gather
from eglr_harness.harness.continuous import (
    DEFAULT_ENGINE, check_engine, choose_engine, generate_continuous, unsupported_options,
)
from eglr_harness.model_args import USE_CACHE_REFUSAL, check_model_args
from eglr_harness.model_names import loaded_name, model_name
from eglr_harness.pool import Job, PoolPlan, assign_jobs
from eglr_harness.presets import load_preset
from eglr_harness.rollout import Rollout
from eglr_harness.settings import RunSettings, cell_config
from eglr_harness.stores import RolloutStore, TauHCache, content_key, loaded_model_fingerprint

logger = logging.getLogger(__name__)
# what HFLM takes by name, and what it forwards to from_pretrained
_PASSTHROUGH_ARGS = (*inspect.signature(HFLM.__init__).parameters, *inspect.signature(PreTrainedModel.from_pretrained).parameters)


def check_eglr_model_args(args: dict) -> None:
    """Refuse a model arg that neither eglr-hf, nor HFLM, nor from_pretrained takes (``model_args.py``)."""
    check_model_args(args, _PASSTHROUGH_ARGS)


_NO_PRESET = {"model_args": {}, "eglr": {}, "tau_h": {}, "name": None}


@register_model("eglr-hf")
class EglrHFLM(HFLM):
    """Hugging Face causal LM decoded with Entropy-Gated Latent Recursion."""

    def __init__(self, pretrained=None, L=None, T=None, alpha=None, k_max=None, tau_kl=None, tau_h=None,
                 top_k=None, top_p=None, seed=None, model_config=None, calib_limit=DEFAULT_CALIB_LIMIT,
                 rollout_cache=None, engine=DEFAULT_ENGINE, **kwargs):
        _follow_lm_eval_logging()
        check_eglr_model_args(kwargs)
        self.preset = load_preset(model_config) if model_config else _NO_PRESET
        check_eglr_model_args(self.preset["model_args"])
        hf_args = {**self.preset["model_args"], **kwargs}
        if pretrained is not None:
            hf_args["pretrained"] = pretrained
        if "pretrained" not in hf_args:
            raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
        self.engine = check_engine(engine)
        self.settings = RunSettings.from_args(self.preset, L=L, T=T, alpha=alpha, k_max=k_max, tau_kl=tau_kl,
                                              tau_h=tau_h, top_k=top_k, top_p=top_p, seed=seed, calib_limit=calib_limit)
        super().__init__(**hf_args)

        self.num_layers = find_model_parts(self.model).num_layers
        for value in self.settings.user_L or ():
            EglrConfig(L=value).validate_for_model(self.num_layers)
        self.model_name = model_name({k: v for k, v in hf_args.items() if isinstance(v, str)}) or loaded_name(hf_args["pretrained"])
        self._fingerprint = loaded_model_fingerprint(self.model, hf_args, settings=self.settings.base.as_dict(),
                                                     max_length=self.max_length,
                                                     add_bos_token=getattr(self, "add_bos_token", None))
        self._store = RolloutStore(rollout_cache, rank=self.rank) if rollout_cache else None
        self._gather = process_gather(self.world_size)
        self._memo: dict[str, dict] = {}  # rollout key -> {"text", "signals"} (as in the rollout store)
        self.accounts = RunAccounts(self.num_layers)
        self._gathered_accounts: RunAccounts | None = None
        self.tau_h_by_task: dict[str, float] = {}
        self._plans: dict = {}
        self._entropy_sink: list | None = None  # set while calibrating: refiners of greedy batches
        self._calibrating: str | None = None  # the task whose tau_h is being calibrated
        self.calibrate_always = False  # eglr-calibrate sets it to calibrate L=0 runs too
        self._warned_loglikelihood = False
        self._continuous = choose_engine(self, self.engine)
        self._fallback_reasons: set[tuple[str, ...]] = set()  # options that sent requests to generate

    # ------------------------------------------------------------------ lm-eval hooks
    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            raise ValueError(USE_CACHE_REFUSAL)
        super().set_cache_hook(cache_hook)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        self._warn_plain_scoring()
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self._warn_plain_scoring()
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)

    def _warn_plain_scoring(self) -> None:
        if not self._warned_loglikelihood:
            self._warned_loglikelihood = True
            logger.warning("eglr-hf: loglikelihood requests are scored by the plain model; EGLR changes generation only.")

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        jobs = self._jobs(requests)
        self._log_plan(jobs)
        self._ensure_tau_h_of(jobs, disable_tqdm, every_task=self.calibrate_always)
        # Identical (context, concrete cell) jobs -- deterministic cells across cycles -- run once.
        items = [(j.context, self._concrete(j)) for j in jobs]
        keys = [content_key(self._fingerprint, c, g) for c, g in items]
        unique = dict(zip(keys, items))
        texts = dict(zip(unique, self._generate(list(unique.values()), disable_tqdm)))
        self._gathered_accounts = self.accounts.gathered(self._gather)
        return [Rollout(texts[key], L=j.cell.L, T=j.cell.T, cycle=j.cycle, signals=self._memo[key].get("signals"))
                for key, j in zip(keys, jobs)]

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        config, cycle, hf_kwargs = cell_config(self.settings, generation_kwargs)
        cell = Cell(config.L, config.T)
        extra = {"eglr_refiner_sink": self._entropy_sink} if self._entropy_sink is not None else {}
        return super()._model_generate(
            context, max_length, stop, **hf_kwargs, custom_generate=eglr_generate, eglr_config=config,
            seed_salt=f"{cell.label},cycle={cycle}", eglr_stats=self.stats_for(cell),
            eglr_stop_strings=list(stop or []), eglr_tokenizer=self.tokenizer,  # rows stop on their own stop strings
            **extra,
        )

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        s = self.settings.base
        info["eglr"] = {
            "model": self.model_name,
            "num_layers": self.num_layers,
            "preset": self.preset.get("name"),
            "engine": self.engine_used,
            "engine_requested": self.engine,
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed},
            "tau_h": dict(self.tau_h_by_task),
            "stats": (self._gathered_accounts or self.accounts).summary(),
        }
        return info

    def _log_plan(self, jobs: list[Job]) -> None:
        """Say once, before the first token, what this call will decode: a long run should not look hung."""
        for task in sorted({j.task for j in jobs}, key=str):
            mine = [j for j in jobs if j.task == task]
            cells = sorted({j.cell for j in mine})
            decodes = len({(j.context, j.cell, j.cycle if j.cell.sampled else 0) for j in mine})
            max_tokens = max(int(j.gen_kwargs.get("max_gen_toks", self.max_gen_toks)) for j in mine)
            setting = self.settings.tau_h_setting(task)
            if task in self.tau_h_by_task or setting != "auto" or not any(c.L > 0 for c in cells):
                tau = "tau_h not needed (L=0 only)" if not any(c.L > 0 for c in cells) else \
                    f"tau_h = {self.tau_h_by_task.get(task, setting)}"
            else:
                prompts = min(self.settings.calib_limit, len({j.context for j in mine}))
                tau = f"tau_h = auto: a greedy calibration on the first {prompts} prompts (unless cached)"
            logger.info("eglr-hf plan, task %s: %d problems x %d cells (%s) = %d rollouts, %d to decode "
                        "(deterministic cells once; fewer if stored), at most %d new tokens each, batch %s, engine %s; %s",
                        task, len({j.doc_id for j in mine}), len(cells), ", ".join(c.label for c in cells[:4])
                        + (", ..." if len(cells) > 4 else ""), len(mine), decodes, max_tokens, self.batch_size,
                        self.engine_used, tau)

    def stats_for(self, cell: Cell):
        """The accounting that a decode of ``cell`` adds to: the cell's, or the calibration's while calibrating."""
        if self._calibrating is not None:
            return self.accounts.calibration_for(self._calibrating)
        return self.accounts.stats_for(cell)

    # ------------------------------------------------------------------ pools and cells
    def _jobs(self, requests: list[Instance]) -> list[Job]:
        return assign_jobs(((r.task_name, r.doc_id, r.idx, *r.args, r.repeats) for r in requests), self._pool)

    def _pool(self, task: str | None, gen_kwargs: dict, repeats: int) -> PoolPlan:
        key = (task, _freeze(gen_kwargs), repeats)
        if key not in self._plans:
            plan = self.settings.pool_plan(task, gen_kwargs, repeats)
            for cell in plan.cells:
                EglrConfig(L=cell.L).validate_for_model(self.num_layers)
            plan.log(f"eglr-hf task {task}", repeats)
            self._plans[key] = plan
        return self._plans[key]

    def _concrete(self, job: Job) -> dict:
        tau_h = self.tau_h_by_task.get(job.task) if job.cell.L > 0 else None
        return self.settings.concrete_gen_kwargs(job.gen_kwargs, job.cell, job.cycle, tau_h)

    def calibrate(self, requests: list[Instance], disable_tqdm: bool = False) -> dict[str, float]:
        """tau_h of every task of ``requests`` (calibrated or looked up), without decoding their rollouts."""
        self._ensure_tau_h_of(self._jobs(requests), disable_tqdm, every_task=True)
        return dict(self.tau_h_by_task)

    def forget_rollouts(self) -> None:
        """Drop the rollouts and accounting of this run (benchmarks time repeated runs)."""
        self._memo.clear()
        self.accounts = RunAccounts(self.num_layers)
        self._gathered_accounts = None

    # ------------------------------------------------------------------ tau_h
    def _ensure_tau_h_of(self, jobs: list[Job], disable_tqdm: bool, every_task: bool) -> None:
        """Every rank calibrates the same tasks in the same order (the steps are collective)."""
        local_tasks = {j.task for j in jobs if every_task or j.cell.L > 0}
        for task in sorted({t for part in self._gather(sorted(local_tasks, key=str)) for t in part}, key=str):
            self._ensure_tau_h(task, [j for j in jobs if j.task == task], disable_tqdm)

    def _ensure_tau_h(self, task: str | None, jobs: list[Job], disable_tqdm: bool) -> None:
        """tau_h of ``task``: the setting, or the calibration (collective: every rank, with or without jobs)."""
        setting = self.settings.tau_h_setting(task)
        if task in self.tau_h_by_task or setting != "auto":
            self.tau_h_by_task.setdefault(task, setting)
            return
        task_gen_kwargs = first_reported(jobs[0].gen_kwargs if jobs else None, self._gather) or {}
        greedy = self.settings.concrete_gen_kwargs(task_gen_kwargs, Cell(0, 0.0), 0, None)
        self._calibrating = task
        try:
            result = calibrate(
                sorted({(j.doc_id, j.context) for j in jobs}), limit=self.settings.calib_limit, gather=self._gather,
                key_of=lambda prompts: content_key("tau_h", self._fingerprint, prompts, greedy), cache=TauHCache(),
                decode_entropies=lambda prompts: self._greedy_entropies(prompts, greedy, disable_tqdm),
                writer=self.rank == 0, label=f"eglr-hf task {task} ({self.model_name})",
            )
        finally:
            self._calibrating = None
        self.tau_h_by_task[task] = result.tau_h
        self.accounts.calibration_source[task] = result.as_dict()

    def _greedy_entropies(self, prompts: list[str], greedy: dict, disable_tqdm: bool) -> list[float]:
        """Decode afresh (stored texts carry no entropies); the texts are reused as the L=0 rollouts."""
        self._entropy_sink = []
        try:
            self._generate([(p, dict(greedy)) for p in prompts], disable_tqdm, reuse=False,
                           desc=f"eglr-hf tau_h calibration ({len(prompts)} greedy prompts)")
            # refiners (hf engine) hold one tensor per step, outcomes (continuous engine) one float per token
            return [e for source in self._entropy_sink for step in source.entropies
                    for e in (step.tolist() if hasattr(step, "tolist") else [step])]
        finally:
            self._entropy_sink = None

    # ------------------------------------------------------------------ generation with resume
    def _generate(self, items: list[tuple[str, dict]], disable_tqdm: bool, reuse: bool = True,
                  desc: str | None = None) -> list[str]:
        """Generate (context, concrete gen kwargs) items, reusing finished rollouts when ``reuse``.

        desc: the progress bar's label when it is not the pool's generation (calibration)."""
        keys = [content_key(self._fingerprint, c, g) for c, g in items]
        texts = [record["text"] if reuse and (record := self._lookup(key)) else None for key in keys]
        missing = [i for i, t in enumerate(texts) if t is None]
        if len(missing) < len(items):
            logger.info("eglr-hf: %d of %d rollouts reused from earlier work", len(items) - len(missing), len(items))
            self.accounts.reused.update(Cell.of(items[i][1]["eglr_L"], items[i][1]["eglr_T"])
                                        for i, t in enumerate(texts) if t is not None)
        by_generate = self._needs_generate([items[i] for i in missing])
        continuous = [i for i, needs in zip(missing, by_generate) if not needs]
        missing = [i for i, needs in zip(missing, by_generate) if needs]
        if continuous:
            fresh = generate_continuous(self, self._continuous, [items[i] for i in continuous], disable_tqdm=disable_tqdm,
                                        entropy_sink=self._entropy_sink, on_text=self._remember,
                                        desc=desc or "eglr-hf generation (continuous engine)")
            for i, text in zip(continuous, fresh):
                texts[i] = text
        # Every rank enters HFLM's loop, also with nothing to do: with batch_size=auto it all-gathers.
        if missing or (self.world_size > 1 and self._continuous is None):
            instances = [Instance("generate_until", doc={}, arguments=items[i], idx=0) for i in missing]
            previous_hook, self.cache_hook = self.cache_hook, _RolloutHook(self)  # HFLM reports each text here
            try:
                if desc is None:  # HFLM's own bar: "Running generate_until requests"
                    fresh = HFLM.generate_until(self, instances, disable_tqdm=disable_tqdm)
                else:  # a bar of our own label over HFLM's batches
                    fresh = _labelled_generate_until(self, instances, disable_tqdm, desc)
            finally:
                self.cache_hook = previous_hook
            for i, text in zip(missing, fresh):
                texts[i] = text
        return texts

    @property
    def engine_used(self) -> str:
        """The engine that decodes (``auto`` resolved): ``continuous`` or ``hf``."""
        return "hf" if self._continuous is None else "continuous"

    def _needs_generate(self, items: list[tuple[str, dict]]) -> list[bool]:
        """Per item, whether it goes through ``generate``: always under the hf engine; under ``auto``
        when it asks for options the continuous engine does not apply (said once per set of options);
        under ``continuous`` never (the engine refuses them by name)."""
        if self._continuous is None:
            return [True] * len(items)
        if self.engine == "continuous":
            return [False] * len(items)
        needs = []
        for _context, gen_kwargs in items:
            other = tuple(unsupported_options(self, gen_kwargs))
            if other and other not in self._fallback_reasons:
                self._fallback_reasons.add(other)
                logger.info("eglr-hf: requests with generation options %s decode with engine=hf (the continuous "
                            "engine applies temperature, top_k and top_p only)", list(other))
            needs.append(bool(other))
        return needs

    def _lookup(self, key: str) -> dict | None:
        """``{"text", "signals"}`` of a finished rollout from this run or the rollout store, or None."""
        record = self._memo.get(key)
        if record is None and self._store is not None:
            record = self._store.get(key)
            if record is not None:
                self._memo[key] = record
        return record

    def _remember(self, context: str, gen_kwargs: dict, text: str, signals: dict | None = None) -> None:
        key = content_key(self._fingerprint, context, gen_kwargs)
        self._memo[key] = {"text": text, "signals": signals}
        if self._store is not None:
            self._store.put(key, self._memo[key])


def _labelled_generate_until(lm: EglrHFLM, instances: list[Instance], disable_tqdm: bool, desc: str) -> list[str]:
    """``HFLM.generate_until`` batch by batch under one progress bar labelled ``desc``."""
    size = lm.batch_size if isinstance(lm.batch_size, int) and lm.batch_size > 0 else len(instances)
    texts = []
    with tqdm(total=len(instances), desc=desc, disable=disable_tqdm or lm.rank != 0) as bar:
        for start in range(0, len(instances), size):
            chunk = instances[start:start + size]
            texts += HFLM.generate_until(lm, chunk, disable_tqdm=True)
            bar.update(len(chunk))
    return texts


class _RolloutHook:
    """Receives HFLM's per-result ``add_partial`` calls and files them as finished rollouts."""

    def __init__(self, lm: EglrHFLM):
        self.lm = lm

    def add_partial(self, attr, req, res) -> None:
        if attr == "generate_until":
            self.lm._remember(*req, res)


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


def _freeze(value):
    """A hashable, order-independent form of gen kwargs."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value
