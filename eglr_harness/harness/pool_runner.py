"""lm-eval's generate requests of an eglr model, as pools of rollouts: the engine-agnostic half of ``eglr-hf``
and ``eglr-vllm``.

``generate`` reads top to bottom: lm-eval instances -> jobs with their ``Cell`` (``run/pool.py``) -> tau_h
per task (``run/calibration.py``) -> one ``RolloutSpec`` per job -> texts (``harness/decode.py``, either
engine) -> a ``rollout.Rollout`` per instance; compute accounting (``run/accounting.py``) and the engines
that decoded each (task, cell) land in the results JSON under ``config.eglr`` (:meth:`eglr_info`).
"""

from __future__ import annotations

import logging

from eglr_harness.core.cell import Cell
from eglr_harness.core.config import STOP_THRESHOLD_ARGS
from eglr_harness.core.rollout import Rollout
from eglr_harness.harness.decode import RolloutDecoder
from eglr_harness.harness.eglr_args import EglrArgs
from eglr_harness.harness.engines import engines_said, log_plan
from eglr_harness.run.accounting import RunAccounts
from eglr_harness.run.calibration import calibrate, first_reported
from eglr_harness.run.pool import Job, ResolvedPool, assign_jobs, frozen
from eglr_harness.run.stores import TauHCache, content_key

logger = logging.getLogger(__name__)


