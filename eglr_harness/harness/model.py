"""``eglr-hf``: lm-eval's ``HFLM`` decoded with EGLR. Glue only: the rules live in leaf modules.

Everything HFLM accepts keeps working (``pretrained``, ``gguf_file``, ``dtype``, ``device``,
``batch_size``, ``parallelize``, chat templates, accelerate data parallel). On top of it the model
args of ``settings.RunSettings``. ``generate_until`` reads top to bottom: lm-eval instances ->
jobs with their ``Cell`` (``pool.py``) -> tau_h per task (``calibrate.py``) -> one ``RolloutSpec``
per job -> engine requests -> outcomes -> texts (``harness/decode.py``, either engine) -> a
``rollout.Rollout`` per instance; compute accounting (``accounts.py``) lands in the results JSON
under ``config.eglr``.
"""

from __future__ import annotations

import inspect
import logging

from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import PreTrainedModel

from eglr_harness.core.cell import Cell
from eglr_harness.core.distributed import process_gather
from eglr_harness.core.errors import RunArgError, model_arg_errors
from eglr_harness.core.generation_options import (
    check_generation_options,
    continuous_refusals,
    generation_config_options,
    refuse_for_continuous,
)
from eglr_harness.core.model_args import USE_CACHE_REFUSAL, check_model_args, check_pretrained_path
from eglr_harness.core.rollout import Rollout
from eglr_harness.decoding.compile_setting import DEFAULT_COMPILE, check_compile_setting, resolve_compile
from eglr_harness.decoding.model_parts import find_model_parts
from eglr_harness.harness.decode import RolloutDecoder, TextCodec
from eglr_harness.harness.engines import (
    DEFAULT_ENGINE,
    build_engines,
    check_engine,
    engine_name,
    engines_said,
    log_plan,
)
from eglr_harness.harness.preflight import declared_limits
from eglr_harness.run.accounting import RunAccounts
from eglr_harness.run.calibration import DEFAULT_CALIB_LIMIT, calibrate, first_reported
from eglr_harness.run.model_names import loaded_name, model_name
from eglr_harness.run.pool import TASK_POOL_KEYS, Job, ResolvedPool, assign_jobs, frozen
from eglr_harness.run.presets import load_preset
from eglr_harness.run.settings import RunSettings
from eglr_harness.run.stores import RolloutStore, TauHCache, check_rollout_cache, content_key, loaded_model_fingerprint

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
                 rollout_cache=None, engine=DEFAULT_ENGINE, compile=DEFAULT_COMPILE, **kwargs):
        _follow_lm_eval_logging()
        with model_arg_errors():  # every check before the weights load; one line each in the CLI
            check_eglr_model_args(kwargs)
            self.preset = load_preset(model_config) if model_config else _NO_PRESET
            check_eglr_model_args(self.preset["model_args"])
            hf_args = {**self.preset["model_args"], **kwargs}
            if pretrained is not None:
                hf_args["pretrained"] = pretrained
            if "pretrained" not in hf_args:
                raise ValueError("eglr-hf needs `pretrained` (a hub id or folder) or `model_config` (a preset name).")
            check_pretrained_path(hf_args["pretrained"])
            self.engine = check_engine(engine)
            self.compile_requested = check_compile_setting(compile)
            if self.compile_requested not in ("auto", "none"):  # an explicit compile refused before the load
                resolve_compile(self.compile_requested, _intended_device(hf_args), self.engine)
            self.settings = RunSettings.from_args(self.preset, L=L, T=T, alpha=alpha, k_max=k_max, tau_kl=tau_kl,
                                                  tau_h=tau_h, top_k=top_k, top_p=top_p, seed=seed,
                                                  calib_limit=calib_limit)
            self.settings.check_layers(declared_limits(hf_args)[0])  # where the config says it without the weights
            if rollout_cache:
                check_rollout_cache(rollout_cache)  # writable, and a damaged store moved aside now
        super().__init__(**hf_args)
        self.num_layers = find_model_parts(self.model).num_layers
        with model_arg_errors():
            self.settings.check_layers(self.num_layers)
            # the model's own generation options, known only now: checked as --gen_kwargs were before the load
            model_options = generation_config_options(self.model.generation_config)
            check_generation_options(model_options, "the model's generation_config")
            if self.engine == "continuous":
                refuse_for_continuous(continuous_refusals({}, self.model.generation_config),
                                      "the model's generation_config")
        self.model_name = model_name({k: v for k, v in hf_args.items() if isinstance(v, str)}) or loaded_name(hf_args["pretrained"])
        self._fingerprint = loaded_model_fingerprint(self.model, hf_args, settings=self.settings.base.as_dict(),
                                                     max_length=self.max_length,
                                                     add_bos_token=getattr(self, "add_bos_token", None))
        self._gather = process_gather(self.world_size)
        self.accounts = RunAccounts(self.num_layers)
        self._gathered_accounts: RunAccounts | None = None
        self.tau_h_by_task: dict[str, float] = {}
        self._plans: dict = {}
        self.calibrate_always = False  # eglr-calibrate sets it to calibrate L=0 runs too
        self._warned_loglikelihood = False
        with model_arg_errors():
            self.engines, self.engine_used, self.compile_plan = build_engines(self, self.engine, self.compile_requested)
        self.decoder = RolloutDecoder(_codec(self), self.engines, self._fingerprint,
                                      RolloutStore(rollout_cache, rank=self.rank) if rollout_cache else None,
                                      strict=self.engine == "continuous", show_progress=self.rank == 0,
                                      names=[engine_name(e) for e in self.engines])
        self.engines_by_cell: dict = {}  # (task, Cell) -> names of the engines that decoded its rollouts
        self._gathered_engines: list[dict] = [self.engines_by_cell]  # the same of every rank

    # ------------------------------------------------------------------ lm-eval hooks
    def set_cache_hook(self, cache_hook) -> None:
        if getattr(cache_hook, "dbdict", None) is not None:
            raise RunArgError(USE_CACHE_REFUSAL)
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
        self._ensure_tau_h_of(jobs, disable_tqdm, every_task=self.calibrate_always)
        items = [(j.context, self.settings.rollout(j.gen_kwargs, j.cell, j.cycle, self.tau_h_by_task.get(j.task)))
                 for j in jobs]
        keys = [self.decoder.key(*item) for item in items]
        log_plan(self, jobs, keys, [spec for _, spec in items])
        done = self.decoder.decode(items, stats_for=lambda config: self.accounts.stats_for(Cell(config.L, config.T)),
                                   desc="eglr-hf generation", disable_tqdm=disable_tqdm, keys=keys)
        self.accounts.reused.update(spec.cell for spec in done.reused)
        self._gathered_accounts = self.accounts.gathered(self._gather)
        for r, j in zip(done.records, jobs):
            self.engines_by_cell.setdefault((j.task, j.cell), set()).add(r.get("engine"))
        self._gathered_engines = self._gather(self.engines_by_cell)  # every rank's rollouts (collective)
        return [Rollout(r["text"], L=j.cell.L, T=j.cell.T, cycle=j.cycle, signals=r.get("signals"),
                        engine=r.get("engine")) for r, j in zip(done.records, jobs)]

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        s = self.settings.base
        engine = engines_said(n for part in self._gathered_engines for names in part.values() for n in names) \
            or self.engine_used  # nothing decoded yet: the engine preferred
        info["eglr"] = {
            "model": self.model_name,
            "num_layers": self.num_layers,
            "preset": self.preset.get("name"),
            # the engine(s) that decoded the rollouts (mixed: some cells or rollouts each), per task and cell
            "engine": engine,
            "engines": self._engines_by_task(),
            "engine_requested": self.engine,
            # what the continuous engine's step ran as; none when every rollout went through generate
            "compile": "none" if engine == "hf" else self.compile_plan.recorded,
            "compile_requested": self.compile_plan.requested,
            # what compiling and capturing cost the continuous engine, late compilations included (should be 0)
            "compile_report": self._compile_report(),
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed},
            "tau_h": dict(self.tau_h_by_task),
            "stats": (self._gathered_accounts or self.accounts).summary(),
        }
        return info

    def _compile_report(self) -> dict | None:
        """The continuous engine's ``warmup_report()`` (this rank's), or None when it is not among the engines."""
        continuous = [e for e in self.engines if engine_name(e) == "continuous"]
        return continuous[0].warmup_report() if continuous else None

    def _engines_by_task(self) -> dict:
        """``{task: {cell label: continuous | hf | mixed}}`` of every rank's rollouts (the engine recorded
        with each; rollouts stored before the engine was recorded are left out)."""
        merged: dict = {}
        for part in self._gathered_engines:
            for task_cell, names in part.items():
                merged.setdefault(task_cell, set()).update(names)
        table: dict = {}
        for (task, cell), names in sorted(merged.items(), key=lambda item: (str(item[0][0]), item[0][1])):
            said = engines_said(names)
            if said is not None:
                table.setdefault(str(task), {})[cell.label] = said
        return table

    # ------------------------------------------------------------------ pools and cells
    def _jobs(self, requests: list[Instance]) -> list[Job]:
        return assign_jobs(((r.task_name, r.doc_id, r.idx, *r.args, r.repeats) for r in requests), self._pool)

    def _pool(self, task: str | None, gen_kwargs: dict, repeats: int) -> ResolvedPool:
        key = (task, frozen(gen_kwargs), repeats)
        if key not in self._plans:
            self._check_task_options(task, gen_kwargs)
            plan = self.settings.pool_plan(task, gen_kwargs, repeats)
            self.settings.check_cells(plan.cells, self.num_layers)
            plan.log(f"eglr-hf task {task}", repeats)
            self._plans[key] = plan
        return self._plans[key]

    def _check_task_options(self, task, gen_kwargs: dict) -> None:
        """A task's generation options (its YAML merged with ``--gen_kwargs``), before any of its rollouts
        decodes: invalid values, and with ``engine=continuous`` the valid ones it does not apply."""
        source = f"generation_kwargs of task {task}"
        with model_arg_errors():
            check_generation_options(gen_kwargs, source, ignore=TASK_POOL_KEYS)
            if self.engine == "continuous":
                options = {k: v for k, v in gen_kwargs.items() if k not in TASK_POOL_KEYS}
                refuse_for_continuous(continuous_refusals(options, self.model.generation_config), source)

    def calibrate(self, requests: list[Instance], disable_tqdm: bool = False) -> dict[str, float]:
        """tau_h of every task of ``requests`` (calibrated or looked up), without decoding their rollouts."""
        self._ensure_tau_h_of(self._jobs(requests), disable_tqdm, every_task=True)
        return dict(self.tau_h_by_task)

    def forget_rollouts(self) -> None:
        """Drop the rollouts and accounting of this run (benchmarks time repeated runs)."""
        self.decoder.forget()
        self.accounts = RunAccounts(self.num_layers)
        self._gathered_accounts = None
        self.engines_by_cell = {}
        self._gathered_engines = [self.engines_by_cell]

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
        greedy = self.settings.rollout(task_gen_kwargs, Cell(0, 0.0), 0, None)
        result = calibrate(
            sorted({(j.doc_id, j.context) for j in jobs}), limit=self.settings.calib_limit, gather=self._gather,
            key_of=lambda prompts: content_key("tau_h", self._fingerprint, prompts, greedy.key_fields()), cache=TauHCache(),
            decode_entropies=lambda prompts: self._greedy_entropies(task, prompts, greedy, disable_tqdm),
            writer=self.rank == 0, label=f"eglr-hf task {task} ({self.model_name})",
        )
        self.tau_h_by_task[task] = result.tau_h
        self.accounts.calibration_source[task] = result.as_dict()

    def _greedy_entropies(self, task, prompts: list[str], greedy, disable_tqdm: bool) -> list[float]:
        """Decode afresh (stored texts carry no entropies); the texts are reused as the L=0 rollouts."""
        done = self.decoder.decode([(p, greedy) for p in prompts], reuse=False, calibration=True,
                                   disable_tqdm=disable_tqdm,
                                   stats_for=lambda _config: self.accounts.calibration_for(task),
                                   desc=f"eglr-hf tau_h calibration ({len(prompts)} greedy prompts)")
        return [e for outcome in done.outcomes if outcome is not None for e in outcome.entropies]


def _intended_device(hf_args: dict) -> str:
    """The device HFLM will load the model on: its ``device`` arg, else CUDA where there is one."""
    import torch  # noqa: PLC0415

    return str(hf_args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))


def _codec(lm: EglrHFLM) -> TextCodec:
    """HFLM's encoding (its add_bos rule, left truncation) and decoding, bound once."""

    def encode(context: str, max_ctx_len: int) -> tuple[int, ...]:
        ids, mask = lm.tok_batch_encode([context], left_truncate_len=max_ctx_len, truncation=lm.truncation)
        return tuple(ids[0][mask[0].bool()].tolist())

    return TextCodec(encode=encode, decode=lm.tok_decode, eos_text=lm.tok_decode(lm.eot_token_id, skip_special_tokens=False),
                     think_end_token=lm.think_end_token, max_length=lm.max_length, default_max_gen_toks=lm.max_gen_toks)


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