class PoolRunner:
    """One model's pools, tau_h values, accounting and engines used, across its ``generate_until`` calls.

    decoder: the model's ``RolloutDecoder`` (its engines and text codec); gather: the all-gather of the
    ranks (every rank calibrates the same tasks together); rank: this process's (rank 0 writes the tau_h
    cache); generation_config: the model's own (for a task's options under engine=continuous), or None;
    max_gen_toks, batch_size: the model's, for the plan line.
    """

    def __init__(self, args: EglrArgs, decoder: RolloutDecoder, *, num_layers: int, gather, rank: int,
                 model_name: str, generation_config=None, max_gen_toks: int, batch_size, head_layers: float = 0.0):
        self.args, self.settings, self.decoder, self.gather = args, args.settings, decoder, gather
        self.num_layers, self.rank, self.model_name = num_layers, rank, model_name
        self.generation_config, self.max_gen_toks, self.batch_size = generation_config, max_gen_toks, batch_size
        self.head_layers = head_layers  # one LM-head projection in decoder layers (ModelParts.head_layers)
        self.accounts = RunAccounts(num_layers, head_layers)
        self.gathered_accounts: RunAccounts | None = None
        self.tau_h_by_task: dict[str, float] = {}
        self.pools: dict = {}
        self.calibrate_always = False  # eglr-calibrate sets it to calibrate L=0 runs too
        self.engines_by_cell: dict = {}  # (task, Cell) -> names of the engines that decoded its rollouts
        self.gathered_engines: list[dict] = [self.engines_by_cell]  # the same of every rank
        self._warned_loglikelihood = False

    # ------------------------------------------------------------------ generate_until
    def generate(self, requests, disable_tqdm: bool = False) -> list[Rollout]:
        """A ``Rollout`` per lm-eval instance (``generate_until``'s answer)."""
        jobs = self.jobs(requests)
        self.ensure_tau_h_of(jobs, disable_tqdm, every_task=self.calibrate_always)
        items = [(j.context, self.settings.rollout(j.gen_kwargs, j.cell, j.cycle, self.tau_h_by_task.get(j.task),
                                                   j.seed_index)) for j in jobs]
        keys = [self.decoder.key(*item) for item in items]
        log_plan(self, jobs, keys, [spec for _, spec in items])
        done = self.decoder.decode(items, stats_for=lambda config: self.accounts.stats_for(Cell(config.L, config.T)),
                                   desc="eglr-hf generation", disable_tqdm=disable_tqdm, keys=keys)
        self.accounts.reused.update(spec.cell for spec in done.reused)
        self.gathered_accounts = self.accounts.gathered(self.gather)
        for r, j in zip(done.records, jobs):
            self.engines_by_cell.setdefault((j.task, j.cell), set()).add(r.get("engine"))
        self.gathered_engines = self.gather(self.engines_by_cell)  # every rank's rollouts (collective)
        seed = self.settings.base.seed  # a pool under several seeds labels each rollout with its own (pool.py)
        return [Rollout(r["text"], L=j.cell.L, T=j.cell.T, cycle=j.cycle, signals=r.get("signals"),
                        engine=r.get("engine"), seed=seed + j.seed_index if j.seeds > 1 else None)
                for r, j in zip(done.records, jobs)]

    def warn_plain_scoring(self) -> None:
        """Said once: loglikelihood requests are the plain model's."""
        if not self._warned_loglikelihood:
            self._warned_loglikelihood = True
            logger.warning("eglr-hf: loglikelihood requests are scored by the plain model; EGLR changes generation "
                           "only.")

    def calibrate(self, requests, disable_tqdm: bool = False) -> dict[str, float]:
        """tau_h of every task of ``requests`` (calibrated or looked up), without decoding their rollouts."""
        self.ensure_tau_h_of(self.jobs(requests), disable_tqdm, every_task=True)
        return dict(self.tau_h_by_task)

    def forget(self) -> None:
        """Drop the rollouts and accounting of this run (benchmarks time repeated runs)."""
        self.decoder.forget()
        self.accounts = RunAccounts(self.num_layers, self.head_layers)
        self.gathered_accounts = None
        self.engines_by_cell = {}
        self.gathered_engines = [self.engines_by_cell]

    # ------------------------------------------------------------------ config.eglr
    def eglr_info(self, engine_fields: dict) -> dict:
        """``config.eglr`` of the results JSON; ``engine_fields``: the engine's entries (``engine``, ...)."""
        s = self.settings.base
        return {
            "model": self.model_name,
            "num_layers": self.num_layers,
            "preset": self.args.preset.get("name"),
            **engine_fields,
            "settings": {"alpha": s.alpha, "k_max": s.k_max, "tau_kl": s.tau_kl, "top_k": s.top_k, "top_p": s.top_p,
                         "seed": s.seed, **({"seeds": self.settings.seeds} if self.settings.seeds > 1 else {}),
                         # the exit rule and its threshold where it is not the paper's kl
                         **{k: v for k, v in s.as_dict().items() if k == "stop" or k in STOP_THRESHOLD_ARGS}},
            "tau_h": dict(self.tau_h_by_task),
            "stats": (self.gathered_accounts or self.accounts).summary(),
        }

    def engines_said(self) -> str | None:
        """The engine(s) that decoded every rank's rollouts so far (``continuous``, ``hf``, ``mixed``), None for
        none."""
        return engines_said(n for part in self.gathered_engines for names in part.values() for n in names)

    def engines_by_task(self) -> dict:
        """``{task: {cell label: continuous | hf | mixed}}`` of every rank's rollouts (the engine recorded
        with each; rollouts stored before the engine was recorded are left out)."""
        merged: dict = {}
        for part in self.gathered_engines:
            for task_cell, names in part.items():
                merged.setdefault(task_cell, set()).update(names)
        table: dict = {}
        for (task, cell), names in sorted(merged.items(), key=lambda item: (str(item[0][0]), item[0][1])):
            said = engines_said(names)
            if said is not None:
                table.setdefault(str(task), {})[cell.label] = said
        return table

    # ------------------------------------------------------------------ pools and cells
    def jobs(self, requests) -> list[Job]:
        return assign_jobs(((r.task_name, r.doc_id, r.idx, *r.args, r.repeats) for r in requests), self.pool)

    def pool(self, task: str | None, gen_kwargs: dict, repeats: int) -> ResolvedPool:
        key = (task, frozen(gen_kwargs), repeats)
        if key not in self.pools:
            self.args.check_task_options(task, gen_kwargs, self.generation_config)
            plan = self.settings.pool_plan(task, gen_kwargs, repeats)
            self.settings.check_cells(plan.cells, self.num_layers)
            plan.log(f"eglr-hf task {task}", repeats)
            self.pools[key] = plan
        return self.pools[key]

    # ------------------------------------------------------------------ tau_h
    def ensure_tau_h_of(self, jobs: list[Job], disable_tqdm: bool, every_task: bool) -> None:
        """Every rank calibrates the same tasks in the same order (the steps are collective)."""
        local_tasks = {j.task for j in jobs if every_task or j.cell.L > 0}
        for task in sorted({t for part in self.gather(sorted(local_tasks, key=str)) for t in part}, key=str):
            self.ensure_tau_h(task, [j for j in jobs if j.task == task], disable_tqdm)

    def ensure_tau_h(self, task: str | None, jobs: list[Job], disable_tqdm: bool) -> None:
        """tau_h of ``task``: the setting, or the calibration (collective: every rank, with or without jobs)."""
        setting = self.settings.tau_h_setting(task)
        if task in self.tau_h_by_task or setting != "auto":
            self.tau_h_by_task.setdefault(task, setting)
            return
        task_gen_kwargs = first_reported(jobs[0].gen_kwargs if jobs else None, self.gather) or {}
        greedy = self.settings.rollout(task_gen_kwargs, Cell(0, 0.0), 0, None)
        result = calibrate(
            sorted({(j.doc_id, j.context) for j in jobs}), limit=self.settings.calib_limit, gather=self.gather,
            key_of=lambda prompts: content_key("tau_h", self.decoder.fingerprint, prompts, greedy.key_fields()),
            cache=TauHCache(),
            decode_entropies=lambda prompts: self.greedy_entropies(task, prompts, greedy, disable_tqdm),
            writer=self.rank == 0, label=f"eglr-hf task {task} ({self.model_name})",
        )
        self.tau_h_by_task[task] = result.tau_h
        self.accounts.calibration_source[task] = result.as_dict()

    def greedy_entropies(self, task, prompts: list[str], greedy, disable_tqdm: bool) -> list[float]:
        """Decode afresh (stored texts carry no entropies); the texts are reused as the L=0 rollouts."""
        done = self.decoder.decode([(p, greedy) for p in prompts], reuse=False, calibration=True,
                                   disable_tqdm=disable_tqdm,
                                   stats_for=lambda _config: self.accounts.calibration_for(task),
                                   desc=f"eglr-hf tau_h calibration ({len(prompts)} greedy prompts)")
        return [e for outcome in done.outcomes if outcome is not None for e in outcome.entropies]
